"""n-step transitions sampled from per-environment trajectories, observations stored once.

Each environment's steps `(obs, action, reward, terminated, truncated)` live in
trajectory storage. The observation after step `t` is `obs[t + 1]`, except
when step `t` ended its episode: an environment that resets automatically
returns the reset observation there, so the final observation of every ended
episode goes to a small per-environment side ring of `K` slots. With episodes of
at least `min_episode_length` steps, `K = ceil(steps_per_env / min_episode_length)`
slots hold the final observation of every episode end still in storage.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuf.core import assembly as _assembly
from jaxbuf.core import contracts as _contracts
from jaxbuf.core import draws as _draws
from jaxbuf.core import lowering as _lowering
from jaxbuf.core import pipeline as _pipeline
from jaxbuf.core import storage as _storage
from jaxbuf.core import time_ring as _time_ring
from jaxbuf.core import validation as _validation
from jaxbuf.core.contracts import Sampler, StackRead
from jaxbuf.core.records import Buffer, PyTree, Transition
from jaxbuf.core.samplers import uniform
from jaxbuf.core.storage import TimeRingState
from jaxbuf.options import frames as _frames
from jaxbuf.options import goals as _goals
from jaxbuf.options import wrappers as _options

STORED = ("obs", "action", "reward", "terminated", "truncated")
# The side ring's default size with the uniform sampler: one final observation per this
# many stored steps (about 1.1 observations per stored step); episodes this long or longer
# lose nothing. The samplers that keep a record per slot (prioritized, epochs) would still
# draw the steps a lost final observation leaves unsampleable: they keep every one (1).
MIN_EPISODE_LENGTH = 10


class FinalObservations(struct.PyTreeNode):
    """A transition buffer's side ring: the final observations of ended episodes.

    Attributes:
      experience: leaves `[num_envs, K, *obs_shape]`, final observations.
      position: int32 `[num_envs]`, the slot written next.
      size: int32 `[num_envs]`, the slots holding an observation.
      added_at: uint32 `[num_envs, K]`, the step number (the storage's `added`
        when it was added) of the episode end whose observation each slot holds.
      slot_of: `[num_envs, steps_per_env]`, the slot of each stored step's final
        observation (meaningful where the step ended an episode).
      stale: int32 `[num_envs]`, how many of the oldest stored steps may not
        start a transition because the final observation they need has been
        overwritten (always 0 when no episode is shorter than `min_episode_length`).

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_transition_buffer(2, 50, 4, n_step=3)  # min_episode_length=10
      >>> example = jaxbuf.Transition(jnp.zeros(2), jnp.int32(0), jnp.float32(0), jnp.bool_(False),
      ...     jnp.bool_(False), jnp.zeros(2))
      >>> state = buffer.init(example)
      >>> state.side.experience.shape, sorted(state.experience)
      ((2, 5, 2), ['action', 'obs', 'reward', 'terminated', 'truncated'])
    """

    experience: PyTree
    position: jax.Array
    size: jax.Array
    added_at: jax.Array
    slot_of: jax.Array
    stale: jax.Array

    def dataset_columns(self, envs: jax.Array, times: jax.Array) -> dict[str, PyTree]:
        """What a dataset writes beside the stored steps at `(envs, times)`: the final
        observation each step's episode end keeps (`final_obs`, meaningful at ends)."""
        slots = self.slot_of[envs, times].astype(jnp.int32)
        return {"final_obs": _storage.read(self.experience, envs, slots)}


class Settings(NamedTuple):
    """A transition buffer's checked arguments (its `config` holds them by name)."""

    num_envs: int
    steps_per_env: int
    sample_batch_size: int
    n_step: int
    discount: float
    min_episode_length: int
    min_size: int


