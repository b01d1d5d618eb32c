"""Flashbax's prioritised trajectory buffer over jaxbuf's prioritized sampler and sum tree.

Items are Flashbax's: the sequences starting on the `period` grid of each row, numbered
`row * (T // period) + t // period` (`T`, the time axis, cut down to a multiple of
`period` as Flashbax cuts it). Underneath, jaxbuf's trajectory buffer draws them with
`jaxbuf.prioritized(priority_exponent)` (stratified, as Flashbax's): a new item gets the
largest priority set so far, an item whose first step is overwritten gets 0, an item is
drawn with probability `p**alpha / sum p**alpha`. What differs from Flashbax, by design:

- the sum tree is jaxbuf's, float32-safe: no draw of an item of priority 0 or never
  written, however many updates (Flashbax #52), and no negative total;
- `set_priorities` ignores (and counts in `state.sum_tree_state.rejected`) an index that
  is not drawable now and a negative, NaN or infinite priority, where Flashbax writes it;
  positive priorities are clamped into `[1e-18, 1e18]`;
- the draws follow the same probabilities but not Flashbax's random stream, so a sample
  is not Flashbax's bit for bit (the uniform buffers' are);
- `state.sum_tree_state` is jaxbuf's `PriorityState` (`tree`, `max_priority`, `rejected`).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any, Generic

import chex
import jax
import jax.numpy as jnp

from jaxbuf.core.records import Buffer
from jaxbuf.core.samplers import prioritized
from jaxbuf.core.storage import TimeRingState
from jaxbuf.core.validation import check_fraction
from jaxbuf.flashbax.buffers.trajectory_buffer import (
    BufferSample,
    BufferState,
    Experience,
    TrajectoryBuffer,
    TrajectoryBufferSample,
    TrajectoryBufferState,
    as_ring,
    can_sample,
    checked_sizes,
    from_ring,
    ring_buffer,
)

Priorities = jax.Array  # p in the PER paper
Probabilities = jax.Array  # P in the PER paper
Indices = jax.Array


class PrioritisedTrajectoryBufferState(TrajectoryBufferState, Generic[Experience]):
    """Flashbax's prioritised state: the trajectory state, the sampler's state
    (`sum_tree_state`, jaxbuf's `PriorityState`) and `running_index`, int32 steps ever
    added per row."""

    sum_tree_state: Any = None
    running_index: jax.Array = None  # type: ignore[assignment]


class PrioritisedTrajectoryBufferSample(TrajectoryBufferSample, Generic[Experience]):
    """Sequences `[B, L, ...]`, their item `indices` (for `set_priorities`) and the
    `probabilities` they were drawn with."""

    indices: Indices = None  # type: ignore[assignment]
    probabilities: Probabilities = None  # type: ignore[assignment]


@dataclasses.dataclass(frozen=True)
class PrioritisedTrajectoryBuffer(TrajectoryBuffer[Experience, BufferState, BufferSample]):
    """Flashbax's prioritised record: the trajectory buffer's functions and
    `set_priorities(state, indices, priorities)`."""

    set_priorities: Callable[[BufferState, Indices, Priorities], BufferState] = None  # type: ignore[assignment]
    # jaxbuf's additions, for carrying states to and from Flashbax (`from_flashbax`)
    priority_exponent: float = 0.6
    period: int = 1


class Items:
    """Flashbax's item numbers and jaxbuf's slots (`env * T + t`) of one buffer."""

    def __init__(self, max_length_time_axis: int, period: int):
        self.length, self.period = max_length_time_axis, period
        self.per_row = max_length_time_axis // period

    def of_slots(self, slots: jax.Array) -> jax.Array:
        rows, times = jnp.divmod(slots, self.length)
        return (rows * self.per_row + times // self.period).astype(jnp.int32)

    def slots_of(self, items: jax.Array) -> jax.Array:
        rows, member = jnp.divmod(jnp.asarray(items).astype(jnp.int32), self.per_row)
        return rows * self.length + member * self.period


def check_priority_exponent(priority_exponent: Any) -> float:
    """Flashbax's range, [0, 1], in jaxbuf's words."""
    return check_fraction("priority_exponent", priority_exponent)


def check_device(device: Any) -> None:
    """Flashbax's `device=` ("cpu", "gpu" or "tpu"): accepted and not needed, jaxbuf picks
    its forms per platform; another value warns, as Flashbax does."""
    if device not in ("cpu", "gpu", "tpu"):
        warnings.warn(
            f"Device must be one of 'cpu', 'gpu' or 'tpu', got {device!r}; jaxbuf "
            "chooses its forms per platform itself.",
            stacklevel=3,
        )


def as_prioritised_ring(state: PrioritisedTrajectoryBufferState) -> TimeRingState:
    """The state as jaxbuf's ring, the sum tree as its sampler's state."""
    return as_ring(state, state.sum_tree_state, state.running_index)


def from_prioritised_ring(state: PrioritisedTrajectoryBufferState, ring: TimeRingState) -> Any:
    """`state` holding what jaxbuf's ring `ring` holds."""
    return from_ring(state, ring).replace(
        sum_tree_state=ring.sampler, running_index=ring.added.astype(jnp.int32)
    )


def init(experience: chex.ArrayTree, *, ring: Buffer) -> PrioritisedTrajectoryBufferState:
    """An empty state shaped by one step `experience` (no batch axes)."""
    ring_state = ring.init(experience)
    return PrioritisedTrajectoryBufferState(
        experience=ring_state.experience,
        current_index=ring_state.position,
        is_full=jnp.zeros((), bool),
        sum_tree_state=ring_state.sampler,
        running_index=jnp.zeros((), jnp.int32),
    )


def add(state: PrioritisedTrajectoryBufferState, batch: chex.ArrayTree, *, ring: Buffer) -> Any:
    """Writes `batch` `[add_batch_size, T, ...]`; new items get the largest priority."""
    return from_prioritised_ring(state, ring.add(as_prioritised_ring(state), batch))


def sample(state: PrioritisedTrajectoryBufferState, rng_key: chex.PRNGKey, *, ring: Buffer,
           items: Items) -> PrioritisedTrajectoryBufferSample:  # fmt: skip
    """Sequences drawn in proportion to priority, with their item numbers."""
    drawn = ring.sample(as_prioritised_ring(state), rng_key)
    return PrioritisedTrajectoryBufferSample(
        experience=drawn.experience,
        indices=items.of_slots(drawn.indices),
        probabilities=drawn.probabilities,
    )


def set_priorities(state: PrioritisedTrajectoryBufferState, indices: Indices,
                   priorities: Priorities, *, ring: Buffer, items: Items) -> Any:  # fmt: skip
    """Sets the priorities of items `indices` (a sample's)."""
    slots = items.slots_of(indices)
    assert ring.set_priorities is not None  # a prioritized sampler's buffer
    return from_prioritised_ring(
        state, ring.set_priorities(as_prioritised_ring(state), slots, priorities)
    )


def make_prioritised_trajectory_buffer(
    add_batch_size: int,
    sample_batch_size: int,
    sample_sequence_length: int,
    period: int,
    min_length_time_axis: int,
    max_size: int | None = None,
    max_length_time_axis: int | None = None,
    priority_exponent: float = 0.6,
    device: str = "cpu",
) -> PrioritisedTrajectoryBuffer:
    """Flashbax's `make_prioritised_trajectory_buffer` (see the module docstring).

    Args:
      add_batch_size: rows added together.
      sample_batch_size: sequences per `sample`.
      sample_sequence_length: steps per sequence.
      period: steps between the starts of the items of a row.
      min_length_time_axis: steps written before `can_sample` is true.
      max_size: steps in all (`max_length_time_axis = max_size // add_batch_size`).
      max_length_time_axis: steps per row, cut down to a multiple of `period`.
      priority_exponent: alpha, in [0, 1].
      device: accepted for Flashbax's signature; jaxbuf chooses per platform.

    Returns:
      A `PrioritisedTrajectoryBuffer`; `sample` gives a `PrioritisedTrajectoryBufferSample`.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf.flashbax as fbx
      >>> buffer = fbx.make_prioritised_trajectory_buffer(add_batch_size=1, sample_batch_size=4,
      ...     sample_sequence_length=1, period=1, min_length_time_axis=1, max_length_time_axis=8)
      >>> state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(4, dtype=jnp.int32)[None])
      >>> state = buffer.set_priorities(state, jnp.arange(4), jnp.array([0.0, 0.0, 1.0, 0.0]))
      >>> batch = buffer.sample(state, jax.random.key(0))
      >>> batch.experience[:, 0].tolist(), batch.indices.tolist(), batch.probabilities.tolist()
      ([2, 2, 2, 2], [2, 2, 2, 2], [1.0, 1.0, 1.0, 1.0])
    """
    max_length, min_length = checked_sizes(
        add_batch_size,
        sample_batch_size,
        sample_sequence_length,
        period,
        min_length_time_axis,
        max_size,
        max_length_time_axis,
    )
    alpha = check_priority_exponent(priority_exponent)
    check_device(device)
    if max_length % period:
        cut = max_length - max_length % period
        warnings.warn(
            f"max_length_time_axis ({max_length}) is cut to {cut}, a multiple of "
            f"period ({period}), as Flashbax cuts it.",
            stacklevel=2,
        )
        max_length -= max_length % period
    items = Items(max_length, period)
    ring = ring_buffer(
        add_batch_size,
        max_length,
        sample_batch_size,
        sample_sequence_length,
        period,
        prioritized(alpha, stratified=True),
    )

    bind = functools.partial
    return PrioritisedTrajectoryBuffer(
        init=bind(init, ring=ring),
        add=bind(add, ring=ring),
        sample=bind(sample, ring=ring, items=items),
        can_sample=bind(can_sample, min_length_time_axis=min_length),
        set_priorities=bind(set_priorities, ring=ring, items=items),
        priority_exponent=alpha,
        period=period,
    )
