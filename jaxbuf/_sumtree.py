"""A sum tree and a min tree over `capacity` leaves, in flat arrays, pure JAX.

Node `i` has children `2i` and `2i + 1`; with `P` the smallest power of two
`>= capacity`, leaves sit at nodes `[P, P + capacity)` and node 1 is the root.
Node 0 is unused.
Every inner node is recomputed from its two children (never adjusted by a
difference), so float32 sums do not drift however many updates come, and an
inner node is zero exactly when all of its leaves are.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class SumTreeState:
    """Sums and minima of the leaf values below every node.

    Attributes:
      sums: float32 `[2P]`; `sums[1]` is the total of all leaves.
      mins: float32 `[2P]`, the smallest positive leaf value below each node
        (`inf` where there is none); `mins[1]` is the smallest overall.
    """

    sums: jax.Array
    mins: jax.Array


def init(capacity: int) -> SumTreeState:
    """A tree of `capacity` leaves, all zero."""
    nodes = 2 * (1 << max(capacity - 1, 0).bit_length())
    return SumTreeState(
        sums=jnp.zeros(nodes, jnp.float32), mins=jnp.full(nodes, jnp.inf, jnp.float32)
    )


def _leaf_offset(tree: SumTreeState) -> int:
    return tree.sums.shape[0] // 2


def leaves(tree: SumTreeState, indices: jax.Array) -> jax.Array:
    """The leaf values at `indices` (int32, in `[0, capacity)`)."""
    return tree.sums[indices + _leaf_offset(tree)]


def last_occurrence(indices: jax.Array) -> jax.Array:
    """bool `[B]`: true where no later entry of `indices` `[B]` holds the same index."""
    order = jnp.argsort(indices, stable=True)
    ordered = indices[order]
    last = jnp.append(ordered[1:] != ordered[:-1], True)
    return jnp.zeros(indices.shape, bool).at[order].set(last, unique_indices=True)


def update(
    tree: SumTreeState,
    indices: jax.Array,
    values: jax.Array,
    keep: jax.Array | None = None,
    *,
    unique: bool = False,
) -> SumTreeState:
    """Sets leaves `indices` `[B]` (in `[0, capacity)`) to `values` `[B]` (float32,
    `>= 0`, finite).

    Where an index appears several times, its LAST kept occurrence wins (pass
    `unique=True` to skip that resolution when the indices are known distinct).
    Entries with `keep` false (bool `[B]`) are ignored. O(B log capacity).
    """
    offset = _leaf_offset(tree)
    if not unique:  # the last occurrence among the kept entries
        marked = indices if keep is None else jnp.where(keep, indices, -1 - jnp.arange(len(keep)))
        last = last_occurrence(marked)
        keep = last if keep is None else keep & last
    size = tree.sums.shape[0]  # out of bounds: dropped writes, filled reads
    nodes = indices + offset if keep is None else jnp.where(keep, indices + offset, size)
    sums = tree.sums.at[nodes].set(values, mode="drop")
    mins = tree.mins.at[nodes].set(jnp.where(values > 0, values, jnp.inf), mode="drop")
    for _ in range(offset.bit_length() - 1):
        nodes = jnp.where(nodes < size, nodes // 2, size)
        left, right = 2 * nodes, 2 * nodes + 1
        sums = sums.at[nodes].set(
            sums.at[left].get(mode="fill", fill_value=0)
            + sums.at[right].get(mode="fill", fill_value=0),
            mode="drop",
        )
        mins = mins.at[nodes].set(
            jnp.minimum(
                mins.at[left].get(mode="fill", fill_value=jnp.inf),
                mins.at[right].get(mode="fill", fill_value=jnp.inf),
            ),
            mode="drop",
        )
    return SumTreeState(sums=sums, mins=mins)


def find(tree: SumTreeState, targets: jax.Array) -> jax.Array:
    """The leaf whose prefix-sum interval holds each target (float32 `[B]`).

    A descent never enters a child whose sum is zero while its sibling's is
    positive, so even when rounding puts a target at or past the total, the leaf
    found has a positive value whenever the total is positive. With a zero total
    the result is meaningless (but in `[0, P)`).
    """
    offset = _leaf_offset(tree)
    node = jnp.ones(targets.shape, jnp.int32)
    for _ in range(offset.bit_length() - 1):
        left, right = tree.sums[2 * node], tree.sums[2 * node + 1]
        go_right = ((targets >= left) & (right > 0)) | (left <= 0)
        targets = jnp.where(go_right, targets - left, targets)
        node = 2 * node + go_right.astype(jnp.int32)
    return node - offset
