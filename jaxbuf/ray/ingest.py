"""The learner's side: blocks from the inbox written into the learner's buffer state.

`Ingest` owns the inbox (a Ray actor it starts), the buffer state, an optional rate
limiter's state and the ledger (`jaxbuf.ray.ledger`). `poll` takes block references
from the inbox, fetches the blocks, and writes each one the ledger allows in one jitted,
donated call (`add`, the initial priorities where given, the limiter's insert count),
while the limiter allows the insert; a block the limiter holds back waits in `pending`
(at most `blocks_per_poll` of them) and the inbox is not read again until it is written.
So the learner holds at most `blocks_per_poll` fetched blocks, the inbox at most
`capacity` references, and Ray's object store at most `writers * window` blocks.

Sampling goes through `sample` (or the learner's own jitted step, then `sampled(n)`), which
the limiter counts; `wait_until_can_sample` blocks on the inbox (no spin) until the
limiter allows a sample.
"""

from __future__ import annotations

import collections
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import ray
import ray.exceptions

from jaxbuf.io import checkpoint as _checkpoint
from jaxbuf.ray.inbox import Inbox, Offer
from jaxbuf.ray.ledger import Ledger
from jaxbuf.rl.rate_limit import batches_allowed

LOST = (ray.exceptions.ObjectLostError, ray.exceptions.RayActorError)


