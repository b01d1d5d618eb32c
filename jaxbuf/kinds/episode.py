"""Whole episodes of variable length, sampled padded to a maximum length with a mask.

Steps live in per-environment trajectory storage. At `add` time every episode
end (`done_fn(step)`) appends a record `(first step number, length)` of the
episode it closes to a per-environment ring, and records whose first step has
been overwritten are dropped. What remains in the ring are exactly the complete
episodes still stored, so `sample` draws uniformly among them in O(batch).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf.core import contracts as _contracts
from jaxbuf.core import draws as _draws
from jaxbuf.core import pipeline as _pipeline
from jaxbuf.core import storage as _storage
from jaxbuf.core import time_ring as _time_ring
from jaxbuf.core import validation as _validation
from jaxbuf.core.contracts import Changes, Sampler
from jaxbuf.core.records import Buffer, PyTree
from jaxbuf.core.samplers import uniform
from jaxbuf.core.storage import TimeRingState
from jaxbuf.options import frames as _frames
from jaxbuf.options import goals as _goals
from jaxbuf.options import wrappers as _options


class EpisodeRecords(struct.PyTreeNode):
    """An episode buffer's side ring: one record per complete stored episode.

    Attributes:
      first_step: uint32 `[num_envs, K]`, the step number (the storage's `added`
        when it was added) of each recorded episode's first step.
      length: int32 `[num_envs, K]`, each recorded episode's length.
      position: int32 `[num_envs]`, the record slot written next.
      size: int32 `[num_envs]`, the complete episodes still stored, which are the
        newest `size` records.
      open_start: uint32 `[num_envs]`, the step number where the unfinished
        episode began.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_episode_buffer(1, 16, 2, max_length=4,
      ...     done_fn=lambda step: step["done"])
      >>> state = buffer.init({"t": jnp.int32(0), "done": jnp.bool_(False)})
      >>> state.experience["t"].shape, state.side.first_step.shape
      ((1, 16), (1, 16))
    """

    first_step: jax.Array
    length: jax.Array
    position: jax.Array
    size: jax.Array
    open_start: jax.Array

    # A prioritized episode buffer keeps one priority per episode record, not per step:
    # a dataset of its steps has no per-step priority column.
    priorities_by_step = False


class Settings(NamedTuple):
    """An episode buffer's checked arguments (its `config` holds them by name)."""

    num_envs: int
    steps_per_env: int
    sample_batch_size: int
    max_length: int
    min_episodes: int
    min_episode_length: int

    @property
    def records(self) -> int:
        """`K`, the episode records kept per environment."""
        return math.ceil(self.steps_per_env / self.min_episode_length)


def _config(num_envs, steps_per_env, sample_batch_size, max_length, min_episodes,
            min_episode_length) -> Settings:  # fmt: skip
    check = _validation.check_int
    steps = check("steps_per_env", steps_per_env, maximum=_storage.MAX_CAPACITY)
    min_episode_length = check("min_episode_length", min_episode_length, maximum=steps)
    config = Settings(
        num_envs=check("num_envs", num_envs),
        steps_per_env=steps,
        sample_batch_size=check("sample_batch_size", sample_batch_size),
        max_length=check("max_length", max_length, maximum=steps),
        min_episodes=check("min_episodes", min_episodes),
        min_episode_length=min_episode_length,
    )
    most = config.num_envs * config.records
    if config.min_episodes > most:
        raise ValueError(
            f"min_episodes={config.min_episodes} exceeds the most complete episodes the "
            f"buffer can hold, num_envs * ceil(steps_per_env / min_episode_length) = {most}."
        )
    return config


def _overwritten(state: TimeRingState, records: EpisodeRecords, written: int) -> jax.Array:
    """Per environment, how many of the newest `records.size` records start before
    the oldest stored step, which an add of `written` steps left.

    Records are in time order, so those are the oldest ones, and there are at
    most `written` of them: records are stored before the add, so only those
    whose first step was among the `written` overwritten steps go, and the open
    episode's record only if it began there too (after them) or before them (and
    then there were none). Checking those keeps the add O(written), not O(K).
    """
    k = records.first_step.shape[1]
    j = jnp.arange(min(k, written), dtype=jnp.int32)[None, :]
    slot = (records.position - records.size)[:, None] + j
    start = jnp.take_along_axis(records.first_step, slot % k, axis=1)
    gone = (j < records.size[:, None]) & (state.added - start > state.size.astype(jnp.uint32))
    return gone.sum(axis=1, dtype=jnp.int32)


