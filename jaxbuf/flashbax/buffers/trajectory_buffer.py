"""Flashbax's trajectory buffer (`flashbax.buffers.trajectory_buffer`) over jaxbuf's time rings.

The state keeps Flashbax's fields: `experience` `[add_batch_size, max_length_time_axis, ...]`,
`current_index` (the time index written next, shared by every row) and `is_full`. Each call
reads it as a jaxbuf `TimeRingState` (`position = current_index`, `size = max_length_time_axis`
once full, else `current_index`), runs jaxbuf's trajectory buffer on it (its checks naming
the leaf, its writes and reads chosen per platform), and hands Flashbax's fields back.

A sample draws as Flashbax does, so the same adds and keys give the same sequences bit for
bit: the key splits twice, a first `randint` picks one of the `(size - L) // period + 1`
starts counted from the oldest stored step (`head`), a second the row:

```text
start = (head + period * randint(k1, [B], 0, (size - L) // period + 1)) % T
row   = randint(k2, [B], 0, add_batch_size)
```
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import chex
import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf.core.contracts import Drawn, Sampler
from jaxbuf.core.records import Buffer, Config
from jaxbuf.core.storage import TimeRingState
from jaxbuf.kinds.trajectory import make_trajectory_buffer as _jaxbuf_trajectory

Experience = TypeVar("Experience", bound=chex.ArrayTree)


class TrajectoryBufferState(struct.PyTreeNode, Generic[Experience]):
    """Flashbax's trajectory buffer state.

    Attributes:
      experience: leaves `[add_batch_size, max_length_time_axis, ...]`.
      current_index: int32 scalar, the time index the next add writes to.
      is_full: bool scalar, whether every time index holds a step.
    """

    experience: Experience
    current_index: jax.Array
    is_full: jax.Array


class TrajectoryBufferSample(struct.PyTreeNode, Generic[Experience]):
    """Sequences drawn from a trajectory buffer: leaves `[B, L, ...]`."""

    experience: Experience


BufferState = TypeVar("BufferState", bound=TrajectoryBufferState)
BufferSample = TypeVar("BufferSample", bound=TrajectoryBufferSample)


@dataclasses.dataclass(frozen=True)
class TrajectoryBuffer(Generic[Experience, BufferState, BufferSample]):
    """Flashbax's buffer record: `init(step)`, `add(state, batch)`, `sample(state, key)`,
    `can_sample(state)`, pure functions to call inside `jit`."""

    init: Callable[[Experience], BufferState]
    add: Callable[[BufferState, Experience], BufferState]
    sample: Callable[[BufferState, chex.PRNGKey], BufferSample]
    can_sample: Callable[[BufferState], jax.Array]

    def replace(self, **changes: Any) -> Any:
        """The record with `changes` (Flashbax's records are chex dataclasses)."""
        return dataclasses.replace(self, **changes)


def as_ring(state: Any, sampler_state: Any = None, added: Any = None) -> TimeRingState:
    """A Flashbax-shaped state (`experience`, `current_index`, `is_full`) as jaxbuf's ring."""
    capacity = jax.tree.leaves(state.experience)[0].shape[1]
    index = jnp.asarray(state.current_index, jnp.int32)
    size = jnp.where(state.is_full, capacity, index).astype(jnp.int32)
    added = size.astype(jnp.uint32) if added is None else jnp.asarray(added).astype(jnp.uint32)
    return TimeRingState(
        experience=state.experience, position=index, size=size, added=added, sampler=sampler_state
    )


def from_ring(state: Any, ring: TimeRingState) -> Any:
    """`state` (Flashbax-shaped) holding what the jaxbuf ring `ring` holds."""
    capacity = jax.tree.leaves(ring.experience)[0].shape[1]
    return state.replace(
        experience=ring.experience, current_index=ring.position, is_full=ring.size >= capacity
    )


def flashbax_uniform(sequence_length: int, period: int) -> Sampler:
    """The sampler of Flashbax's uniform trajectory buffer over a jaxbuf trajectory layout
    (see the module docstring): sequences of `sequence_length` starting every `period`
    steps from the oldest stored one, the row drawn apart."""

    def draw(layout, state: TimeRingState, key: jax.Array, count: int) -> Drawn:
        rows, capacity = layout.groups, layout.num_slots // layout.groups
        head = jnp.where(state.size >= capacity, state.position, 0)
        last = state.size - sequence_length
        starts_count = jnp.where(last >= 0, last // period + 1, 0)
        key, items_key = jax.random.split(key)
        _, rows_key = jax.random.split(key)
        member = jax.random.randint(items_key, (count,), 0, starts_count)
        where = (
            jax.random.randint(rows_key, (count,), 0, rows),
            (head + member * period) % capacity,
        )
        valid = jnp.broadcast_to(starts_count > 0, (count,))
        return Drawn(slots=layout.flatten(where), where=where, valid=valid)

    def available(layout, state: TimeRingState) -> jax.Array:
        return state.size >= sequence_length

    config = Config(kind="flashbax_uniform", sequence_length=sequence_length, period=period)
    return Sampler(
        config=config,
        init=lambda num_slots, groups: None,
        draw=draw,
        after_add=lambda state, changes: state,
        available=available,
    )


def can_sample(state: Any, min_length_time_axis: int) -> jax.Array:
    """Flashbax's rule: full, or `min_length_time_axis` steps written."""
    return state.is_full | (state.current_index >= min_length_time_axis)


def steps_per_row(max_size: Any, add_batch_size: int, max_length_time_axis: Any) -> Any:
    """`max_length_time_axis`, or `max_size // add_batch_size` where `max_size` is given
    (warning, as Flashbax does, that it sets the time axis)."""
    if max_size is None:
        return max_length_time_axis
    warnings.warn(
        f"Setting max_size sets `max_length_time_axis` to max_size // "
        f"add_batch_size = {max_size // add_batch_size}.",
        stacklevel=4,
    )
    return max_size // add_batch_size


def check_sequence_fits(sample_sequence_length: int, max_length_time_axis: int) -> None:
    """Flashbax's check that a sequence fits in a row."""
    if sample_sequence_length > max_length_time_axis:
        raise ValueError(
            f"`sample_sequence_length` ({sample_sequence_length}) must be less "
            f"than or equal to `max_length_time_axis` ({max_length_time_axis})."
        )


def checked_sizes(
    add_batch_size: Any,
    sample_batch_size: Any,
    sample_sequence_length: Any,
    period: Any,
    min_length_time_axis: Any,
    max_size: Any,
    max_length_time_axis: Any,
) -> tuple[int, int]:
    """Flashbax's argument checks and warnings; returns `(max_length_time_axis,
    min_length_time_axis)` as Flashbax uses them."""
    if max_size is not None and max_length_time_axis is not None:
        raise ValueError("Cannot specify both `max_size` and `max_length_time_axis` arguments.")
    if max_size is None and max_length_time_axis is None:
        raise ValueError(
            "Give `max_length_time_axis` (steps per row) or `max_size` (steps in "
            "all): the buffer needs one of them."
        )
    max_length_time_axis = steps_per_row(max_size, add_batch_size, max_length_time_axis)
    if sample_sequence_length > min_length_time_axis:
        warnings.warn(
            f"sample_sequence_length ({sample_sequence_length}) is greater than "
            f"min_length_time_axis ({min_length_time_axis}), which is set to "
            "sample_sequence_length.",
            stacklevel=3,
        )
        min_length_time_axis = sample_sequence_length
    if period > sample_sequence_length:
        warnings.warn(
            f"period ({period}) is greater than sample_sequence_length "
            f"({sample_sequence_length}): {period - sample_sequence_length} steps in "
            "every period are never sampled.",
            stacklevel=3,
        )
    check_sequence_fits(sample_sequence_length, max_length_time_axis)
    if min_length_time_axis > max_length_time_axis:
        raise ValueError(
            f"`min_length_time_axis` ({min_length_time_axis}) must be less than or "
            f"equal to `max_length_time_axis` ({max_length_time_axis})."
        )
    assert max_length_time_axis is not None  # given, or made from max_size above
    return int(max_length_time_axis), int(min_length_time_axis)


def ring_buffer(
    add_batch_size: int,
    max_length_time_axis: int,
    sample_batch_size: int,
    sample_sequence_length: int,
    period: int,
    sampler: Sampler,
) -> Buffer:
    """The jaxbuf trajectory buffer a drop-in runs on."""
    return _jaxbuf_trajectory(
        add_batch_size,
        max_length_time_axis,
        sample_batch_size,
        sample_sequence_length,
        period=period,
        sampler=sampler,
    )


def init(experience: chex.ArrayTree, *, ring: Buffer) -> TrajectoryBufferState:
    """An empty state shaped by one step `experience` (no batch axes)."""
    state = ring.init(experience)
    return TrajectoryBufferState(
        experience=state.experience, current_index=state.position, is_full=jnp.zeros((), bool)
    )


def add(
    state: TrajectoryBufferState, batch: chex.ArrayTree, *, ring: Buffer
) -> TrajectoryBufferState:
    """Writes `batch` `[add_batch_size, T, ...]` at the current index of every row."""
    return from_ring(state, ring.add(as_ring(state), batch))


def sample(
    state: TrajectoryBufferState, rng_key: chex.PRNGKey, *, ring: Buffer
) -> TrajectoryBufferSample:
    """Sequences drawn as Flashbax draws them (see the module docstring)."""
    return TrajectoryBufferSample(experience=ring.sample(as_ring(state), rng_key).experience)


def make_trajectory_buffer(
    add_batch_size: int,
    sample_batch_size: int,
    sample_sequence_length: int,
    period: int,
    min_length_time_axis: int,
    max_size: int | None = None,
    max_length_time_axis: int | None = None,
) -> TrajectoryBuffer:
    """Flashbax's `make_trajectory_buffer`, the same arguments and samples (module docstring).

    Args:
      add_batch_size: rows added together (`add` takes leaves `[add_batch_size, T, ...]`).
      sample_batch_size: sequences per `sample`.
      sample_sequence_length: steps per sequence.
      period: steps between the starts a sequence may have, counted from the oldest.
      min_length_time_axis: steps written before `can_sample` is true.
      max_size: steps in all (`max_length_time_axis = max_size // add_batch_size`).
      max_length_time_axis: steps per row.

    Returns:
      A `TrajectoryBuffer` whose `sample` gives leaves `[sample_batch_size,
      sample_sequence_length, ...]`.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf.flashbax as fbx
      >>> buffer = fbx.make_trajectory_buffer(add_batch_size=2, sample_batch_size=3,
      ...     sample_sequence_length=4, period=1, min_length_time_axis=4, max_length_time_axis=16)
      >>> state = buffer.init({"obs": jnp.zeros(3)})
      >>> state = buffer.add(state, {"obs": jnp.ones((2, 5, 3))})
      >>> buffer.sample(state, jax.random.key(0)).experience["obs"].shape
      (3, 4, 3)
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
    ring = ring_buffer(
        add_batch_size,
        max_length,
        sample_batch_size,
        sample_sequence_length,
        1,
        flashbax_uniform(sample_sequence_length, period),
    )

    bind = functools.partial
    return TrajectoryBuffer(
        init=bind(init, ring=ring),
        add=bind(add, ring=ring),
        sample=bind(sample, ring=ring),
        can_sample=bind(can_sample, min_length_time_axis=min_length),
    )