def _config(num_envs, steps_per_env, sample_batch_size, n_step, discount, min_episode_length,
            min_size) -> Settings:  # fmt: skip
    check = _validation.check_int
    capacity = check("steps_per_env", steps_per_env, minimum=2)
    n_step = check("n_step", n_step, maximum=capacity - 1)
    if min_episode_length is None:
        min_episode_length = min(MIN_EPISODE_LENGTH, capacity)
    min_episode_length = check("min_episode_length", min_episode_length, maximum=capacity)
    return Settings(
        num_envs=check("num_envs", num_envs),
        steps_per_env=capacity,
        sample_batch_size=check("sample_batch_size", sample_batch_size),
        n_step=n_step,
        discount=_validation.check_fraction("discount", discount),
        min_episode_length=min_episode_length,
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


def _write_final(side: FinalObservations, position, added, steps: Transition, capacity: int,
                 where: _storage.Gate = None):  # fmt: skip
    """Puts the final observations of the episodes that `steps` end into the side ring
    (none with `where` false).

    Returns the new side ring (but for `stale`) and, per environment, whether this
    add pushed an episode end out of the ring and the step number of the newest
    end it pushed out (meaningless where none was).
    """
    k = side.added_at.shape[1]
    done = steps.terminated | steps.truncated  # [N, T]
    done = done if where is None else done & where
    numbers = jnp.broadcast_to(added + jnp.arange(done.shape[1], dtype=jnp.uint32), done.shape)
    pushed_side = _push_final(side, position, steps, done, numbers, where)
    if k >= capacity:
        # A ring of `capacity` ends holds the end of every stored step, so an end
        # pushed out never belongs to a stored step: nothing can turn stale, and
        # the ring's step numbers need not be read (a read of the ring beside its
        # write made XLA copy the ring on every add).
        none = jnp.zeros(done.shape[:1], bool)
        return pushed_side, none, jnp.zeros(done.shape[:1], jnp.uint32)
    # The ends pushed out are the oldest of [ring in order, this chunk's ends].
    pushed = side.size + done.sum(axis=1, dtype=jnp.int32) - k
    newest = pushed - 1
    old_slot = (side.position - side.size + newest) % k
    old_number = jnp.take_along_axis(side.added_at, old_slot[:, None], axis=1)[:, 0]
    rank = _draws.running_sum(done, axis=1) - 1
    new_index = jnp.argmax(done & (rank == (newest - side.size)[:, None]), axis=1)
    new_number = added + new_index.astype(jnp.uint32)  # numbers[env, new_index], no read
    number = jnp.where(newest < side.size, old_number, new_number)
    return pushed_side, pushed > 0, number


def _push_final(side: FinalObservations, position, steps: Transition, done, numbers, where):
    """Appends the final observations (and step numbers) of the ends in `done`."""
    (experience, added_at), next_slot, size, slots = _storage.push_where(
        (side.experience, side.added_at), side.position, side.size, done,
        (steps.next_obs, numbers),
    )  # fmt: skip
    slot_of = _storage.write_times(side.slot_of, position, slots.astype(side.slot_of.dtype), where)
    return side.replace(
        experience=experience, position=next_slot, size=size, added_at=added_at, slot_of=slot_of
    )


def _stale(before, after, stale, evicted, number) -> jax.Array:
    """Oldest stored steps that may not start a transition, after an add.

    Args:
      before, after: the states before and after the add.
      stale: the count before the add.
      evicted, number: whether an episode end lost its final observation in this
        add, and the step number of the newest such end.
    """
    length = (after.added - before.added).astype(jnp.int32)
    shifted = jnp.maximum(stale - (before.size + length - after.size), 0)
    age = jnp.minimum(after.added - number, (after.size + 1).astype(jnp.uint32))
    offset = after.size - age.astype(jnp.int32)  # chronological offset of that end
    return jnp.where(evicted, jnp.maximum(shifted, offset + 1), shifted)


def n_step_at(state: TimeRingState, envs, starts, n: int, discount: float):
    """The n-step transitions starting at time `starts` of environments `envs` (int32
    `[B]` each): `(Transition, length)`."""
    steps, side = state.experience, state.side
    capacity = side.slot_of.shape[1]
    times = _time_ring.window_times(starts, n, capacity)
    reward, terminated, truncated = (
        jnp.asarray(_storage.read(steps[name], envs[:, None], times))
        for name in ("reward", "terminated", "truncated")
    )
    used = _time_ring.episode_mask(terminated | truncated)
    length = used.sum(axis=1, dtype=jnp.int32)
    last = length - 1
    end_terminated, end_truncated, last_time = (
        _draws.take_columns(x, last) for x in (terminated, truncated, times)
    )
    powers = jnp.asarray(np.power(discount, np.arange(n + 1)), reward.dtype)
    ended = end_terminated | end_truncated
    slot = _storage.read(side.slot_of, envs, last_time).astype(jnp.int32)
    # Rows that did not end read one fixed final observation (discarded below), which
    # stays in cache: for large observations the read costs only the rows that ended.
    final = _storage.read(side.experience, jnp.where(ended, envs, 0), jnp.where(ended, slot, 0))
    following = (starts + n) % capacity
    obs, following_obs = _lowering.apart_or_together(
        steps["obs"], envs, starts, following, apart=_two_reads, together=_one_read
    )
    next_obs = _where_rows(ended, final, following_obs)
    transition = Transition(
        obs=obs,
        action=_storage.read(steps["action"], envs, starts),
        reward=jnp.sum(jnp.where(used, reward * powers[None, :n], 0), axis=1),
        terminated=end_terminated,
        truncated=end_truncated,
        next_obs=next_obs,
        discount=jnp.where(end_terminated, 0, _draws.take_small(powers, length)).astype(
            reward.dtype
        ),
    )
    return transition, length


def _two_reads(obs: PyTree, envs, starts, following) -> tuple[PyTree, PyTree]:
    """The observations at `starts` and at `following` (int32 `[B]` each), read apart:
    on CPU XLA narrows each read to the columns its consumers use."""
    return _storage.read(obs, envs, starts), _storage.read(obs, envs, following)


def _one_read(obs: PyTree, envs, starts, following) -> tuple[PyTree, PyTree]:
    """`_two_reads` as one read of `[B, 2]` rows: one gather kernel on accelerators."""
    pair = _storage.read(obs, envs[:, None], jnp.stack([starts, following], axis=1))
    return jax.tree.map(lambda x: x[:, 0], pair), jax.tree.map(lambda x: x[:, 1], pair)


def _where_rows(rows: jax.Array, yes: PyTree, no: PyTree) -> PyTree:
    """Leaf by leaf, `yes` where the bool `[B]` `rows` is true, else `no`."""
    return jax.tree.map(lambda a, b: jnp.where(rows.reshape(-1, *[1] * (a.ndim - 1)), a, b),
                        yes, no)  # fmt: skip


def stacked_obs(state: TimeRingState, where: tuple[jax.Array, jax.Array], drawn: tuple,
                stacks: dict[str, int], *, config: Settings) -> dict[str, StackRead]:  # fmt: skip
    """Where the frame stacks `[B, k, ...]` of `obs` and `next_obs` of the transitions
    drawn at `where = (envs, starts)` lie: `obs`, the `k` frames back from its step;
    `next_obs`, the `k - 1` frames back from the transition's last step, then the next
    observation `drawn` holds (the final one where the transition ended there). With
    `n_step=1`, the first of those are the `obs` stack's newest: `k + 1` frames read per
    transition instead of `2k`."""
    (envs, starts), (transition, _, length), k = where, drawn, stacks["obs"]
    steps = state.experience

    def done_at(e: jax.Array, t: jax.Array) -> jax.Array:
        return _time_ring.gather(steps["terminated"], e, t) | _time_ring.gather(
            steps["truncated"], e, t)  # fmt: skip

    def frames_at(times: jax.Array, count: int) -> jax.Array:
        return _time_ring.frame_times(state, envs, times, count, done_at)

    obs = StackRead(leaf="obs", envs=envs[:, None], times=frames_at(starts, k))
    if config.n_step == 1:
        return {"obs": obs, "next_obs": obs._replace(times=None, older="obs",
                                                      newest=transition.next_obs)}  # fmt: skip
    before = frames_at((starts + length - 1) % config.steps_per_env, k - 1)
    return {"obs": obs, "next_obs": obs._replace(times=before, newest=transition.next_obs)}


def init_transitions(example: Transition | Mapping, *, config: Settings,
                     goals: _goals.Hindsight | None) -> TimeRingState:  # fmt: skip
    """An empty ring of steps per environment and its side ring of
    `ceil(steps_per_env / min_episode_length)` final observations, from one `Transition`
    (or a dict with its field names) without batch axes."""
    example = _as_transition(example, "example")
    _check_example(example)
    spec = _validation.item_spec(example, "example")
    if goals is not None:
        _goals.check(goals, spec.obs, "example.obs", episode=False)
    num_envs, capacity = config.num_envs, config.steps_per_env
    k = math.ceil(capacity / config.min_episode_length)
    side = FinalObservations(
        experience=_storage.allocate(spec.obs, num_envs, k),
        position=jnp.zeros(num_envs, jnp.int32),
        size=jnp.zeros(num_envs, jnp.int32),
        added_at=jnp.zeros((num_envs, k), jnp.uint32),
        slot_of=jnp.zeros((num_envs, capacity), _slot_dtype(k)),
        stale=jnp.zeros(num_envs, jnp.int32),
    )
    stored = {name: getattr(spec, name) for name in STORED}
    state = _time_ring.init_steps(stored, num_envs=num_envs, capacity=capacity)
    return state.replace(side=side)


def _spec(state: TimeRingState) -> Transition:
    stored = _storage.item_spec(state.experience, 1)
    return Transition(**stored, next_obs=stored["obs"])


def write_transitions(state: TimeRingState, steps: Transition | Mapping, where=None, *,
                      config: Settings):  # fmt: skip
    """Writes steps `[num_envs, T, ...]`: each step's observation into the ring, the final
    observation of each episode they end into the side ring; returns the state and the
    starts the write completed (`n_step + 1` stored steps)."""
    capacity = config.steps_per_env
    steps = _as_transition(steps, "steps")
    _storage.check_steps(_spec(state), steps, config.num_envs, capacity)
    side, evicted, number = _write_final(
        state.side, state.position, state.added, steps, capacity, where
    )
    stored = {name: getattr(steps, name) for name in STORED}
    after = _storage.append_steps(state, stored, where)
    side = side.replace(stale=_stale(state, after, side.stale, evicted, number))
    length = jax.tree_util.tree_leaves(stored)[0].shape[1]
    return after.replace(side=side), _time_ring.span_changes(
        state, after, length, config.n_step + 1
    )


def one_transition_step(state: TimeRingState, step: Transition | Mapping, *,
                        num_envs: int) -> Transition:  # fmt: skip
    """One step per environment `[num_envs, ...]` as steps `[num_envs, 1, ...]`, checked."""
    return _storage.one_step(_spec(state), _as_transition(step, "step"), num_envs)


def start_count(state: TimeRingState, *, config: Settings) -> jax.Array:
    """Allowed starts per environment: chronological offsets `[stale, size - n)`."""
    return jnp.maximum(state.size - config.n_step - state.side.stale, 0)


def start_of(state: TimeRingState, env: jax.Array, member: jax.Array, *,
             config: Settings) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`(env, time)` of environment `env`'s `member`-th allowed start (oldest first)."""
    oldest = state.position - state.size
    time = (oldest + _draws.take_small(state.side.stale, env) + member) % config.steps_per_env
    return env, time


def starts_transition(state: TimeRingState, slots: jax.Array, *, config: Settings) -> jax.Array:
    """Whether each slot starts `n_step + 1` stored steps not made stale."""
    capacity = config.steps_per_env
    envs, times = _storage.split(slots, capacity)
    offset = (times - (state.position - state.size)) % capacity
    stale = _draws.take_small(state.side.stale, envs)
    return _time_ring.valid_start(state, times, config.n_step + 1) & (offset >= stale)


def read_transitions(
    state: TimeRingState, where: tuple[jax.Array, jax.Array], *, config: Settings
) -> tuple[Transition, None, jax.Array]:
    """The n-step transitions starting at `where = (envs, starts)` `[B]`, and the steps
    each sums (`n_step_at`)."""
    envs, starts = where
    transition, length = n_step_at(state, envs, starts, config.n_step, config.discount)
    return transition, None, length


def _layout(config: Settings, goals: _goals.Hindsight | None) -> _contracts.Layout:
    bind = functools.partial
    return _time_ring.ring_layout(
        num_envs=config.num_envs,
        size=config.steps_per_env,
        init=bind(init_transitions, config=config, goals=goals),
        write=bind(write_transitions, config=config),
        counts=bind(start_count, config=config),
        slot=bind(start_of, config=config),
        usable=bind(starts_transition, config=config),
        expand=bind(read_transitions, config=config),
        ready=bind(_assembly.holds_min_size, min_size=config.min_size),
        one_step=bind(one_transition_step, num_envs=config.num_envs),
        side_of="obs",  # the final observations follow obs (and next_obs)
        frame_reads=bind(stacked_obs, config=config),
    )


@_validation.steps_per_env_not_capacity
def make_transition_buffer(
    num_envs: int,
    steps_per_env: int,
    sample_batch_size: int,
    *,
    n_step: int = 1,
    discount: float = 0.99,
    min_episode_length: int | None = None,
    min_size: int | None = None,
    frames: Mapping[str, int] | None = None,
    goals: _goals.Hindsight | None = None,
    sampler: Sampler = uniform(),  # a frozen record: one shared default is safe
    storage_dtypes: Mapping[str, Any] | None = None,
    host_memory: Sequence[str] | None = None,
) -> Buffer:
    """Makes a buffer of n-step transitions that stores each observation once.

    Memory per environment: `steps_per_env` steps (observation, action, reward, two
    flags and a 1-4 byte side-ring slot) plus `K = ceil(steps_per_env /
    min_episode_length)` final observations, i.e. about `1 + 1 / min_episode_length`
    observations per stored step, where a buffer of full transitions keeps 2.
    The default with the uniform sampler, `min_episode_length=10` (or `steps_per_env`
    where smaller), holds about 1.1 and loses nothing while the stored episodes average 10
    steps or more (with `prioritized` or `epochs`, which keep a record per slot, the
    default is 1). If
    they are shorter, the oldest final observations are overwritten first and the
    steps that would need them are no longer sampled: `state.side.stale` counts
    them per environment, and the buffer holds fewer usable steps, never wrong
    ones (episodes of 2 steps keep about a fifth usable). Give `min_episode_length=1`
    where episodes may be that short (nothing is ever lost, at 2 observations per
    stored step), or 100 for episodes of hundreds of steps (about 1.01).
    `jaxbuf.memory(buffer, example)` gives the bytes per stored step, and the
    episode length the buffer is sized for, before anything is allocated.

    Args:
      num_envs: environments stepped together.
      steps_per_env: steps stored per environment; the oldest are overwritten (jaxbuf
        0.3 called it `capacity`; `capacity=` is refused, saying so).
      sample_batch_size: transitions per `sample`.
      n_step: rewards summed per transition (fewer where an episode ends first).
      discount: the per-step discount gamma, in [0, 1].
      min_episode_length: the average episode length (in steps) the side ring is
        sized for, at least 1 and at most `steps_per_env`; default 10 (or
        `steps_per_env`) with the uniform sampler, 1 with the others.
      min_size: steps per environment from which `can_sample` is true; at least
        (and by default) `n_step + 1`.
      frames: `{"obs": k}`: `obs` and `next_obs` come as stacks of `k` frames,
        `[B, k, ...]`, never reaching before the episode's first step (whose
        frame stands in) or the oldest stored step; a `next_obs` after an
        episode end stacks that episode's last frames and its final observation.
        Storage keeps one frame per step.
      goals: `jaxbuf.hindsight(reward_fn, ...)`: relabel the desired goal of a
        `ratio` of the sampled transitions with a goal achieved in the same
        episode (see `jaxbuf.hindsight`); the observation must be a dict holding
        the goal leaves. One-step transitions only (`n_step=1`), without `frames`.
      sampler: `jaxbuf.uniform()` (the default) or `jaxbuf.prioritized(...)`.
      storage_dtypes: `{"obs": "bfloat16"}`: float32 leaves kept in 2 bytes
        (`"bfloat16"` or `"float16"`), sampled as float32; lossy, opt-in. `obs`
        covers `next_obs`; not with `goals`.
      host_memory: `("obs",)`: leaves kept in the device's `pinned_host`
        memory (JAX 0.7+). `obs` takes the final observations along; not with
        `goals`. Both options are described once, in `jaxbuf.options.wrappers`.

    Returns:
      A `Buffer` with `init(example)` taking one `Transition` (or a dict with its field
      names) without batch axes; `add(state, steps)` with leaves `[num_envs, T,
      ...]`; `add_step(state, step)` with leaves `[num_envs, ...]`; `sample(state,
      key) -> Sample` whose `experience` is a `Transition` of n-step transitions
      and `length` the steps each sums; `can_sample`; `take`. A transition starts
      at a stored step whose `n_step` following steps are stored too (it never
      reads across the write position); the n-step sum stops at the first
      termination (discount 0) or truncation (bootstrap from the final observation).

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_transition_buffer(2, 16, 4, n_step=3, discount=0.5)
      >>> step = jaxbuf.Transition(obs=jnp.zeros(3), action=jnp.int32(0),
      ...     reward=jnp.float32(1), terminated=jnp.bool_(False),
      ...     truncated=jnp.bool_(False), next_obs=jnp.zeros(3))
      >>> state = buffer.init(step)
      >>> steps = jax.tree.map(lambda x: jnp.broadcast_to(x, (2, 5, *x.shape)), step)
      >>> batch = buffer.sample(buffer.add(state, steps), jax.random.key(0))
      >>> batch.experience.reward.tolist(), batch.experience.discount.tolist()
      ([1.75, 1.75, 1.75, 1.75], [0.125, 0.125, 0.125, 0.125])
    """
    sampler = _pipeline.check_sampler(sampler)
    if min_episode_length is None and sampler.config.kind != "uniform":
        min_episode_length = 1  # its slots stay drawable: keep every final observation
    config = _config(
        num_envs, steps_per_env, sample_batch_size, n_step, discount, min_episode_length, min_size
    )
    stacks = _frames.check_frames(frames, config.steps_per_env, allowed=("obs",))
    options = (
        _frames.option(stacks, refuses={"goals": "the goal leaves live in the stacked obs"}),
        _goals.option(goals, _goals.transition_relabeling, discount=config.discount),
        *_options.storage(storage_dtypes=storage_dtypes, host_memory=host_memory),
    )
    _check_goals(goals, config.n_step)
    return _pipeline.build(
        _layout(config, goals), sampler, config.sample_batch_size,
        options, kind="transition", **config._asdict(), frames=stacks or None,
        goals=None if goals is None else goals.config,
    )  # fmt: skip


def _check_goals(goals: _goals.Hindsight | None, n_step: int) -> None:
    """What relabeling one-step transitions asks of `goals` (checked already)."""
    if goals is None:
        return
    if n_step != 1:
        raise ValueError(f"goals relabel one-step transitions; got n_step={n_step} (an n-step "
                         "return under a new goal would need every step's reward recomputed "
                         "and is off-policy biased; use n_step=1).")  # fmt: skip
    if goals.terminated is not None or goals.reward != ("reward",):
        raise ValueError("a transition buffer's hindsight takes no reward= or terminated= "
                         "paths: it rewrites the Transition's reward and terminated.")  # fmt: skip
