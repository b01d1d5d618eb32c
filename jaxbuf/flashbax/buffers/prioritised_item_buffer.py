"""Flashbax's prioritised item buffer: the item buffer's items drawn by priority (see
`prioritised_trajectory_buffer` for what differs from Flashbax)."""

from __future__ import annotations

import chex

from jaxbuf.flashbax.buffers import _shapes
from jaxbuf.flashbax.buffers.item_buffer import check_items, item_sizes
from jaxbuf.flashbax.buffers.prioritised_trajectory_buffer import (
    PrioritisedTrajectoryBuffer,
    PrioritisedTrajectoryBufferSample,
    PrioritisedTrajectoryBufferState,
    make_prioritised_trajectory_buffer,
)


def make_prioritised_item_buffer(
    max_length: int,
    min_length: int,
    sample_batch_size: int,
    add_sequences: bool = False,
    add_batches: bool = False,
    priority_exponent: float = 0.6,
    device: str = "cpu",
) -> PrioritisedTrajectoryBuffer:
    """Flashbax's `make_prioritised_item_buffer` (arguments as `make_item_buffer`, with
    `priority_exponent` alpha in [0, 1] and Flashbax's `device`, not needed here).

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf.flashbax as fbx
      >>> buffer = fbx.make_prioritised_item_buffer(max_length=8, min_length=1,
      ...     sample_batch_size=3, add_batches=True, priority_exponent=1.0)
      >>> state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(2, dtype=jnp.int32))
      >>> state = buffer.set_priorities(state, jnp.array([0, 1]), jnp.array([3.0, 1.0]))
      >>> buffer.sample(state, jax.random.key(0)).probabilities.tolist()
      [0.75, 0.75, 0.25]
    """
    check_items(max_length, min_length, sample_batch_size)
    buffer = make_prioritised_trajectory_buffer(
        sample_batch_size=sample_batch_size,
        priority_exponent=priority_exponent,
        device=device,
        **item_sizes(max_length, min_length),
    )

    def sample(
        state: PrioritisedTrajectoryBufferState, rng_key: chex.PRNGKey
    ) -> PrioritisedTrajectoryBufferSample:
        drawn = buffer.sample(state, rng_key)
        return drawn.replace(experience=_shapes.squeezed(drawn.experience))

    add = _shapes.with_axes(_shapes.as_one_row(buffer.add), add_batches, add_sequences)
    return buffer.replace(add=add, sample=sample)
