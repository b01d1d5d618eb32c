"""Prioritized experience replay (Schaul et al., 2016) over a FIFO ring of items."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf import _priority, _replay, _validation

PyTree = Any


@struct.dataclass
class PrioritizedReplayBufferState:
    """State of a prioritized replay buffer.

    Attributes:
      storage: the item storage, as in a uniform replay buffer.
      priorities: the slots' priorities (`priority ** priority_exponent` in a sum
        tree), the largest priority so far, and the count of rejected updates.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_prioritized_replay_buffer(100, 8)
      >>> state = buffer.add(buffer.init(jnp.float32(0)), jnp.ones(5))
      >>> int(state.storage.size), float(state.priorities.max_priority)
      (5, 1.0)
    """

    storage: _replay.ReplayBufferState
    priorities: _priority.PriorityState


@struct.dataclass
class PrioritizedSample:
    """A batch drawn in proportion to priority.

    Attributes:
      experience: leaves `[sample_batch_size, *item_shape]`.
      indices: int32 `[sample_batch_size]`, the storage row of each item (pass them
        to `set_priorities`).
      probabilities: float32, the probability `P(i)` with which each item was drawn.
      weights: float32, importance weights `(N P(i))**-beta / max_j (N P(j))**-beta`,
        the maximum over every stored item with a positive priority (so at most 1);
        0 where `valid` is false.
      valid: bool, false while the buffer cannot sample.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_prioritized_replay_buffer(100, 4, priority_exponent=1.0)
      >>> state = buffer.add(buffer.init(jnp.float32(0)), jnp.arange(2.0))
      >>> state = buffer.set_priorities(state, jnp.arange(2), jnp.array([1.0, 3.0]))
      >>> batch = buffer.sample(state, jax.random.key(0), importance_exponent=1.0)
      >>> batch.experience.tolist(), batch.probabilities.tolist(), batch.weights.tolist()
      ([0.0, 1.0, 1.0, 1.0], [0.25, 0.75, 0.75, 0.75], [1.0, 0.3333333432674408, 0.3333333432674408,
      0.3333333432674408])
    """

    experience: PyTree
    indices: jax.Array
    probabilities: jax.Array
    weights: jax.Array
    valid: jax.Array


class PrioritizedReplayBufferConfig(NamedTuple):
    """The validated configuration of a prioritized replay buffer.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> jaxbuf.make_prioritized_replay_buffer(100, 8).config
      PrioritizedReplayBufferConfig(capacity=100, sample_batch_size=8, min_size=1,
      priority_exponent=0.6, stratified=True, truncate_ok=False)
    """

    capacity: int
    sample_batch_size: int
    min_size: int
    priority_exponent: float
    stratified: bool
    truncate_ok: bool


class PrioritizedReplayBuffer(NamedTuple):
    """The pure functions of a prioritized replay buffer, and its configuration.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_prioritized_replay_buffer(capacity=100, sample_batch_size=8)
      >>> buffer._fields
      ('init', 'add', 'sample', 'set_priorities', 'can_sample', 'config')
    """

    init: Any
    add: Any
    sample: Any
    set_priorities: Any
    can_sample: Any
    config: PrioritizedReplayBufferConfig


def make_prioritized_replay_buffer(
    capacity: int,
    sample_batch_size: int,
    *,
    min_size: int = 1,
    priority_exponent: float = 0.6,
    stratified: bool = True,
    truncate_ok: bool = False,
) -> PrioritizedReplayBuffer:
    """Makes a prioritized replay buffer: FIFO storage, draws in proportion to priority.

    Item `i` is drawn with probability `P(i) = p_i**alpha / sum_k p_k**alpha`
    (`alpha = priority_exponent`; 0 is uniform). New items get the largest
    priority set so far (1 before any), so each is likely to be seen once.

    Args:
      capacity: the number of items stored; once full, `add` overwrites the oldest.
      sample_batch_size: the number of items `sample` returns.
      min_size: the number of items from which `can_sample` is true.
      priority_exponent: alpha, in [0, 1].
      stratified: draw one item from each of `sample_batch_size` equal segments of
        the total priority (the paper's scheme, lower variance); otherwise every
        draw is independent.
      truncate_ok: whether `add` accepts more than `capacity` items at once.

    Returns:
      A `PrioritizedReplayBuffer`: `init(example)`, `add(state, items)` with leaves
      `[B, ...]`, `sample(state, key, importance_exponent=0.4)` (beta may be a traced
      scalar, to anneal it inside `jit`), `set_priorities(state, indices,
      priorities)` and `can_sample(state)`.

      `set_priorities` takes int `[B]` storage rows and float `[B]` priorities.
      Where a row appears more than once, the last accepted entry wins. A negative,
      NaN or infinite priority, a row outside `[0, size)`, is ignored (that row
      keeps its priority) and counted in `state.priorities.rejected`. A priority of
      0 stops the item from being drawn until it is overwritten. In float32, a draw
      never returns a row of zero priority or a row never written.

      Rows are storage positions, not item identities: if `add` overwrote a row
      between `sample` and `set_priorities` (more than `capacity - size` new items
      at the front of the ring), the priority goes to the new item there, as in
      Dopamine and Flashbax. Keep the adds between a sample and its update below
      the capacity, as a usual training loop does.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> buffer = jaxbuf.make_prioritized_replay_buffer(8, 4, priority_exponent=1.0)
      >>> state = buffer.add(buffer.init(jnp.int32(0)), jnp.arange(4, dtype=jnp.int32))
      >>> state = buffer.set_priorities(state, jnp.arange(4), jnp.array([0.0, 0, 3, 1]))
      >>> batch = buffer.sample(state, jax.random.key(0), importance_exponent=1.0)
      >>> batch.experience.tolist(), batch.probabilities.tolist(), batch.weights.tolist()
      ([2, 2, 2, 3], [0.75, 0.75, 0.75, 0.25], [0.333..., 0.333..., 0.333..., 1.0])
    """
    config = PrioritizedReplayBufferConfig(
        capacity=_validation.check_int("capacity", capacity, maximum=_replay.MAX_CAPACITY),
        sample_batch_size=_validation.check_int("sample_batch_size", sample_batch_size),
        min_size=_validation.check_int("min_size", min_size),
        priority_exponent=_priority.check_exponent("priority_exponent", priority_exponent),
        stratified=_validation.check_bool("stratified", stratified),
        truncate_ok=_validation.check_bool("truncate_ok", truncate_ok),
    )
    storage = _replay.make_replay_buffer(
        config.capacity, 1, min_size=config.min_size, truncate_ok=config.truncate_ok
    )
    alpha = config.priority_exponent

    def init(example: PyTree) -> PrioritizedReplayBufferState:
        return PrioritizedReplayBufferState(
            storage=storage.init(example), priorities=_priority.init(config.capacity)
        )

    def add(state: PrioritizedReplayBufferState, items: PyTree) -> PrioritizedReplayBufferState:
        stored = storage.add(state.storage, items)  # validates `items`
        written = min(jax.tree_util.tree_leaves(items)[0].shape[0], config.capacity)
        rows = (stored.position - written + jnp.arange(written, dtype=jnp.int32)) % config.capacity
        return state.replace(
            storage=stored, priorities=_priority.fill(state.priorities, rows, alpha)
        )

    def set_priorities(
        state: PrioritizedReplayBufferState, indices: jax.Array, priorities: jax.Array
    ) -> PrioritizedReplayBufferState:
        indices, priorities = _priority.check_update(indices, priorities)
        allowed = (indices >= 0) & (indices < state.storage.size)
        rows = jnp.clip(indices, 0, config.capacity - 1)
        updated = _priority.update(state.priorities, rows, priorities, allowed, alpha)
        return state.replace(priorities=updated)

    def can_sample(state: PrioritizedReplayBufferState) -> jax.Array:
        return (state.storage.size >= config.min_size) & (state.priorities.tree.total > 0)

    def sample(
        state: PrioritizedReplayBufferState, key: jax.Array, importance_exponent=0.4
    ) -> PrioritizedSample:
        _priority.check_importance_exponent(importance_exponent)
        drawn = _priority.draw(
            state.priorities, key, config.sample_batch_size, config.capacity,
            config.stratified, importance_exponent,
        )  # fmt: skip
        # `drawn.positive` implies a positive total; the tree is read only by the draw.
        valid = drawn.positive & (state.storage.size >= config.min_size)
        return PrioritizedSample(
            experience=jax.tree.map(
                lambda x: x.at[drawn.slots].get(mode="promise_in_bounds"),
                state.storage.experience,
            ),
            indices=drawn.slots,
            probabilities=drawn.probabilities,
            weights=jnp.where(valid, drawn.weights, 0.0),
            valid=valid,
        )

    return PrioritizedReplayBuffer(init, add, sample, set_priorities, can_sample, config)
