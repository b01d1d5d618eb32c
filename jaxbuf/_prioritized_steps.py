"""Prioritized sequences and n-step transitions over per-environment trajectory storage.

Slot `env * capacity + t` holds the priority of the sequence (or transition)
starting at storage time `t` of environment `env`. It is positive only while that
start is valid: aligned to `period` and with its `span` steps (the sequence
length, or `n_step + 1` for a transition and its bootstrap observation) stored
and consecutive. An add of `T` steps at position `p` therefore clears the slots
of the rows it writes (they are now the newest steps) and fills, with the
maximum priority, the `T` starts whose span it completes: rows
`p - span + 1, ..., p + T - span`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf import _priority, _trajectory, _transition, _validation
from jaxbuf._access import steps_of

PyTree = Any


@struct.dataclass
class PrioritizedTrajectoryBufferState:
    """State of a prioritized trajectory (or transition) buffer.

    Attributes:
      storage: a `TrajectoryBufferState` (or a `TransitionBufferState`).
      priorities: priorities of the `num_envs * capacity` starts.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_prioritized_trajectory_buffer(2, 50, 4, 3)
      >>> state = buffer.add(buffer.init({"obs": jnp.zeros(3)}), {"obs": jnp.ones((2, 7, 3))})
      >>> state.storage.experience["obs"].shape, float(state.priorities.tree.total)
      ((2, 50, 3), 10.0)
    """

    storage: Any
    priorities: _priority.PriorityState


@struct.dataclass
class PrioritizedSequenceSample:
    """Sequences drawn in proportion to priority.

    Attributes:
      experience: leaves `[sample_batch_size, sequence_length, *step_shape]`.
      indices: int32 `[sample_batch_size]`, each start's slot `env * capacity + time`,
        for `set_priorities`.
      env_indices, time_indices: int32, the environment and storage time of each start.
      mask: bool `[sample_batch_size, sequence_length]` up to the first episode end
        (None without `done_fn`).
      probabilities, weights: float32, `P(i)` and the importance weights (see
        `make_prioritized_replay_buffer`).
      valid: bool, false while the buffer cannot sample.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_prioritized_trajectory_buffer(2, 50, 4, 3)
      >>> state = buffer.add(buffer.init({"obs": jnp.zeros(3)}), {"obs": jnp.ones((2, 7, 3))})
      >>> batch = buffer.sample(state, jax.random.key(0))
      >>> batch.experience["obs"].shape, batch.indices.shape, batch.weights.tolist()
      ((4, 3, 3), (4,), [1.0, 1.0, 1.0, 1.0])
    """

    experience: PyTree
    indices: jax.Array
    env_indices: jax.Array
    time_indices: jax.Array
    mask: jax.Array | None
    probabilities: jax.Array
    weights: jax.Array
    valid: jax.Array


@struct.dataclass
class PrioritizedNStepSample:
    """n-step transitions drawn in proportion to priority.

    Attributes:
      transitions: a `NStepSample` (obs, action, reward, discount, next_obs, ...).
      indices: int32, each start's slot `env * capacity + time`, for `set_priorities`.
      probabilities, weights: float32, `P(i)` and the importance weights.
      valid: bool, false while the buffer cannot sample.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_prioritized_transition_buffer(1, 20, 2, n_step=2, discount=0.5)
      >>> steps = jaxbuf.Transition(obs=jnp.arange(4.0)[None, :, None], action=jnp.zeros((1, 4),
      ...     jnp.int32), reward=jnp.ones((1, 4)), terminated=jnp.zeros((1, 4), bool),
      ...     truncated=jnp.zeros((1, 4), bool), next_obs=jnp.arange(1.0, 5.0)[None, :, None])
      >>> state = buffer.add(buffer.init(jax.tree.map(lambda x: x[0, 0], steps)), steps)
      >>> batch = buffer.sample(state, jax.random.key(0))
      >>> batch.transitions.reward.tolist(), batch.indices.tolist(), batch.weights.tolist()
      ([1.5, 1.5], [0, 1], [1.0, 1.0])
    """

    transitions: _transition.NStepSample
    indices: jax.Array
    probabilities: jax.Array
    weights: jax.Array
    valid: jax.Array


class PrioritizedTrajectoryBuffer(NamedTuple):
    """The pure functions of a prioritized trajectory or transition buffer.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_prioritized_trajectory_buffer(num_envs=2, capacity=50,
      ...     sample_batch_size=4, sequence_length=3)
      >>> buffer._fields
      ('init', 'add', 'add_step', 'sample', 'set_priorities', 'can_sample', 'config')
    """

    init: Any
    add: Any
    add_step: Any
    sample: Any
    set_priorities: Any
    can_sample: Any
    config: Any


class _Layout(NamedTuple):
    num_envs: int
    capacity: int
    span: int
    period: int
    alpha: float


def _valid_start(storage, layout: _Layout, times: jax.Array) -> jax.Array:
    """Whether storage times `times` are valid starts now."""
    age = (storage.position - 1 - times) % layout.capacity  # 0: the newest step
    return (times % layout.period == 0) & (age >= layout.span - 1) & (age < storage.size)


def _after_add(state, storage, length: int, layout: _Layout) -> _priority.PriorityState:
    """Priorities after `length` steps were written at the old position (see module doc)."""
    n, c = layout.num_envs, layout.capacity
    base = (jnp.arange(n, dtype=jnp.int32) * c)[:, None]
    j = jnp.arange(length, dtype=jnp.int32)[None, :]
    old = steps_of(state.storage).position
    priorities = _priority.clear(state.priorities, (base + (old + j) % c).ravel())
    completed = (old - layout.span + 1 + j) % c
    keep = jnp.broadcast_to(_valid_start(steps_of(storage), layout, completed), (n, length))
    return _priority.fill(priorities, (base + completed).ravel(), layout.alpha, keep.ravel())


def _set_priorities(state, indices, priorities, layout: _Layout):
    indices, priorities = _priority.check_update(indices, priorities)
    slots = jnp.clip(indices, 0, layout.num_envs * layout.capacity - 1)
    allowed = (indices == slots) & _valid_start(
        steps_of(state.storage), layout, slots % layout.capacity
    )
    updated = _priority.update(state.priorities, slots, priorities, allowed, layout.alpha)
    return state.replace(priorities=updated)


def _draw(state, key, layout: _Layout, batch: int, stratified: bool, beta):
    _priority.check_importance_exponent(beta)
    num_slots = layout.num_envs * layout.capacity
    drawn = _priority.draw(state.priorities, key, batch, num_slots, stratified, beta)
    envs, starts = drawn.slots // layout.capacity, drawn.slots % layout.capacity
    return drawn, envs, starts


def _wrap(base, layout: _Layout, config, sample_fn, can_sample):
    def init(example):
        storage = base.init(example)
        return PrioritizedTrajectoryBufferState(
            storage=storage, priorities=_priority.init(layout.num_envs * layout.capacity)
        )

    def add(state, steps):
        storage = base.add(state.storage, steps)  # validates `steps`
        length = jax.tree_util.tree_leaves(steps)[0].shape[1]
        return state.replace(storage=storage, priorities=_after_add(state, storage, length, layout))

    def add_step(state, step):
        storage = base.add_step(state.storage, step)  # validates `step`
        return state.replace(storage=storage, priorities=_after_add(state, storage, 1, layout))

    def set_priorities(state, indices, priorities):
        return _set_priorities(state, indices, priorities, layout)

    return PrioritizedTrajectoryBuffer(
        init, add, add_step, sample_fn, set_priorities, can_sample, config
    )


class PrioritizedTrajectoryBufferConfig(NamedTuple):
    """The validated configuration of a prioritized trajectory buffer.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> jaxbuf.make_prioritized_trajectory_buffer(2, 50, 4, 3).config
      PrioritizedTrajectoryBufferConfig(trajectory=TrajectoryBufferConfig(num_envs=2, capacity=50,
      sample_batch_size=4, sequence_length=3, period=1, min_size=3), priority_exponent=0.6,
      stratified=True)
    """

    trajectory: _trajectory.TrajectoryBufferConfig
    priority_exponent: float
    stratified: bool


class PrioritizedTransitionBufferConfig(NamedTuple):
    """The validated configuration of a prioritized transition buffer.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> jaxbuf.make_prioritized_transition_buffer(2, 50, 4, n_step=3).config
      PrioritizedTransitionBufferConfig(transition=TransitionBufferConfig(num_envs=2, capacity=50,
      sample_batch_size=4, n_step=3, discount=0.99, min_episode_length=1, final_capacity=50,
      min_size=4), priority_exponent=0.6, stratified=True)
    """

    transition: _transition.TransitionBufferConfig
    priority_exponent: float
    stratified: bool


def make_prioritized_trajectory_buffer(
    num_envs: int,
    capacity: int,
    sample_batch_size: int,
    sequence_length: int,
    *,
    period: int = 1,
    min_size: int | None = None,
    done_fn: Callable[[PyTree], jax.Array] | None = None,
    priority_exponent: float = 0.6,
    stratified: bool = True,
) -> PrioritizedTrajectoryBuffer:
    """Makes a trajectory buffer whose sequences are drawn in proportion to priority.

    The arguments before `priority_exponent` are `make_trajectory_buffer`'s, and
    sequences obey the same rules (aligned to `period`, never straddling the write
    position); `priority_exponent` and `stratified` are
    `make_prioritized_replay_buffer`'s. A new start gets the largest priority set
    so far once its `sequence_length` steps are stored.

    Returns:
      A `PrioritizedTrajectoryBuffer`: `init`, `add` (`[num_envs, T, ...]`),
      `add_step` (`[num_envs, ...]`), `sample(state, key, importance_exponent=0.4)
      -> PrioritizedSequenceSample`, `set_priorities(state, indices, priorities)`
      with the sample's `indices` (a start that is no longer valid is ignored and
      counted in `state.priorities.rejected`), and `can_sample`.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_prioritized_trajectory_buffer(2, 8, 3, 4)
      >>> state = buffer.init({"t": jnp.int32(0)})
      >>> state = buffer.add(state, {"t": jnp.tile(jnp.arange(6, dtype=jnp.int32), (2, 1))})
      >>> batch = buffer.sample(state, jax.random.key(0))
      >>> batch.experience["t"].shape, bool(batch.valid.all())
      ((3, 4), True)
    """
    base = _trajectory.make_trajectory_buffer(
        num_envs, capacity, sample_batch_size, sequence_length,
        period=period, min_size=min_size, done_fn=done_fn,
    )  # fmt: skip
    config = PrioritizedTrajectoryBufferConfig(
        trajectory=base.config,
        priority_exponent=_priority.check_exponent("priority_exponent", priority_exponent),
        stratified=_validation.check_bool("stratified", stratified),
    )
    t = base.config
    layout = _Layout(t.num_envs, t.capacity, t.sequence_length, t.period, config.priority_exponent)

    def can_sample(state) -> jax.Array:
        return (state.storage.size >= t.min_size) & (state.priorities.tree.total > 0)

    def sample(state, key, importance_exponent=0.4) -> PrioritizedSequenceSample:
        drawn, envs, starts = _draw(
            state, key, layout, t.sample_batch_size, config.stratified, importance_exponent
        )
        experience, mask = _trajectory.windows(
            state.storage.experience, envs, starts, t.sequence_length, done_fn
        )
        valid = drawn.positive & (state.storage.size >= t.min_size)  # see the replay buffer
        return PrioritizedSequenceSample(
            experience, drawn.slots, envs, starts, mask, drawn.probabilities,
            jnp.where(valid, drawn.weights, 0.0), valid,
        )  # fmt: skip

    return _wrap(base, layout, config, sample, can_sample)


def make_prioritized_transition_buffer(
    num_envs: int,
    capacity: int,
    sample_batch_size: int,
    *,
    n_step: int = 1,
    discount: float = 0.99,
    min_episode_length: int = 1,
    min_size: int | None = None,
    priority_exponent: float = 0.6,
    stratified: bool = True,
) -> PrioritizedTrajectoryBuffer:
    """Makes an n-step transition buffer whose transitions are drawn by priority.

    The arguments before `priority_exponent` are `make_transition_buffer`'s, and
    transitions are built by the same rules; `priority_exponent` and `stratified`
    are `make_prioritized_replay_buffer`'s. If episodes are shorter than
    `min_episode_length`, a drawn transition whose final observation was
    overwritten comes back with `valid` false (and weight 0) rather than wrong.

    Returns:
      A `PrioritizedTrajectoryBuffer` as for sequences, whose `sample(state, key,
      importance_exponent=0.4)` returns a `PrioritizedNStepSample`.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_prioritized_transition_buffer(2, 16, 4, n_step=2, discount=0.5)
      >>> step = jaxbuf.Transition(obs=jnp.zeros(3), action=jnp.int32(0),
      ...     reward=jnp.float32(1), terminated=jnp.bool_(False),
      ...     truncated=jnp.bool_(False), next_obs=jnp.zeros(3))
      >>> steps = jax.tree.map(lambda x: jnp.broadcast_to(x, (2, 5, *x.shape)), step)
      >>> state = buffer.add(buffer.init(step), steps)
      >>> batch = buffer.sample(state, jax.random.key(0), importance_exponent=1.0)
      >>> batch.transitions.reward.tolist(), batch.weights.tolist()
      ([1.5, 1.5, 1.5, 1.5], [1.0, 1.0, 1.0, 1.0])
    """
    base = _transition.make_transition_buffer(
        num_envs, capacity, sample_batch_size, n_step=n_step, discount=discount,
        min_episode_length=min_episode_length, min_size=min_size,
    )  # fmt: skip
    config = PrioritizedTransitionBufferConfig(
        transition=base.config,
        priority_exponent=_priority.check_exponent("priority_exponent", priority_exponent),
        stratified=_validation.check_bool("stratified", stratified),
    )
    t = base.config
    layout = _Layout(t.num_envs, t.capacity, t.n_step + 1, 1, config.priority_exponent)

    def can_sample(state) -> jax.Array:
        return base.can_sample(state.storage) & (state.priorities.tree.total > 0)

    def sample(state, key, importance_exponent=0.4) -> PrioritizedNStepSample:
        drawn, envs, starts = _draw(
            state, key, layout, t.sample_batch_size, config.stratified, importance_exponent
        )
        storage = state.storage.storage
        offset = (starts - (storage.position - storage.size)) % t.capacity
        fresh = offset >= state.storage.stale[envs]  # its final observation is still stored
        valid = drawn.positive & fresh & base.can_sample(state.storage)
        transitions = _transition.n_step_at(state.storage, envs, starts, t.n_step, t.discount)
        return PrioritizedNStepSample(
            transitions.replace(valid=valid), drawn.slots, drawn.probabilities,
            jnp.where(valid, drawn.weights, 0.0), valid,
        )  # fmt: skip

    return _wrap(base, layout, config, sample, can_sample)
