"""Flashbax's item buffer: items in one row of a trajectory buffer with sequences of 1
(see `trajectory_buffer`); the same samples as Flashbax's, bit for bit."""

from __future__ import annotations

import chex

from jaxbuf.flashbax.buffers import _shapes
from jaxbuf.flashbax.buffers.trajectory_buffer import (
    TrajectoryBuffer,
    TrajectoryBufferSample,
    TrajectoryBufferState,
    make_trajectory_buffer,
)


def check_items(max_length: int, min_length: int, sample_batch_size: int) -> None:
    """Flashbax's checks of an item buffer's sizes."""
    if sample_batch_size > max_length:
        raise ValueError(
            f"sample_batch_size ({sample_batch_size}) must be less than or equal "
            f"to max_length ({max_length})."
        )
    if min_length > max_length:
        raise ValueError(
            f"min_length ({min_length}) cannot be larger than max_length ({max_length})."
        )


def item_sizes(max_length: int, min_length: int) -> dict[str, int]:
    """The trajectory buffer an item buffer is, as Flashbax sizes it."""
    return {
        "add_batch_size": 1,
        "sample_sequence_length": 1,
        "period": 1,
        "max_length_time_axis": max_length,
        "min_length_time_axis": min_length,
    }


def make_item_buffer(
    max_length: int,
    min_length: int,
    sample_batch_size: int,
    add_sequences: bool = False,
    add_batches: bool = False,
) -> TrajectoryBuffer:
    """Flashbax's `make_item_buffer`: `sample` gives items `[sample_batch_size, ...]`.

    Args:
      max_length: items stored.
      min_length: items before `can_sample`.
      sample_batch_size: items per `sample`.
      add_sequences: whether `add` takes a time axis.
      add_batches: whether `add` takes a batch axis.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf.flashbax as fbx
      >>> buffer = fbx.make_item_buffer(max_length=8, min_length=1, sample_batch_size=2,
      ...                               add_batches=True)
      >>> state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(5, dtype=jnp.int32))
      >>> buffer.sample(state, jax.random.key(0)).experience.shape
      (2,)
    """
    check_items(max_length, min_length, sample_batch_size)
    buffer = make_trajectory_buffer(
        sample_batch_size=sample_batch_size, **item_sizes(max_length, min_length)
    )

    def sample(state: TrajectoryBufferState, rng_key: chex.PRNGKey) -> TrajectoryBufferSample:
        return TrajectoryBufferSample(
            experience=_shapes.squeezed(buffer.sample(state, rng_key).experience)
        )

    add = _shapes.with_axes(_shapes.as_one_row(buffer.add), add_batches, add_sequences)
    return buffer.replace(add=add, sample=sample)
