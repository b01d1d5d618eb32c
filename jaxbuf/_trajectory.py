"""Per-environment trajectory storage with sequence sampling that respects time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf import _replay, _ring, _sampling, _validation

PyTree = Any


@struct.dataclass
class TrajectoryBufferState:
    """State of a trajectory buffer.

    Attributes:
      experience: leaves `[num_envs, capacity, *step_shape]`, time-major per
        environment: row `t` of environment `e` is one step.
      position: int32 scalar, the time index the next step is written to (all
        environments add together).
      size: int32 scalar, the number of steps stored per environment.
      added: uint32 scalar, steps ever added per environment, modulo 2**32.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_trajectory_buffer(2, 50, 4, 3)
      >>> state = buffer.add(buffer.init({"obs": jnp.zeros(3)}), {"obs": jnp.ones((2, 7, 3))})
      >>> state.experience["obs"].shape, int(state.size)
      ((2, 50, 3), 7)
    """

    experience: PyTree
    position: jax.Array
    size: jax.Array
    added: jax.Array


@struct.dataclass
class SequenceSample:
    """A batch of sequences of consecutive steps.

    Attributes:
      experience: leaves `[sample_batch_size, sequence_length, *step_shape]`.
      env_indices: int32 `[sample_batch_size]`, the environment of each sequence.
      time_indices: int32 `[sample_batch_size]`, the storage time index of its first step.
      mask: bool `[sample_batch_size, sequence_length]`, true up to and including the
        first step where `done_fn` is true (all true without an episode end); None
        when the buffer has no `done_fn`.
      valid: bool `[sample_batch_size]`, false while the buffer cannot sample.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_trajectory_buffer(2, 50, 4, 3)
      >>> state = buffer.add(buffer.init({"obs": jnp.zeros(3)}), {"obs": jnp.ones((2, 7, 3))})
      >>> batch = buffer.sample(state, jax.random.key(0))
      >>> batch.experience["obs"].shape, batch.env_indices.shape, batch.time_indices.shape
      ((4, 3, 3), (4,), (4,))
    """

    experience: PyTree
    env_indices: jax.Array
    time_indices: jax.Array
    mask: jax.Array | None
    valid: jax.Array


class TrajectoryBufferConfig(NamedTuple):
    """The validated configuration of a trajectory buffer.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> jaxbuf.make_trajectory_buffer(2, 50, 4, 3).config
      TrajectoryBufferConfig(num_envs=2, capacity=50, sample_batch_size=4, sequence_length=3,
      period=1, min_size=3)
    """

    num_envs: int
    capacity: int
    sample_batch_size: int
    sequence_length: int
    period: int
    min_size: int


class TrajectoryBuffer(NamedTuple):
    """The pure functions of a trajectory buffer, and its configuration.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_trajectory_buffer(num_envs=2, capacity=50, sample_batch_size=4,
      ...     sequence_length=3)
      >>> buffer._fields
      ('init', 'add', 'add_step', 'sample', 'can_sample', 'config')
    """

    init: Any
    add: Any
    add_step: Any
    sample: Any
    can_sample: Any
    config: TrajectoryBufferConfig


def _config(num_envs, capacity, sample_batch_size, sequence_length, period, min_size):
    check = _validation.check_int
    config = TrajectoryBufferConfig(
        num_envs=check("num_envs", num_envs),
        capacity=check("capacity", capacity, maximum=_replay.MAX_CAPACITY),
        sample_batch_size=check("sample_batch_size", sample_batch_size),
        sequence_length=check("sequence_length", sequence_length),
        period=check("period", period),
        min_size=check("min_size", sequence_length if min_size is None else min_size),
    )
    if config.num_envs * config.capacity > _validation.MAX_INT32:
        raise ValueError("num_envs * capacity must fit in int32.")
    if config.sequence_length > config.capacity:
        raise ValueError(
            f"sequence_length={config.sequence_length} exceeds capacity={config.capacity} "
            "(steps per environment): no sequence would ever fit."
        )
    if config.capacity % config.period:
        raise ValueError(
            f"period={config.period} does not divide capacity={config.capacity}: sequence "
            "starts would drift as the storage wraps around."
        )
    if not config.sequence_length <= config.min_size <= config.capacity:
        raise ValueError(
            f"min_size={config.min_size} must be in [sequence_length, capacity] = "
            f"[{config.sequence_length}, {config.capacity}]."
        )
    return config


def _starts(state: TrajectoryBufferState, config: TrajectoryBufferConfig):
    """The first aligned start (a storage time index) and how many starts there are.

    Chronological offset 0 is the oldest stored step. A sequence may start at
    offset `o` if `o + sequence_length <= size` (so it lies within consecutive
    stored steps and never crosses the write position) and its storage index is
    a multiple of `period`. Those offsets are `o0, o0 + period, ...`.
    """
    oldest = (state.position - state.size) % config.capacity
    first = (-oldest) % config.period
    room = state.size - config.sequence_length - first
    count = jnp.where(room >= 0, room // config.period + 1, 0)
    return (oldest + first) % config.capacity, count


def apply_done_fn(done_fn: Callable[[PyTree], jax.Array], steps: PyTree) -> jax.Array:
    """`done_fn` over steps with leaves `[batch, T, ...]`: bool `[batch, T]`."""
    leading = jax.tree_util.tree_leaves(steps)[0].shape[:2]
    done = jax.vmap(jax.vmap(done_fn))(steps)
    if not hasattr(done, "dtype") or done.shape != leading or done.dtype != jnp.bool_:
        got = (
            f"dtype {done.dtype} and shape {done.shape[2:]}"
            if hasattr(done, "dtype")
            else type(done).__name__
        )
        raise TypeError(f"done_fn must return a bool scalar per step, got {got}.")
    return jnp.asarray(done)


def check_steps(spec: PyTree, steps: PyTree, num_envs: int, capacity: int) -> int:
    """Checks steps (leaves `[num_envs, T, *step_shape]`) against the step spec; returns T."""
    axes = [("num_envs", num_envs), ("T", None)]
    _, length = _validation.check_batch(spec, steps, axes, what="steps")
    if length > capacity:
        raise ValueError(
            f"steps holds T={length} steps per environment, more than capacity={capacity}."
        )
    return length


def one_step(spec: PyTree, step: PyTree, num_envs: int) -> PyTree:
    """Checks one step per environment (leaves `[num_envs, *step_shape]`) against the
    step spec and returns it with a time axis of length 1."""
    _validation.check_batch(spec, step, [("num_envs", num_envs)], what="step")
    return jax.tree.map(lambda x: jnp.expand_dims(x, 1), step)


def windows(
    experience: PyTree,
    envs: jax.Array,
    starts: jax.Array,
    length: int,
    done_fn: Callable[[PyTree], jax.Array] | None,
) -> tuple[PyTree, jax.Array | None]:
    """The `length` steps from each (env, start) `[B]`, wrapping around the storage,
    and the episode mask (None without `done_fn`)."""
    capacity = jax.tree_util.tree_leaves(experience)[0].shape[1]
    times = (starts[:, None] + jnp.arange(length, dtype=jnp.int32)[None, :]) % capacity
    experience = jax.tree.map(
        lambda x: x.at[envs[:, None], times].get(mode="promise_in_bounds"), experience
    )
    mask = None if done_fn is None else episode_mask(apply_done_fn(done_fn, experience))
    return experience, mask


def episode_mask(done: jax.Array) -> jax.Array:
    """True up to and including the first true of each row of `done` `[batch, L]`."""
    done = done.astype(jnp.int32)
    return (jnp.cumsum(done, axis=1) - done) == 0


def make_trajectory_buffer(
    num_envs: int,
    capacity: int,
    sample_batch_size: int,
    sequence_length: int,
    *,
    period: int = 1,
    min_size: int | None = None,
    done_fn: Callable[[PyTree], jax.Array] | None = None,
) -> TrajectoryBuffer:
    """Makes a buffer of per-environment trajectories that samples sequences.

    Args:
      num_envs: environments stepped together; each has its own time line.
      capacity: steps stored PER ENVIRONMENT (the buffer holds
        `num_envs * capacity` steps); once full, the oldest are overwritten.
      sample_batch_size: sequences per `sample`.
      sequence_length: consecutive steps per sequence.
      period: sequences start only at storage time indices that are multiples of
        `period` (1: anywhere); it must divide `capacity`.
      min_size: steps per environment from which `can_sample` is true; at least
        `sequence_length` (the default).
      done_fn: `done_fn(step) -> bool scalar` for one step (no batch axes); when
        given, samples carry a `mask` that ends at the first episode end.

    Returns:
      A `TrajectoryBuffer`: `init(example_step)`, `add(state, steps)` with leaves
      `[num_envs, T, ...]`, `add_step(state, step)` with leaves `[num_envs, ...]`,
      `sample(state, key)` and `can_sample(state)`. A sequence never straddles the
      write position: its steps are consecutive in time, never the newest steps
      followed by overwritten ones.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_trajectory_buffer(num_envs=2, capacity=8,
      ...     sample_batch_size=3, sequence_length=4, done_fn=lambda s: s["done"])
      >>> state = buffer.init({"t": jnp.int32(0), "done": jnp.bool_(False)})
      >>> steps = {"t": jnp.tile(jnp.arange(6, dtype=jnp.int32), (2, 1)),
      ...          "done": jnp.zeros((2, 6), bool)}
      >>> batch = buffer.sample(buffer.add(state, steps), jax.random.key(0))
      >>> batch.experience["t"].shape, batch.mask.shape
      ((3, 4), (3, 4))
    """
    config = _config(num_envs, capacity, sample_batch_size, sequence_length, period, min_size)
    if done_fn is not None and not callable(done_fn):
        raise TypeError(f"done_fn must be callable, got {type(done_fn).__name__}.")

    def init(example_step: PyTree) -> TrajectoryBufferState:
        spec = _validation.item_spec(example_step, "example_step")
        per_env = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct((config.capacity, *s.shape), s.dtype), spec
        )
        return TrajectoryBufferState(
            experience=jax.tree.map(
                lambda s: jnp.zeros((config.num_envs, *s.shape), s.dtype), per_env
            ),
            position=jnp.zeros((), jnp.int32),
            size=jnp.zeros((), jnp.int32),
            added=jnp.zeros((), jnp.uint32),
        )

    def add(state: TrajectoryBufferState, steps: PyTree) -> TrajectoryBufferState:
        spec = _replay.storage_spec(state.experience, 1)
        length = check_steps(spec, steps, config.num_envs, config.capacity)
        write = jax.vmap(_ring.write, in_axes=(0, None, 0))
        return state.replace(
            experience=write(state.experience, state.position, steps),
            position=(state.position + length) % config.capacity,
            size=jnp.minimum(state.size + length, config.capacity),
            added=state.added + length,
        )

    def add_step(state: TrajectoryBufferState, step: PyTree) -> TrajectoryBufferState:
        spec = _replay.storage_spec(state.experience, 1)
        return add(state, one_step(spec, step, config.num_envs))

    def ready(state: TrajectoryBufferState, count: jax.Array) -> jax.Array:
        return (count > 0) & (state.size >= config.min_size)

    def can_sample(state: TrajectoryBufferState) -> jax.Array:
        return ready(state, _starts(state, config)[1])

    def sample(state: TrajectoryBufferState, key: jax.Array) -> SequenceSample:
        batch, length = config.sample_batch_size, config.sequence_length
        first, count = _starts(state, config)
        words = _sampling.random_words(key, 2 * batch)
        envs = _sampling.scale_below(words[:batch], jnp.int32(config.num_envs))
        starts = (
            first + _sampling.scale_below(words[batch:], count) * config.period
        ) % config.capacity
        experience, mask = windows(state.experience, envs, starts, length, done_fn)
        valid = jnp.broadcast_to(ready(state, count), (batch,))
        return SequenceSample(experience, envs, starts, mask, valid)

    return TrajectoryBuffer(init, add, add_step, sample, can_sample, config)
