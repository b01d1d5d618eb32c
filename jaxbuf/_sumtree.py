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
    return _with_minimum(jnp.zeros(size, jnp.float32), minima)


def _leaf_offset(tree: SumTreeState) -> int:
    return tree.sums.shape[0] // 2


def _depth(tree: SumTreeState) -> int:
    return _leaf_offset(tree).bit_length() - 1


def leaves(tree: SumTreeState, indices: jax.Array) -> jax.Array:
    """The leaf values at `indices` (int32, in `[0, capacity)`)."""
    return tree.sums[indices + _leaf_offset(tree)]


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


def _positive_or_inf(values: jax.Array) -> jax.Array:
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
        at capacity 1e6); `"parallel"` recomputes one level of every path at a
        time, for accelerators. None picks per lowering platform with
        `jax.lax.platform_dependent` (sequential on CPU, parallel elsewhere), so
        a program exported from a CPU host for `cuda` gets the parallel method.
    """
    keep = jnp.ones(indices.shape, bool) if keep is None else keep
    sequential = jax.named_call(_update_sequential, name="sumtree_sequential")
    parallel = jax.named_call(functools.partial(_update_parallel, unique=unique),
                              name="sumtree_parallel")  # fmt: skip
    if method is None:
        return jax.lax.platform_dependent(
            tree, indices, values, keep, cpu=sequential, default=parallel
        )
    if method not in ("sequential", "parallel"):
        raise ValueError(f"method must be 'sequential' or 'parallel', got {method!r}.")
    return (sequential if method == "sequential" else parallel)(tree, indices, values, keep)


def _update_parallel(tree, indices, values, keep, *, unique: bool) -> SumTreeState:
    """One level of every path at a time; the last kept occurrence of an index wins."""
    if not unique:
        marked = jnp.where(keep, indices, -1 - jnp.arange(len(keep)))
        keep = keep & last_occurrence(marked)
    size = tree.sums.shape[0]  # out of bounds: the write is dropped
    rows = jnp.where(keep, indices + _leaf_offset(tree), size)
    sums = tree.sums.at[rows].set(values, mode="drop")
    minima = tree.minima.at[rows].set(_positive_or_inf(values), mode="drop")

    def level(_, carry):  # a loop, not unrolled: on CPU about 3x faster at B = 256
        rows, sums, minima = carry
        rows = jnp.where(rows < size, rows // 2, size)
        left, right = 2 * rows, 2 * rows + 1
        sums = sums.at[rows].set(sums.at[left].get(mode="clip") + sums.at[right].get(mode="clip"),
                                 mode="drop")  # fmt: skip
        low = jnp.minimum(minima.at[left].get(mode="clip"), minima.at[right].get(mode="clip"))
        return rows, sums, minima.at[rows].set(low, mode="drop")

    _, sums, minima = jax.lax.fori_loop(0, _depth(tree), level, (rows, sums, minima))
    return _with_minimum(sums, minima)


def _with_minimum(sums: jax.Array, minima: jax.Array) -> SumTreeState:
    """The tree, with the root's minimum copied into the unused node 0 of `sums`."""
    return SumTreeState(sums=jax.lax.dynamic_update_slice(sums, minima[1:2], (0,)), minima=minima)


def _update_sequential(tree, indices, values, keep) -> SumTreeState:
    """One leaf after another (so the last occurrence wins), each path in a scalar loop."""
    offset = _leaf_offset(tree)

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
        row = index + offset
        # A skipped entry rewrites its leaf's old value and recomputes its unchanged
        # path. Each array's old leaf is read from that array alone: a read of
        # `sums` in the write of `minima` would make XLA copy `sums` first.
        old_sum = jax.lax.dynamic_slice(sums, (row,), (1,))
        old_min = jax.lax.dynamic_slice(minima, (row,), (1,))
        sums = jax.lax.dynamic_update_slice(sums, jnp.where(kept, value, old_sum), (row,))
        low = jnp.where(kept, _positive_or_inf(value), old_min)
        minima = jax.lax.dynamic_update_slice(minima, low, (row,))
        _, sums, minima = jax.lax.fori_loop(0, _depth(tree), level, (row, sums, minima))
        return (sums, minima), None

    (sums, minima), _ = jax.lax.scan(one, (tree.sums, tree.minima), (indices, values, keep))
    return _with_minimum(sums, minima)


def _descend(node, targets, left, right):
    """One level down from `node` `[B]` with children sums `left`, `right` `[B]`.

    Never enters a child whose sum is zero while its sibling's is positive.
    """
    go_right = ((targets >= left) & (right > 0)) | (left <= 0)
    targets = jnp.where(go_right, targets - left, targets)
    return 2 * node + go_right.astype(jnp.int32), targets, jnp.where(go_right, right, left)


def find(tree: SumTreeState, fractions: jax.Array):
    """Draws leaves in proportion to their values.

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
    sums = tree.sums
    # Read the root by a gather at an index XLA cannot fold into a constant: a
    # static slice of the tree makes XLA copy the whole tree before an update.
    # Node 0 holds the root's minimum, so that one gather from the sums (which the
    # descent then depends on) reads both: a separate read of `minima` would be
    # duplicated by XLA into later consumers, after an update of the tree.
    node = (fractions == fractions).astype(jnp.int32)  # 1 (NaN fractions: node 0)
    root = sums.at[node[:, None] - jnp.arange(2, dtype=jnp.int32)[None, :]].get(mode="clip")
    total, smallest = root[:, 0], root[:, 1]
    state = (node, fractions * total, total)
    if _depth(tree) % 2:  # one level alone, then two at a time
        pair = sums.at[2 * node[:, None] + jnp.arange(2, dtype=jnp.int32)[None, :]].get(mode="clip")
        state = _descend(node, state[1], pair[:, 0], pair[:, 1])

    def two_levels(_, state):
        node, targets, _ = state  # node < P / 2: its grandchildren are inner nodes or leaves
        below = 4 * node[:, None] + jnp.arange(4, dtype=jnp.int32)[None, :]
        grand = sums.at[below].get(mode="promise_in_bounds")  # [B, 4], contiguous
        node, targets, _ = _descend(
            node, targets, grand[:, 0] + grand[:, 1], grand[:, 2] + grand[:, 3]
        )  # the children's sums, bit for bit
        right = (node % 2).astype(bool)
        left_pair = jnp.where(right, grand[:, 2], grand[:, 0])
        right_pair = jnp.where(right, grand[:, 3], grand[:, 1])
        return _descend(node, targets, left_pair, right_pair)

    node, _, value = jax.lax.fori_loop(0, _depth(tree) // 2, two_levels, state)
    # The barrier keeps XLA from fusing reads of the tree into later consumers of
    # these results, where they would no longer precede an update of the tree.
    return jax.lax.optimization_barrier((node - _leaf_offset(tree), value, total, smallest))