def _record(before: TimeRingState, done: jax.Array, capacity: int) -> EpisodeRecords:
    """Appends a record per episode end in `done` `[N, T]` (the steps just added)."""
    records = before.side
    t = jnp.arange(done.shape[1], dtype=jnp.int32)
    numbers = before.added + jnp.broadcast_to(t.astype(jnp.uint32), done.shape)
    # The first step of each step's episode: the step after the previous end in
    # this chunk, else the open episode's first step (wrap-safe in uint32).
    last_end = jax.lax.cummax(jnp.where(done, t[None, :], -1), axis=1)  # [N, T], inclusive
    previous = jnp.pad(last_end, ((0, 0), (1, 0)), constant_values=-1)  # [N, T + 1]
    starts = jnp.where(
        previous >= 0, before.added + (previous + 1).astype(jnp.uint32), records.open_start[:, None]
    )
    lengths = jnp.minimum(numbers - starts[:, :-1] + 1, jnp.uint32(capacity + 1))
    (first_step, length), position, size, _ = _storage.push_where(
        (records.first_step, records.length), records.position, records.size, done,
        (starts[:, :-1], lengths.astype(jnp.int32)),
    )  # fmt: skip
    return EpisodeRecords(first_step, length, position, size, open_start=starts[:, -1])


def _changes(before: EpisodeRecords, after: EpisodeRecords, pushed, written: int) -> Changes:
    """Record slots `env * K + slot` that stopped being drawable (the oldest of the
    old and pushed records that are not kept; -1 pads) and started (the pushed
    records that are kept).

    An add of `T` steps removes at most `T` old records whose first step it
    overwrote, one new record that began before them, and `T` pushed out of the
    ring by new ones, so `2T + 1` candidates suffice.
    """
    num_envs, k = before.first_step.shape
    base = (jnp.arange(num_envs, dtype=jnp.int32) * k)[:, None]
    removed = (before.size + pushed - after.size)[:, None]
    j = jnp.arange(min(k, 2 * written + 1), dtype=jnp.int32)[None, :]
    oldest = (before.position - before.size)[:, None]
    cleared = jnp.where(j < removed, base + (oldest + j) % k, -1)
    new = jnp.minimum(pushed, k)[:, None]
    i = jnp.arange(min(k, written), dtype=jnp.int32)[None, :]
    keep = (i < new) & (new - i <= after.size[:, None])
    filled = base + (after.position[:, None] - new + i) % k
    return Changes(cleared=cleared.ravel(), filled=filled.ravel(), keep=keep.ravel())


def _oldest_record(records: EpisodeRecords, envs: jax.Array) -> jax.Array:
    """The slot (unwrapped) of the oldest record of each of `envs` `[B]`."""
    return _draws.take_small(records.position - records.size, envs)


def write_episodes(state: TimeRingState, steps: PyTree, where=None, *, config: Settings,
                   done_fn: Callable) -> tuple[TimeRingState, Changes]:  # fmt: skip
    """Writes steps `[num_envs, T, ...]` and records the episodes they end; the changed
    slots are the records pushed out and those added."""
    capacity = config.steps_per_env
    after, written = _time_ring.write_steps(
        state, steps, where, num_envs=config.num_envs, capacity=capacity
    )  # validates `steps`
    done = _time_ring.apply_done_fn(done_fn, steps)  # [N, T]
    done = done if where is None else done & where  # no records for steps not written
    records = _record(state, done, capacity)
    records = records.replace(size=records.size - _overwritten(after, records, written))
    pushed = done.sum(axis=1, dtype=jnp.int32)
    changes = _changes(state.side, records, pushed, written)
    return after.replace(side=records), changes


def init_episodes(example_step: PyTree, *, config: Settings,
                  goals: _goals.Hindsight | None) -> TimeRingState:  # fmt: skip
    """An empty ring of steps per environment and `records` episode records each."""
    if goals is not None:
        spec = _validation.item_spec(example_step, "example_step")
        _goals.check(goals, spec, "the example step", episode=True)
    num_envs, k = config.num_envs, config.records
    side = EpisodeRecords(
        first_step=jnp.zeros((num_envs, k), jnp.uint32),
        length=jnp.zeros((num_envs, k), jnp.int32),
        position=jnp.zeros(num_envs, jnp.int32),
        size=jnp.zeros(num_envs, jnp.int32),
        open_start=jnp.zeros(num_envs, jnp.uint32),
    )
    state = _time_ring.init_steps(example_step, num_envs=num_envs, capacity=config.steps_per_env)
    return state.replace(side=side)


