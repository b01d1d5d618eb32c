"""Per-environment trajectory storage with sequence sampling that respects time."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxbuf.core import assembly as _assembly
from jaxbuf.core import contracts as _contracts
from jaxbuf.core import pipeline as _pipeline
from jaxbuf.core import storage as _storage
from jaxbuf.core import time_ring as _time_ring
from jaxbuf.core import validation as _validation
from jaxbuf.core.contracts import Changes, Sampler
from jaxbuf.core.records import Buffer, PyTree
from jaxbuf.core.samplers import uniform
from jaxbuf.core.storage import TimeRingState
from jaxbuf.options import frames as _frames
from jaxbuf.options import wrappers as _options


class Settings(NamedTuple):
    """A trajectory buffer's checked arguments (its `config` holds them by name)."""

    num_envs: int
    steps_per_env: int
    sample_batch_size: int
    sequence_length: int
    period: int
    min_size: int


def _config(num_envs, steps_per_env, sample_batch_size, sequence_length, period,
            min_size) -> Settings:  # fmt: skip
    check = _validation.check_int
    config = Settings(
        num_envs=check("num_envs", num_envs),
        steps_per_env=check("steps_per_env", steps_per_env, maximum=_storage.MAX_CAPACITY),
        sample_batch_size=check("sample_batch_size", sample_batch_size),
        sequence_length=check("sequence_length", sequence_length),
        period=check("period", period),
        min_size=check("min_size", sequence_length if min_size is None else min_size),
    )
    steps, length, period = config.steps_per_env, config.sequence_length, config.period
    if config.num_envs * steps > _validation.MAX_INT32:
        raise ValueError("num_envs * steps_per_env must fit in int32.")
    if length > steps:
        raise ValueError(
            f"sequence_length={length} exceeds steps_per_env={steps} "
            "(steps stored per environment): no sequence would ever fit."
        )
    if steps % period:
        raise ValueError(
            f"period={period} does not divide steps_per_env={steps}: sequence "
            "starts would drift as the storage wraps around."
        )
    if not length <= config.min_size <= steps:
        raise ValueError(
            f"min_size={config.min_size} must be in [sequence_length, steps_per_env] = "
            f"[{length}, {steps}]."
        )
    return config


