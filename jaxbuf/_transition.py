"""n-step transitions sampled from per-environment trajectories, observations stored once.

Each environment's steps `(obs, action, reward, terminated, truncated)` live in
trajectory storage. The observation after step `t` is `obs[t + 1]`, except
when step `t` ended its episode: an environment that resets automatically
returns the reset observation there, so the final observation of every ended
episode goes to a small per-environment side ring of `K` slots. With episodes of
at least `min_episode_length` steps, `K = ceil(capacity / min_episode_length)`
slots hold the final observation of every episode end still in storage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuf import _replay, _ring, _sampling, _trajectory, _validation

PyTree = Any
STORED = ("obs", "action", "reward", "terminated", "truncated")


@struct.dataclass
class Transition:
    """One environment step, as `add` takes it (leaves `[num_envs, T, ...]`).

    Attributes:
      obs: the observation the action was chosen in (any pytree).
      action: the action taken (any pytree).
      reward: floating scalar per step, the reward received.
      terminated: bool per step: the episode reached a terminal state (no bootstrap).
      truncated: bool per step: the episode was cut short, e.g. by a time limit
        (bootstrap from `next_obs`).
      next_obs: the observation after the step. Where the episode ended, it must be
        the FINAL observation (before any automatic reset, e.g. gymnax's and
        Gymnasium's `info["final_observation"]`); elsewhere it equals the next
        step's `obs` and is not stored.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> step = jaxbuf.Transition(obs=jnp.zeros(2), action=jnp.int32(0), reward=jnp.float32(0),
      ...     terminated=jnp.bool_(False), truncated=jnp.bool_(False), next_obs=jnp.zeros(2))
      >>> jax.tree.map(jnp.shape, step)
      Transition(obs=(2,), action=(), reward=(), terminated=(), truncated=(), next_obs=(2,))
    """

    obs: PyTree
    action: PyTree
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: PyTree


@struct.dataclass
class TransitionBufferState:
    """State of a transition buffer.

    Attributes:
      storage: trajectory storage of the steps (a dict with the keys `obs`,
        `action`, `reward`, `terminated`, `truncated`), leaves `[num_envs, capacity, ...]`.
      final_obs: the side ring, leaves `[num_envs, K, *obs_shape]`: final
        observations of ended episodes.
      final_slot: `[num_envs, capacity]`, the side-ring slot of each step's final
        observation (meaningful where the step ended an episode).
      final_step: uint32 `[num_envs, K]`, the step number (`storage.added` when it
        was added) of the episode end whose final observation each slot holds.
      final_next: int32 `[num_envs]`, the slot written next.
      final_filled: int32 `[num_envs]`, the slots holding an observation.
      stale: int32 `[num_envs]`, how many of the oldest stored steps may not start a
        transition because the final observation they need has been overwritten
        (always 0 when no episode is shorter than `min_episode_length`).

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_transition_buffer(2, 50, 4, n_step=3)
      >>> example = jaxbuf.Transition(jnp.zeros(2), jnp.int32(0), jnp.float32(0), jnp.bool_(False),
      ...     jnp.bool_(False), jnp.zeros(2))
      >>> state = buffer.init(example)
      >>> jax.tree.map(jnp.shape, state.storage.experience)
      {'action': (2, 50), 'obs': (2, 50, 2), 'reward': (2, 50), 'terminated': (2, 50), 'truncated':
      (2, 50)}
    """

    storage: _trajectory.TrajectoryBufferState
    final_obs: PyTree
    final_slot: jax.Array
    final_step: jax.Array
    final_next: jax.Array
    final_filled: jax.Array
    stale: jax.Array


@struct.dataclass
class NStepSample:
    """A batch of n-step transitions `(obs, action, reward, discount, next_obs)`.

    The learning target of transition `i` is `reward[i] + discount[i] * V(next_obs[i])`.

    Attributes:
      obs: observation at the start, leaves `[sample_batch_size, ...]`.
      action: action taken there.
      reward: `sum_{j<k} discount**j * r_j` over the `k <= n_step` steps up to and
        including the first episode end, `[sample_batch_size]`.
      discount: `discount**k`, or 0 where the k-th step terminated.
      next_obs: the observation after the k-th step: the next stored observation,
        or the final observation of the episode that step ended.
      length: int32, the `k` of each transition.
      env_indices: int32, the environment of each transition.
      time_indices: int32, the storage time index of its first step.
      valid: bool, false while the buffer cannot sample.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_transition_buffer(1, 20, 2, n_step=2, discount=0.5)
      >>> steps = jaxbuf.Transition(obs=jnp.arange(4.0)[None, :, None], action=jnp.zeros((1, 4),
      ...     jnp.int32), reward=jnp.ones((1, 4)), terminated=jnp.zeros((1, 4), bool),
      ...     truncated=jnp.zeros((1, 4), bool), next_obs=jnp.arange(1.0, 5.0)[None, :, None])
      >>> state = buffer.add(buffer.init(jax.tree.map(lambda x: x[0, 0], steps)), steps)
      >>> batch = buffer.sample(state, jax.random.key(0))
      >>> (batch.obs[:, 0].tolist(), batch.reward.tolist(), batch.discount.tolist(),
      ...  batch.next_obs[:, 0].tolist())
      ([0.0, 0.0], [1.5, 1.5], [0.25, 0.25], [2.0, 2.0])
    """

    obs: PyTree
    action: PyTree
    reward: jax.Array
    discount: jax.Array
    next_obs: PyTree
    length: jax.Array
    env_indices: jax.Array
    time_indices: jax.Array
    valid: jax.Array


class TransitionBufferConfig(NamedTuple):
    """The validated configuration of a transition buffer.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> jaxbuf.make_transition_buffer(2, 50, 4, n_step=3).config
      TransitionBufferConfig(num_envs=2, capacity=50, sample_batch_size=4, n_step=3, discount=0.99,
      min_episode_length=1, final_capacity=50, min_size=4)
    """

    num_envs: int
    capacity: int
    sample_batch_size: int
    n_step: int
    discount: float
    min_episode_length: int
    final_capacity: int
    min_size: int


class TransitionBuffer(NamedTuple):
    """The pure functions of a transition buffer, and its configuration.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_transition_buffer(num_envs=2, capacity=50, sample_batch_size=4,
      ...     n_step=3)
      >>> buffer._fields
      ('init', 'add', 'add_step', 'sample', 'can_sample', 'config')
    """

    init: Any
    add: Any
    add_step: Any
    sample: Any
    can_sample: Any
    config: TransitionBufferConfig


def _config(num_envs, capacity, sample_batch_size, n_step, discount, min_episode_length, min_size):
    check = _validation.check_int
    capacity = check("capacity", capacity, minimum=2)
    n_step = check("n_step", n_step, maximum=capacity - 1)
    if isinstance(discount, bool) or not isinstance(discount, (int, float, np.floating)):
        raise TypeError(f"discount must be a float, got {discount!r}.")
    if not 0.0 <= float(discount) <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount}.")
    min_episode_length = check("min_episode_length", min_episode_length, maximum=capacity)
    return TransitionBufferConfig(
        num_envs=check("num_envs", num_envs),
        capacity=capacity,
        sample_batch_size=check("sample_batch_size", sample_batch_size),
        n_step=n_step,
        discount=float(discount),
        min_episode_length=min_episode_length,
        final_capacity=math.ceil(capacity / min_episode_length),
        min_size=check(
            "min_size", n_step + 1 if min_size is None else min_size, minimum=n_step + 1,
            maximum=capacity,
        ),
    )  # fmt: skip


def _as_transition(steps: Any, what: str) -> Transition:
    if isinstance(steps, Transition):
        return steps
    if isinstance(steps, Mapping) and set(steps) == {*STORED, "next_obs"}:
        return Transition(**steps)
    raise TypeError(
        f"{what} must be a jaxbuf.Transition (or a dict with exactly the keys "
        f"{', '.join((*STORED, 'next_obs'))}), got {type(steps).__name__}."
    )


def _check_example(example: Transition) -> None:
    spec = _validation.item_spec(example, "example")
    if not jnp.issubdtype(spec.reward.dtype, jnp.floating) or spec.reward.shape:
        raise TypeError(f"example.reward must be a floating scalar, got {spec.reward}.")
    for name in ("terminated", "truncated"):
        leaf = getattr(spec, name)
        if leaf.dtype != jnp.bool_ or leaf.shape:
            raise TypeError(f"example.{name} must be a bool scalar, got {leaf}.")
    if jax.tree.structure(spec.obs) != jax.tree.structure(spec.next_obs) or any(
        (a.shape, a.dtype) != (b.shape, b.dtype)
        for a, b in zip(jax.tree.leaves(spec.obs), jax.tree.leaves(spec.next_obs), strict=True)
    ):
        raise ValueError("example.next_obs must have the structure, shapes and dtypes of obs.")


def _slot_dtype(final_capacity: int) -> np.dtype:
    for dtype in (np.uint8, np.uint16):
        if final_capacity <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.int32)


def _write_final(state: TransitionBufferState, steps: Transition, k: int):
    """Puts the final observations of the episodes that `steps` end into the side ring.

    Returns the new state (but for `storage` and `stale`) and, per environment,
    whether this add pushed an episode end out of the ring and the step number of
    the newest end it pushed out (meaningless where none was).
    """
    done = steps.terminated | steps.truncated  # [N, T]
    numbers = state.storage.added + jnp.arange(done.shape[1], dtype=jnp.uint32)
    numbers = jnp.broadcast_to(numbers, done.shape)
    if k >= _storage_capacity(state):
        # A ring of `capacity` ends holds the end of every stored step, so an end
        # pushed out never belongs to a stored step: nothing can turn stale, and
        # the ring's step numbers need not be read (a read of the ring beside its
        # write made XLA copy the ring on every add).
        state = _push_final(state, steps, done, numbers)
        none = jnp.zeros(done.shape[:1], bool)
        return state, none, jnp.zeros(done.shape[:1], jnp.uint32)
    # The ends pushed out are the oldest of [ring in order, this chunk's ends].
    ends = done.sum(axis=1, dtype=jnp.int32)
    pushed = state.final_filled + ends - k
    newest = pushed - 1
    old_slot = (state.final_next - state.final_filled + newest) % k
    old_number = jnp.take_along_axis(state.final_step, old_slot[:, None], axis=1)[:, 0]
    rank = jnp.cumsum(done, axis=1, dtype=jnp.int32) - 1
    new_index = jnp.argmax(done & (rank == (newest - state.final_filled)[:, None]), axis=1)
    new_number = jnp.take_along_axis(numbers, new_index[:, None], axis=1)[:, 0]
    number = jnp.where(newest < state.final_filled, old_number, new_number)
    state = _push_final(state, steps, done, numbers)
    return state, pushed > 0, number


def _storage_capacity(state: TransitionBufferState) -> int:
    return jax.tree_util.tree_leaves(state.storage.experience)[0].shape[1]


def _push_final(state: TransitionBufferState, steps: Transition, done, numbers):
    """Appends the final observations (and step numbers) of the ends in `done`."""
    (final_obs, final_step), final_next, final_filled, slots = _ring.push_where(
        (state.final_obs, state.final_step),
        state.final_next,
        state.final_filled,
        done,
        (steps.next_obs, numbers),
    )
    write = jax.vmap(_ring.write, in_axes=(0, None, 0))
    state = state.replace(
        final_obs=final_obs,
        final_slot=write(
            state.final_slot, state.storage.position, slots.astype(state.final_slot.dtype)
        ),
        final_step=final_step,
        final_next=final_next,
        final_filled=final_filled,
    )
    return state


def _stale(before, after, stale, evicted, number) -> jax.Array:
    """Oldest stored steps that may not start a transition, after an add.

    Args:
      before, after: the trajectory storage before and after the add.
      stale: the count before the add.
      evicted, number: whether an episode end lost its final observation in this
        add, and the step number of the newest such end.
    """
    length = (after.added - before.added).astype(jnp.int32)
    shifted = jnp.maximum(stale - (before.size + length - after.size), 0)
    age = jnp.minimum(after.added - number, (after.size + 1).astype(jnp.uint32))
    offset = after.size - age.astype(jnp.int32)  # chronological offset of that end
    return jnp.where(evicted, jnp.maximum(shifted, offset + 1), shifted)


def n_step_at(
    state: TransitionBufferState, envs: jax.Array, starts: jax.Array, n: int, discount: float
) -> NStepSample:
    """The n-step transitions from each (env, start) `[B]`; `valid` is all true."""
    steps = state.storage.experience
    capacity = state.final_slot.shape[1]
    times = (starts[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :]) % capacity
    window = envs[:, None], times

    def at(tree, env, time):
        return jax.tree.map(lambda x: x.at[env, time].get(mode="promise_in_bounds"), tree)

    reward, terminated, truncated = (
        steps[name].at[window].get(mode="promise_in_bounds")
        for name in ("reward", "terminated", "truncated")
    )
    done = terminated | truncated
    used = _trajectory.episode_mask(done)
    length = used.sum(axis=1, dtype=jnp.int32)
    last = (length - 1)[:, None]
    powers = jnp.asarray(np.power(discount, np.arange(n + 1)), reward.dtype)
    ended = jnp.take_along_axis(done, last, axis=1)[:, 0]
    slot = state.final_slot.at[envs, jnp.take_along_axis(times, last, axis=1)[:, 0]].get(
        mode="promise_in_bounds"
    )
    final = at(state.final_obs, envs, slot.astype(jnp.int32))
    following = at(steps["obs"], envs, (starts + n) % capacity)
    return NStepSample(
        obs=at(steps["obs"], envs, starts),
        action=at(steps["action"], envs, starts),
        reward=jnp.sum(jnp.where(used, reward * powers[None, :n], 0), axis=1),
        discount=jnp.where(
            jnp.take_along_axis(terminated, last, axis=1)[:, 0], 0, powers[length]
        ).astype(reward.dtype),
        next_obs=jax.tree.map(
            lambda f, o: jnp.where(ended.reshape(-1, *[1] * (f.ndim - 1)), f, o), final, following
        ),
        length=length,
        env_indices=envs,
        time_indices=starts,
        valid=jnp.ones(envs.shape, bool),
    )


def make_transition_buffer(
    num_envs: int,
    capacity: int,
    sample_batch_size: int,
    *,
    n_step: int = 1,
    discount: float = 0.99,
    min_episode_length: int = 1,
    min_size: int | None = None,
) -> TransitionBuffer:
    """Makes a buffer of n-step transitions that stores each observation once.

    Memory per environment: `capacity` steps (observation, action, reward, two
    flags and a 1-4 byte side-ring slot) plus `K = ceil(capacity /
    min_episode_length)` final observations, i.e. about `1 + 1 / min_episode_length`
    observations per stored step, where a buffer of full transitions keeps 2.
    With the default `min_episode_length=1` nothing is ever lost; set it to a
    length no episode goes below to save the memory. If episodes are shorter, the
    oldest final observations are overwritten first and the steps that would need
    them are no longer sampled (`state.stale` counts them): the buffer holds
    fewer usable steps, never wrong ones.

    Args:
      num_envs: environments stepped together.
      capacity: steps stored PER ENVIRONMENT; the oldest are overwritten.
      sample_batch_size: transitions per `sample`.
      n_step: rewards summed per transition (fewer where an episode ends first).
      discount: the per-step discount gamma, in [0, 1].
      min_episode_length: the shortest episode expected, sizing the side ring.
      min_size: steps per environment from which `can_sample` is true; at least
        (and by default) `n_step + 1`.

    Returns:
      A `TransitionBuffer`: `init(example)` with one `Transition` (or a dict with
      its field names) without batch axes; `add(state, steps)` with leaves
      `[num_envs, T, ...]`; `add_step(state, step)` with leaves `[num_envs, ...]`;
      `sample(state, key) -> NStepSample`; `can_sample(state)`. A transition starts
      at a stored step whose `n_step` following steps are stored too (it never
      reads across the write position); the n-step sum stops at the first
      termination (discount 0) or truncation (bootstrap from the final observation).

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_transition_buffer(2, 16, 4, n_step=3, discount=0.5)
      >>> step = jaxbuf.Transition(obs=jnp.zeros(3), action=jnp.int32(0),
      ...     reward=jnp.float32(1), terminated=jnp.bool_(False),
      ...     truncated=jnp.bool_(False), next_obs=jnp.zeros(3))
      >>> state = buffer.init(step)
      >>> steps = jax.tree.map(lambda x: jnp.broadcast_to(x, (2, 5, *x.shape)), step)
      >>> batch = buffer.sample(buffer.add(state, steps), jax.random.key(0))
      >>> batch.reward.tolist(), batch.discount.tolist()
      ([1.75, 1.75, 1.75, 1.75], [0.125, 0.125, 0.125, 0.125])
    """
    config = _config(
        num_envs, capacity, sample_batch_size, n_step, discount, min_episode_length, min_size
    )
    steps_buffer = _trajectory.make_trajectory_buffer(
        config.num_envs, config.capacity, config.sample_batch_size, config.n_step + 1
    )
    k, n = config.final_capacity, config.n_step

    def init(example: Transition | Mapping) -> TransitionBufferState:
        example = _as_transition(example, "example")
        _check_example(example)
        spec = _validation.item_spec(example, "example")
        per_env = (config.num_envs, k)
        return TransitionBufferState(
            storage=steps_buffer.init({name: getattr(spec, name) for name in STORED}),
            final_obs=jax.tree.map(lambda s: jnp.zeros((*per_env, *s.shape), s.dtype), spec.obs),
            final_slot=jnp.zeros((config.num_envs, config.capacity), _slot_dtype(k)),
            final_step=jnp.zeros(per_env, jnp.uint32),
            final_next=jnp.zeros(config.num_envs, jnp.int32),
            final_filled=jnp.zeros(config.num_envs, jnp.int32),
            stale=jnp.zeros(config.num_envs, jnp.int32),
        )

    def spec(state: TransitionBufferState) -> Transition:
        stored = _replay.storage_spec(state.storage.experience, 1)
        return Transition(**stored, next_obs=stored["obs"])

    def add(state: TransitionBufferState, steps: Transition | Mapping) -> TransitionBufferState:
        steps = _as_transition(steps, "steps")
        _trajectory.check_steps(spec(state), steps, config.num_envs, config.capacity)
        before = state.storage
        state, evicted, number = _write_final(state, steps, k)
        after = steps_buffer.add(before, {name: getattr(steps, name) for name in STORED})
        return state.replace(
            storage=after, stale=_stale(before, after, state.stale, evicted, number)
        )

    def add_step(state: TransitionBufferState, step: Transition | Mapping) -> TransitionBufferState:
        step = _as_transition(step, "step")
        return add(state, _trajectory.one_step(spec(state), step, config.num_envs))

    def counts(state: TransitionBufferState) -> jax.Array:
        """Allowed starts per environment: chronological offsets `[stale, size - n)`."""
        return jnp.maximum(state.storage.size - n - state.stale, 0)

    def can_sample(state: TransitionBufferState) -> jax.Array:
        return (counts(state).sum() > 0) & (state.storage.size >= config.min_size)

    def sample(state: TransitionBufferState, key: jax.Array) -> NStepSample:
        storage, batch = state.storage, config.sample_batch_size
        envs, member = _sampling.uniform_in_groups(
            _sampling.random_words(key, batch), counts(state)
        )
        oldest = storage.position - storage.size
        starts = (oldest + state.stale[envs] + member) % config.capacity
        return n_step_at(state, envs, starts, n, config.discount).replace(
            valid=jnp.broadcast_to(can_sample(state), (batch,))
        )

    return TransitionBuffer(init, add, add_step, sample, can_sample, config)
