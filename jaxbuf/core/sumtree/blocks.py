"""The sum tree walked several levels per memory access: its accelerator paths.

On a GPU or TPU every loop iteration is a kernel launch driven from the host,
so the one-level-per-iteration loops that are fastest on a CPU are the slowest
there. The heap layout of `_sumtree_nodes` makes every subtree level contiguous: the
descendants of node `n` that lie `j` levels below it are the `2^j` nodes
`n·2^j … n·2^j + 2^j − 1`. So both operations take `⌈D / _lowering.LEVELS⌉` wide
accesses for a tree of depth `D`, unrolled at trace time (no loop):

- `find` gathers that block `[B, 2^j]` under the current node, rebuilds the
  pyramid of its `j` levels pairwise (each node `left + right`, bit for bit the
  stored sums) and descends through it with `_sumtree_nodes.descend`, so it picks
  the leaf the CPU path picks, on every platform;
- `update` writes the leaves, then for each jump gathers the `2^j`-wide block of
  every touched ancestor and writes the whole pyramid above it in one scatter
  per array. Entries that share an ancestor write identical values, so the
  order of those writes does not matter, and every node is `left + right` (or
  the minimum of the two) exactly as the sequential path computes it: the state
  is bit for bit the same.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxbuf.core import lowering as _lowering
from jaxbuf.core.sumtree import nodes as _sumtree_nodes


def jumps(depth: int, levels: int = _lowering.LEVELS) -> list[int]:
    """The levels of each jump from the root down a tree of `depth` levels: the
    first takes the remainder, e.g. `jumps(12, 5) == [2, 5, 5]`."""
    out, left = [], depth
    while left > 0:
        out.append(left % levels or levels)
        left -= out[-1]
    return out


def _block(node: jax.Array, levels: int) -> jax.Array:
    """int32 `[B, 2^levels]`: the descendants of `node` `[B]` that lie `levels` below."""
    width = 1 << levels
    return node[:, None] * width + jnp.arange(width, dtype=jnp.int32)[None, :]


def _pairs(values: jax.Array, combine) -> jax.Array:
    """`[B, w/2]`: `combine` of each adjacent pair of `values` `[B, w]`."""
    return combine(values[:, 0::2], values[:, 1::2])


def _pick(level: jax.Array, position: jax.Array) -> jax.Array:
    """`level[b, position[b]]` for `level` `[B, w]`, without a gather (exact: one
    entry is kept and the rest are zeros)."""
    hit = jnp.arange(level.shape[1], dtype=jnp.int32)[None, :] == position[:, None]
    return jnp.sum(jnp.where(hit, level, 0.0), axis=1)


def find(tree: _sumtree_nodes.SumTreeState, fractions: jax.Array):
    """`_sumtree.find`, `_lowering.LEVELS` levels per gather; the same results bit for bit."""
    sums, offset = tree.sums, _sumtree_nodes.leaf_offset(tree)
    node, total, smallest = _sumtree_nodes.read_root(tree, fractions)
    targets, value = fractions * total, total
    for levels in jumps(_sumtree_nodes.depth(tree)):
        below = sums.at[_block(node, levels)].get(mode="promise_in_bounds")  # [B, 2^levels]
        pyramid = [below]
        while pyramid[0].shape[1] > 2:
            pyramid.insert(0, _pairs(pyramid[0], jnp.add))  # the stored sums, bit for bit
        position = jnp.zeros_like(node)
        for level in pyramid:  # [B, 2], [B, 4], ... below the current node
            left, right = _pick(level, 2 * position), _pick(level, 2 * position + 1)
            node, targets, value = _sumtree_nodes.descend(node, targets, left, right)
            position = 2 * position + node % 2
    return node - offset, value, total, smallest


def update(tree: _sumtree_nodes.SumTreeState, indices, values, keep, *, unique: bool):
    """`_sumtree.update`'s accelerator method: no loop, the same state bit for bit."""
    if not unique:
        marked = jnp.where(keep, indices, -1 - jnp.arange(keep.shape[0]))
        keep = keep & _sumtree_nodes.last_occurrence(marked)
    size, offset = tree.sums.shape[0], _sumtree_nodes.leaf_offset(tree)
    rows = jnp.where(keep, indices + offset, size)  # out of bounds: the write is dropped
    sums = tree.sums.at[rows].set(values, mode="drop")
    minima = tree.minima.at[rows].set(_sumtree_nodes.positive_or_inf(values), mode="drop")
    node = jnp.where(keep, rows, offset)  # a skipped entry recomputes leaf 0's unchanged path
    for levels in reversed(jumps(_sumtree_nodes.depth(tree))):
        node = node >> levels
        sums = _write_pyramid(sums, node, levels, jnp.add)
        minima = _write_pyramid(minima, node, levels, jnp.minimum)
    return _sumtree_nodes.with_minimum(sums, minima)


def _write_pyramid(nodes: jax.Array, ancestors: jax.Array, levels: int, combine) -> jax.Array:
    """`nodes` with the `levels` levels from the block below each of `ancestors`
    `[B]` up to the ancestor itself recomputed, pair by pair, in one scatter."""
    rows = _block(ancestors, levels)
    values = nodes.at[rows].get(mode="promise_in_bounds")
    written_rows, written = [], []
    for _ in range(levels):
        rows, values = rows[:, 0::2] // 2, _pairs(values, combine)
        written_rows.append(rows)
        written.append(values)
    rows = jnp.concatenate(written_rows, axis=1).reshape(-1)
    return nodes.at[rows].set(jnp.concatenate(written, axis=1).reshape(-1), mode="drop")
