"""Preallocated ring storage: a pytree of `[capacity, *item_shape]` arrays.

Writes touch only the written rows (a scatter with unique, in-bounds indices), so
with a donated state XLA updates the storage in place and the cost of a write is
O(B), independent of the capacity.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


def allocate(spec: PyTree, capacity: int) -> PyTree:
    """Zero-filled storage for `capacity` items of the given item spec."""
    return jax.tree.map(lambda s: jnp.zeros((capacity, *s.shape), s.dtype), spec)


def capacity_of(storage: PyTree) -> int:
    """The static capacity, read off the leading axis of the storage."""
    return jax.tree_util.tree_leaves(storage)[0].shape[0]


def write(storage: PyTree, position: jax.Array, items: PyTree) -> PyTree:
    """Writes `items` (leaves `[B, ...]`, `B <= capacity`) at `position`, wrapping.

    Item `j` goes to row `(position + j) % capacity`.
    """
    batch = jax.tree_util.tree_leaves(items)[0].shape[0]
    rows = (position + jnp.arange(batch, dtype=jnp.int32)) % capacity_of(storage)

    def put(column: jax.Array, values: jax.Array) -> jax.Array:
        return column.at[rows].set(values, unique_indices=True, mode="promise_in_bounds")

    return jax.tree.map(put, storage, items)


def read(storage: PyTree, rows: jax.Array) -> PyTree:
    """Gathers the given rows (int32 indices, all in `[0, capacity)`)."""
    return jax.tree.map(lambda column: column.at[rows].get(mode="promise_in_bounds"), storage)


def push_where(
    rings: PyTree, next_slot: jax.Array, filled: jax.Array, mask: jax.Array, values: PyTree
) -> tuple[PyTree, jax.Array, jax.Array, jax.Array]:
    """Appends, row by row, the values where `mask` is true to rings of `K` slots.

    Args:
      rings: leaves `[N, K, ...]`, one ring per row.
      next_slot: int32 `[N]`, the slot each ring writes next.
      filled: int32 `[N]`, the slots of each ring holding a value.
      mask: bool `[N, T]`, which values to append, in order.
      values: leaves `[N, T, ...]`.

    Returns:
      `(rings, next_slot, filled, slots)`. When a row appends more than `K`
      values only its last `K` are written; `slots` (int32 `[N, T]`) is the slot
      each appended value went to (meaningless where `mask` is false).
    """
    k = jax.tree_util.tree_leaves(rings)[0].shape[1]
    rank = jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1
    count = rank[:, -1] + 1
    slots = (next_slot[:, None] + rank) % k
    rows = jnp.where(mask & (rank >= count[:, None] - k), slots, k)  # k: out of bounds, dropped
    envs = jnp.arange(mask.shape[0], dtype=jnp.int32)[:, None]
    rings = jax.tree.map(lambda ring, v: ring.at[envs, rows].set(v, mode="drop"), rings, values)
    return rings, (next_slot + count) % k, jnp.minimum(filled + count, k), slots
