"""The actor's side: steps batched into blocks and sent to a learner's inbox through Ray.

A `Writer` lives in an actor process (a Ray actor, or any process connected to the
cluster). It never holds the learner's buffer and never starts JAX: steps are NumPy
arrays, stacked into blocks of `block_size` steps, each block put into Ray's object store
once and offered to the inbox by reference. At most `window` blocks are in flight (sent,
not yet written by the learner); the next send waits for the oldest to be written, so a
fast actor runs at the learner's pace.

A block is acknowledged once the learner has written it into its buffer; the writer then
drops it. A writer whose inbox goes away (the learner restarted) connects again, keeps
its incarnation where the restored learner allows it, and sends again the blocks that the
restored learner has not written.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import ray
import ray.exceptions

from jaxbuf.ray.inbox import Offer

# Blocks up to this size travel inside the offer (one message to the inbox, one to the
# learner); larger ones go through the object store once, by reference (Ray inlines
# task arguments up to 100 KiB itself).
INLINE_BYTES = 64 * 1024
# Seconds after which `params` asks the inbox even where no answer brought a newer version.
PARAMS_CHECK = 1.0
UNREACHABLE = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
               ray.exceptions.GetTimeoutError)  # fmt: skip


class Writer:
    """Sends an actor's steps to a learner's inbox (see the module docstring).

    Args:
      inbox: the inbox's Ray actor name (what `jaxbuf.ray.Ingest` was given), or its handle.
      name: this writer's name, stable across restarts of its process (`"actor-3"`): the
        learner counts what it wrote per name.
      block_size: steps per block.
      window: blocks in flight at most.
      reconnect_timeout: seconds to wait for an inbox that went away to come back.
      answer_timeout: seconds a call to the inbox may take beyond its own wait before the
        writer looks the inbox up by name again (a dead actor's calls fail at once; this
        bounds the others: an inbox whose process hangs, a lost reply).
    """

    def __init__(self, inbox: Any, name: str, *, block_size: int, window: int = 4,
                 reconnect_timeout: float = 60.0, answer_timeout: float = 30.0,
                 namespace: str | None = None) -> None:  # fmt: skip
        _check_positive("block_size", block_size)
        _check_positive("window", window)
        _check_seconds("reconnect_timeout", reconnect_timeout)
        _check_seconds("answer_timeout", answer_timeout)
        self._answer_timeout = float(answer_timeout)
        self.name, self.block_size, self.window = str(name), block_size, window
        self._inbox_name = inbox if isinstance(inbox, str) else None
        self._inbox = _inbox_handle(inbox, namespace, reconnect_timeout)
        self._namespace, self._reconnect_timeout = namespace, reconnect_timeout
        self._steps: list[list[np.ndarray]] = []
        self._priorities: list[float] = []
        self._treedef: Any = None
        self._unwritten: collections.OrderedDict[int, Offer] = collections.OrderedDict()
        self._sequence, self.written_blocks, self.written_steps, self.dropped_blocks = 0, 0, 0, 0
        self._params_version, self._params, self._last_written = 0, None, -1
        self._boxed: tuple[int, Any] = (0, [])  # the newest parameters' reference heard of
        self._newest, self._heard_at = 0, time.monotonic()
        self._answers: collections.deque[Any] = collections.deque()  # offers' answers
        self.incarnation, _, self._restarts = ray.get(
            self._inbox.connect.remote(self.name, None), timeout=self._answer_timeout)  # fmt: skip

    def append(self, step: Any, priority: float | None = None) -> None:
        """Adds one step (a pytree of arrays or scalars, without a batch axis), with its
        initial priority where the learner's buffer is prioritized."""
        leaves, treedef = _flatten(step)
        if self._treedef is None:
            self._treedef = treedef
        elif treedef != self._treedef:
            raise ValueError(
                f"step structure {treedef} differs from the first step's {self._treedef}."
            )
        if self._steps and (priority is None) != (not self._priorities):
            raise ValueError("give a priority with every step of a block, or with none.")
        self._steps.append(leaves)
        if priority is not None:
            self._priorities.append(float(priority))
        if len(self._steps) == self.block_size:
            self._send()

    def flush(self) -> None:
        """Sends the steps appended since the last block (a shorter block), if any."""
        if self._steps:
            self._send()

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until every block sent is written (or `timeout` seconds); whether it is."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._unwritten:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._await_written(next(reversed(self._unwritten)), min(left or 5.0, 5.0))
        return True

    @property
    def in_flight(self) -> int:
        """Blocks sent and not yet written by the learner."""
        return len(self._unwritten)

    def params(self) -> Any:
        """The newest parameters the learner published (`Ingest.publish`) that this writer
        has heard of, fetched from the object store only when they changed; `None` before
        the first. The inbox's answers to this writer's blocks carry the newest version,
        and its reference where newer than this writer's, so a writer that sends asks the
        inbox only where an answer told of a newer version without bringing it; one that
        has heard nothing for `PARAMS_CHECK` seconds asks anyway."""
        self._listen()
        quiet = time.monotonic() - self._heard_at > PARAMS_CHECK
        unknown = self._params is None and not self._boxed[1]  # none fetched, none heard of
        if unknown or self._newest > self._boxed[0] or quiet:
            self._heard(*self._call(lambda inbox: inbox.params.remote(self._params_version)))
        version, boxed = self._boxed
        if version > self._params_version:
            self._params = ray.get(boxed[0], timeout=self._answer_timeout)
            # the reference let go once fetched: the object store may free old parameters
            self._params_version, self._boxed = version, (version, [])
        return self._params

    def _listen(self) -> None:
        """What the answers to the blocks offered that are here say: the newest version,
        the blocks written, a restart of the learner (then sends again what is unwritten)."""
        while self._answers and ray.wait([self._answers[0]], timeout=0)[0]:
            answer = self._answers.popleft()
            with contextlib.suppress(*UNREACHABLE):  # a dead inbox: `_call` finds the next
                self._heard_written(*ray.get(answer, timeout=self._answer_timeout))

    def _heard_written(
        self, version: int, last: int, restarts: int, boxed: Sequence[Any] = ()
    ) -> None:
        """An answer of the inbox: `(newest version, last block written, restarts)`, and
        the newest parameters' reference where the answer brought it (`[ref]`)."""
        self._heard(version, boxed)
        self._forget_through(last)
        if restarts != self._restarts:  # the learner went back to a checkpoint
            self._restarts = restarts
            self._answers.clear()  # answers from before the restart say nothing now
            self._send_again()

    def _heard(self, version: int, boxed: Sequence[Any] = ()) -> None:
        """What an answer says of the parameters: the newest version published, and its
        reference where the answer brought one (`[ref]`)."""
        self._newest, self._heard_at = max(self._newest, version), time.monotonic()
        if boxed and version > self._boxed[0]:
            self._boxed = (version, boxed)

    @property
    def params_version(self) -> int:
        """How many times the learner had published when `params` last fetched (0: never)."""
        return self._params_version

    def _send(self) -> None:
        columns = [np.stack(column) for column in zip(*self._steps, strict=True)]
        block = _unflatten(self._treedef, columns)
        priorities = np.asarray(self._priorities, np.float32) if self._priorities else None
        steps = len(self._steps)
        self._steps, self._priorities = [], []
        self._listen()  # acknowledgements the offers' answers brought: no call
        while len(self._unwritten) >= self.window:
            self._await_written(next(iter(self._unwritten)), 5.0)
        offer = Offer(self.name, self.incarnation, self._sequence,
                      _payload(block, priorities, columns), steps, self._last_written,
                      max(self._params_version, self._boxed[0]))  # fmt: skip
        self._sequence += 1
        self._unwritten[offer.sequence] = offer
        self._answers.append(self._inbox.offer.remote(offer))

    def _await_written(self, sequence: int, timeout: float) -> None:
        last, restarts, version = self._call(lambda inbox: inbox.written.remote(
            self.name, self.incarnation, sequence, self._restarts, timeout), timeout)  # fmt: skip
        self._heard_written(version, last, restarts)

    @property
    def written_through(self) -> tuple[int, int]:
        """`(incarnation, last block of it the learner has written)` as last heard; -1: none."""
        return self.incarnation, self._last_written

    def _forget_through(self, last: int) -> None:
        self._last_written = max(self._last_written, last)
        for sequence in [s for s in self._unwritten if s <= last]:
            offer = self._unwritten.pop(sequence)
            self.written_blocks += 1
            self.written_steps += offer.steps

    def _call(self, method: Any, waits: float = 0.0) -> Any:
        """`ray.get(method(inbox))` within `waits + answer_timeout` seconds (`waits`: the
        call's own wait at the inbox), connecting again (and sending again what the learner
        has not written) where the inbox went away or did not answer in time; the call is
        then made again on the inbox found."""
        deadline = time.monotonic() + self._reconnect_timeout
        while True:
            try:
                return ray.get(method(self._inbox), timeout=waits + self._answer_timeout)
            except UNREACHABLE:
                if self._inbox_name is None or time.monotonic() > deadline:
                    raise
            self._reconnect(deadline)

    def _reconnect(self, deadline: float) -> None:
        """Finds the inbox by name again (waiting for it until `deadline`) and connects."""
        while True:
            self._inbox = _inbox_handle(self._inbox_name, self._namespace,
                                        max(deadline - time.monotonic(), 0.0))  # fmt: skip
            try:
                answer = self._inbox.connect.remote(self.name, self.incarnation)
                incarnation, last, self._restarts = ray.get(answer, timeout=self._answer_timeout)
                break
            except UNREACHABLE:  # the old inbox's name, not yet freed, or a slow one
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        if incarnation != self.incarnation:  # another process took the name: start afresh
            self.incarnation, self._sequence, self._last_written = incarnation, 0, -1
            self.dropped_blocks += len(self._unwritten)
            self._unwritten.clear()
            return
        self._forget_through(last)
        self._send_again()

    def _send_again(self) -> None:
        """Offers again every block not acknowledged, in order, with the current floor
        (the learner's ledger writes those it lacks and drops the others)."""
        for sequence, offer in self._unwritten.items():
            self._unwritten[sequence] = offer._replace(floor=self._last_written)
            self._inbox.offer.remote(self._unwritten[sequence])