def episode_times(state: TimeRingState, where: tuple, *, max_length: int) -> tuple:
    """Where the episodes of records `where = (envs, slots)` `[B]` are stored: `(envs
    [B, 1], times [B, max_length])` from each one's first step."""
    capacity = _storage.capacity_of(state.experience, 1)
    envs, slot = where
    age = (state.added - state.side.first_step[envs, slot]).astype(jnp.int32)
    times = _time_ring.window_times((state.position - age) % capacity, max_length, capacity)
    return envs[:, None], times


def read_episodes(state: TimeRingState, where: tuple, *,
                  max_length: int) -> tuple[PyTree, jax.Array, jax.Array]:  # fmt: skip
    """The episodes of records `where = (envs, slots)` (int32 `[B]` each), padded with
    zeros: `(experience, mask, length)`."""
    envs, times = episode_times(state, where, max_length=max_length)
    length = state.side.length[where]
    mask = jnp.arange(max_length, dtype=jnp.int32)[None, :] < length[:, None]

    def zero_padding(window: jax.Array) -> jax.Array:
        keep = mask.reshape(*mask.shape, *[1] * (window.ndim - 2))
        return jnp.where(keep, window, jnp.zeros((), window.dtype))

    experience = _storage.read(state.experience, envs, times)
    return jax.tree.map(zero_padding, experience), mask, length


def episode_count(state: TimeRingState) -> jax.Array:
    """int32 `[num_envs]`: the complete episodes recorded per environment."""
    return state.side.size


def record_of(state: TimeRingState, env: jax.Array, member: jax.Array, *,
              records: int) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`(env, slot)` of environment `env`'s `member`-th recorded episode (oldest first)."""
    return env, (_oldest_record(state.side, env) + member) % records


def holds_record(state: TimeRingState, slots: jax.Array, *, records: int) -> jax.Array:
    """Whether each slot holds a recorded episode."""
    envs, slot = _storage.split(slots, records)
    rank = (slot - _oldest_record(state.side, envs)) % records
    return rank < _draws.take_small(state.side.size, envs)


def holds_min_episodes(state: TimeRingState, slots=None, *, min_episodes: int) -> jax.Array:
    """bool scalar: at least `min_episodes` complete episodes are recorded."""
    return state.side.size.sum() >= min_episodes


def _layout(config: Settings, done_fn, goals) -> _contracts.Layout:
    bind = functools.partial
    k = config.records
    return _time_ring.ring_layout(
        num_envs=config.num_envs,
        size=k,
        init=bind(init_episodes, config=config, goals=goals),
        write=bind(write_episodes, config=config, done_fn=done_fn),
        counts=episode_count,
        slot=bind(record_of, records=k),
        usable=bind(holds_record, records=k),
        expand=bind(read_episodes, max_length=config.max_length),
        frame_reads=bind(
            _time_ring.step_frames,
            done_fn=done_fn,
            padded=True,
            read_times=bind(episode_times, max_length=config.max_length),
        ),
        ready=bind(holds_min_episodes, min_episodes=config.min_episodes),
    )


