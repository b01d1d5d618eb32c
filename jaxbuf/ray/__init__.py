"""Actor fleets on Ray feeding one learner's jaxbuf buffer (install `jaxbuf[ray]`).

On the learner::

    ingest = jaxbuf.ray.Ingest(buffer, state, inbox="learner", limiter=limiter)
    while training:
        ingest.wait_until_can_sample()
        batch = ingest.sample(key)                 # counted by the limiter
        ...                                        # learn; ingest.set_priorities(...)
        if step % k == 0:
            ingest.publish(params)                 # once into the object store

On each actor (another process or machine of the Ray cluster; no JAX backend starts)::

    writer = jaxbuf.ray.Writer("learner", name="actor-3", block_size=64, window=4)
    writer.append(step, priority=p)                # blocks of 64 steps, 4 in flight at most
    params = writer.params()                       # the newest published, fetched once

Guarantees (tested in `tests/test_ray.py`): every block a writer was told is written is in
the buffer exactly once, also where actors die or restart and where the learner restores a
checkpoint (`Ingest.save` / `Ingest.restore`: buffer, limiter and per-writer ledger); the
limiter's samples-per-insert bounds hold at the learner at every moment; a writer waits
(backpressure) rather than the learner's memory growing. See `docs/ray.md`.

The package's modules: `ledger` decides which blocks are written (each once); `inbox` is the
Ray actor between the writers and the learner; `writer` is the actor's side, `ingest` the
learner's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jaxbuf.ray.ledger import Ledger
from jaxbuf.ray.writer import Writer

if TYPE_CHECKING:
    from jaxbuf.ray.ingest import Ingest

__all__ = ["Ingest", "Ledger", "Writer"]


def __getattr__(name: str) -> Any:
    """`Ingest` on first use: an actor's process imports `Writer` without JAX."""
    if name == "Ingest":
        from jaxbuf.ray.ingest import Ingest

        return Ingest
    raise AttributeError(f"module 'jaxbuf.ray' has no attribute {name!r}")
