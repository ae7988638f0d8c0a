"""The node's view of its log: durable storage (read-only LogStorage) plus the
in-memory `Unstable` tail that has been appended but not yet reported durable.

Pipeline position: RaftNode appends here; `RaftNode.ready()` hands the
unstable tail to the host ("in progress"); `RaftNode.persisted(seq)` moves it
to stable (the host has written it into storage by then).

Invariants:
- storage holds durable entries up to `unstable.offset - 1`; any storage entry
  at or beyond `unstable.offset` is stale (about to be overwritten) and is
  never read.
- applied <= applying <= committed <= last_index().
"""
from __future__ import annotations

from broker.raft.errors import Compacted, InvariantViolation, StorageError, Unavailable
from broker.raft.storage import LogStorage, limit_size
from broker.raft.types import Entry, Index, Snapshot, Term


class Unstable:
    """Entries (and possibly a snapshot) not yet durable.

    Invariant: entries[k].index == offset + k; the first `in_progress`
    entries (and the snapshot if snapshot_in_progress) were handed to the
    host in a Ready and are being written."""

    __slots__ = ("snapshot", "snapshot_in_progress", "entries", "offset", "in_progress")

    def __init__(self, offset: Index) -> None:
        self.snapshot: Snapshot | None = None
        self.snapshot_in_progress = False
        self.entries: list[Entry] = []
        self.offset: int = offset
        self.in_progress = 0

    def truncate_and_append(self, ents: list[Entry]) -> None:
        after = ents[0].index
        n = self.offset + len(self.entries)
        if after == n:
            self.entries.extend(ents)
        elif after <= self.offset:
            # Replace everything unstable (and the stale storage tail).
            self.offset = after
            self.entries = list(ents)
            self.in_progress = 0
        else:
            k = after - self.offset
            del self.entries[k:]
            self.entries.extend(ents)
            if self.in_progress > k:
                self.in_progress = k

    def stable_to(self, index: int, term: int) -> None:
        """Entries up to (index, term) are durable; drop them, unless the entry
        at index was since replaced by one of another term."""
        k = index - self.offset
        if k < 0 or k >= len(self.entries) or self.entries[k].term != term:
            return
        del self.entries[: k + 1]
        self.offset = index + 1
        self.in_progress = max(0, self.in_progress - (k + 1))

    def stable_snap_to(self, index: int) -> None:
        if self.snapshot is not None and self.snapshot.meta.index == index:
            self.snapshot = None
            self.snapshot_in_progress = False

    def restore(self, snap: Snapshot) -> None:
        self.snapshot = snap
        self.snapshot_in_progress = False
        self.entries = []
        self.offset = snap.meta.index + 1
        self.in_progress = 0


