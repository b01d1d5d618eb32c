"""Flashbax's mixer: one batch drawn from several buffers in fixed proportions.

Each buffer's share of `sample_batch_size` is `int(p / sum(p) * sample_batch_size)`, the
first taking what rounding leaves over; the key splits into one per buffer, and each
buffer's first rows of its own sample make its share, in the buffers' order. The same
states and key give Flashbax's batch (bit for bit for the uniform buffers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Mixer:
    """Flashbax's mixer record: `sample(states, key)` and `can_sample(states)`."""

    sample: Callable[[Sequence[Any], chex.PRNGKey], Any]
    can_sample: Callable[[Sequence[Any]], jax.Array]


def shares(sample_batch_size: int, proportions: Sequence[float]) -> list[int]:
    """Each buffer's rows of a batch (see the module docstring)."""
    total = sum(proportions)
    sizes = [int(p / total * sample_batch_size) for p in proportions]
    sizes[0] += sample_batch_size - sum(sizes)
    return sizes


def make_mixer(
    buffers: Sequence[Any], sample_batch_size: int, proportions: Sequence[float]
) -> Mixer:
    """Flashbax's `make_mixer` (see the module docstring).

    Args:
      buffers: buffers of one type (each draws at least its share per `sample`).
      sample_batch_size: rows per mixed batch, at least 1.
      proportions: non-negative numbers, one per buffer.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf.flashbax as fbx
      >>> make = lambda: fbx.make_item_buffer(8, 1, 4, add_batches=True)
      >>> first, second = make(), make()
      >>> mixer = fbx.make_mixer([first, second], sample_batch_size=4, proportions=[3, 1])
      >>> states = [b.add(b.init(jnp.int32(0)), jnp.full(3, v, jnp.int32))
      ...           for b, v in ((first, 1), (second, 2))]
      >>> mixer.sample(states, jax.random.key(0)).experience.tolist()
      [1, 1, 1, 2]
    """
    if len(buffers) != len(proportions):
        raise ValueError(
            f"Number of buffers ({len(buffers)}) and proportions ({len(proportions)}) must match."
        )
    if any(type(b) is not type(buffers[0]) for b in buffers):
        raise ValueError(
            f"All buffers must be of the same type, got {[type(b).__name__ for b in buffers]}."
        )
    if sample_batch_size <= 0:
        raise ValueError(f"Sample batch size must be greater than 0, got {sample_batch_size}.")
    sizes = shares(sample_batch_size, proportions)

    def sample(states: Sequence[Any], key: chex.PRNGKey) -> Any:
        keys = jax.random.split(key, len(states))
        parts = [
            jax.tree.map(lambda x, n=n: x[:n], buffer.sample(state, k))
            for buffer, state, k, n in zip(buffers, states, keys, sizes, strict=True)
        ]
        return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *parts)

    def can_sample(states: Sequence[Any]) -> jax.Array:
        return jnp.all(jnp.asarray([b.can_sample(s) for b, s in zip(buffers, states, strict=True)]))

    return Mixer(sample=sample, can_sample=can_sample)
