"""GroupLog: the durable log of one Raft group on this node (public surface,
re-exported by `broker.storage` and `broker.storage.manager`).

Pipeline position: the Raft driver in broker/runtime hands each group's
`Ready` to `append` / `set_hard_state`; these update the memory table at
once and queue encoded records for the node's WAL writer (`Wal.submit`).
Reads go: memory table -> segment files (through the node's cache of open
segment readers, `SegmentCache.reader`; each entry, and each slot's term, is
served only after its entry's crc was checked).

Owns one group's in-memory state: its memory table (memtable.py), its
segment files and their composition (segments.SegmentSet), snapshot meta,
hard states, durable index, release bound, write-error epoch and failure;
and the Raft rules over them (overwrite, restart after a snapshot, snapshot
reconciliation and fallback, release, compaction).

It shares with its LogManager only a `NodeShared` (the node lock, config,
WAL, segment cache, closed flag). The LogManager and the WAL writer call it
through these methods, all with the node lock held: `wal_written` /
`wal_failed` (WalGroup, after each batch), `flush_portion` /
`install_flushed` (segment writer), `reopen`, `mark_deleted`,
`holds_all_after`, `drop_void_leading` (open/delete).

Locking: the node-wide lock (`NodeShared.lock`) guards all in-memory state.
It is never held across a WAL write/fsync; it is held across segment reads
(page-cache preads) and the short install step of a flush.

Invariants:
- the log is contiguous: visible segment entries, then the memory table;
- `durable_index() <= last_index()` and every entry <= durable_index() is on
  disk (WAL fsynced or segment fsynced) exactly as it is served;
- memory entries carry the WAL generation they were queued in, and
  generations never decrease along the log (a write at i truncates >= i).

Imports: `codec`, `files`, `types`, `errors`, `memtable`, `segments`,
`snapshots`, `compaction`, `wal`; never `manager` or `recovery`.

Why this file is over ~600 lines: it is one class whose methods all work on
one lock-protected state (the Raft log rules: append/overwrite/restart,
reads, snapshot reconciliation, release, compaction's swap); the file work
is already out (segments.py, snapshots.py, compaction.py, memtable.py), and
splitting the rules themselves would scatter the invariants above.
"""
from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import broker.storage.codec as codec
import broker.storage.compaction as compaction
import broker.storage.snapshots as snapshots

from .errors import (
    CompactedError,
    CorruptionError,
    CorruptSegmentError,
    CorruptSnapshotError,
    GroupAlreadyOpenError,
    GroupClosedError,
    GroupFailedError,
    InvalidEntriesError,
    InvariantError,
    LogGapError,
    StorageError,
    StorageIOError,
    UnavailableError,
)
from .files import read_file, write_file_atomic
from .memtable import MemTable
from .segments import SegFile, SegmentCache, SegmentSet, SegReader, read_range, unlink_segments
from .types import Entry, HardState, Snapshot, SnapshotMeta, StorageConfig
from .wal import OnDurable, OnError, Pending, Wal

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class NodeShared:
    """What every GroupLog of a node shares with its LogManager."""

    #: the node-wide lock: guards the in-memory state of every group, the
    #: open groups, the segment cache and the WAL's generation
    lock: threading.Lock
    config: StorageConfig
    #: False only with sync_method "none" (benchmarks, logic tests)
    do_sync: bool
    wal: Wal
    cache: SegmentCache
    #: True until LogManager.open() has recovered, and after close(); under `lock`
    closed: bool = True


#: entry classes `GroupLog.append` stores as they are, not converted to Entry
_STORED_AS_IS: set[type] = {Entry}


def accept_entry_type(cls: type) -> None:
    """Let `GroupLog.append` store entries of `cls` as they are: its
    instances must be immutable, with int `index`, `term` and `kind` (an int
    subclass will do) and bytes `data` (still checked for each entry). Reads
    then return them as appended (while in memory). The Raft layer's entries
    are (runtime/raft_group.py): a conversion per entry each way, ~1.5 us of
    a message's ~40 on the leader, is saved."""
    _STORED_AS_IS.add(cls)


