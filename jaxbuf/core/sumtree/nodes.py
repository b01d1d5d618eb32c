"""The sum tree's state and the node arithmetic both of its walks share.

Node `i` has children `2i` and `2i + 1`; with `P` the smallest power of two
`>= capacity`, leaves sit at nodes `[P, P + capacity)` and node 1 is the root
(node 0 is unused). `sums[i]` is the sum of the leaves below node `i` and
`minima[i]` their smallest positive value; `sums[0]` repeats the root's
minimum (see `read_root`). Every inner node is recomputed from its two children
as `left + right` (never adjusted by a difference), so float32 sums do not
drift however many updates come, an inner node's sum is zero exactly when all
of its leaves are, and a node's sum can be recomputed bit for bit from the nodes
below it.

The walks live above this module: `_sumtree` (the CPU's loops, and the choice
per lowering platform) and `_sumtree_blocks` (the accelerators' wide accesses).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf.core import lowering as _lowering


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
    if count <= _lowering.PAIRS:
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


def with_minimum(sums: jax.Array, minima: jax.Array) -> SumTreeState:
    """The tree, with the root's minimum copied into the unused node 0 of `sums`."""
    return SumTreeState(sums=jax.lax.dynamic_update_slice(sums, minima[1:2], (0,)), minima=minima)


def descend(node, targets, left, right):
    """One level down from `node` `[B]` with children sums `left`, `right` `[B]`.

    Never enters a child whose sum is zero while its sibling's is positive.
    """
    go_right = ((targets >= left) & (right > 0)) | (left <= 0)
    targets = jnp.where(go_right, targets - left, targets)
    return 2 * node + go_right.astype(jnp.int32), targets, jnp.where(go_right, right, left)


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
