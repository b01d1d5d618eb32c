"""Flashbax's flat buffer: transitions as pairs of consecutive steps `(first, second)` of a
trajectory buffer with sequences of 2 (see `trajectory_buffer`); the same samples as
Flashbax's, bit for bit."""

from __future__ import annotations

from typing import Any, Generic, NamedTuple

import chex
from flax import struct

from jaxbuf.flashbax.buffers import _shapes
from jaxbuf.flashbax.buffers.trajectory_buffer import (
    Experience,
    TrajectoryBuffer,
    TrajectoryBufferState,
    make_trajectory_buffer,
)


class ExperiencePair(NamedTuple, Generic[Experience]):
    """A transition's two steps: `first` (s, a, r, ...) and `second` (s', ...)."""

    first: Experience
    second: Experience


class TransitionSample(struct.PyTreeNode, Generic[Experience]):
    """A flat buffer's sample: `experience`, an `ExperiencePair` of leaves `[B, ...]`."""

    experience: ExperiencePair


def check_flat(
    max_length: int, min_length: int, sample_batch_size: int, add_batch_size: int
) -> None:
    """Flashbax's checks of a flat buffer's sizes."""
    if sample_batch_size > max_length:
        raise ValueError(
            f"sample_batch_size ({sample_batch_size}) must be less than or equal "
            f"to max_length ({max_length})."
        )
    if min_length // add_batch_size + 1 > max_length:
        raise ValueError(
            f"min_length ({min_length}) used is too large for the buffer size: "
            f"min_length // add_batch_size + 1 = {min_length // add_batch_size + 1} "
            f"steps per row, more than max_length ({max_length})."
        )
    if max_length // add_batch_size < 2:
        raise ValueError(
            f"max_length // add_batch_size ({max_length} // {add_batch_size}) must "
            "be at least 2: each row holds pairs of consecutive steps."
        )


def flat_sizes(max_length: int, min_length: int, add_batch_size: int | None) -> dict[str, Any]:
    """The trajectory buffer a flat one is, as Flashbax sizes it."""
    rows = 1 if add_batch_size is None else add_batch_size
    return {
        "add_batch_size": rows,
        "sample_sequence_length": 2,
        "period": 1,
        "max_length_time_axis": max_length // rows,
        "min_length_time_axis": min_length // rows + 1,
    }


def make_flat_buffer(
    max_length: int,
    min_length: int,
    sample_batch_size: int,
    add_sequences: bool = False,
    add_batch_size: int | None = None,
) -> TrajectoryBuffer:
    """Flashbax's `make_flat_buffer`: `sample` gives `TransitionSample(experience=
    ExperiencePair(first, second))`, leaves `[sample_batch_size, ...]`.

    Args:
      max_length: steps in all (`max_length // add_batch_size` per row).
      min_length: steps before `can_sample` (`min_length // add_batch_size + 1` per row).
      sample_batch_size: transitions per `sample`.
      add_sequences: whether `add` takes a time axis.
      add_batch_size: rows added together (None: `add` takes no batch axis, one row).

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf.flashbax as fbx
      >>> buffer = fbx.make_flat_buffer(max_length=32, min_length=2, sample_batch_size=4)
      >>> state = buffer.init({"obs": jnp.float32(0)})
      >>> for t in range(3):
      ...     state = buffer.add(state, {"obs": jnp.float32(t)})
      >>> pair = buffer.sample(state, jax.random.key(0)).experience
      >>> (pair.second["obs"] - pair.first["obs"]).tolist()
      [1.0, 1.0, 1.0, 1.0]
    """
    check_flat(
        max_length, min_length, sample_batch_size, 1 if add_batch_size is None else add_batch_size
    )
    buffer = make_trajectory_buffer(
        sample_batch_size=sample_batch_size, **flat_sizes(max_length, min_length, add_batch_size)
    )

    def sample(state: TrajectoryBufferState, rng_key: chex.PRNGKey) -> TransitionSample:
        first, second = _shapes.first_and_second(buffer.sample(state, rng_key).experience)
        return TransitionSample(experience=ExperiencePair(first=first, second=second))

    add = _shapes.with_axes(buffer.add, add_batch_size is not None, add_sequences)
    return buffer.replace(add=add, sample=sample)
