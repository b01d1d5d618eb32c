"""A sum tree and a min tree over `capacity` leaves, pure JAX: its operations.

`update` sets leaves and `find` draws leaves in proportion to their values.
Each has two walks that give the same results bit for bit: the CPU's, here,
one or two levels per loop iteration, which XLA compiles tightly on CPU; and
the accelerators', in `_sumtree_blocks`, several levels per wide access with
no loop. The lowering seam (`_lowering`) picks one per lowering platform. The
state and the node arithmetic both walks share live below them, in
`_sumtree_nodes` (node `i` has children `2i` and `2i + 1`, leaves at
`[P, P + capacity)`, every inner node `left + right`).

The CPU's `find` descends two levels per memory access: the four grandchildren
`4n .. 4n + 3` of node `n` are contiguous, and the two children's sums are
their pairwise sums.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxbuf.core import lowering as _lowering
from jaxbuf.core.sumtree import blocks as _sumtree_blocks
from jaxbuf.core.sumtree.nodes import (
    SumTreeState,
    depth,
    descend,
    init,
    leaf_offset,
    leaves,
    positive_or_inf,
    read_root,
    with_minimum,
)

__all__ = ["SumTreeState", "find", "init", "leaves", "update"]


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
        loops, which XLA compiles tightly on CPU; `"parallel"` recomputes `_lowering.LEVELS`
        levels of every path per wide access, with no loop, for accelerators.
        Both give the same tree bit for bit. None picks per lowering platform
        (`_lowering.loop_or_unrolled`: sequential on CPU, parallel elsewhere), so
        a program exported from a CPU host for `cuda` gets the parallel method.
    """
    keep = jnp.ones(indices.shape, bool) if keep is None else keep
    sequential = jax.named_call(_update_sequential, name="sumtree_sequential")
    parallel = jax.named_call(functools.partial(_sumtree_blocks.update, unique=unique),
                              name="sumtree_parallel")  # fmt: skip
    if method is None:
        return _lowering.loop_or_unrolled(
            tree, indices, values, keep, loop=sequential, unrolled=parallel
        )
    if method not in ("sequential", "parallel"):
        raise ValueError(f"method must be 'sequential' or 'parallel', got {method!r}.")
    return (sequential if method == "sequential" else parallel)(tree, indices, values, keep)


def _update_sequential(tree, indices, values, keep) -> SumTreeState:
    """One leaf after another (so the last occurrence wins), each path in a scalar loop
    that stops below the lowest ancestor it shares with the next entry's leaf: that
    entry, or the last one below the ancestor, recomputes it after every leaf below
    it is final. Entries in order along the leaves (a kind's runs of new rows) walk a
    level or two each; the last walks to the root."""
    offset = leaf_offset(tree)
    rows = jnp.clip(indices, 0, offset - 1) + offset  # a skipped entry writes no leaf
    following = jnp.append(rows[1:], rows[-1:] ^ (1 << depth(tree)))  # the last: the root
    shared = 32 - jax.lax.clz(rows ^ following)  # the level of the lowest common ancestor
    walks = jnp.maximum(shared - 1, 0)

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
        row, value, kept, walk = entry[0], entry[1][None], entry[2][None], entry[3]
        # Each array's old leaf is read from that array alone: a read of `sums` in the
        # write of `minima` would make XLA copy `sums` first.
        old_sum = jax.lax.dynamic_slice(sums, (row,), (1,))
        old_min = jax.lax.dynamic_slice(minima, (row,), (1,))
        sums = jax.lax.dynamic_update_slice(sums, jnp.where(kept, value, old_sum), (row,))
        low = jnp.where(kept, positive_or_inf(value), old_min)
        minima = jax.lax.dynamic_update_slice(minima, low, (row,))
        _, sums, minima = jax.lax.fori_loop(0, walk, level, (row, sums, minima))
        return (sums, minima), None

    entries = (rows, values, keep, walks)
    (sums, minima), _ = jax.lax.scan(one, (tree.sums, tree.minima), entries)
    return with_minimum(sums, minima)


def find(tree: SumTreeState, fractions: jax.Array):
    """Draws leaves in proportion to their values.

    Where lowered for CPU the descent runs in a loop, two levels per iteration;
    for accelerators `_sumtree_blocks.find` takes the same steps with no loop,
    several levels per gather (`_lowering.loop_or_unrolled`). Both find the same
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
    found = _lowering.loop_or_unrolled(
        tree, fractions, loop=_find_in_loop, unrolled=_sumtree_blocks.find
    )
    # The barrier keeps XLA from fusing reads of the tree into later consumers of
    # these results, where they would no longer precede an update of the tree.
    return jax.lax.optimization_barrier(found)


def _find_in_loop(tree: SumTreeState, fractions: jax.Array):
    """`find`, three levels per loop iteration (the CPU path): each iteration reads the
    8 descendants 3 levels below the current node in one access (contiguous: one cache
    line), rebuilds their two levels above pairwise (bit for bit the stored sums) and
    descends through the three with selects alone."""
    sums = tree.sums
    node, total, smallest = read_root(tree, fractions)
    state = (node, fractions * total, total)
    for _ in range(depth(tree) % 3):  # the remainder one level at a time, then three
        pair = sums.at[2 * state[0][:, None] + jnp.arange(2, dtype=jnp.int32)[None, :]].get(
            mode="clip"
        )
        state = descend(state[0], state[1], pair[:, 0], pair[:, 1])

    def three_levels(_, state):
        node, targets, _ = state  # node < P / 4: its descendants 3 below are nodes
        below = 8 * node[:, None] + jnp.arange(8, dtype=jnp.int32)[None, :]
        block = sums.at[below].get(mode="promise_in_bounds")  # [B, 8], contiguous
        quarters = [block[:, 2 * j] + block[:, 2 * j + 1] for j in range(4)]
        halves = [quarters[0] + quarters[1], quarters[2] + quarters[3]]
        node, targets, _ = descend(node, targets, halves[0], halves[1])
        upper = (node % 2).astype(bool)
        node, targets, _ = descend(node, targets, jnp.where(upper, quarters[2], quarters[0]),
                                   jnp.where(upper, quarters[3], quarters[1]))  # fmt: skip
        at = 2 * upper.astype(jnp.int32) + node % 2  # the quarter reached, 0..3
        left, right = block[:, 0], block[:, 1]
        for j in range(1, 4):
            left = jnp.where(at == j, block[:, 2 * j], left)
            right = jnp.where(at == j, block[:, 2 * j + 1], right)
        return descend(node, targets, left, right)

    node, _, value = jax.lax.fori_loop(0, depth(tree) // 3, three_levels, state)
    return node - leaf_offset(tree), value, total, smallest
