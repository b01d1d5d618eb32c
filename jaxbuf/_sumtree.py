"""A sum tree and a min tree over `capacity` leaves, pure JAX.

Node `i` has children `2i` and `2i + 1`; with `P` the smallest power of two
`>= capacity`, leaves sit at nodes `[P, P + capacity)` and node 1 is the root
(node 0 is unused). `sums[i]` is the sum of the leaves below node `i` and
`minima[i]` their smallest positive value; `sums[0]` repeats the root's
minimum (see `find`). Every inner node is recomputed from
its two children as `left + right` (never adjusted by a difference), so float32
sums do not drift however many updates come, an inner node's sum is zero exactly
when all of its leaves are, and a node's sum can be recomputed bit for bit from
the nodes below it.

That last property lets `find` descend two levels per memory access: the four
grandchildren `4n .. 4n + 3` of node `n` are contiguous, and the two children's
sums are their pairwise sums.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf import _sumtree_blocks


class SumTreeState(struct.PyTreeNode):
    """Sums and minima of the leaf values below every node.

    Attributes:
      sums: float32 `[2P]`: the sum of the leaves below each node; `sums[0]`
        (no node) repeats `minima[1]`.
      minima: float32 `[2P]`: their smallest positive value (`inf` if none).
    """

    sums: jax.Array
    minima: jax.Array

    @property
    def total(self) -> jax.Array:
        """The sum of all leaves."""
        return self.sums[1]

    @property
    def minimum(self) -> jax.Array:
        """The smallest positive leaf (`inf` if none)."""
        return self.minima[1]


def init(capacity: int) -> SumTreeState:
    """A tree of `capacity` leaves, all zero."""
    size = 2 * (1 << max(capacity - 1, 0).bit_length())
    minima = jnp.full(size, jnp.inf, jnp.float32)
    return with_minimum(jnp.zeros(size, jnp.float32), minima)


def leaf_offset(tree: SumTreeState) -> int:
    """`P`, the node of leaf 0."""
    return tree.sums.shape[0] // 2


def depth(tree: SumTreeState) -> int:
    """`log2 P`, the levels between the root and the leaves."""
    return leaf_offset(tree).bit_length() - 1


def leaves(tree: SumTreeState, indices: jax.Array) -> jax.Array:
    """The leaf values at `indices` (int32, in `[0, capacity)`)."""
    return tree.sums[indices + leaf_offset(tree)]


def last_occurrence(indices: jax.Array) -> jax.Array:
    """bool `[B]`: true where no later entry of `indices` `[B]` holds the same index."""
    count = indices.shape[0]
    if count <= 1024:  # O(B^2) comparisons beat a sort on CPU at these sizes (17 vs 57 us)
        steps = jnp.arange(count)
        later = steps[:, None] < steps[None, :]
        return ~jnp.any((indices[:, None] == indices[None, :]) & later, axis=1)
    order = jnp.argsort(indices, stable=True)
    ordered = indices[order]
    last = jnp.append(ordered[1:] != ordered[:-1], True)
    return jnp.zeros(indices.shape, bool).at[order].set(last, unique_indices=True)


def positive_or_inf(values: jax.Array) -> jax.Array:
    """A leaf's entry in the min tree: its value if positive, else `inf`."""
    return jnp.where(values > 0, values, jnp.inf)


def update(
    tree: SumTreeState,
    indices: jax.Array,
    values: jax.Array,
    keep: jax.Array | None = None,
    *,
    unique: bool = False,
    method: str | None = None,
) -> SumTreeState:
    """Sets leaves `indices` `[B]` (in `[0, capacity)`) to `values` `[B]` (float32,
    `>= 0`, finite).

    Where an index appears several times, its LAST kept occurrence wins. Entries
    with `keep` false (bool `[B]`) are ignored. O(B log capacity).

    Args:
      tree: the tree.
      indices, values, keep: the leaves, their new values and which to write.
      unique: the indices are known distinct (skips the duplicate resolution of
        the parallel method).
      method: `"sequential"` walks each leaf's path to the root in turn, in scalar
        loops, which XLA compiles tightly on CPU (40 us against 150 for B = 256
        at capacity 1e6); `"parallel"` recomputes `_sumtree_blocks.LEVELS`
        levels of every path per wide access, with no loop, for accelerators.
        Both give the same tree bit for bit. None picks per lowering platform with
        `jax.lax.platform_dependent` (sequential on CPU, parallel elsewhere), so
        a program exported from a CPU host for `cuda` gets the parallel method.
    """
    keep = jnp.ones(indices.shape, bool) if keep is None else keep
    sequential = jax.named_call(_update_sequential, name="sumtree_sequential")
    parallel = jax.named_call(functools.partial(_sumtree_blocks.update, unique=unique),
                              name="sumtree_parallel")  # fmt: skip
    if method is None:
        return jax.lax.platform_dependent(
            tree, indices, values, keep, cpu=sequential, default=parallel
        )
    if method not in ("sequential", "parallel"):
        raise ValueError(f"method must be 'sequential' or 'parallel', got {method!r}.")
    return (sequential if method == "sequential" else parallel)(tree, indices, values, keep)


def with_minimum(sums: jax.Array, minima: jax.Array) -> SumTreeState:
    """The tree, with the root's minimum copied into the unused node 0 of `sums`."""
    return SumTreeState(sums=jax.lax.dynamic_update_slice(sums, minima[1:2], (0,)), minima=minima)