def _payload(block: Any, priorities: np.ndarray | None, columns: list[np.ndarray]) -> Any:
    """`(block, priorities)` where small, else a list holding its object reference."""
    nbytes = sum(column.nbytes for column in columns)
    nbytes += 0 if priorities is None else priorities.nbytes
    return (block, priorities) if nbytes <= INLINE_BYTES else [ray.put((block, priorities))]


def _inbox_handle(inbox: Any, namespace: str | None, timeout: float) -> Any:
    """The inbox's handle: `inbox` itself, or the named actor once it exists (waits)."""
    if not isinstance(inbox, str):
        return inbox
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get_actor(inbox, namespace=namespace)
        except ValueError:
            if time.monotonic() > deadline:
                raise ValueError(
                    f"no inbox named {inbox!r} in the Ray cluster after {timeout} s: start the "
                    "learner (jaxbuf.ray.Ingest) first, or pass the name it was given."
                ) from None
            time.sleep(0.2)


class _Structure(NamedTuple):
    """A step's structure: a leaf, None, or a plain dict (`meta`: its sorted keys), list,
    tuple or named tuple (`meta`: its class) of structures; or JAX's (`meta`: a treedef)
    for any other container."""

    kind: str
    meta: Any = None
    children: tuple = ()


class _Foreign(Exception):
    """A container the writer does not walk itself."""


