"""The inbox: one Ray actor between the writers and the learner, holding small blocks
and references to large ones.

Writers `offer` each block: a small one (up to `writer.INLINE_BYTES`) travels in the
offer itself, a larger one is put into Ray's object store by the writer and the offer
carries its reference; the learner `take`s offers and fetches the referenced blocks.
The inbox holds at most `capacity` offers: a writer's `offer` waits while it is full, so
actors slow down to the learner's pace instead of the learner's memory growing. It also
carries what flows back: the learner's acknowledgements (per writer name, the last block
written into the buffer) and the newest parameters' reference.

Every method is a coroutine of one event loop (an async Ray actor): no two run at once,
and a waiting call (a full inbox, an empty one, an acknowledgement not yet given) sleeps
on the condition of what it waits for until another call changes it, or until its timeout.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import time
from typing import Any, NamedTuple


class Offer(NamedTuple):
    """One block on its way: the writer's name, incarnation and block number, the block
    itself (`(steps, priorities)`) where it is small, else a list holding its object
    reference (a list, so that Ray passes the reference and does not fetch the block),
    and its number of steps; `floor`: the writer's blocks up to this one are written (none
    comes again); `params`: the version of the parameters the writer holds."""

    name: str
    incarnation: int
    sequence: int
    block: Any
    steps: int
    floor: int = -1
    params: int = 0


def _counted(method: Any) -> Any:
    """`method`, counting its calls in `self.calls` (what `stats` reports)."""

    @functools.wraps(method)
    async def counted(self: Inbox, *args: Any, **kwargs: Any) -> Any:
        self.calls[method.__name__] += 1
        return await method(self, *args, **kwargs)

    return counted


class Inbox:
    """The inbox's state and methods (made a Ray actor by `jaxbuf.ray.start_inbox`)."""

    def __init__(self, capacity: int, acknowledged: dict[str, tuple[int, int]]) -> None:
        self._capacity = capacity
        self._offers: collections.deque[Offer] = collections.deque()
        self._acknowledged = dict(acknowledged)
        self._handed = {name: inc for name, (inc, _) in acknowledged.items()}
        self._params: tuple[int, list] = (0, [])
        # One lock, a condition per thing waited for: a change wakes only the calls that
        # wait for it (with many writers, one condition woke every waiting call each time).
        lock = asyncio.Lock()
        self._space, self._arrived, self._written = (asyncio.Condition(lock) for _ in range(3))
        self._offered, self._restarts = 0, 0
        self.calls: collections.Counter[str] = collections.Counter()

    @_counted
    async def connect(self, name: str, incarnation: int | None) -> tuple[int, int, int]:
        """A writer (re)connects: keeps `incarnation` where no later one was handed out or
        written for `name`, else gets a new one. Returns `(incarnation, last block of it
        written (-1 where none was), restarts of the learner)`."""
        newest = max(self._handed.get(name, 0), self._acknowledged.get(name, (0, -1))[0])
        if incarnation is None or incarnation < newest:
            incarnation = newest + 1
        self._handed[name] = incarnation
        return incarnation, self._last_written(name, incarnation), self._restarts

    def _last_written(self, name: str, incarnation: int) -> int:
        written_in, last = self._acknowledged.get(name, (0, -1))
        return last if written_in == incarnation else -1

    @_counted
    async def offer(self, offer: Offer) -> tuple[int, int, int, list]:
        """Queues a block's reference, waiting while the inbox holds `capacity` of them;
        returns `(newest parameters' version, last block of the writer's incarnation
        written, restarts of the learner, [parameters' reference] where newer than the
        writer's, else [])`: a writer whose window is not full learns of its
        acknowledgements and of new parameters without a call of its own."""
        async with self._space:
            await self._space.wait_for(lambda: len(self._offers) < self._capacity)
            self._offers.append(offer)
            self._offered += 1
            self._arrived.notify()
        written = self._last_written(offer.name, offer.incarnation)
        return self._params[0], written, self._restarts, self._newer(offer.params)

    @_counted
    async def take(self, most: int, timeout: float,
                   acknowledged: dict | None = None) -> list[Offer]:  # fmt: skip
        """Up to `most` offers, oldest first; waits up to `timeout` seconds for the first.
        `acknowledged`: the learner's ledger since its last writes (`acknowledge`'s, carried
        by the take that follows them: one message fewer per poll)."""
        if acknowledged:
            await self._acknowledge(acknowledged)
        async with self._arrived:
            try:
                await asyncio.wait_for(self._arrived.wait_for(lambda: bool(self._offers)), timeout)
            except TimeoutError:
                return []
            taken = [self._offers.popleft() for _ in range(min(most, len(self._offers)))]
            self._space.notify(len(taken))  # as many writers as there is new room for
            return taken

    @_counted
    async def acknowledge(self, acknowledged: dict[str, tuple[int, int]]) -> None:
        """The learner's ledger after a write: wakes the writers waiting on it."""
        await self._acknowledge(acknowledged)

    async def _acknowledge(self, acknowledged: dict[str, tuple[int, int]]) -> None:
        async with self._written:
            self._acknowledged.update(acknowledged)
            self._written.notify_all()

    @_counted
    async def restart(self, acknowledged: dict[str, tuple[int, int]]) -> None:
        """A restored learner's ledger replaces what was acknowledged; offers queued
        before stay (the ledger decides them). Writers learn of it from `written` and
        send again the blocks not acknowledged (the learner may have taken them)."""
        async with self._written:
            self._restarts += 1
            self._acknowledged = dict(acknowledged)
            for name, (incarnation, _) in acknowledged.items():
                self._handed[name] = max(self._handed.get(name, 0), incarnation)
            self._written.notify_all()

    @_counted
    async def written(self, name: str, incarnation: int, sequence: int, restarts: int,
                      timeout: float) -> tuple[int, int, int]:  # fmt: skip
        """Waits up to `timeout` seconds until block `sequence` of the writer's incarnation
        is written (or a later incarnation of the name is, or the learner restarted since
        the writer's `restarts`); returns `(last written, restarts, newest parameters'
        version)`."""
        async with self._written:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._written.wait_for(
                    lambda: self._passed(name, incarnation, sequence)
                    or self._restarts != restarts), timeout)  # fmt: skip
            return self._last_written(name, incarnation), self._restarts, self._params[0]

    def _passed(self, name: str, incarnation: int, sequence: int) -> bool:
        written_in, last = self._acknowledged.get(name, (0, -1))
        return written_in > incarnation or (written_in == incarnation and last >= sequence)

    @_counted
    async def publish(self, version: int, boxed: list) -> None:
        """The newest parameters' reference (in a list, so that it stays a reference); an
        older version arriving late (calls to an async actor may overtake) is dropped."""
        if version > self._params[0]:
            self._params = (version, boxed)

    @_counted
    async def params(self, have: int) -> tuple[int, list]:
        """`(version, [reference])` where newer than `have`, else `(have, [])`."""
        boxed = self._newer(have)
        return (self._params[0], boxed) if boxed else (have, [])

    def _newer(self, have: int) -> list:
        """`[reference]` of the newest parameters where newer than version `have`, else []."""
        version, boxed = self._params
        return boxed if version > have else []

    @_counted
    async def stats(self) -> dict[str, Any]:
        """Offers queued and ever offered, the acknowledgements, the last incarnations
        handed, the calls of each method (this one included) and the inbox process's CPU
        seconds."""
        return {"queued": len(self._offers), "offered": self._offered,
                "capacity": self._capacity, "acknowledged": dict(self._acknowledged),
                "incarnations": dict(self._handed), "calls": dict(self.calls),
                "cpu_seconds": time.process_time()}  # fmt: skip