@_validation.steps_per_env_not_capacity
def make_episode_buffer(
    num_envs: int,
    steps_per_env: int,
    sample_batch_size: int,
    max_length: int,
    *,
    done_fn: Callable[[PyTree], jax.Array],
    min_episodes: int = 1,
    min_episode_length: int = 1,
    frames: Mapping[str, int] | None = None,
    goals: _goals.Hindsight | None = None,
    sampler: Sampler = uniform(),  # a frozen record: one shared default is safe
    storage_dtypes: Mapping[str, Any] | None = None,
    host_memory: Sequence[str] | None = None,
) -> Buffer:
    """Makes a buffer that samples whole episodes, padded to `max_length` with a mask.

    An episode is the steps of one environment up to and including a step where
    `done_fn` is true. Only complete episodes whose every step is still stored are
    sampled, uniformly (each episode equally likely, whatever its length); an
    unfinished episode waits for its end.

    Memory per environment: `steps_per_env` steps plus `K = ceil(steps_per_env /
    min_episode_length)` records of 8 bytes. With the default
    `min_episode_length=1` every stored episode is recorded; a larger value saves
    memory, and if episodes are shorter, the oldest records go first and fewer
    (never wrong) episodes are sampled.

    Args:
      num_envs: environments stepped together; each has its own time line.
      steps_per_env: steps stored per environment; the oldest are overwritten (jaxbuf
        0.3 called it `capacity`; `capacity=` is refused, saying so).
      sample_batch_size: episodes per `sample`.
      max_length: steps per sampled episode; shorter ones are padded with zeros,
        longer ones cut to their first `max_length` steps (`length` tells).
      done_fn: `done_fn(step) -> bool scalar` for one step (no batch axes): true at
        an episode's last step (terminated or truncated).
      min_episodes: complete episodes (over all environments) from which
        `can_sample` is true.
      min_episode_length: the shortest episode expected, sizing the records.
      frames: `{leaf name: k}`: each step's leaf comes stacked over its last `k`
        steps, `[B, max_length, k, ...]`, the episode's first frame standing in
        for steps before it (see `jaxbuf.options.frames`); storage keeps one frame per step.
      goals: `jaxbuf.hindsight(reward_fn, ...)`: each step of a sampled episode
        gets, with probability `ratio`, a goal achieved in the same episode as its
        desired goal, and its reward (and termination) recomputed; the paths name
        leaves of the step (see `jaxbuf.hindsight`). `goal_source` is
        `[B, max_length]`.
      storage_dtypes: `{"obs": "bfloat16"}`: float32 leaves kept in 2 bytes
        (`"bfloat16"` or `"float16"`), sampled as float32; lossy, opt-in. `done_fn`
        sees the stored values, as float32; not with `goals`.
      host_memory: `("obs",)`: leaves kept in the device's `pinned_host`
        memory (JAX 0.7+). Not with `goals`. Both options are described once,
        in `jaxbuf.options.wrappers`.

    Returns:
      A `Buffer` with `init(example_step)`, `add(state, steps)` with leaves
      `[num_envs, T, ...]`, `add_step(state, step)` with leaves `[num_envs, ...]`,
      `sample(state, key) -> Sample` and `can_sample(state)`.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_episode_buffer(1, 16, 2, max_length=4,
      ...     done_fn=lambda step: step["done"])
      >>> state = buffer.init({"t": jnp.int32(0), "done": jnp.bool_(False)})
      >>> steps = {"t": jnp.arange(5, dtype=jnp.int32)[None],
      ...          "done": jnp.array([[False, False, True, False, False]])}
      >>> batch = buffer.sample(buffer.add(state, steps), jax.random.key(0))
      >>> batch.experience["t"].tolist(), batch.mask[0].tolist(), batch.length.tolist()
      ([[0, 1, 2, 0], [0, 1, 2, 0]], [True, True, True, False], [3, 3])
    """
    config = _config(
        num_envs, steps_per_env, sample_batch_size, max_length, min_episodes, min_episode_length
    )
    if not callable(done_fn):
        raise TypeError(f"done_fn must be callable, got {type(done_fn).__name__}.")
    stacks = _frames.check_frames(frames, config.steps_per_env)
    options = (
        _frames.option(stacks),
        _goals.option(goals, _goals.episode_relabeling, max_length=config.max_length),
        *_options.storage(storage_dtypes=storage_dtypes, host_memory=host_memory),
    )
    _check_goals(goals, stacks)
    done_seen = _options.seen_as_stored(done_fn, storage_dtypes)
    return _pipeline.build(
        _layout(config, done_seen, goals), sampler, config.sample_batch_size, options,
        kind="episode", **config._asdict(), **_time_ring.done_config(done_fn),
        frames=stacks or None, goals=None if goals is None else goals.config,
    )  # fmt: skip


def _check_goals(goals: _goals.Hindsight | None, frames: dict) -> None:
    """What relabeling padded episodes asks of `goals` (checked already): no stacked
    leaf on its paths."""
    if goals is None:
        return
    paths = [goals.achieved, *goals.desired, goals.reward]
    stacked = sorted({p[0] for p in paths if p[0] in frames})
    if stacked:
        raise ValueError(f"frames stack {stacked}, which hindsight's paths use; stack other "
                         "leaves (a goal is not a frame).")  # fmt: skip
