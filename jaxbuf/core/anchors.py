"""Anchors in per-environment time rings: slots `env * capacity + time` and their spans.

A trajectory, transition or episode buffer draws anchors (a window's first step, a
transition's start, an episode record) from per-environment rings. A slot is
`outer * size + inner`; a span of `span` consecutive stored steps starting at
storage time `t` is valid while it does not cross the write position.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxbuf.core import storage as _storage
from jaxbuf.core.contracts import Changes


def place(slots: jax.Array, *, size: int) -> tuple[jax.Array, jax.Array]:
    """`(outer, inner)` of slots `outer * size + inner` (a layout's `place`)."""
    return _storage.split(slots, size)


def flatten(where: tuple[jax.Array, jax.Array], *, size: int) -> jax.Array:
    """The slots `outer * size + inner` of `where = (outer, inner)` (a layout's `flatten`)."""
    return where[0] * size + where[1]


def window_times(starts: jax.Array, length: int, capacity: int) -> jax.Array:
    """int32 `[B, length]`: the storage times of the `length` steps from each start."""
    return (starts[:, None] + jnp.arange(length, dtype=jnp.int32)[None, :]) % capacity


def valid_start(state: Any, times: jax.Array, span: int, period: int = 1) -> jax.Array:
    """Whether storage times `times` start `span` stored, consecutive steps on the
    `period` grid (never crossing the write position)."""
    capacity = _storage.capacity_of(state.experience, 1)
    age = (state.position - 1 - times) % capacity  # 0: the newest step
    return (times % period == 0) & (age >= span - 1) & (age < state.size)


def span_changes(before: Any, after: Any, length: int, span: int, period: int = 1) -> Changes:
    """Slots `env * capacity + time` after `length` steps were written at
    `before.position`: the written rows are cleared (they are now the newest
    steps), and the `length` starts whose `span` the add completed are filled
    where they are valid starts."""
    num_envs, capacity = jax.tree_util.tree_leaves(after.experience)[0].shape[:2]
    base = (jnp.arange(num_envs, dtype=jnp.int32) * capacity)[:, None]
    j = jnp.arange(length, dtype=jnp.int32)[None, :]
    completed = (before.position - span + 1 + j) % capacity
    keep = jnp.broadcast_to(valid_start(after, completed, span, period), (num_envs, length))
    return Changes(
        cleared=(base + (before.position + j) % capacity).ravel(),
        filled=(base + completed).ravel(),
        keep=keep.ravel(),
    )
