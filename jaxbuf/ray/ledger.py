"""Which writers' blocks the learner's buffer holds: the rule that writes each block once.

A writer (one actor process, or one of its restarts) numbers its blocks `0, 1, 2, ...`
within its *incarnation*, a number the inbox hands it when it connects; a restarted actor
connects again and gets a larger one. The ledger keeps, per writer name, the incarnation
it last wrote for, the numbers written in it (all up to `last`, and those written above
it), and decides each block that arrives:

- `"write"`: a later incarnation than any written for that name, or the same one and a
  number not written yet: write it, then `written` records it;
- `"duplicate"`: the same incarnation, a number already written (a block sent again);
- `"stale"`: an earlier incarnation than one already written (a block of a dead process
  that arrived after its successor's first).

A writer's blocks may reach the learner out of order (the inbox is an async Ray actor,
whose calls do not keep the order they were sent in), at most `window` apart: the
numbers written above `last` stay few. The ledger is what a learner's checkpoint saves
beside its buffer: after a restore, blocks written
after that checkpoint are gone from the buffer and from the ledger alike, and a writer's
later blocks (larger numbers) are written; nothing is written twice.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Decision = Literal["write", "duplicate", "stale"]


@dataclasses.dataclass
class Entry:
    """One writer's line: its incarnation, the block up to which every block of it is
    written (-1: none yet), the blocks written above that one, and what was written for
    the name over all incarnations."""

    incarnation: int
    last: int = -1
    blocks: int = 0
    steps: int = 0
    above: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Ledger:
    """Writer name -> `Entry`, and how many blocks were refused as duplicate or stale.

    Examples:
      >>> ledger = Ledger()
      >>> ledger.decide("actor-0", 1, 0)
      'write'
      >>> ledger.written("actor-0", 1, 0, steps=32)
      >>> ledger.decide("actor-0", 1, 0), ledger.decide("actor-0", 2, 0)
      ('duplicate', 'write')
    """

    entries: dict[str, Entry] = dataclasses.field(default_factory=dict)
    duplicates: int = 0
    stale: int = 0

    def decide(self, name: str, incarnation: int, sequence: int, floor: int = -1) -> Decision:
        """What to do with block `sequence` of `name`'s `incarnation` (counts refusals).

        `floor`: the writer's blocks up to this one were acknowledged to it, so it never
        sends them again; the ledger stops waiting for any of them it lacks (those a
        learner's restore took out of the buffer after acknowledging them)."""
        entry = self.entries.get(name)
        if entry is None or incarnation > entry.incarnation:
            return "write"
        if incarnation == entry.incarnation and floor > entry.last:
            entry.last = floor
            entry.above = [s for s in entry.above if s > floor]
            self._advance(entry)
        if incarnation < entry.incarnation:
            self.stale += 1
            return "stale"
        if sequence <= entry.last or sequence in entry.above:
            self.duplicates += 1
            return "duplicate"
        return "write"

    def written(self, name: str, incarnation: int, sequence: int, *, steps: int) -> None:
        """Records that the block was written into the buffer (call after `decide` said so)."""
        entry = self.entries.get(name)
        if entry is None or incarnation > entry.incarnation:
            entry = self.entries[name] = Entry(
                incarnation, blocks=entry.blocks if entry else 0, steps=entry.steps if entry else 0
            )
        entry.above.append(sequence)
        self._advance(entry)
        entry.blocks += 1
        entry.steps += steps

    @staticmethod
    def _advance(entry: Entry) -> None:
        """Moves `last` up through the blocks written above it without a gap."""
        while entry.last + 1 in entry.above:
            entry.above.remove(entry.last + 1)
            entry.last += 1

    def acknowledged(self) -> dict[str, tuple[int, int]]:
        """Name -> `(incarnation, block up to which all are written)`: what writers are
        told (a writer drops the blocks up to that one)."""
        return {name: (e.incarnation, e.last) for name, e in self.entries.items()}

    def to_json(self) -> dict:
        """A JSON-ready form, for a checkpoint's metadata."""
        return {"entries": {name: dataclasses.asdict(e) for name, e in self.entries.items()},
                "duplicates": self.duplicates, "stale": self.stale}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict) -> Ledger:
        """The ledger `to_json` wrote; a `ValueError` names what is missing or wrong."""
        try:
            entries = {str(name): _entry(e) for name, e in data["entries"].items()}
            return cls(entries, int(data["duplicates"]), int(data["stale"]))
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            raise ValueError(
                f"not a writer ledger saved by jaxbuf.ray ({type(error).__name__}: {error}); "
                "restore from a checkpoint that Ingest.save wrote."
            ) from error


def _entry(data: dict) -> Entry:
    """An `Entry` from its JSON form (numbers checked to be integers)."""
    above = [int(sequence) for sequence in data.get("above", [])]
    return Entry(**{k: int(v) for k, v in data.items() if k != "above"}, above=above)
