"""Flashbax's prioritised flat buffer: the flat buffer's pairs drawn by priority (see
`prioritised_trajectory_buffer` for what differs from Flashbax)."""

from __future__ import annotations

from typing import Generic

import chex

from jaxbuf.flashbax.buffers import _shapes
from jaxbuf.flashbax.buffers.flat_buffer import (
    ExperiencePair,
    TransitionSample,
    check_flat,
    flat_sizes,
)
from jaxbuf.flashbax.buffers.prioritised_trajectory_buffer import (
    Indices,
    PrioritisedTrajectoryBuffer,
    PrioritisedTrajectoryBufferState,
    Probabilities,
    make_prioritised_trajectory_buffer,
)
from jaxbuf.flashbax.buffers.trajectory_buffer import Experience


class PrioritisedTransitionSample(TransitionSample, Generic[Experience]):
    """A prioritised flat buffer's sample: the pair, item `indices` and `probabilities`."""

    indices: Indices = None  # type: ignore[assignment]
    probabilities: Probabilities = None  # type: ignore[assignment]


def make_prioritised_flat_buffer(
    max_length: int,
    min_length: int,
    sample_batch_size: int,
    add_sequences: bool = False,
    add_batch_size: int | None = None,
    priority_exponent: float = 0.6,
    device: str = "cpu",
) -> PrioritisedTrajectoryBuffer:
    """Flashbax's `make_prioritised_flat_buffer` (arguments as `make_flat_buffer`, with
    `priority_exponent` alpha in [0, 1] and Flashbax's `device`, not needed here).

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf.flashbax as fbx
      >>> buffer = fbx.make_prioritised_flat_buffer(max_length=32, min_length=2,
      ...                                           sample_batch_size=4)
      >>> state = buffer.init(jnp.float32(0))
      >>> for t in range(3):
      ...     state = buffer.add(state, jnp.float32(t))
      >>> batch = buffer.sample(state, jax.random.key(0))
      >>> sorted(set(batch.indices.tolist())), batch.probabilities.tolist()
      ([0, 1], [0.5, 0.5, 0.5, 0.5])
    """
    check_flat(
        max_length, min_length, sample_batch_size, 1 if add_batch_size is None else add_batch_size
    )
    buffer = make_prioritised_trajectory_buffer(
        sample_batch_size=sample_batch_size,
        priority_exponent=priority_exponent,
        device=device,
        **flat_sizes(max_length, min_length, add_batch_size),
    )

    def sample(
        state: PrioritisedTrajectoryBufferState, rng_key: chex.PRNGKey
    ) -> PrioritisedTransitionSample:
        drawn = buffer.sample(state, rng_key)
        first, second = _shapes.first_and_second(drawn.experience)
        return PrioritisedTransitionSample(
            experience=ExperiencePair(first=first, second=second),
            indices=drawn.indices,
            probabilities=drawn.probabilities,
        )

    add = _shapes.with_axes(buffer.add, add_batch_size is not None, add_sequences)
    return buffer.replace(add=add, sample=sample)
