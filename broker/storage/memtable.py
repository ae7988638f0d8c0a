"""The memory table of one group: the entries not yet in segment files, and
the WAL generation each run of them was queued in.

Owns: `MemTable` (entries, first index, generation marks) and the rules that
keep the marks right when entries are written, overwritten, dropped after a
failed WAL write, or flushed into segments. Knows nothing of segments,
snapshots or the WAL itself: `GroupLog` (group.py) combines them.

Locking: no lock of its own; every call is made with the node lock held.

Invariants: `entries[k]` has index `first + k`; marks are in index order,
each mark's `first` lies inside the table, and generations never decrease
along the table (a write at i truncates everything >= i).

Imports: `types` only.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .types import Entry


@dataclass(frozen=True, slots=True)
class Mark:
    """Memory-table entries from index `first` on were queued in WAL generation `gen`."""

    gen: int
    first: int
    reset: bool


class MemTable:
    """Entries of one group still (also) held in memory; see the module docstring."""

    __slots__ = ("entries", "first", "marks")

    def __init__(self) -> None:
        # entries[k] has index first + k
        self.entries: list[Entry] = []
        self.first = 0
        self.marks: list[Mark] = []

    def reset(self, first: int) -> None:
        """Drop everything; the next entry written has index `first`."""
        self.entries.clear()
        self.marks.clear()
        self.first = first

    def put(self, f: int, entries: Sequence[Entry], gen: int, reset: bool) -> bool:
        """Write `entries` (from index `f`) queued in WAL generation `gen`:
        `reset` (the log restarts at f), an overwrite of the table's suffix, or
        else a fresh table at f. Returns whether the first record written must
        carry the RESET flag (a restart, or an overwrite of a restart)."""
        mem = self.entries
        marks = self.marks
        if reset:
            mem.clear()
            marks.clear()
            self.first = f
        elif mem and f >= self.first:
            del mem[f - self.first :]
        else:  # memory table empty, or overwrite reaching into the segments
            mem.clear()
            self.first = f
        keep_reset = reset
        while marks and marks[-1].first >= f:
            m = marks.pop()
            keep_reset = keep_reset or (m.first == f and m.reset)
        if not marks or marks[-1].gen != gen:
            marks.append(Mark(gen, f, keep_reset))
        mem.extend(entries)
        return keep_reset

    def truncate_from(self, i: int) -> None:
        """Drop entries >= i (a failed WAL write: they were never durable)."""
        if not self.entries:
            return
        k = max(i - self.first, 0)
        del self.entries[k:]
        while self.marks and self.marks[-1].first >= i:
            self.marks.pop()
        if not self.entries:
            self.marks.clear()

    def flush_portion(self, gen: int) -> tuple[list[Entry], bool] | None:
        """Entries queued in WAL generations <= gen (a prefix of the table) and
        whether the first of them restarts the log; None if there are none."""
        if not self.entries or not self.marks or self.marks[0].gen > gen:
            return None
        return self.entries[: self._end_of(gen) - self.first], self.marks[0].reset

    def drop_below(self, i: int) -> None:
        """Forget the entries below index `i`: released (below the snapshot and
        every live entry), so never read again. They stay in their WAL file
        until it is flushed, and are not written to segments then. Not across
        a restart of the log (a RESET mark first): the flush must still write
        that generation's first file, whose flag voids the older files."""
        if not self.entries or i <= self.first or self.marks[0].reset:
            return
        k = min(i - self.first, len(self.entries))
        del self.entries[:k]
        self.first += k
        if not self.entries:
            self.marks.clear()
            return
        first = self.first
        marks = self.marks
        n = 0  # marks starting at or before the new first: the last one stays, moved to it
        while n < len(marks) and marks[n].first <= first:
            n += 1
        head = marks[n - 1]
        self.marks = [Mark(head.gen, first, head.reset), *marks[n:]]

    def _end_of(self, gen: int) -> int:
        """The index after the last entry queued in a generation <= gen."""
        for m in self.marks:
            if m.gen > gen:
                return m.first
        return self.first + len(self.entries)

    def drop_flushed(self, gen: int) -> int | None:
        """Drop the entries of generations <= gen (now in segment files);
        returns the new first index, or None if nothing was dropped."""
        if not (self.entries and self.marks and self.marks[0].gen <= gen):
            return None
        keep_from = self._end_of(gen)
        del self.entries[: keep_from - self.first]
        self.first = keep_from
        self.marks = [m for m in self.marks if m.gen > gen]
        return keep_from
