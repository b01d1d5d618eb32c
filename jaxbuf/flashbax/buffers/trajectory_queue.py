"""Flashbax's trajectory queue: first in, first out, sequences read in the order written.

The state is Flashbax's (`experience` `[add_batch_size, max_length_time_axis, ...]`,
`write_index`, `read_index`, `is_full`); an add writes through jaxbuf's time-ring writes
(checked, naming the leaf), a sample reads the next `sample_sequence_length` steps of every
row and moves the read index on. It holds `count` unread steps per row (`max_length_time_axis`
when full, else `(write_index - read_index) % max_length_time_axis`): `can_add` is true while
an add of `add_sequence_length` steps fits without overwriting an unread one, `can_sample`
while `sample_sequence_length` are unread. As in Flashbax, `add` and `sample` do not check:
call them where `can_add` and `can_sample` hold.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Generic

import chex
import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf.core import storage as _storage
from jaxbuf.core import time_ring as _time_ring
from jaxbuf.flashbax.buffers.trajectory_buffer import (
    Experience,
    check_sequence_fits,
    steps_per_row,
)


class TrajectoryQueueState(struct.PyTreeNode, Generic[Experience]):
    """Flashbax's queue state (see the module docstring)."""

    experience: Experience
    write_index: jax.Array
    read_index: jax.Array
    is_full: jax.Array


class TrajectoryQueueSample(struct.PyTreeNode, Generic[Experience]):
    """The next sequences of every row: leaves `[add_batch_size, sample_sequence_length, ...]`."""

    experience: Experience


@dataclasses.dataclass(frozen=True)
class TrajectoryQueue(Generic[Experience]):
    """Flashbax's queue record: `init`, `add`, `sample(state) -> (state, sample)`,
    `can_sample`, `can_add`."""

    init: Callable[[Experience], TrajectoryQueueState]
    add: Callable[[TrajectoryQueueState, Experience], TrajectoryQueueState]
    sample: Callable[[TrajectoryQueueState], tuple[TrajectoryQueueState, TrajectoryQueueSample]]
    can_sample: Callable[[TrajectoryQueueState], jax.Array]
    can_add: Callable[[TrajectoryQueueState], jax.Array]

    def replace(self, **changes: Any) -> Any:
        """The record with `changes`."""
        return dataclasses.replace(self, **changes)


def unread(state: TrajectoryQueueState, capacity: int) -> jax.Array:
    """int32 scalar: the steps per row written and not yet read."""
    return jnp.where(state.is_full, capacity, (state.write_index - state.read_index) % capacity)


def init(experience: chex.ArrayTree, *, rows: int, capacity: int) -> TrajectoryQueueState:
    """An empty queue shaped by one step `experience` (no batch axes)."""
    ring = _time_ring.init_steps(experience, num_envs=rows, capacity=capacity)
    return TrajectoryQueueState(  # each its own array: a donated state holds no leaf twice
        experience=ring.experience,
        write_index=jnp.zeros((), jnp.int32),
        read_index=jnp.zeros((), jnp.int32),
        is_full=jnp.zeros((), bool),
    )


def add(state: TrajectoryQueueState, batch: chex.ArrayTree, *, rows: int,
        capacity: int) -> TrajectoryQueueState:  # fmt: skip
    """Writes `batch` `[rows, T, ...]` at the write index (checked, naming the leaf)."""
    spec = _storage.item_spec(state.experience, 1)
    length = _storage.check_steps(spec, batch, rows, capacity)
    experience = _storage.write_times(state.experience, state.write_index, batch)
    written = (state.write_index + length) % capacity
    return state.replace(experience=experience, write_index=written,
                         is_full=written == state.read_index)  # fmt: skip


def sample(state: TrajectoryQueueState, *, sequence_length: int, rows: int,
           capacity: int) -> tuple[TrajectoryQueueState, TrajectoryQueueSample]:  # fmt: skip
    """The next `sequence_length` steps of every row, and the queue moved past them."""
    times = (state.read_index + jnp.arange(sequence_length)) % capacity
    sequences = _storage.read(state.experience, jnp.arange(rows)[:, None], times[None, :])
    state = state.replace(read_index=(state.read_index + sequence_length) % capacity,
                          is_full=jnp.zeros((), bool))  # fmt: skip
    return state, TrajectoryQueueSample(experience=sequences)


def can_add(state: TrajectoryQueueState, *, sequence_length: int, rows: int,
            capacity: int) -> jax.Array:  # fmt: skip
    """Whether `sequence_length` more steps fit without overwriting an unread one."""
    return ~state.is_full & (unread(state, capacity) + sequence_length <= capacity)


def can_sample(state: TrajectoryQueueState, *, sequence_length: int, rows: int,
               capacity: int) -> jax.Array:  # fmt: skip
    """Whether `sequence_length` steps are unread."""
    return unread(state, capacity) >= sequence_length


def make_trajectory_queue(
    max_length_time_axis: int,
    add_batch_size: int,
    add_sequence_length: int,
    sample_sequence_length: int,
    max_size: int | None = None,
) -> TrajectoryQueue:
    """Flashbax's `make_trajectory_queue` (see the module docstring).

    Args:
      max_length_time_axis: steps per row.
      add_batch_size: rows added together.
      add_sequence_length: steps per row an `add` writes (what `can_add` checks for).
      sample_sequence_length: steps per row a `sample` reads.
      max_size: steps in all (`max_length_time_axis = max_size // add_batch_size`).

    Examples:
      >>> import jax.numpy as jnp, jaxbuf.flashbax as fbx
      >>> queue = fbx.make_trajectory_queue(max_length_time_axis=8, add_batch_size=1,
      ...     add_sequence_length=3, sample_sequence_length=2)
      >>> state = queue.add(queue.init(jnp.int32(0)), jnp.arange(3, dtype=jnp.int32)[None])
      >>> state, batch = queue.sample(state)
      >>> batch.experience.tolist(), bool(queue.can_sample(state)), bool(queue.can_add(state))
      ([[0, 1]], False, True)
    """
    max_length_time_axis = steps_per_row(max_size, add_batch_size, max_length_time_axis)
    check_sequence_fits(sample_sequence_length, max_length_time_axis)

    bind = functools.partial
    shape = {"rows": add_batch_size, "capacity": max_length_time_axis}
    return TrajectoryQueue(
        init=bind(init, **shape),
        add=bind(add, **shape),
        sample=bind(sample, sequence_length=sample_sequence_length, **shape),
        can_sample=bind(can_sample, sequence_length=sample_sequence_length, **shape),
        can_add=bind(can_add, sequence_length=add_sequence_length, **shape),
    )