def _flatten(step: Any) -> tuple[list[np.ndarray], _Structure]:
    """The step's leaves as NumPy arrays (in JAX's order), and its structure. Plain
    dicts, lists, tuples and named tuples are walked here, without importing JAX (an
    actor then starts without it); any other container through `jax.tree_util`."""
    leaves: list[np.ndarray] = []
    try:
        return leaves, _walk(step, leaves)
    except _Foreign:
        import jax.tree_util as tree_util

        flat, treedef = tree_util.tree_flatten(step)
        return [np.asarray(leaf) for leaf in flat], _Structure("jax", treedef)


def _walk(node: Any, leaves: list[np.ndarray]) -> _Structure:
    if node is None:
        return _Structure("none")
    if type(node) is dict:
        keys = tuple(sorted(node))
        return _Structure("dict", keys, tuple(_walk(node[k], leaves) for k in keys))
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return _Structure("named", type(node), tuple(_walk(v, leaves) for v in node))
    if type(node) in (list, tuple):
        return _Structure(type(node).__name__, None, tuple(_walk(v, leaves) for v in node))
    if isinstance(node, (np.ndarray, np.generic, bool, int, float)) or hasattr(node, "__array__"):
        leaves.append(np.asarray(node))
        return _Structure("leaf")
    raise _Foreign


def _unflatten(structure: _Structure, columns: list[np.ndarray]) -> Any:
    """The container `structure` describes, holding `columns` in leaf order."""
    if structure.kind == "jax":
        return structure.meta.unflatten(columns)
    rest = iter(columns)

    def build(node: _Structure) -> Any:
        if node.kind in ("leaf", "none"):
            return next(rest) if node.kind == "leaf" else None
        items = [build(child) for child in node.children]
        if node.kind == "dict":
            return dict(zip(node.meta, items, strict=True))
        return node.meta(*items) if node.kind == "named" else _sequence(node.kind)(items)

    return build(structure)


def _sequence(kind: str) -> type:
    return list if kind == "list" else tuple


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")


def _check_seconds(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}.")