def _as_entry(e: object) -> Entry:
    """Convert a duck-typed entry (e.g. the Raft layer's) into a storage Entry."""
    try:
        return Entry(
            int(e.index),  # type: ignore[attr-defined]
            int(e.term),  # type: ignore[attr-defined]
            bytes(e.data),  # type: ignore[attr-defined]
            int(getattr(e, "kind", 0)),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise InvalidEntriesError(f"not a valid entry: {e!r}") from exc


class GroupLog:
    """The durable log of one Raft group on this node. Obtain it from
    `LogManager.open_group`. Thread-safe; callbacks run on the WAL writer thread."""

    def __init__(
        self,
        node: NodeShared,
        group_id: str,
        ref: int,
        path: str,
        files: list[SegFile],
        snapshot: SnapshotMeta | None,
        hard_state: HardState,
        on_durable: OnDurable | None,
        on_error: OnError | None,
    ) -> None:
        self._node = node
        self._lock = node.lock
        self._wal = node.wal
        self._cache = node.cache
        self.group_id = group_id
        self.path = path
        self._ref = ref
        self._on_durable = on_durable
        self._on_error = on_error
        self._segs = SegmentSet(files)
        self._mem = MemTable()
        self._snapshot = snapshot
        # release(): entries below this are not needed (below the snapshot and
        # the smallest live index); segment files written later (a flush of
        # the memory table) that hold only such entries are dropped too
        self._release_bound = 0
        # a flush of this group is between flush_portion and install_flushed
        self._flushing = False
        self._hs = hard_state
        self._durable_hs = hard_state
        self._epoch = 0  # bumped on a write error: queued appends of older epochs are dropped
        self._failed: BaseException | None = None
        # the write error that dropped this group's not-durable writes, until
        # the handle is reopened (see wal_failed)
        self._io_error: StorageIOError | None = None
        self._closed = False
        # Test hook: called with the name of each step of compact() as it is
        # passed ("written", "renamed", "dir_synced", "unlinked") so crash
        # tests can kill the process there. None in production.
        self._compact_hook: Callable[[str], None] | None = None
        last = self._log_last()
        self._durable = last if last is not None else self._empty_last()
        self._reconcile_with_snapshot()

    def _reconcile_with_snapshot(self) -> None:
        """Raft's rule for a snapshot (lock held or not yet shared): if the log
        holds the snapshot's entry with the snapshot's term, the log is
        consistent with it and stays; otherwise (a snapshot installed from a
        leader over a stale or shorter log) every entry, below and above the
        snapshot, is discarded: the log restarts after the snapshot. Reads stop
        seeing the discarded entries at once; on disk they are voided by the
        reset flag of the next append (and this check runs again at every
        open, so a crash in between changes nothing)."""
        snap = self._snapshot
        first, last = self._log_first(), self._log_last()
        if snap is None or first is None or last is None or first > snap.index:
            return  # no log, or a log that restarted after the snapshot
        if last >= snap.index:
            try:
                if self._entry_term_locked(snap.index) == snap.term:
                    return
            except CompactedError:
                # compacted away: this is an older (fallback) snapshot below a
                # compaction; the fallback check refuses it, never discard here
                return
            except StorageError as exc:
                # Unreadable: never guess (discarding could drop live bodies
                # below a local snapshot); the group stops instead.
                self._fail(exc)
                return
        log.info("storage: group %r: snapshot %d/%d does not match the log: discarding the log",
                 self.group_id, snap.index, snap.term)
        self._mem.reset(snap.index + 1)
        self._segs.set_clip(0)
        self._durable = snap.index

    # ----- composition (lock held)
    def _log_first(self) -> int | None:
        pieces = self._segs.pieces
        mem = self._mem
        if pieces and (not mem.entries or pieces[0][0] < mem.first):
            return pieces[0][0]
        return mem.first if mem.entries else None

    def _log_last(self) -> int | None:
        mem = self._mem
        if mem.entries:
            return mem.first + len(mem.entries) - 1
        pieces = self._segs.pieces
        return pieces[-1][1] if pieces else None

    def _empty_last(self) -> int:
        return self._snapshot.index if self._snapshot is not None else 0

    def _check(self) -> None:
        if self._closed or self._node.closed:
            raise GroupClosedError(f"group {self.group_id!r} is closed")
        if self._failed is not None:
            raise GroupFailedError(
                f"group {self.group_id!r} stopped: {self._failed}"
            ) from self._failed

    def _fail(self, exc: BaseException) -> None:
        if self._failed is None:
            self._failed = exc
            log.error("storage: group %r stopped: %s", self.group_id, exc)

    def _broken(self, what: str) -> InvariantError:
        """A read would serve entries other than those asked for (a bug): stop the group."""
        exc = InvariantError(f"group {self.group_id!r}: {what}")
        self._fail(exc)
        return exc

    # ----- queries
    def first_index(self) -> int:
        """Smallest retained index (entries below the snapshot stay until released)."""
        with self._lock:
            self._check()
            first = self._log_first()
            return first if first is not None else self._empty_last() + 1

    def last_index(self) -> int:
        """max(last entry, snapshot index)."""
        with self._lock:
            self._check()
            return self._last_index_locked()

    def last_entry_index(self) -> int:
        """Index of the last entry held (below last_index() right after a
        snapshot install past the log); first_index() - 1 if none."""
        with self._lock:
            self._check()
            last = self._log_last()
            if last is not None:
                return last
            first = self._log_first()
            return (first if first is not None else self._empty_last() + 1) - 1

    def _last_index_locked(self) -> int:
        last = self._log_last()
        return max(last if last is not None else 0, self._empty_last())

    def durable_index(self) -> int:
        """Every entry <= this index is on disk (fsynced)."""
        with self._lock:
            self._check()
            return self._durable

    def hard_state(self) -> HardState:
        """Latest hard state set (recovered one after a restart)."""
        with self._lock:
            self._check()
            return self._hs

    def durable_hard_state(self) -> HardState:
        with self._lock:
            self._check()
            return self._durable_hs

    def snapshot_meta(self) -> SnapshotMeta | None:
        with self._lock:
            self._check()
            return self._snapshot

    # The group's bootstrap record: what its host decided when the group was
    # created here (e.g. the Raft configuration to start from), kept beside
    # the log so every restart decides the same. Written once, durably.
    _BOOTSTRAP = "bootstrap"

    def read_bootstrap(self) -> bytes | None:
        """The bootstrap record, or None if this group has none."""
        self._check()
        try:
            return read_file(os.path.join(self.path, self._BOOTSTRAP))
        except FileNotFoundError:
            return None

    def write_bootstrap(self, data: bytes) -> None:
        """Write the bootstrap record (tmp + fsync + rename + dir fsync)."""
        self._check()
        try:
            write_file_atomic(os.path.join(self.path, self._BOOTSTRAP), [data])
        except OSError as exc:
            raise StorageIOError(exc.errno or 5, f"group {self.group_id!r}: writing its bootstrap "
                                                 f"record: {exc.strerror or exc}") from exc

    @property
    def failed(self) -> BaseException | None:
        """The error that stopped this group, if any."""
        return self._failed

    def settled(self) -> bool:
        """Usable, and nothing written is still on its way to disk (every
        entry and the hard state set are durable): what a member stopped by
        a failed write waits for before a new one starts over this handle
        (the runtime's restart of queue members and of the metadata group)."""
        with self._lock:
            if self._closed or self._node.closed or self._failed is not None:
                return False
            return self._last_index_locked() == self._durable and self._hs == self._durable_hs

    @property
    def io_failed(self) -> bool:
        """A WAL write of this group failed since it was opened (its
        not-durable entries were dropped; see `wal_failed`)."""
        return self._io_error is not None

    def term(self, index: int) -> int:
        """Term of entry `index` (or of the snapshot at `index`; term(0) == 0)."""
        with self._lock:
            self._check()
            return self._term_locked(index)

    def _term_locked(self, index: int) -> int:
        # The snapshot's term is authoritative at its index (a snapshot
        # installed from a leader may sit on a stale local entry).
        snap = self._snapshot
        if snap is not None and index == snap.index:
            return snap.term
        return self._entry_term_locked(index)

    def _entry_term_locked(self, index: int) -> int:
        """Term of the log entry `index` itself (not the snapshot's)."""
        mem = self._mem.entries
        mem_first = self._mem.first
        if mem and mem_first <= index < mem_first + len(mem):
            return mem[index - mem_first].term
        snap = self._snapshot
        if index == 0:
            return 0
        piece = self._piece_for(index)
        if piece is not None:
            reader = self._reader(piece[2])
            try:
                term = reader.checked_term(index)  # a term only from a checked entry
            except CorruptSegmentError as exc:
                self._fail(exc)
                raise
            if term is None:
                if reader.idxs is not None:
                    raise CompactedError(f"group {self.group_id!r}: index {index} is compacted")
                raise self._broken(f"{piece[2].path}: no slot for entry {index}")
            return term
        first = self._log_first()
        if index <= self._last_index_locked() and (
                first is None or index < first or (snap is not None and index < snap.index)):
            raise CompactedError(f"group {self.group_id!r}: index {index} is compacted")
        raise UnavailableError(f"group {self.group_id!r}: index {index} is beyond the log")

    def _piece_for(self, index: int) -> tuple[int, int, SegFile] | None:
        segs = self._segs
        k = bisect.bisect_right(segs.piece_los, index) - 1
        if k < 0:
            return None
        piece = segs.pieces[k]
        hi = piece[1]
        if self._mem.entries:
            hi = min(hi, self._mem.first - 1)
        return piece if index <= hi else None

    def _reader(self, f: SegFile) -> SegReader:
        try:
            return self._cache.reader(f)
        except CorruptionError as exc:
            self._fail(exc)
            raise

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi). With max_bytes, stop once the data exceeds it
        (always at least one entry). Raises CompactedError / UnavailableError."""
        with self._lock:
            self._check()
            if lo > hi:
                raise ValueError(f"entries(lo={lo}, hi={hi}): lo > hi")
            if lo == hi:
                return []
            first = self._log_first()
            last = self._log_last()
            if first is None or last is None:
                if lo <= self._empty_last():
                    raise CompactedError(f"group {self.group_id!r}: index {lo} is compacted")
                raise UnavailableError(f"group {self.group_id!r}: [{lo}, {hi}) beyond the log")
            if lo < first:
                raise CompactedError(f"group {self.group_id!r}: index {lo} is compacted")
            if hi > last + 1:
                raise UnavailableError(
                    f"group {self.group_id!r}: [{lo}, {hi}) beyond last index {last}"
                )
            out: list[Entry] = []
            size = 0
            i = lo
            mem_first = self._mem.first if self._mem.entries else last + 1
            while i < hi and i < mem_first:
                piece = self._piece_for(i)
                if piece is None:
                    raise CompactedError(f"group {self.group_id!r}: index {i} not in any segment")
                stop = min(hi - 1, piece[1], mem_first - 1)
                got, size, full = self._read_segment(piece[2], i, stop, size, max_bytes, bool(out))
                out.extend(got)
                if full:
                    return out
                i = stop + 1
            if i < hi:
                chunk = self._mem.entries[i - mem_first : hi - mem_first]
                if max_bytes is None:
                    out.extend(chunk)
                else:
                    for e in chunk:
                        size += len(e.data)
                        if size > max_bytes and out:
                            break
                        out.append(e)
            return out

    def _read_segment(
        self, f: SegFile, lo: int, hi: int, size: int, max_bytes: int | None, have: bool
    ) -> tuple[list[Entry], int, bool]:
        reader = self._reader(f)
        try:
            return read_range(reader, self.group_id, lo, hi, size, max_bytes, have)
        except (InvariantError, CorruptSegmentError) as exc:
            self._fail(exc)
            raise

    # ----- writes
    def _after_failure(self, what: str) -> StorageIOError:
        """A write that needs what a failed WAL write dropped (lock held)."""
        err = self._io_error
        assert err is not None
        return StorageIOError(err.errno or 5, f"group {self.group_id!r}: {what} needs writes "
                                              f"that failed: {err.strerror or err}")

    def append(self, entries: Sequence[Entry]) -> None:
        """Queue entries for the WAL (non-blocking). If entries[0].index <=
        last_index() this is an overwrite: the suffix from there is dropped
        first. A first index past last_index() + 1 is allowed only right after
        a snapshot at first - 1 (the log then restarts there)."""
        if not entries:
            return
        ref = self._ref
        enc = codec.encode_entry_header
        # hot path: validation and encoding inlined (this runs per entry)
        pack_rest = codec.REC_REST.pack
        pack_crc = codec.REC_CRC.pack
        crc32 = codec.crc32
        rec_entry = codec.REC_ENTRY
        parts: list[bytes] = []
        add = parts.append
        nbytes = 0
        checked: list[Entry] = entries if type(entries) is list else list(entries)
        converted = False
        prev_index = checked[0].index - 1
        prev_term = 0
        as_is = _STORED_AS_IS
        try:
            for n, e in enumerate(checked):
                if type(e) not in as_is or type(e.data) is not bytes:
                    e = _as_entry(e)
                    if not converted:
                        checked = list(checked)
                        converted = True
                    checked[n] = e
                data = e.data
                index = e.index
                term = e.term
                if index != prev_index + 1 or term < prev_term:
                    raise InvalidEntriesError(
                        f"entries must have consecutive indexes and non-decreasing terms; got "
                        f"{index}/{term} after {prev_index}/{prev_term}"
                    )
                prev_index = index
                prev_term = term
                rest = pack_rest(len(data), rec_entry, e.kind, 0, ref, index, term)
                add(pack_crc(crc32(data, crc32(rest))) + rest)
                add(data)
                nbytes += 32 + len(data)
        except struct.error as exc:
            raise InvalidEntriesError(
                f"entry {prev_index + 1}: index/term must be u64 and kind 0..255 ({exc})"
            ) from exc
        if checked[0].index < 1:
            raise InvalidEntriesError(f"indexes start at 1, got {checked[0].index}")
        f = checked[0].index
        with self._lock:
            self._check()
            last = self._log_last()
            first = self._log_first()
            snap = self._snapshot
            reset = False
            if last is None or f > last + 1:
                # a hole is only allowed right after a snapshot that covers it: the log restarts
                if snap is not None and f == snap.index + 1 and (last is None or last <= snap.index):
                    reset = True
                elif not (last is None and snap is None and f == 1):
                    if self._io_error is not None:
                        raise self._after_failure(f"append at {f}")
                    raise LogGapError(
                        f"group {self.group_id!r}: append at {f} but last index is "
                        f"{last if last is not None else self._empty_last()}"
                    )
            elif first is not None and f < first:
                raise InvalidEntriesError(
                    f"group {self.group_id!r}: cannot overwrite index {f} below first index {first}"
                )
            if not reset and f > 1:
                try:
                    before = self._term_locked(f - 1)
                except (CompactedError, UnavailableError):
                    before = 0
                if checked[0].term < before:
                    raise InvalidEntriesError(
                        f"group {self.group_id!r}: entry {f} term {checked[0].term} < term "
                        f"{before} of entry {f - 1}"
                    )
            mem = self._mem
            segs = self._segs
            if reset:
                segs.set_clip(0)
            elif not (mem.entries and f >= mem.first):
                # memory table empty, or overwrite reaching into the segments
                if segs.clip != f - 1:
                    segs.set_clip(f - 1)
            if mem.put(f, checked, self._wal.gen, reset):
                parts[0] = enc(ref, f, checked[0].term, checked[0].kind, checked[0].data, True)
            if reset:
                self._durable = f - 1
            elif self._durable >= f:
                self._durable = f - 1
            self._wal.submit(Pending(self, self._epoch, parts, nbytes, checked[-1], None, None,
                                     ref=ref))

    def set_hard_state(self, hs: HardState) -> None:
        """Queue the hard state; it is written in the same WAL batch/fsync as
        entries queued before it. durable_hard_state() reflects it once durable."""
        if hs.term < 0 or hs.commit < 0:
            raise ValueError(f"bad hard state {hs!r}")
        rec = codec.encode_hard_state(self._ref, hs.term, hs.voted_for, hs.commit)
        with self._lock:
            self._check()
            if self._io_error is not None and hs.commit > self._last_index_locked():
                raise self._after_failure(f"hard state commit {hs.commit}")
            self._hs = hs
            self._wal.submit(Pending(self, self._epoch, [rec], len(rec), None, hs, rec,
                                     ref=self._ref))

    # ----- WAL writer interface (WalGroup; lock held for the two calls)
    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def on_durable(self) -> OnDurable | None:
        return self._on_durable

    @property
    def on_error(self) -> OnError | None:
        return self._on_error

    def wal_written(self, last_entry: Entry | None, hs: HardState | None) -> tuple[int, int]:
        """The batch holding `last_entry` / `hs` is durable: (durable index, its term)."""
        if last_entry is not None:
            i = last_entry.index
            mem = self._mem.entries
            k = i - self._mem.first
            if mem and 0 <= k < len(mem) and mem[k] is last_entry:
                self._durable = i
        if hs is not None:
            self._durable_hs = hs
        try:
            term = self._term_locked(self._durable)
        except (StorageError, OSError):
            term = 0
        return self._durable, term

    def wal_failed(self, err: StorageIOError) -> None:
        """Drop everything not durable: the caller re-appends from
        durable_index() + 1 after on_error. Until then (on_error reaches its
        loop later), a write that builds on what was dropped raises `err`
        instead of being queued: an append past the new end (it would be a
        gap) and a hard state committing beyond it. So the group stops on
        the write error itself, and no hard state can become durable with a
        commit index its durable log does not reach."""
        self._io_error = err
        self._epoch += 1
        self._mem.truncate_from(self._durable + 1)
        self._hs = self._durable_hs

    # ----- segment writer interface (lock held)
    def flush_portion(self, gen: int) -> tuple[list[Entry], bool, list[int]] | None:
        """Entries queued in WAL generations <= gen (a prefix of the memory
        table), whether they restart the log, and the seqs of their files."""
        got = self._mem.flush_portion(gen)
        if got is None:
            return None
        self._flushing = True  # until install_flushed: see release()
        portion, reset = got
        n = self._node.config.segment_max_entries
        nfiles = (len(portion) + n - 1) // n
        return portion, reset, self._segs.take_seqs(nfiles)

    def install_flushed(self, gen: int, files: list[SegFile]) -> list[SegFile]:
        """Add flushed segment files; drop generation <= gen from memory.
        Returns leading files now void in the segment-only composition or
        wholly below the release bound (to delete: a release that came while
        their entries were still only in the WAL); their readers are evicted."""
        self._flushing = False
        keep_from = self._mem.drop_flushed(gen)
        self._segs.add(files, None if keep_from is None else keep_from - 1)
        dropped = self._segs.drop_leading(self._release_bound)
        for f in dropped:
            self._cache.evict(f.path)
        return dropped

    # ----- LogManager interface (lock held)
    def reopen(self, on_durable: OnDurable | None, on_error: OnError | None) -> None:
        """open_group() of a closed handle: use it again with these callbacks."""
        if not self._closed:
            raise GroupAlreadyOpenError(f"group {self.group_id!r} is already open")
        self._closed = False
        self._io_error = None
        self._on_durable, self._on_error = on_durable, on_error

    def mark_deleted(self) -> None:
        """delete_group(): every later call raises; close its cached readers."""
        self._closed = True
        self._failed = GroupClosedError(f"group {self.group_id!r} was deleted")
        for f in self._segs.files:
            self._cache.evict(f.path)

    def drop_void_leading(self) -> list[SegFile]:
        """At open: remove the leading files that are void (to delete)."""
        return self._segs.drop_leading(0)

    def holds_all_after(self, have: int) -> bool:
        """Does the log hold every entry after index `have` (none released,
        none compacted away)? Decides whether falling back to an older
        snapshot at `have` is sound."""
        first = self._log_first()
        if first is None or first > have + 1:
            return False
        return not any(f.sparse and hi > have for _lo, hi, f in self._segs.pieces)

    # ----- snapshots and truncation
    def save_snapshot(self, index: int, term: int, config: bytes, data: bytes) -> SnapshotMeta:
        """Write a snapshot durably (tmp, fsync, rename, dir fsync); blocking.
        Keeps the previous snapshot file as a fallback, deletes older ones.
        A failed write raises StorageIOError and changes nothing."""
        with self._lock:
            self._check()
            cur = self._snapshot
            if index < 1 or term < 0:
                raise ValueError(f"snapshot index must be >= 1 and term >= 0, got {index}/{term}")
            if cur is not None and index < cur.index:
                raise ValueError(
                    f"group {self.group_id!r}: snapshot {index} is older than current {cur.index}"
                )
        snapdir = os.path.join(self.path, "snapshots")
        try:
            meta = snapshots.write_snapshot(snapdir, index, term, config, data, self._node.do_sync)
        except OSError as exc:
            # Nothing changed: the tmp file is gone, the previous snapshot and
            # the log stand. The caller decides (a local snapshot retries
            # later; an installed one stops the group).
            raise StorageIOError(exc.errno or 5, f"group {self.group_id!r}: writing snapshot {index}: "
                                                 f"{exc.strerror or exc}") from exc
        with self._lock:
            if self._snapshot is None or self._snapshot.index <= index:
                self._snapshot = meta
                self._reconcile_with_snapshot()
        snapshots.prune_snapshots(snapdir, keep=2)
        return meta

    def latest_snapshot(self) -> Snapshot | None:
        """The newest valid snapshot on disk (config + data), or None.

        Falling back to an older snapshot (the newest is unreadable) is only
        allowed while the log still holds every entry after the older one;
        otherwise entries would be silently skipped, so the group stops with
        CorruptSnapshotError."""
        with self._lock:
            self._check()
        found = snapshots.load_latest_snapshot(os.path.join(self.path, "snapshots"))
        with self._lock:
            want = self._snapshot
            if want is not None and (found is None or found.meta.index < want.index):
                have = found.meta.index if found is not None else 0
                if not self.holds_all_after(have):
                    exc = CorruptSnapshotError(
                        f"group {self.group_id!r}: snapshot {want.index} is unreadable and the log "
                        f"no longer holds the entries after {'snapshot ' + str(have) if have else 'the start'}")
                    self._fail(exc)
                    raise exc
        return found

    def release(self, smallest_live_index: int) -> int:
        """Delete whole segment files whose entries all lie below
        min(smallest_live_index, snapshot index + 1), and forget the memory
        table's entries below it (their WAL file's flush skips them).
        Returns files deleted."""
        with self._lock:
            self._check()
            snap = self._snapshot
            if snap is None:
                return 0
            bound = min(smallest_live_index, snap.index + 1)
            self._release_bound = max(self._release_bound, bound)
            dropped = self._segs.drop_leading(self._release_bound)
            for f in dropped:
                self._cache.evict(f.path)
        unlink_segments(self.path, dropped, self._node.do_sync)
        with self._lock:
            self._check()
            self._drop_released_memory()
        return len(dropped)

    def _drop_released_memory(self) -> None:
        """Lock held: forget the memory table's entries below the release
        bound (keeping its last entry, so the log never empties and the next
        append needs no restart), so the flush of their WAL file does not
        write them to segments. Only while this group has no segment file
        and no flush between its portion and its install, i.e. the log is
        the memory table alone, on disk as in memory:
        - a file below the bound is deleted (durably: release() unlinks
          before it drops) before its memory table is, so a crash never
          finds an older file, then a gap, then a WAL run;
        - a file holding stale entries (an overwrite's or a restarted log's
          shadowed tail, past the clip) is voided on disk only by the flush
          of that write's first entries (a file starting at the overwritten
          index, or carrying the reset flag), which the drop would skip;
        - a flush in flight: not needed for correctness as far as the tests
          and the reasoning go (every piece its install keeps then lies
          below the release bound and its file is deleted at once:
          test_a_release_during_a_flush_leaves_the_overwrite_that_clips_its_portion),
          kept as a margin, since the drop gains nothing while a flush is
          writing that WAL file's entries anyway.
        The memory table also keeps a restarted log whole until it is
        flushed (MemTable.drop_below)."""
        mem = self._mem
        if self._flushing or self._segs.files or not mem.entries:
            return
        mem.drop_below(min(self._release_bound, mem.first + len(mem.entries) - 1))

    def compaction_span(self) -> int:
        """Index range of the not yet compacted leading segment files wholly
        below the snapshot index (what compact() could free); cheap, no file
        I/O. A caller compares it with its live count to decide whether
        compact() is worth computing the live indexes for (0: nothing to do)."""
        with self._lock:
            self._check()
            return sum(n for _f, _lo, _hi, n in self._compactable_prefix())

    def _compactable_prefix(self) -> list[tuple[SegFile, int, int, int]]:
        """Lock held: (file, lo, hi, entries) of the leading segment files, in
        seq order, whose surviving entries all lie below the snapshot index
        (and below the memory table), with no void file among them."""
        snap = self._snapshot
        if snap is None:
            return []
        bound = snap.index  # entry snap.index itself is always kept
        if self._mem.entries:
            bound = min(bound, self._mem.first)
        files = self._segs.files
        out: list[tuple[SegFile, int, int, int]] = []
        for k, (lo, hi, f) in enumerate(self._segs.pieces):
            if k >= len(files) or files[k] is not f or hi >= bound:
                break
            if out and lo != out[-1][2] + 1:
                break
            out.append((f, lo, hi, 0 if f.sparse else hi - lo + 1))
        return out

    def compact(self, live_indexes: Iterable[int], min_gain: float = 0.5) -> int:
        """Compact the leading segment files below the snapshot index: their
        live entries (`live_indexes`: every index below the snapshot that is
        still read, e.g. a queue's live messages; others are ignored) plus the
        first and last entry of the range are rewritten into one compacted
        (sparse) segment file, and the old files are deleted. Index lookups
        (`entries(i, i + 1)`, `term(i)`) of kept entries are unchanged; the
        other entries of the range are no longer served (CompactedError).

        Done only if it frees at least `min_gain` of those files' bytes. The
        new file takes the name (sequence number) of the last file it
        replaces, by an atomic rename after fdatasync, and carries the RESET
        flag, so a crash at any point leaves either the old files or the new
        one serving every kept entry (older leftovers are void and deleted at
        open). Blocking (file I/O). Returns the number of files replaced by
        the compacted one (0: nothing done)."""
        do_sync = self._node.do_sync
        with self._lock:
            self._check()
            prefix = self._compactable_prefix()
        if not prefix:
            return 0
        try:
            plan = compaction.plan(prefix, live_indexes, min_gain)
        except CorruptionError as bad:
            self._fail(bad)
            raise
        if plan is None:
            return 0
        hook = self._compact_hook
        old = plan.old
        last_f = old[-1]
        path = last_f.path
        tmp = compaction.write_tmp(path, plan.entries, do_sync)
        if hook is not None:
            hook("written")
        new = SegFile(last_f.seq, path, plan.first, plan.last, True, True)
        with self._lock:
            files = self._segs.files
            ok = (self._failed is None and not self._closed and len(files) >= len(old)
                  and all(a is b for a, b in zip(files, old, strict=False)))
            if ok:
                # the composition of everything after the replaced files must not change
                runs = [(f.first, f.last, f.reset) for f in files]
                before = codec.compose(runs)
                after = codec.compose([(new.first, new.last, True), *runs[len(old):]])
                ok = after[0] == (plan.first, plan.last) and after[1:] == before[len(old):]
            if ok:
                try:
                    os.rename(tmp, path)
                except BaseException:
                    os.unlink(tmp)
                    raise
                for f in old:
                    self._cache.evict(f.path)
                self._segs.replace_prefix(len(old), new)
        if not ok:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass  # the group was deleted meanwhile
            return 0
        compaction.finish(os.path.join(self.path, "segments"), old, do_sync, hook)
        return len(old)

    def segment_files(self) -> list[str]:
        """Paths of this group's segment files (for tests and the audit)."""
        with self._lock:
            return [f.path for f in self._segs.files]

    def close(self) -> None:
        """Stop using this handle. Unflushed entries stay safe in the WAL."""
        with self._lock:
            self._closed = True
