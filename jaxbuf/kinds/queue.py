"""A FIFO queue of items (trajectory chunks, say) for actor-learner pipelines."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuf.core import footprint as _footprint
from jaxbuf.core import storage as _storage
from jaxbuf.core import validation as _validation
from jaxbuf.core.records import Config, PyTree, Sample, _Record


class QueueState(struct.PyTreeNode):
    """State of a queue.

    Attributes:
      experience: leaves `[capacity, *item_shape]`, a ring.
      position: int32 scalar, the row the next item is written to; the oldest
        queued item is at `(position - size) % capacity`.
      size: int32 scalar, the number of items queued.
      added: uint32 scalar, items ever queued, modulo 2**32.
      dropped: int32 scalar, items offered to `add` while there was no room
        (saturating at 2**31 - 1, never wrapping).

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> queue = jaxbuf.make_queue(8, 2, 4)
      >>> state = queue.add(queue.init(jnp.int32(0)), jnp.array([1, 2], jnp.int32))
      >>> state.experience.shape, int(state.size), int(state.dropped)
      ((8,), 2, 0)
    """

    experience: PyTree
    position: jax.Array
    size: jax.Array
    added: jax.Array
    dropped: jax.Array

    def stored_rows(self) -> tuple[dict, tuple[np.ndarray], PyTree]:
        """On the host: `(labels, index, tree)`, the queued items, oldest first."""
        size, capacity = int(self.size), _storage.capacity_of(self.experience)
        rows = (int(self.position) - size + np.arange(size, dtype=np.int32)) % capacity
        return {}, (rows,), self.experience


@dataclasses.dataclass(frozen=True)
class Queue(_Record):
    """The pure functions of a queue (see `make_queue`), and its configuration.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxbuf
      >>> queue = jaxbuf.make_queue(capacity=8, add_batch_size=2, sample_batch_size=4)
      >>> [field.name for field in dataclasses.fields(queue)]
      ['init', 'add', 'pop', 'can_add', 'can_sample', 'config']
    """

    init: Callable[..., Any]
    add: Callable[..., Any]
    pop: Callable[..., Any]
    can_add: Callable[..., Any]
    can_sample: Callable[..., Any]
    config: Config


def _init(capacity: int, example: PyTree) -> QueueState:
    spec = _validation.item_spec(example)

    def allocate() -> QueueState:
        experience = _storage.allocate(spec, capacity)
        return QueueState(experience=experience, **_storage.counters(), dropped=jnp.int32(0))

    _footprint.refuse_unfit(allocate, spec)
    return allocate()


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
      A `Queue` with `init(example)`, `add(state, items)` with leaves
      `[add_batch_size, ...]`, `pop(state) -> (state, Sample)`,
      `can_add(state)`, `can_sample(state)`.

    Examples:
      >>> import jax.numpy as jnp, jaxbuf
      >>> queue = jaxbuf.make_queue(capacity=4, add_batch_size=2, sample_batch_size=3)
      >>> state = queue.init(jnp.int32(0))
      >>> state = queue.add(queue.add(state, jnp.array([1, 2])), jnp.array([3, 4]))
      >>> state, batch = queue.pop(state)
      >>> batch.experience.tolist(), batch.valid.tolist(), int(state.size)
      ([1, 2, 3], [True, True, True], 1)
    """
    config = Config(
        kind="queue",
        capacity=_validation.check_int("capacity", capacity, maximum=_storage.MAX_CAPACITY),
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
        """An empty queue for items like `example` (one item, no batch axis): leaves
        `[capacity, *item]` of zeros; refused before allocating if it cannot fit."""
        return _init(config.capacity, example)

    def can_add(state: QueueState) -> jax.Array:
        """bool scalar: whether `add_batch_size` more items fit."""
        return state.size + config.add_batch_size <= config.capacity

    def can_sample(state: QueueState) -> jax.Array:
        """bool scalar: whether `sample_batch_size` items are queued."""
        return state.size >= config.sample_batch_size

    def add(state: QueueState, items: PyTree) -> QueueState:
        """Queues `items` (leaves `[add_batch_size, ...]`) if all fit, else none
        (counted in `dropped`)."""
        spec = _storage.item_spec(state.experience, 0)
        _validation.check_batch(spec, items, [("add_batch_size", config.add_batch_size)])
        room = can_add(state)
        rows = _storage.ring_rows(state.position, config.add_batch_size, config.capacity)
        rows = jnp.where(room, rows, config.capacity)  # out of bounds: nothing written

        def put(column: jax.Array, values: jax.Array) -> jax.Array:
            return column.at[rows].set(values, mode="drop")

        taken = jnp.where(room, config.add_batch_size, 0)
        return state.replace(
            experience=jax.tree.map(put, state.experience, items),
            position=(state.position + taken) % config.capacity,
            size=state.size + taken,
            added=state.added + taken.astype(jnp.uint32),
            dropped=_validation.count_up(state.dropped, config.add_batch_size - taken),
        )

    def pop(state: QueueState) -> tuple[QueueState, Sample]:
        """Takes the `sample_batch_size` oldest items if that many are queued:
        `(state, Sample)` with `experience` `[sample_batch_size, ...]`, `indices`
        the rows, and `valid` false (nothing taken) otherwise."""
        ready = can_sample(state)
        head = state.position - state.size
        rows = _storage.ring_rows(head, config.sample_batch_size, config.capacity)
        state = state.replace(size=state.size - jnp.where(ready, config.sample_batch_size, 0))
        batch = Sample(
            experience=_storage.read(state.experience, rows),
            indices=rows,
            valid=jnp.broadcast_to(ready, (config.sample_batch_size,)),
        )
        return state, batch

    return Queue(init, add, pop, can_add, can_sample, config)
