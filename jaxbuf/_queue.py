"""A FIFO queue of items (trajectory chunks, say) for actor-learner pipelines."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuf import _replay, _ring, _validation

PyTree = Any


@struct.dataclass
class QueueState:
    """State of a queue.

    Attributes:
      items: leaves `[capacity, *item_shape]`, a ring.
      head: int32 scalar, the row of the oldest item.
      size: int32 scalar, the number of items queued.
      dropped: int32 scalar, items offered to `add` while there was no room.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> queue = jaxbuf.make_queue(8, 2, 4)
      >>> state = queue.add(queue.init(jnp.int32(0)), jnp.array([1, 2], jnp.int32))
      >>> state.items.shape, int(state.size), int(state.dropped)
      ((8,), 2, 0)
    """

    items: PyTree
    head: jax.Array
    size: jax.Array
    dropped: jax.Array


@struct.dataclass
class QueueSample:
    """Items taken from a queue, oldest first.

    Attributes:
      experience: leaves `[sample_batch_size, *item_shape]`.
      valid: bool `[sample_batch_size]`, false when the queue held fewer than
        `sample_batch_size` items (then nothing was taken).

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> queue = jaxbuf.make_queue(8, 2, 4)
      >>> state = queue.init(jnp.int32(0))
      >>> state = queue.add(queue.add(state, jnp.array([1, 2], jnp.int32)), jnp.array([3, 4],
      ...     jnp.int32))
      >>> state, batch = queue.pop(state)
      >>> batch.experience.tolist(), batch.valid.tolist(), int(state.size)
      ([1, 2, 3, 4], [True, True, True, True], 0)
    """

    experience: PyTree
    valid: jax.Array


class QueueConfig(NamedTuple):
    """The validated configuration of a queue.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> jaxbuf.make_queue(8, 2, 4).config
      QueueConfig(capacity=8, add_batch_size=2, sample_batch_size=4)
    """

    capacity: int
    add_batch_size: int
    sample_batch_size: int


class Queue(NamedTuple):
    """The pure functions of a queue, and its configuration.

    Example:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> queue = jaxbuf.make_queue(capacity=8, add_batch_size=2, sample_batch_size=4)
      >>> queue._fields
      ('init', 'add', 'pop', 'can_add', 'can_sample', 'config')
    """

    init: Any
    add: Any
    pop: Any
    can_add: Any
    can_sample: Any
    config: QueueConfig


def make_queue(capacity: int, add_batch_size: int, sample_batch_size: int) -> Queue:
    """Makes a FIFO queue: items leave in the order they came, each exactly once.

    Unlike a replay buffer, a queue never overwrites: `add` stores its items only
    if all of them fit (else it stores none and counts them in `state.dropped`),
    and `pop` takes the `sample_batch_size` oldest items only if that many are
    queued (else it takes none and flags the batch invalid). Check `can_add` and
    `can_sample` to act on those conditions inside `jit`.

    Args:
      capacity: items the queue holds.
      add_batch_size: items per `add` (static).
      sample_batch_size: items per `pop` (static).

    Returns:
      A `Queue`: `init(example)`, `add(state, items)` with leaves
      `[add_batch_size, ...]`, `pop(state) -> (state, QueueSample)`,
      `can_add(state)`, `can_sample(state)`.

    Example:
      >>> import jax.numpy as jnp, jaxbuf
      >>> queue = jaxbuf.make_queue(capacity=4, add_batch_size=2, sample_batch_size=3)
      >>> state = queue.init(jnp.int32(0))
      >>> state = queue.add(queue.add(state, jnp.array([1, 2])), jnp.array([3, 4]))
      >>> state, batch = queue.pop(state)
      >>> batch.experience.tolist(), batch.valid.tolist(), int(state.size)
      ([1, 2, 3], [True, True, True], 1)
    """
    config = QueueConfig(
        capacity=_validation.check_int("capacity", capacity, maximum=_replay.MAX_CAPACITY),
        add_batch_size=_validation.check_int("add_batch_size", add_batch_size),
        sample_batch_size=_validation.check_int("sample_batch_size", sample_batch_size),
    )
    for name in ("add_batch_size", "sample_batch_size"):
        if getattr(config, name) > config.capacity:
            raise ValueError(
                f"{name}={getattr(config, name)} exceeds capacity={config.capacity}: the queue "
                "could never hold that many items."
            )

    def init(example: PyTree) -> QueueState:
        zero = jnp.zeros((), jnp.int32)
        items = _ring.allocate(_validation.item_spec(example), config.capacity)
        return QueueState(items=items, head=zero, size=zero, dropped=zero)

    def can_add(state: QueueState) -> jax.Array:
        return state.size + config.add_batch_size <= config.capacity

    def can_sample(state: QueueState) -> jax.Array:
        return state.size >= config.sample_batch_size

    def add(state: QueueState, items: PyTree) -> QueueState:
        spec = _replay.storage_spec(state.items, 0)
        _validation.check_batch(spec, items, [("add_batch_size", config.add_batch_size)])
        room = can_add(state)
        tail = (state.head + state.size) % config.capacity
        rows = (tail + jnp.arange(config.add_batch_size, dtype=jnp.int32)) % config.capacity
        kept = jax.tree.map(
            lambda new, old: jnp.where(room, new, old), items, _ring.read(state.items, rows)
        )
        return state.replace(
            items=_ring.write(state.items, tail, kept),
            size=state.size + jnp.where(room, config.add_batch_size, 0),
            dropped=state.dropped + jnp.where(room, 0, config.add_batch_size),
        )

    def pop(state: QueueState) -> tuple[QueueState, QueueSample]:
        ready = can_sample(state)
        rows = (
            state.head + jnp.arange(config.sample_batch_size, dtype=jnp.int32)
        ) % config.capacity
        taken = jnp.where(ready, config.sample_batch_size, 0)
        state = state.replace(head=(state.head + taken) % config.capacity, size=state.size - taken)
        sample = QueueSample(
            experience=_ring.read(state.items, rows),
            valid=jnp.broadcast_to(ready, (config.sample_batch_size,)),
        )
        return state, sample

    return Queue(init, add, pop, can_add, can_sample, config)