class Ingest:
    """Feeds a learner's buffer state from remote writers (see the module docstring).

    Args:
      buffer: the learner's buffer (any kind whose `add` takes a block: a replay buffer
        takes items `[n, ...]`); initial priorities need a prioritized replay buffer.
      state: its state (device or host memory), which `Ingest` then owns: read it (and
        set it after a step of your own) through `state`.
      inbox: the name writers connect to.
      capacity: block references the inbox holds at most.
      limiter: a `jaxbuf.sample_to_insert_ratio(...)`, or None.
      limiter_state: its state (default: `limiter.init()`).
      ledger: the writers' ledger (from a checkpoint; default empty).
      blocks_per_poll: blocks fetched per `poll` at most.
    """

    def __init__(self, buffer: Any, state: Any, *, inbox: str = "jaxbuf-inbox",
                 capacity: int = 64, limiter: Any = None, limiter_state: Any = None,
                 ledger: Ledger | None = None, blocks_per_poll: int = 8,
                 namespace: str | None = None) -> None:  # fmt: skip
        for name, value in (("capacity", capacity), ("blocks_per_poll", blocks_per_poll)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        self.buffer, self.limiter, self.name = buffer, limiter, inbox
        self.state = state
        self.limiter_state = limiter.init() if limiter and limiter_state is None else limiter_state
        self.ledger = ledger or Ledger()
        self.blocks_per_poll, self.lost_blocks = blocks_per_poll, 0
        self.pending: collections.deque[tuple[Offer, Any, Any]] = collections.deque()
        self.inbox = _start_inbox(inbox, capacity, self.ledger.acknowledged(), namespace)
        self._write = jax.jit(
            functools.partial(write_block, buffer, limiter), donate_argnums=(0, 1)
        )
        self._sample = jax.jit(buffer.sample) if hasattr(buffer, "sample") else None
        # the limiter's checks are a few hundred scalar operations: one call each, not eager
        self._can_insert: Any = jax.jit(limiter.can_insert) if limiter else None
        self._allowed: Any = jax.jit(functools.partial(_allowed, buffer, limiter),
                                     static_argnames="most")  # fmt: skip
        self._sampled: Any = jax.jit(limiter.sampled) if limiter else None
        self._params_version = 0
        self._unacknowledged = False  # blocks written since the inbox last heard the ledger
        self._drained = True  # the last take found fewer offers than it could take

    def poll(self, timeout: float = 0.0) -> int:
        """Writes what it can: the pending blocks, else up to `blocks_per_poll` new ones
        (waiting up to `timeout` seconds for the first). Returns the blocks written.

        The writers hear of what a poll wrote with the next poll's take of new blocks where
        the inbox holds more (a busy learner), else at once."""
        if not self.pending:
            self._fetch(timeout)
        written = 0
        while self.pending:
            offer, block, priorities = self.pending[0]
            decision = self.ledger.decide(
                offer.name, offer.incarnation, offer.sequence, offer.floor
            )
            if decision == "write":
                if self.limiter and not bool(self._can_insert(self.limiter_state, offer.steps)):
                    break
                self.state, self.limiter_state = self._write(
                    self.state, self.limiter_state, block, priorities
                )
                self.ledger.written(
                    offer.name, offer.incarnation, offer.sequence, steps=offer.steps
                )
                written += 1
            self.pending.popleft()
        self._unacknowledged = self._unacknowledged or written > 0
        # Where blocks wait for the limiter, or the inbox was drained (the writers may be
        # waiting on these very blocks, and the next take may be far), tell them now.
        if self._unacknowledged and (self.pending or self._drained):
            self.inbox.acknowledge.remote(self.ledger.acknowledged())
            self._unacknowledged = False
        return written

    def _fetch(self, timeout: float) -> None:
        # A take sent ahead (answered while the learner writes) was tried: it came back
        # with fewer offers each (sent when the inbox had just been emptied), and the
        # learner's CPU per step rose by a third (the transport table, blocks of 32). The
        # acknowledgements of the last writes travel with this take.
        acknowledged = self.ledger.acknowledged() if self._unacknowledged else None
        offers = ray.get(self.inbox.take.remote(self.blocks_per_poll, timeout, acknowledged))
        self._unacknowledged, self._drained = False, len(offers) < self.blocks_per_poll
        referenced = [offer.block[0] for offer in offers if isinstance(offer.block, list)]
        try:  # one round trip for all the referenced blocks
            fetched = iter(ray.get(referenced))
        except LOST:
            fetched = iter(_each_or_none(referenced))
        for offer in offers:
            block = next(fetched) if isinstance(offer.block, list) else offer.block
            if block is None:  # its writer died before it was fetched: never acknowledged
                self.lost_blocks += 1
                continue
            self.pending.append((offer, *block))

    def can_sample(self, batch_size: int | None = None) -> bool:
        """Whether the buffer can sample and the limiter allows `batch_size` samples
        (default: the buffer's `sample_batch_size`)."""
        return self.batches_allowed(1, batch_size) > 0

    def batches_allowed(self, most: int = 1, batch_size: int | None = None) -> int:
        """How many batches of `batch_size` (default: the buffer's) may be drawn now, one
        after another, at most `most` (`jaxbuf.batches_allowed`; 0 where the buffer cannot
        sample): one check, one host sync, for up to `most` updates."""
        n = batch_size or self.buffer.config["sample_batch_size"]
        return int(self._allowed(self.state, self.limiter_state, n, most=most))

    def wait_until_can_sample(self, timeout: float = 60.0) -> bool:
        """Writes arriving blocks, waiting on the inbox (no spin), until `can_sample`;
        whether it can after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not self.can_sample():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.poll(timeout=min(left, 1.0) if not self.pending else 0.0)
        return True

    def sample(self, key: jax.Array) -> Any:
        """A batch from the buffer, counted by the limiter (call `can_sample` first)."""
        if self._sample is None:
            raise TypeError(f"{type(self.buffer).__name__} has no sample: draw in your own step.")
        batch = self._sample(self.state, key)
        self.sampled(self.buffer.config["sample_batch_size"])
        return batch

    def sampled(self, n: int) -> None:
        """Counts `n` samples drawn by the learner's own step."""
        if self.limiter:
            self.limiter_state = self._sampled(self.limiter_state, n)

    def set_priorities(self, indices: Any, priorities: Any) -> None:
        """The buffer's `set_priorities`, on the state `Ingest` owns."""
        self.state = self.buffer.set_priorities(self.state, indices, priorities)

    def publish(self, params: Any) -> int:
        """Puts `params` into Ray's object store once (as NumPy arrays) for every writer's
        `params()`; returns its version (1, 2, ...)."""
        self._params_version += 1
        ref = ray.put(jax.device_get(params))
        self.inbox.publish.remote(self._params_version, [ref])  # not waited for: the inbox
        return self._params_version  # keeps the newest version it has seen

    def save(self, path: Any) -> Any:
        """Saves the buffer state, the limiter's state and the ledger in one checkpoint."""
        state = {"buffer": self.state, "limiter": self.limiter_state}
        return _checkpoint.save(path, state, extra={"ledger": self.ledger.to_json()})

    def restore(self, path: Any) -> None:
        """Goes back to a checkpoint `save` wrote: the buffer state, the limiter's state and
        the ledger; the inbox is told, and pending blocks are decided by that ledger."""
        template = {"buffer": self.state, "limiter": self.limiter_state}
        restored = _checkpoint.restore(path, template)
        metadata = _checkpoint.load_metadata(path)
        if not metadata.get("extra") or "ledger" not in metadata["extra"]:
            raise ValueError(f"{path} holds no writer ledger: save it with Ingest.save.")
        self.ledger = Ledger.from_json(metadata["extra"]["ledger"])
        self.state, self.limiter_state = restored["buffer"], restored["limiter"]
        ray.get(self.inbox.restart.remote(self.ledger.acknowledged()))
        self._unacknowledged = False

    def stats(self) -> dict[str, Any]:
        """The inbox's counts, the ledger's per-writer counts and the refusals."""
        inbox = ray.get(self.inbox.stats.remote())
        writers = {name: {"incarnation": e.incarnation, "blocks": e.blocks, "steps": e.steps}
                   for name, e in self.ledger.entries.items()}  # fmt: skip
        return {"inbox": inbox, "writers": writers, "pending": len(self.pending),
                "duplicates": self.ledger.duplicates, "stale": self.ledger.stale,
                "lost": self.lost_blocks}  # fmt: skip

    def close(self) -> None:
        """Stops the inbox (writers waiting on it then wait for a new one)."""
        ray.kill(self.inbox)


def _each_or_none(refs: list) -> list:
    """Each referenced block, or None where its owner died (one round trip each)."""
    blocks = []
    for ref in refs:
        try:
            blocks.append(ray.get(ref))
        except LOST:
            blocks.append(None)
    return blocks


def _start_inbox(name: str, capacity: int, acknowledged: dict, namespace: str | None) -> Any:
    """The inbox actor, named `name` (an async actor: one event loop, many waiting calls),
    on the learner's node: it lives and dies with the learner, never with a worker node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    actor: Any = ray.remote(Inbox)
    options = {"name": name, "namespace": namespace, "num_cpus": 0, "max_concurrency": 1000,
               "scheduling_strategy": here}  # fmt: skip
    return actor.options(**options).remote(capacity, acknowledged)


def write_block(buffer: Any, limiter: Any, state: Any, limiter_state: Any, block: Any,
                priorities: Any) -> tuple[Any, Any]:  # fmt: skip
    """One block `[n, ...]` into the buffer (jit it and donate `state`, `limiter_state`):
    `add`, then the block's initial priorities `[n]` (or None) on the rows it took (a
    replay ring: from `position`), then the limiter's count (where a limiter is given)."""
    n = jax.tree.leaves(block)[0].shape[0]
    rows = None
    if priorities is not None:
        _check_prioritized_ring(buffer, state)
        capacity = jax.tree.leaves(state.experience)[0].shape[0]
        rows = (state.position + jnp.arange(n, dtype=jnp.int32)) % capacity
    state = buffer.add(state, block)
    if rows is not None:
        state = buffer.set_priorities(state, rows, jnp.asarray(priorities, jnp.float32))
    if limiter is not None:
        limiter_state = limiter.inserted(limiter_state, n)
    return state, limiter_state


def _allowed(buffer: Any, limiter: Any, state: Any, limiter_state: Any, n: Any,
             most: int) -> jax.Array:  # fmt: skip
    """int32: batches of `n` the limiter allows now (at most `most`), 0 where the buffer
    cannot sample (one call, one sync)."""
    allowed = (
        jnp.int32(most) if limiter is None else batches_allowed(limiter, limiter_state, n, most)
    )
    return jnp.where(buffer.can_sample(state), allowed, 0)


def _check_prioritized_ring(buffer: Any, state: Any) -> None:
    if getattr(buffer, "set_priorities", None) is None or not hasattr(state, "position"):
        raise TypeError(
            "blocks with initial priorities need a prioritized replay buffer "
            "(make_replay_buffer(..., sampler=jaxbuf.prioritized(...))), got "
            f"{type(buffer).__name__} with state {type(state).__name__}."
        )