class RaftLog:
    __slots__ = ("storage", "unstable", "committed", "applying", "applied")

    def __init__(self, storage: LogStorage, applied: int = 0) -> None:
        self.storage = storage
        self.unstable = Unstable(Index(storage.last_index() + 1))
        first = storage.first_index()
        self.committed = first - 1
        # Everything up to the snapshot is in the state machine already.
        self.applied = max(first - 1, applied)
        self.applying = self.applied

    # --- queries ---
    def first_index(self) -> int:
        u = self.unstable
        if u.snapshot is not None:
            return u.snapshot.meta.index + 1
        return self.storage.first_index()

    def last_index(self) -> int:
        u = self.unstable
        if u.entries:
            return u.offset + len(u.entries) - 1
        if u.snapshot is not None:
            return u.snapshot.meta.index
        return u.offset - 1

    def durable_index(self) -> int:
        """Last index that is durable and belongs to this log (-1 if a
        snapshot is pending)."""
        u = self.unstable
        if u.snapshot is not None:
            return -1
        return u.offset - 1

    def last_term(self) -> int:
        return self.term(self.last_index())

    def term(self, i: int) -> int:
        """Term at index i; raises Compacted / Unavailable."""
        u = self.unstable
        k = i - u.offset
        if k >= 0:
            if k < len(u.entries):
                return u.entries[k].term
            raise Unavailable(f"term({i}): last index is {self.last_index()}")
        if u.snapshot is not None:
            si = u.snapshot.meta.index
            if i == si:
                return u.snapshot.meta.term
            raise Compacted(f"term({i}): below pending snapshot {si}")
        return self.storage.term(Index(i))

    def match_term(self, i: int, t: int) -> bool:
        try:
            return self.term(i) == t
        except StorageError:
            return False

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """§5.4.1: the candidate's log is at least as up-to-date as ours."""
        lt = self.last_term()
        return last_term > lt or (last_term == lt and last_index >= self.last_index())

    def slice(self, lo: int, hi: int, max_bytes: int | None) -> list[Entry]:
        """Entries [lo, hi) limited to max_bytes (at least one entry)."""
        if lo >= hi:
            return []
        if lo < self.first_index():
            raise Compacted(f"entries from {lo}: first index is {self.first_index()}")
        if hi > self.last_index() + 1:
            raise InvariantViolation(f"slice [{lo},{hi}) beyond last index {self.last_index()}")
        u = self.unstable
        off = u.offset
        if lo >= off:
            ents = u.entries[lo - off : hi - off]
            return limit_size(ents, max_bytes)
        ents = self.storage.entries(Index(lo), Index(min(hi, off)), max_bytes)
        if hi > off and len(ents) == off - lo:
            ents = limit_size(ents + u.entries[: hi - off], max_bytes)
        return ents

    def find_conflict(self, ents: list[Entry]) -> int:
        """Index of the first entry of ents that conflicts with (or extends)
        our log; 0 if every entry is already present."""
        last = self.last_index()
        for e in ents:
            if e.index > last:
                return e.index
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def find_conflict_by_term(self, index: int, term: int) -> int:
        """Largest i <= index whose term <= term (the fast back-off hint)."""
        first = self.first_index()
        i = index
        while i >= first:
            try:
                if self.term(i) <= term:
                    return i
            except StorageError:
                return i
            i -= 1
        return i  # first - 1: the snapshot point

    # --- mutations ---
    def append(self, ents: list[Entry]) -> int:
        if not ents:
            return self.last_index()
        if ents[0].index - 1 < self.committed:
            raise InvariantViolation(
                f"append at {ents[0].index} would overwrite committed entries (commit {self.committed})"
            )
        self.unstable.truncate_and_append(ents)
        return self.last_index()

    def maybe_append(
        self, prev_index: int, prev_term: int, commit: int, ents: list[Entry]
    ) -> tuple[int, list[Entry]] | None:
        """Follower side of AppendEntries (§5.3). Returns (last new index,
        the entries actually appended) or None when the logs do not match at
        prev_index. Entries already present are left alone (a delayed or
        duplicated append must not truncate newer entries)."""
        if not self.match_term(prev_index, prev_term):
            return None
        last_new = prev_index + len(ents)
        ci = self.find_conflict(ents) if ents else 0
        appended: list[Entry] = []
        if ci:
            if ci <= self.committed:
                raise InvariantViolation(
                    f"entry {ci} conflicts with the committed log (commit {self.committed})"
                )
            appended = ents[ci - prev_index - 1 :]
            self.append(appended)
        self.commit_to(min(commit, last_new))
        return last_new, appended

    def commit_to(self, i: int) -> bool:
        if i > self.committed:
            if i > self.last_index():
                raise InvariantViolation(
                    f"commit {i} beyond last index {self.last_index()}"
                )
            self.committed = i
            return True
        return False

    def restore(self, snap: Snapshot) -> None:
        self.committed = snap.meta.index
        self.applying = snap.meta.index
        self.unstable.restore(snap)

    def next_committed(self) -> list[Entry]:
        """Committed entries not yet handed out for applying; only entries
        that are durable locally."""
        hi = min(self.committed, self.durable_index())
        lo = self.applying + 1
        if hi < lo:
            return []
        return self.slice(lo, hi + 1, None)

    def has_next_committed(self) -> bool:
        return min(self.committed, self.durable_index()) > self.applying


__all__ = ["RaftLog", "Unstable", "Term"]
