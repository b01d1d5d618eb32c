"""Which writers' blocks the learner's buffer holds: the rule that writes each block once.

A writer (one actor process, or one of its restarts) numbers its blocks `0, 1, 2, ...`
within its *incarnation*, a number the inbox hands it when it connects; a restarted actor
connects again and gets a larger one. The ledger keeps, per writer name, the incarnation
it last wrote for and the last sequence number written then, and decides each block that
arrives:

- `"write"`: the block is newer than anything written for that name (a later incarnation,
  or the same one with a larger number): write it, then `written` records it;
- `"duplicate"`: the same incarnation, a number already written (a block sent again);
- `"stale"`: an earlier incarnation than one already written (a block of a dead process
  that arrived after its successor's first).

Blocks of one writer reach the learner in the order it sent them (Ray runs one caller's
calls to one actor in order), so within an incarnation numbers only grow. The ledger is
what a learner's checkpoint saves beside its buffer: after a restore, blocks written
after that checkpoint are gone from the buffer and from the ledger alike, and a writer's
later blocks (larger numbers) are written; nothing is written twice.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Decision = Literal["write", "duplicate", "stale"]


@dataclasses.dataclass
class Entry:
    """One writer's line: its incarnation, the last block written in it (-1: none yet),
    and what was written for the name over all incarnations."""

    incarnation: int
    last: int = -1
    blocks: int = 0
    steps: int = 0


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

    def decide(self, name: str, incarnation: int, sequence: int) -> Decision:
        """What to do with block `sequence` of `name`'s `incarnation` (counts refusals)."""
        entry = self.entries.get(name)
        if entry is None or incarnation > entry.incarnation:
            return "write"
        if incarnation < entry.incarnation:
            self.stale += 1
            return "stale"
        if sequence <= entry.last:
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
        entry.last = sequence
        entry.blocks += 1
        entry.steps += steps

    def acknowledged(self) -> dict[str, tuple[int, int]]:
        """Name -> `(incarnation, last block written)`: what writers are told."""
        return {name: (e.incarnation, e.last) for name, e in self.entries.items()}

    def to_json(self) -> dict:
        """A JSON-ready form, for a checkpoint's metadata."""
        return {"entries": {name: dataclasses.asdict(e) for name, e in self.entries.items()},
                "duplicates": self.duplicates, "stale": self.stale}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict) -> Ledger:
        """The ledger `to_json` wrote; a `ValueError` names what is missing or wrong."""
        try:
            entries = {str(name): Entry(**{k: int(v) for k, v in e.items()})
                       for name, e in data["entries"].items()}  # fmt: skip
            return cls(entries, int(data["duplicates"]), int(data["stale"]))
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            raise ValueError(
                f"not a writer ledger saved by jaxbuf.ray ({type(error).__name__}: {error}); "
                "restore from a checkpoint that Ingest.save wrote."
            ) from error