def first_start(state: TimeRingState, length: int, period: int) -> tuple[jax.Array, jax.Array]:
    """The first aligned start (a storage time index) and how many starts there are.

    Chronological offset 0 is the oldest stored step. A window may start at
    offset `o` if `o + length <= size` (so it lies within consecutive stored
    steps and never crosses the write position) and its storage index is a
    multiple of `period`. Those offsets are `o0, o0 + period, ...`.
    """
    capacity = _storage.capacity_of(state.experience, 1)
    oldest = (state.position - state.size) % capacity
    first = (-oldest) % period
    room = state.size - length - first
    count = jnp.where(room >= 0, room // period + 1, 0)
    return (oldest + first) % capacity, count


def write_windows(state: TimeRingState, steps: PyTree, where=None, *, config: Settings
                  ) -> tuple[TimeRingState, Changes]:  # fmt: skip
    """Writes steps `[num_envs, T, ...]`; the changed slots are the window starts the
    write completed (and the rows it overwrote)."""
    after, written = _time_ring.write_steps(state, steps, where, num_envs=config.num_envs,
                                            capacity=config.steps_per_env)  # fmt: skip
    changes = _time_ring.span_changes(state, after, written, config.sequence_length, config.period)
    return after, changes


def window_count(state: TimeRingState, *, config: Settings) -> jax.Array:
    """int32 `[num_envs]`: the windows that start on the `period` grid in each ring."""
    return first_start(state, config.sequence_length, config.period)[1]


def window_start(state: TimeRingState, env: jax.Array, member: jax.Array, *,
                 config: Settings) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`(env, time)` of environment `env`'s `member`-th window (oldest first)."""
    first, _ = first_start(state, config.sequence_length, config.period)
    return env, (first + member * config.period) % config.steps_per_env


def starts_window(state: TimeRingState, slots: jax.Array, *, config: Settings) -> jax.Array:
    """Whether each slot starts a window of stored, consecutive steps on the grid."""
    times = slots % config.steps_per_env
    return _time_ring.valid_start(state, times, config.sequence_length, config.period)


def read_windows(state: TimeRingState, where: tuple[jax.Array, jax.Array], *, config: Settings,
                 done_fn: Callable | None) -> tuple[PyTree, jax.Array | None, None]:  # fmt: skip
    """The windows starting at `where = (envs, starts)` `[B]`: leaves `[B, L, ...]`, and
    their episode mask with a `done_fn`."""
    envs, starts = where
    experience, mask = windows(state.experience, envs, starts, config.sequence_length, done_fn)
    return experience, mask, None


def window_times(state: TimeRingState, where: tuple[jax.Array, jax.Array], *,
                 config: Settings) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """Where the windows at `where = (envs, starts)` were read: `(envs [B, 1], times
    [B, L])`."""
    envs, starts = where
    return envs[:, None], _time_ring.window_times(starts, config.sequence_length,
                                                config.steps_per_env)  # fmt: skip


def _layout(config: Settings, done_fn) -> _contracts.Layout:
    bind = functools.partial
    return _time_ring.ring_layout(
        num_envs=config.num_envs,
        size=config.steps_per_env,
        init=bind(_time_ring.init_steps, num_envs=config.num_envs, capacity=config.steps_per_env),
        write=bind(write_windows, config=config),
        counts=bind(window_count, config=config),
        slot=bind(window_start, config=config),
        usable=bind(starts_window, config=config),
        expand=bind(read_windows, config=config, done_fn=done_fn),
        ready=bind(_assembly.holds_min_size, min_size=config.min_size),
        frame_reads=bind(
            _time_ring.step_frames, done_fn=done_fn, read_times=bind(window_times, config=config)
        ),
    )


def windows(
    experience: PyTree,
    envs: jax.Array,
    starts: jax.Array,
    length: int,
    done_fn: Callable[[PyTree], jax.Array] | None,
) -> tuple[PyTree, jax.Array | None]:
    """The `length` steps from each (env, start) `[B]`, wrapping around the storage,
    and the episode mask (None without `done_fn`)."""
    times = _time_ring.window_times(starts, length, _storage.capacity_of(experience, 1))
    experience = _storage.read(experience, envs[:, None], times)
    mask = (
        None
        if done_fn is None
        else _time_ring.episode_mask(_time_ring.apply_done_fn(done_fn, experience))
    )
    return experience, mask


@_validation.steps_per_env_not_capacity
def make_trajectory_buffer(
    num_envs: int,
    steps_per_env: int,
    sample_batch_size: int,
    sequence_length: int,
    *,
    period: int = 1,
    min_size: int | None = None,
    done_fn: Callable[[PyTree], jax.Array] | None = None,
    frames: Mapping[str, int] | None = None,
    sampler: Sampler = uniform(),  # a frozen record: one shared default is safe
    storage_dtypes: Mapping[str, Any] | None = None,
    host_memory: Sequence[str] | None = None,
) -> Buffer:
    """Makes a buffer of per-environment trajectories that samples sequences.

    Args:
      num_envs: environments stepped together; each has its own time line.
      steps_per_env: steps stored per environment (the buffer holds `num_envs *
        steps_per_env` steps); once full, each environment's oldest are overwritten.
        (jaxbuf 0.3 called it `capacity`; `capacity=` is refused, saying so.)
      sample_batch_size: sequences per `sample`.
      sequence_length: consecutive steps per sequence.
      period: sequences start only at storage time indices that are multiples of
        `period` (1: anywhere); it must divide `steps_per_env`.
      min_size: steps per environment from which `can_sample` is true; at least
        `sequence_length` (the default).
      done_fn: `done_fn(step) -> bool scalar` for one step (no batch axes); when
        given, samples carry a `mask` that ends at the first episode end.
      frames: `{leaf name: k}`: each sampled step's leaf comes stacked over its
        last `k` steps, `[B, L, k, ...]` (see `jaxbuf.options.frames`; episode starts
        come from `done_fn`, without it only the oldest stored step limits a
        stack); storage keeps one frame per step.
      storage_dtypes: `{"obs": "bfloat16"}`: float32 leaves kept in 2 bytes
        (`"bfloat16"` or `"float16"`), sampled as float32; lossy, opt-in. `done_fn`
        sees the stored values, as float32.
      host_memory: `("obs",)`: leaves kept in the device's `pinned_host`
        memory (JAX 0.7+). Both options are described once, in
        `jaxbuf.options.wrappers`.

    Returns:
      A `Buffer` with `init(example_step)`, `add(state, steps)` with leaves
      `[num_envs, T, ...]`, `add_step(state, step)` with leaves `[num_envs, ...]`,
      `sample(state, key)` and `can_sample(state)`. A sequence never straddles the
      write position: its steps are consecutive in time, never the newest steps
      followed by overwritten ones.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_trajectory_buffer(num_envs=2, steps_per_env=8,
      ...     sample_batch_size=3, sequence_length=4, done_fn=lambda s: s["done"])
      >>> state = buffer.init({"t": jnp.int32(0), "done": jnp.bool_(False)})
      >>> steps = {"t": jnp.tile(jnp.arange(6, dtype=jnp.int32), (2, 1)),
      ...          "done": jnp.zeros((2, 6), bool)}
      >>> batch = buffer.sample(buffer.add(state, steps), jax.random.key(0))
      >>> batch.experience["t"].shape, batch.mask.shape
      ((3, 4), (3, 4))
    """
    config = _config(num_envs, steps_per_env, sample_batch_size, sequence_length, period,
                     min_size)  # fmt: skip
    if done_fn is not None and not callable(done_fn):
        raise TypeError(f"done_fn must be callable, got {type(done_fn).__name__}.")
    stacks = _frames.check_frames(frames, config.steps_per_env)
    options = (
        _frames.option(stacks),
        *_options.storage(storage_dtypes=storage_dtypes, host_memory=host_memory),
    )
    layout = _layout(config, _options.seen_as_stored(done_fn, storage_dtypes))
    return _pipeline.build(
        layout, sampler, config.sample_batch_size, options, kind="trajectory",
        **config._asdict(), **_time_ring.done_config(done_fn), frames=stacks or None,
    )  # fmt: skip
