"""The narrow read protocol the Raft core needs from durable storage, and an
in-memory implementation for tests, the simulator and the benchmark.

Pipeline position: the core only ever *reads* storage (LogStorage). The host
writes what `Ready` hands it (entries, hard state, snapshots) into its storage
and then tells the node via `RaftNode.persisted(seq)`. broker/storage's WAL +
segment store is adapted to this protocol by the runtime.

Index conventions (as etcd's Storage): storage holds a snapshot at
(snap_index, snap_term) and the entries snap_index+1 .. last_index.
`first_index() == snap_index + 1`; `term(snap_index)` is answerable;
`term(i)` for i < snap_index raises Compacted, for i > last_index Unavailable.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Protocol

from broker.raft.errors import Compacted, InvariantViolation, RaftUsageError, Unavailable
from broker.raft.types import (
    EMPTY_HARD_STATE,
    ENTRY_OVERHEAD,
    Entry,
    EntryKind,
    HardState,
    Index,
    Membership,
    NodeId,
    Snapshot,
    SnapshotMeta,
    Term,
    entry_size,
)


class LogStorage(Protocol):
    def initial_state(self) -> tuple[HardState, Membership]:
        """The durable hard state and the membership *as of the snapshot*
        (the node replays committed CONFIG entries above it itself)."""
        ...

    def entries(self, lo: Index, hi: Index, max_bytes: int | None) -> list[Entry]:
        """Entries [lo, hi). With max_bytes, stop once the total size would
        exceed it, but always return at least one entry if lo < hi.
        Raises Compacted if lo < first_index(), Unavailable if hi > last_index()+1."""
        ...

    def term(self, index: Index) -> Term:
        """Term of the entry at index; valid for first_index()-1 .. last_index()."""
        ...

    def first_index(self) -> Index: ...

    def last_index(self) -> Index: ...

    def snapshot(self) -> Snapshot:
        """The latest snapshot (index 0 / empty data if none was taken)."""
        ...


def limit_size(ents: list[Entry], max_bytes: int | None) -> list[Entry]:
    """Prefix of ents whose total entry_size stays within max_bytes (>= 1 entry)."""
    if max_bytes is None or not ents:
        return ents
    # Fast path (C-level loop): everything fits.
    if sum(map(len, map(_data_of, ents))) + ENTRY_OVERHEAD * len(ents) <= max_bytes:
        return ents
    total = 0
    for i, e in enumerate(ents):
        total += len(e.data) + ENTRY_OVERHEAD
        if total > max_bytes and i > 0:
            return ents[:i]
    return ents


_data_of = attrgetter("data")


class MemoryStorage:
    """LogStorage in memory. `_ents[0]` is a dummy entry standing for the
    snapshot point (index snap_index, term snap_term)."""

    __slots__ = ("_hard_state", "_snapshot", "_ents")

    def __init__(self, voters: Iterable[str] = (), learners: Iterable[str] = ()) -> None:
        config = Membership(
            frozenset(NodeId(v) for v in voters), frozenset(NodeId(n) for n in learners)
        )
        self._hard_state = EMPTY_HARD_STATE
        self._snapshot = Snapshot(SnapshotMeta(Index(0), Term(0), config), b"")
        # Invariant: _ents[k].index == _ents[0].index + k.
        self._ents: list[Entry] = [Entry(Term(0), Index(0), EntryKind.NOOP, b"")]

    # --- LogStorage ---
    def initial_state(self) -> tuple[HardState, Membership]:
        return self._hard_state, self._snapshot.meta.config

    def entries(self, lo: Index, hi: Index, max_bytes: int | None) -> list[Entry]:
        offset = self._ents[0].index
        if lo <= offset:
            raise Compacted(f"entries from {lo}: compacted up to {offset}")
        if hi > self.last_index() + 1:
            raise Unavailable(f"entries up to {hi}: last index is {self.last_index()}")
        return limit_size(self._ents[lo - offset : hi - offset], max_bytes)

    def term(self, index: Index) -> Term:
        offset = self._ents[0].index
        if index < offset:
            raise Compacted(f"term({index}): compacted up to {offset}")
        if index - offset >= len(self._ents):
            raise Unavailable(f"term({index}): last index is {self.last_index()}")
        return self._ents[index - offset].term

    def first_index(self) -> Index:
        return Index(self._ents[0].index + 1)

    def last_index(self) -> Index:
        return Index(self._ents[0].index + len(self._ents) - 1)

    def snapshot(self) -> Snapshot:
        return self._snapshot

    # --- writes (the host's side) ---
    def hard_state(self) -> HardState:
        return self._hard_state

    def set_hard_state(self, hs: HardState) -> None:
        self._hard_state = hs

    def append(self, entries: Sequence[Entry]) -> None:
        """Append entries, truncating any existing suffix they overlap
        (a follower's log being corrected by the leader)."""
        if not entries:
            return
        first = self.first_index()
        last = entries[0].index + len(entries) - 1
        if last < first:
            return  # all already compacted into the snapshot
        if first > entries[0].index:
            entries = entries[first - entries[0].index :]
        offset = entries[0].index - self._ents[0].index
        n = len(self._ents)
        if offset == n:
            self._ents.extend(entries)
        elif offset < n:
            del self._ents[offset:]
            self._ents.extend(entries)
        else:
            raise InvariantViolation(
                f"gap in log: appending at {entries[0].index}, last is {self.last_index()}"
            )

    def create_snapshot(self, index: Index, config: Membership, data: bytes) -> Snapshot:
        """Record a snapshot of the state machine at `index` (<= last_index)."""
        if index <= self._snapshot.meta.index:
            raise RaftUsageError(f"snapshot at {index} is not newer than {self._snapshot.meta.index}")
        if index > self.last_index():
            raise RaftUsageError(f"snapshot at {index} beyond last index {self.last_index()}")
        snap = Snapshot(SnapshotMeta(index, self.term(index), config), data)
        self._snapshot = snap
        return snap

    def compact(self, index: Index) -> None:
        """Discard entries up to and including `index` (which must be covered
        by the latest snapshot, so a lagging follower can still be served)."""
        offset = self._ents[0].index
        if index <= offset:
            return
        if index > self._snapshot.meta.index:
            raise RaftUsageError(f"compact({index}) beyond snapshot {self._snapshot.meta.index}")
        k = index - offset
        self._ents = [Entry(self._ents[k].term, index, EntryKind.NOOP, b"")] + self._ents[k + 1 :]

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Install a snapshot received from the leader: the log restarts after it."""
        if snap.meta.index <= self._snapshot.meta.index:
            return
        self._snapshot = snap
        self._ents = [Entry(snap.meta.term, snap.meta.index, EntryKind.NOOP, b"")]


__all__ = ["LogStorage", "MemoryStorage", "limit_size", "entry_size"]
