"""Whole episodes of variable length, sampled padded to a maximum length with a mask.

Steps live in per-environment trajectory storage. At `add` time every episode
end (`done_fn(step)`) appends a record `(first step number, length)` of the
episode it closes to a per-environment ring, and records whose first step has
been overwritten are dropped. What remains in the ring are exactly the complete
episodes still stored, so `sample` draws uniformly among them in O(batch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf import _replay, _ring, _sampling, _trajectory, _validation

PyTree = Any


@struct.dataclass
class EpisodeBufferState:
    """State of an episode buffer.

    Attributes:
      storage: the trajectory storage of the steps, leaves `[num_envs, capacity, ...]`.
      episode_start: uint32 `[num_envs, K]`, the step number (`storage.added` when
        it was added) of each recorded episode's first step.
      episode_length: int32 `[num_envs, K]`, each recorded episode's length.
      next_slot: int32 `[num_envs]`, the record slot written next.
      filled: int32 `[num_envs]`, the complete episodes still stored, which are the
        newest `filled` records.
      open_start: uint32 `[num_envs]`, the step number where the unfinished episode
        began.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_episode_buffer(1, 16, 2, max_length=4,
      ...     done_fn=lambda step: step["done"])
      >>> state = buffer.init({"t": jnp.int32(0), "done": jnp.bool_(False)})
      >>> state.storage.experience["t"].shape
      (1, 16)
    """

    storage: _trajectory.TrajectoryBufferState
    episode_start: jax.Array
    episode_length: jax.Array
    next_slot: jax.Array
    filled: jax.Array
    open_start: jax.Array


@struct.dataclass
class EpisodeSample:
    """A batch of whole episodes, padded with zeros to `max_length` steps.

    Attributes:
      experience: leaves `[sample_batch_size, max_length, *step_shape]`; steps past
        an episode's end are zeros.
      mask: bool `[sample_batch_size, max_length]`, true on the episode's steps.
      length: int32 `[sample_batch_size]`, each episode's full length; where it
        exceeds `max_length`, `experience` holds its first `max_length` steps.
      env_indices: int32 `[sample_batch_size]`, the environment of each episode.
      time_indices: int32 `[sample_batch_size]`, the storage time index of its first step.
      valid: bool `[sample_batch_size]`, false while the buffer cannot sample.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_episode_buffer(1, 16, 2, max_length=4,
      ...     done_fn=lambda step: step["done"])
      >>> state = buffer.init({"t": jnp.int32(0), "done": jnp.bool_(False)})
      >>> steps = {"t": jnp.arange(3, dtype=jnp.int32)[None], "done": jnp.array([[False, False,
      ...     True]])}
      >>> batch = buffer.sample(buffer.add(state, steps), jax.random.key(0))
      >>> batch.experience["t"].shape, batch.mask.tolist(), batch.length.tolist()
      ((2, 4), [[True, True, True, False], [True, True, True, False]], [3, 3])
    """

    experience: PyTree
    mask: jax.Array
    length: jax.Array
    env_indices: jax.Array
    time_indices: jax.Array
    valid: jax.Array


class EpisodeBufferConfig(NamedTuple):
    """The validated configuration of an episode buffer.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> jaxbuf.make_episode_buffer(1, 16, 2, max_length=4,
      ...     done_fn=lambda step: step["done"]).config
      EpisodeBufferConfig(num_envs=1, capacity=16, sample_batch_size=2, max_length=4,
      min_episodes=1, min_episode_length=1, max_records=16)
    """

    num_envs: int
    capacity: int
    sample_batch_size: int
    max_length: int
    min_episodes: int
    min_episode_length: int
    max_records: int


class EpisodeBuffer(NamedTuple):
    """The pure functions of an episode buffer, and its configuration.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_episode_buffer(1, 16, 2, max_length=4,
      ...     done_fn=lambda step: step["done"])
      >>> buffer._fields
      ('init', 'add', 'add_step', 'sample', 'can_sample', 'config')
    """

    init: Any
    add: Any
    add_step: Any
    sample: Any
    can_sample: Any
    config: EpisodeBufferConfig


def _config(num_envs, capacity, sample_batch_size, max_length, min_episodes, min_episode_length):
    check = _validation.check_int
    capacity = check("capacity", capacity, maximum=_replay.MAX_CAPACITY)
    min_episode_length = check("min_episode_length", min_episode_length, maximum=capacity)
    config = EpisodeBufferConfig(
        num_envs=check("num_envs", num_envs),
        capacity=capacity,
        sample_batch_size=check("sample_batch_size", sample_batch_size),
        max_length=check("max_length", max_length, maximum=capacity),
        min_episodes=check("min_episodes", min_episodes),
        min_episode_length=min_episode_length,
        max_records=math.ceil(capacity / min_episode_length),
    )
    if config.min_episodes > config.num_envs * config.max_records:
        raise ValueError(
            f"min_episodes={config.min_episodes} exceeds the most complete episodes the "
            f"buffer can hold, num_envs * ceil(capacity / min_episode_length) = "
            f"{config.num_envs * config.max_records}."
        )
    return config


def _first_stored(state: EpisodeBufferState, filled: jax.Array) -> jax.Array:
    """Per environment, how many of the `filled` newest records start before the oldest
    stored step (a binary search: records are in time order, oldest first)."""
    storage, k = state.storage, state.episode_start.shape[1]
    lo, hi = jnp.zeros_like(filled), filled
    for _ in range(k.bit_length()):
        mid = (lo + hi) // 2
        slot = (state.next_slot - filled + mid) % k
        start = jnp.take_along_axis(state.episode_start, slot[:, None], axis=1)[:, 0]
        stored = (storage.added - start <= storage.size.astype(jnp.uint32)) | (lo == hi)
        lo, hi = jnp.where(stored, lo, mid + 1), jnp.where(stored, mid, hi)
    return lo


def make_episode_buffer(
    num_envs: int,
    capacity: int,
    sample_batch_size: int,
    max_length: int,
    *,
    done_fn: Callable[[PyTree], jax.Array],
    min_episodes: int = 1,
    min_episode_length: int = 1,
) -> EpisodeBuffer:
    """Makes a buffer that samples whole episodes, padded to `max_length` with a mask.

    An episode is the steps of one environment up to and including a step where
    `done_fn` is true. Only complete episodes whose every step is still stored are
    sampled, uniformly (each episode equally likely, whatever its length); an
    unfinished episode waits for its end.

    Memory per environment: `capacity` steps plus `K = ceil(capacity /
    min_episode_length)` records of 8 bytes. With the default
    `min_episode_length=1` every stored episode is recorded; a larger value saves
    memory, and if episodes are shorter, the oldest records go first and fewer
    (never wrong) episodes are sampled.

    Args:
      num_envs: environments stepped together; each has its own time line.
      capacity: steps stored PER ENVIRONMENT; the oldest are overwritten.
      sample_batch_size: episodes per `sample`.
      max_length: steps per sampled episode; shorter ones are padded with zeros,
        longer ones cut to their first `max_length` steps (`length` tells).
      done_fn: `done_fn(step) -> bool scalar` for one step (no batch axes): true at
        an episode's last step (terminated or truncated).
      min_episodes: complete episodes (over all environments) from which
        `can_sample` is true.
      min_episode_length: the shortest episode expected, sizing the records.

    Returns:
      An `EpisodeBuffer`: `init(example_step)`, `add(state, steps)` with leaves
      `[num_envs, T, ...]`, `add_step(state, step)` with leaves `[num_envs, ...]`,
      `sample(state, key) -> EpisodeSample` and `can_sample(state)`.

    Example:
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
        num_envs, capacity, sample_batch_size, max_length, min_episodes, min_episode_length
    )
    if not callable(done_fn):
        raise TypeError(f"done_fn must be callable, got {type(done_fn).__name__}.")
    steps_buffer = _trajectory.make_trajectory_buffer(
        config.num_envs, config.capacity, config.sample_batch_size, 1
    )
    records = (config.num_envs, config.max_records)

    def init(example_step: PyTree) -> EpisodeBufferState:
        return EpisodeBufferState(
            storage=steps_buffer.init(example_step),
            episode_start=jnp.zeros(records, jnp.uint32),
            episode_length=jnp.zeros(records, jnp.int32),
            next_slot=jnp.zeros(config.num_envs, jnp.int32),
            filled=jnp.zeros(config.num_envs, jnp.int32),
            open_start=jnp.zeros(config.num_envs, jnp.uint32),
        )

    def add(state: EpisodeBufferState, steps: PyTree) -> EpisodeBufferState:
        storage = steps_buffer.add(state.storage, steps)  # validates `steps`
        done = _trajectory.apply_done_fn(done_fn, steps)  # [N, T]
        t = jnp.arange(done.shape[1], dtype=jnp.int32)
        numbers = state.storage.added + jnp.broadcast_to(t.astype(jnp.uint32), done.shape)
        # The first step of each step's episode: the step after the previous end in
        # this chunk, else the open episode's first step (wrap-safe in uint32).
        last_end = jax.lax.cummax(jnp.where(done, t[None, :], -1), axis=1)  # [N, T], inclusive
        previous = jnp.pad(last_end, ((0, 0), (1, 0)), constant_values=-1)  # [N, T + 1]
        starts = jnp.where(
            previous >= 0,
            state.storage.added + (previous + 1).astype(jnp.uint32),
            state.open_start[:, None],
        )
        lengths = jnp.minimum(numbers - starts[:, :-1] + 1, jnp.uint32(config.capacity + 1))
        (episode_start, episode_length), next_slot, filled, _ = _ring.push_where(
            (state.episode_start, state.episode_length),
            state.next_slot,
            state.filled,
            done,
            (starts[:, :-1], lengths.astype(jnp.int32)),
        )
        state = state.replace(
            storage=storage,
            episode_start=episode_start,
            episode_length=episode_length,
            next_slot=next_slot,
            open_start=starts[:, -1],
        )
        return state.replace(filled=filled - _first_stored(state, filled))

    def add_step(state: EpisodeBufferState, step: PyTree) -> EpisodeBufferState:
        spec = _replay.storage_spec(state.storage.experience, 1)
        return add(state, _trajectory.one_step(spec, step, config.num_envs))

    def can_sample(state: EpisodeBufferState) -> jax.Array:
        return state.filled.sum() >= config.min_episodes

    def sample(state: EpisodeBufferState, key: jax.Array) -> EpisodeSample:
        storage, k = state.storage, config.max_records
        words = _sampling.random_words(key, config.sample_batch_size)
        envs, member = _sampling.uniform_in_groups(words, state.filled)
        slot = (state.next_slot[envs] - state.filled[envs] + member) % k
        age = (storage.added - state.episode_start[envs, slot]).astype(jnp.int32)
        starts = (storage.position - age) % config.capacity
        length = state.episode_length[envs, slot]
        steps = jnp.arange(config.max_length, dtype=jnp.int32)
        times = (starts[:, None] + steps[None, :]) % config.capacity
        mask = steps[None, :] < length[:, None]

        def gather(x: jax.Array) -> jax.Array:
            window = x.at[envs[:, None], times].get(mode="promise_in_bounds")
            keep = mask.reshape(*mask.shape, *[1] * (window.ndim - 2))
            return jnp.where(keep, window, jnp.zeros((), x.dtype))

        return EpisodeSample(
            experience=jax.tree.map(gather, storage.experience),
            mask=mask,
            length=length,
            env_indices=envs,
            time_indices=starts,
            valid=jnp.broadcast_to(can_sample(state), (config.sample_batch_size,)),
        )

    return EpisodeBuffer(init, add, add_step, sample, can_sample, config)