def _update_sequential(tree, indices, values, keep) -> SumTreeState:
    """One leaf after another (so the last occurrence wins), each path in a scalar loop."""
    offset = leaf_offset(tree)

    def level(_, carry):
        row, sums, minima = carry
        row = row // 2
        pair_sums = jax.lax.dynamic_slice(sums, (2 * row,), (2,))
        pair_minima = jax.lax.dynamic_slice(minima, (2 * row,), (2,))
        sums = jax.lax.dynamic_update_slice(sums, (pair_sums[0] + pair_sums[1])[None], (row,))
        low = jnp.minimum(pair_minima[0], pair_minima[1])
        return row, sums, jax.lax.dynamic_update_slice(minima, low[None], (row,))

    def one(carry, entry):
        sums, minima = carry
        index, value, kept = entry[0], entry[1][None], entry[2][None]
        row = jnp.where(entry[2], index, 0) + offset
        # A skipped entry (its index may be -1) rewrites leaf 0's old value and
        # recomputes its unchanged path. Each array's old leaf is read from that
        # array alone: a read of `sums` in the write of `minima` would make XLA
        # copy `sums` first.
        old_sum = jax.lax.dynamic_slice(sums, (row,), (1,))
        old_min = jax.lax.dynamic_slice(minima, (row,), (1,))
        sums = jax.lax.dynamic_update_slice(sums, jnp.where(kept, value, old_sum), (row,))
        low = jnp.where(kept, positive_or_inf(value), old_min)
        minima = jax.lax.dynamic_update_slice(minima, low, (row,))
        _, sums, minima = jax.lax.fori_loop(0, depth(tree), level, (row, sums, minima))
        return (sums, minima), None

    (sums, minima), _ = jax.lax.scan(one, (tree.sums, tree.minima), (indices, values, keep))
    return with_minimum(sums, minima)


def descend(node, targets, left, right):
    """One level down from `node` `[B]` with children sums `left`, `right` `[B]`.

    Never enters a child whose sum is zero while its sibling's is positive.
    """
    go_right = ((targets >= left) & (right > 0)) | (left <= 0)
    targets = jnp.where(go_right, targets - left, targets)
    return 2 * node + go_right.astype(jnp.int32), targets, jnp.where(go_right, right, left)


def find(tree: SumTreeState, fractions: jax.Array):
    """Draws leaves in proportion to their values.

    Where lowered for CPU the descent runs in a loop, two levels per iteration;
    for accelerators `_sumtree_blocks.find` takes the same steps with no loop,
    several levels per gather (`jax.lax.platform_dependent`). Both find the same
    leaves bit for bit.

    Args:
      tree: the tree.
      fractions: float32 `[B]` in `[0, 1)`; fraction `u` picks the leaf whose
        prefix-sum interval holds `u * total`.

    Returns:
      `(indices, values, total, minimum)`, int32 leaf indices `[B]`, their
      values, and the tree's total and smallest positive leaf (repeated `[B]`).
      A descent never enters a child whose sum is zero while its sibling's is
      positive, so even when rounding puts a target at or past the total, every
      leaf found has a positive value whenever the total is positive. With a
      zero total the indices are meaningless (but in `[0, P)`).
    """
    found = jax.lax.platform_dependent(
        tree, fractions, cpu=_find_in_loop, default=_sumtree_blocks.find
    )
    # The barrier keeps XLA from fusing reads of the tree into later consumers of
    # these results, where they would no longer precede an update of the tree.
    return jax.lax.optimization_barrier(found)


def read_root(tree: SumTreeState, fractions: jax.Array):
    """`(node, total, smallest)`, each `[B]`: the root node (0 for NaN fractions),
    the tree's total and its smallest positive leaf, where a descent starts.

    The root is read by a gather at an index XLA cannot fold into a constant: a
    static slice of the tree makes XLA copy the whole tree before an update.
    Node 0 holds the root's minimum, so that one gather from the sums (which the
    descent then depends on) reads both: a separate read of `minima` would be
    duplicated by XLA into later consumers, after an update of the tree.
    """
    node = (fractions == fractions).astype(jnp.int32)  # 1 (NaN fractions: node 0)
    offsets = jnp.arange(2, dtype=jnp.int32)[None, :]
    root = tree.sums.at[node[:, None] - offsets].get(mode="clip")
    return node, root[:, 0], root[:, 1]


def _find_in_loop(tree: SumTreeState, fractions: jax.Array):
    """`find`, two levels per loop iteration (the CPU path)."""
    sums = tree.sums
    node, total, smallest = read_root(tree, fractions)
    state = (node, fractions * total, total)
    if depth(tree) % 2:  # one level alone, then two at a time
        pair = sums.at[2 * node[:, None] + jnp.arange(2, dtype=jnp.int32)[None, :]].get(mode="clip")
        state = descend(node, state[1], pair[:, 0], pair[:, 1])

    def two_levels(_, state):
        node, targets, _ = state  # node < P / 2: its grandchildren are inner nodes or leaves
        below = 4 * node[:, None] + jnp.arange(4, dtype=jnp.int32)[None, :]
        grand = sums.at[below].get(mode="promise_in_bounds")  # [B, 4], contiguous
        node, targets, _ = descend(
            node, targets, grand[:, 0] + grand[:, 1], grand[:, 2] + grand[:, 3]
        )  # the children's sums, bit for bit
        right = (node % 2).astype(bool)
        left_pair = jnp.where(right, grand[:, 2], grand[:, 0])
        right_pair = jnp.where(right, grand[:, 3], grand[:, 1])
        return descend(node, targets, left_pair, right_pair)

    node, _, value = jax.lax.fori_loop(0, depth(tree) // 2, two_levels, state)
    return node - leaf_offset(tree), value, total, smallest
