"""LogManager (one per node) and GroupLog (one per Raft group): the storage shell.

Pipeline position: the Raft driver in broker/runtime hands each group's
`Ready` (entries + hard state) to `GroupLog.append` / `set_hard_state`; these
update the in-memory table at once and queue encoded records for the node's
single WAL writer thread, which writes everything queued with one pwrite and
one fdatasync (group commit) and then calls `on_durable(group_id, index,
term)`. When the WAL passes `wal_max_size_bytes` it rolls over: a new WAL file
is started and the segment-writer thread flushes the old file's entries into
per-group segment files, then deletes the old WAL. Reads go: memory table ->
segment files (through a small cache of open, verified segment indexes).

Locking: one node-wide lock (`LogManager._lock`) guards all in-memory state.
It is never held across a WAL write/fsync; it is held across segment reads
(page-cache preads) and the short install step of a flush.

Invariants (per group):
- the log is contiguous: visible segment entries, then the memory table;
- `durable_index() <= last_index()` and every entry <= durable_index() is on
  disk (WAL fsynced or segment fsynced) exactly as it is served;
- memory entries carry the WAL generation they were queued in, and
  generations never decrease along the log (a write at i truncates >= i).
"""
from __future__ import annotations

import bisect
import collections
import fcntl
import logging
import os
import queue
import random
import shutil
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from . import codec
from .errors import (
    CompactedError,
    CorruptionError,
    CorruptSegmentError,
    CorruptSnapshotError,
    CorruptWalError,
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
from .files import fsync_dir, makedirs_durable, read_file, write_all, write_file_atomic
from .types import Entry, HardState, Snapshot, SnapshotMeta, StorageConfig

log = logging.getLogger(__name__)

class RandomSource(Protocol):
    """Randomness the LogManager needs (inject a seeded random.Random in tests)."""

    def randint(self, a: int, b: int) -> int: ...


OnDurable = Callable[[str, int, int], None]
OnError = Callable[[str, BaseException], None]

_NO_CLIP = 1 << 63
WAL_SUFFIX = ".wal"
SEG_SUFFIX = ".segment"
SNAP_SUFFIX = ".snapshot"
CORRUPT_MARKER = "CORRUPT"
GROUP_FILE = "GROUP"
#: Random id of one incarnation of a group directory; a DELETE record names
#: the incarnation it deletes, so a re-created group is not removed on replay.
INCARNATION_FILE = "INCARNATION"


# ------------------------------------------------------------------ helpers
_Slot = codec.SegmentSlot
@dataclass(frozen=True, slots=True)
class _SegFile:
    """One segment file on disk (immutable once renamed into place)."""

    seq: int
    path: str
    first: int
    last: int
    reset: bool
    #: a compacted segment: slots hold strictly increasing indexes in
    #: [first, last]; an index without a slot is compacted away
    sparse: bool = False


@dataclass(frozen=True, slots=True)
class _Mark:
    """Memory-table entries from index `first` on were queued in WAL generation `gen`."""

    gen: int
    first: int
    reset: bool


class _SegReader:
    """An open, fully verified segment file: fd + index slots.

    `seg` is the very _SegFile it was opened for: a path can name another
    file later (a deleted and re-created group numbers its segments from 1
    again), so the cache only answers for that object."""

    __slots__ = ("fd", "slots", "first", "seg", "idxs")

    def __init__(self, fd: int, slots: list[codec.SegmentSlot], seg: _SegFile) -> None:
        self.fd = fd
        self.slots = slots
        self.first = slots[0].idx
        self.seg = seg
        # sparse (compacted) segments: the slot indexes, for bisection
        self.idxs: list[int] | None = [s.idx for s in slots] if seg.sparse else None

    def slot_for(self, index: int) -> codec.SegmentSlot | None:
        """The slot holding entry `index`, or None (a compacted hole)."""
        idxs = self.idxs
        if idxs is None:
            k = index - self.first
            return self.slots[k] if 0 <= k < len(self.slots) else None
        k = bisect.bisect_left(idxs, index)
        return self.slots[k] if k < len(idxs) and idxs[k] == index else None


class _Pending:
    """One append/set_hard_state call queued for the WAL writer."""

    __slots__ = ("group", "epoch", "parts", "nbytes", "last_entry", "hs", "hs_record", "barrier",
                 "ref", "error")

    def __init__(
        self,
        group: GroupLog | None,
        epoch: int,
        parts: list[bytes],
        nbytes: int,
        last_entry: Entry | None,
        hs: HardState | None,
        hs_record: bytes | None,
        barrier: threading.Event | None = None,
        ref: int = 0,
    ) -> None:
        #: group=None items are node-level: a sync() barrier, or a record for `ref`
        self.barrier = barrier
        self.ref = ref
        self.error: BaseException | None = None
        self.group = group
        self.epoch = epoch
        self.parts = parts
        self.nbytes = nbytes
        self.last_entry = last_entry
        self.hs = hs
        self.hs_record = hs_record


class _Run:
    """Recovery: one group's entries replayed from the WAL files, in order."""

    __slots__ = ("first", "entries", "reset")

    def __init__(self, first: int, reset: bool) -> None:
        self.first = first
        self.entries: list[Entry] = []
        self.reset = reset

    def add(self, e: Entry, reset_flag: bool) -> None:
        last = self.first + len(self.entries) - 1
        if reset_flag or e.index > last + 1:
            # a new log starts here (after a snapshot install)
            self.first, self.entries, self.reset = e.index, [e], True
        elif e.index >= self.first:
            del self.entries[e.index - self.first :]
            self.entries.append(e)
        else:  # overwrite below this run: it truncates the older log at e.index
            self.first, self.entries = e.index, [e]


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


def _sync(fd: int, method: str) -> None:
    if method == "fdatasync":
        os.fdatasync(fd)
    elif method == "fsync":
        os.fsync(fd)


#: How far past a bad WAL record recovery looks for a valid one (which would
#: make the bad record corruption rather than a torn tail).
_SCAN_LIMIT = 256 * 1024


def _scan_for_record(buf: bytes, lo: int, hi: int) -> int | None:
    """Offset of the first valid WAL record starting in [lo, hi), if any."""
    types = codec.REC_TYPES
    for q in range(lo, hi):
        if q + codec.REC_HEADER_SIZE <= len(buf) and buf[q + 8] in types:
            if codec.decode_record(buf, q) is not None:
                return q
    return None


def _lock_dir(path: str) -> int:
    """Exclusive flock on <data_dir>/LOCK: one LogManager per directory."""
    fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise StorageError(f"{path} is in use by another LogManager") from exc
    return fd


def _seq_of(name: str, suffix: str) -> int | None:
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    return int(stem) if stem.isdigit() else None


# ----------------------------------------------------------------- GroupLog
class GroupLog:
    """The durable log of one Raft group on this node. Obtain it from
    `LogManager.open_group`. Thread-safe; callbacks run on the WAL writer thread."""

    def __init__(
        self,
        mgr: LogManager,
        group_id: str,
        ref: int,
        path: str,
        files: list[_SegFile],
        snapshot: SnapshotMeta | None,
        hard_state: HardState,
        on_durable: OnDurable | None,
        on_error: OnError | None,
    ) -> None:
        self._mgr = mgr
        self.group_id = group_id
        self.path = path
        self._ref = ref
        self._on_durable = on_durable
        self._on_error = on_error
        # segment files on disk, by sequence number (write order)
        self._files = files
        self._next_seq = (files[-1].seq + 1) if files else 1
        # Invariant: segment entries with index > _clip are shadowed by later writes.
        self._clip = _NO_CLIP
        self._pieces: list[tuple[int, int, _SegFile]] = []
        self._piece_los: list[int] = []
        # memory table: _mem[k] has index _mem_first + k
        self._mem: list[Entry] = []
        self._mem_first = 0
        self._marks: list[_Mark] = []
        self._snapshot = snapshot
        # release(): entries below this are not needed (below the snapshot and
        # the smallest live index); segment files written later (a flush of
        # the memory table) that hold only such entries are dropped too
        self._release_bound = 0
        self._hs = hard_state
        self._durable_hs = hard_state
        self._epoch = 0  # bumped on a write error: queued appends of older epochs are dropped
        self._failed: BaseException | None = None
        self._closed = False
        # Test hook: called with the name of each step of compact() as it is
        # passed ("written", "renamed", "dir_synced", "unlinked") so crash
        # tests can kill the process there. None in production.
        self._compact_hook: Callable[[str], None] | None = None
        self._recompute_pieces()
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
        self._mem.clear()
        self._marks.clear()
        self._mem_first = snap.index + 1
        self._clip = 0
        self._recompute_pieces()
        self._durable = snap.index

    # ----- composition (lock held)
    def _recompute_pieces(self) -> None:
        comp = codec.compose([(f.first, f.last, f.reset) for f in self._files])
        pieces = []
        for f, p in zip(self._files, comp, strict=True):
            if p is not None and p[0] <= self._clip:
                pieces.append((p[0], min(p[1], self._clip), f))
        self._pieces = pieces
        self._piece_los = [p[0] for p in pieces]

    def _seg_last(self) -> int | None:
        if not self._pieces:
            return None
        hi = self._pieces[-1][1]
        if self._mem:
            hi = min(hi, self._mem_first - 1)
        return hi

    def _log_first(self) -> int | None:
        if self._pieces and (not self._mem or self._pieces[0][0] < self._mem_first):
            return self._pieces[0][0]
        return self._mem_first if self._mem else None

    def _log_last(self) -> int | None:
        if self._mem:
            return self._mem_first + len(self._mem) - 1
        return self._pieces[-1][1] if self._pieces else None

    def _empty_last(self) -> int:
        return self._snapshot.index if self._snapshot is not None else 0

    def _check(self) -> None:
        if self._closed or self._mgr._closed:
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
        with self._mgr._lock:
            self._check()
            first = self._log_first()
            return first if first is not None else self._empty_last() + 1

    def last_index(self) -> int:
        """max(last entry, snapshot index)."""
        with self._mgr._lock:
            self._check()
            return self._last_index_locked()

    def last_entry_index(self) -> int:
        """Index of the last entry held (below last_index() right after a
        snapshot install past the log); first_index() - 1 if none."""
        with self._mgr._lock:
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
        with self._mgr._lock:
            self._check()
            return self._durable

    def hard_state(self) -> HardState:
        """Latest hard state set (recovered one after a restart)."""
        with self._mgr._lock:
            self._check()
            return self._hs

    def durable_hard_state(self) -> HardState:
        with self._mgr._lock:
            self._check()
            return self._durable_hs

    def snapshot_meta(self) -> SnapshotMeta | None:
        with self._mgr._lock:
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

    def term(self, index: int) -> int:
        """Term of entry `index` (or of the snapshot at `index`; term(0) == 0)."""
        with self._mgr._lock:
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
        mem = self._mem
        if mem and self._mem_first <= index < self._mem_first + len(mem):
            return mem[index - self._mem_first].term
        snap = self._snapshot
        if index == 0:
            return 0
        piece = self._piece_for(index)
        if piece is not None:
            reader = self._reader(piece[2])
            slot = reader.slot_for(index)
            if slot is None or slot.idx != index:
                if reader.idxs is not None:
                    raise CompactedError(f"group {self.group_id!r}: index {index} is compacted")
                raise self._broken(f"{piece[2].path}: no slot for entry {index}")
            return slot.term
        first = self._log_first()
        if index <= self._last_index_locked() and (
                first is None or index < first or (snap is not None and index < snap.index)):
            raise CompactedError(f"group {self.group_id!r}: index {index} is compacted")
        raise UnavailableError(f"group {self.group_id!r}: index {index} is beyond the log")

    def _piece_for(self, index: int) -> tuple[int, int, _SegFile] | None:
        k = bisect.bisect_right(self._piece_los, index) - 1
        if k < 0:
            return None
        piece = self._pieces[k]
        hi = piece[1]
        if self._mem:
            hi = min(hi, self._mem_first - 1)
        return piece if index <= hi else None

    def _reader(self, f: _SegFile) -> _SegReader:
        try:
            return self._mgr._segment_reader(f)
        except CorruptionError as exc:
            self._fail(exc)
            raise

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi). With max_bytes, stop once the data exceeds it
        (always at least one entry). Raises CompactedError / UnavailableError."""
        with self._mgr._lock:
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
            mem_first = self._mem_first if self._mem else last + 1
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
                chunk = self._mem[i - mem_first : hi - mem_first]
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
        self, f: _SegFile, lo: int, hi: int, size: int, max_bytes: int | None, have: bool
    ) -> tuple[list[Entry], int, bool]:
        reader = self._reader(f)
        if reader.idxs is not None:  # compacted: only whole runs of kept entries
            k = bisect.bisect_left(reader.idxs, lo)
            slots = reader.slots[k : k + hi - lo + 1]
            if len(slots) != hi - lo + 1 or not slots or slots[0].idx != lo or slots[-1].idx != hi:
                raise CompactedError(
                    f"group {self.group_id!r}: [{lo}, {hi}] not all held (compacted segment)")
        else:
            k = lo - reader.first
            slots = reader.slots[k : hi - reader.first + 1] if k >= 0 else []
        if len(slots) != hi - lo + 1 or slots[0].idx != lo or slots[-1].idx != hi:
            raise self._broken(f"{f.path}: slots do not hold entries [{lo}, {hi}]")
        start = slots[0].offset
        end = slots[-1].offset + slots[-1].length
        buf = os.pread(reader.fd, end - start, start)
        out: list[Entry] = []
        for s in slots:
            stored = buf[s.offset - start : s.offset - start + s.length]
            if len(stored) != s.length or codec.entry_crc(s.idx, s.term, stored) != s.crc:
                exc = CorruptSegmentError(f"{f.path}: entry {s.idx} checksum mismatch")
                self._fail(exc)
                raise exc
            size += s.length - 1
            if max_bytes is not None and size > max_bytes and (have or out):
                return out, size, True
            out.append(Entry(s.idx, s.term, stored[1:], stored[0]))
        return out, size, False

    # ----- writes
    def append(self, entries: Sequence[Entry]) -> None:
        """Queue entries for the WAL (non-blocking). If entries[0].index <=
        last_index() this is an overwrite: the suffix from there is dropped
        first. A first index past last_index() + 1 is allowed only right after
        a snapshot at first - 1 (the log then restarts there)."""
        if not entries:
            return
        mgr = self._mgr
        ref = self._ref
        enc = codec.encode_entry_header
        # hot path: validation and encoding inlined (this runs per entry)
        pack_rest = codec.REC_REST.pack
        pack_crc = codec.REC_CRC.pack
        crc32 = zlib.crc32
        rec_entry = codec.REC_ENTRY
        parts: list[bytes] = []
        add = parts.append
        nbytes = 0
        checked: list[Entry] = entries if type(entries) is list else list(entries)
        converted = False
        prev_index = checked[0].index - 1
        prev_term = 0
        try:
            for n, e in enumerate(checked):
                if type(e) is not Entry or type(e.data) is not bytes:
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
        with mgr._lock:
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
            gen = mgr._gen
            mem = self._mem
            marks = self._marks
            if reset:
                mem.clear()
                marks.clear()
                self._mem_first = f
                self._clip = 0
                self._recompute_pieces()
            elif mem and f >= self._mem_first:
                del mem[f - self._mem_first :]
            else:  # memory table empty, or overwrite reaching into the segments
                mem.clear()
                self._mem_first = f
                if self._clip != f - 1:
                    self._clip = f - 1
                    self._recompute_pieces()
            keep_reset = reset
            while marks and marks[-1].first >= f:
                m = marks.pop()
                keep_reset = keep_reset or (m.first == f and m.reset)
            if not marks or marks[-1].gen != gen:
                marks.append(_Mark(gen, f, keep_reset))
            if keep_reset:
                parts[0] = enc(ref, f, checked[0].term, checked[0].kind, checked[0].data, True)
            mem.extend(checked)
            if reset:
                self._durable = f - 1
            elif self._durable >= f:
                self._durable = f - 1
            mgr._enqueue(_Pending(self, self._epoch, parts, nbytes, checked[-1], None, None))

    def set_hard_state(self, hs: HardState) -> None:
        """Queue the hard state; it is written in the same WAL batch/fsync as
        entries queued before it. durable_hard_state() reflects it once durable."""
        if hs.term < 0 or hs.commit < 0:
            raise ValueError(f"bad hard state {hs!r}")
        rec = codec.encode_hard_state(self._ref, hs.term, hs.voted_for, hs.commit)
        with self._mgr._lock:
            self._check()
            self._hs = hs
            self._mgr._enqueue(_Pending(self, self._epoch, [rec], len(rec), None, hs, rec))

    # ----- writer-thread hooks (lock held)
    def _batch_durable(self, entry: Entry | None, hs: HardState | None) -> tuple[int, int]:
        if entry is not None:
            i = entry.index
            k = i - self._mem_first
            if self._mem and 0 <= k < len(self._mem) and self._mem[k] is entry:
                self._durable = i
        if hs is not None:
            self._durable_hs = hs
        try:
            term = self._term_locked(self._durable)
        except (StorageError, OSError):
            term = 0
        return self._durable, term

    def _write_failed(self) -> None:
        """Drop everything not durable: the caller re-appends after on_error."""
        self._epoch += 1
        self._truncate_mem_from(self._durable + 1)
        self._hs = self._durable_hs

    def _truncate_mem_from(self, i: int) -> None:
        if not self._mem:
            return
        k = max(i - self._mem_first, 0)
        del self._mem[k:]
        while self._marks and self._marks[-1].first >= i:
            self._marks.pop()
        if not self._mem:
            self._marks.clear()

    # ----- flush (segment-writer thread)
    def _flush_portion(self, gen: int) -> tuple[list[Entry], bool, list[int]] | None:
        """Entries queued in WAL generations <= gen (a prefix of the memory table)."""
        if not self._mem or not self._marks or self._marks[0].gen > gen:
            return None
        end = self._mem_first + len(self._mem)
        for m in self._marks:
            if m.gen > gen:
                end = m.first
                break
        portion = self._mem[: end - self._mem_first]
        n = self._mgr.config.segment_max_entries
        nfiles = (len(portion) + n - 1) // n
        seqs = list(range(self._next_seq, self._next_seq + nfiles))
        self._next_seq += nfiles
        return portion, self._marks[0].reset, seqs

    def _install(self, gen: int, files: list[_SegFile]) -> list[_SegFile]:
        """Add flushed segment files; drop generation <= gen from memory.
        Returns leading files now void in the segment-only composition or
        wholly below the release bound (to delete: a release that came while
        their entries were still only in the WAL)."""
        self._files.extend(files)
        self._files.sort(key=lambda f: f.seq)
        if self._mem and self._marks and self._marks[0].gen <= gen:
            keep_from = self._mem_first + len(self._mem)
            for m in self._marks:
                if m.gen > gen:
                    keep_from = m.first
                    break
            del self._mem[: keep_from - self._mem_first]
            self._mem_first = keep_from
            self._marks = [m for m in self._marks if m.gen > gen]
            self._clip = keep_from - 1
        self._recompute_pieces()
        return self._drop_leading(self._release_bound)

    def _drop_leading(self, bound: int) -> list[_SegFile]:
        """Remove (from the list) leading files that are void in the segment-only
        composition, or whose surviving entries all lie below `bound`."""
        comp = codec.compose([(f.first, f.last, f.reset) for f in self._files])
        n = 0
        for p in comp:
            if p is None or p[1] < bound:
                n += 1
            else:
                break
        dropped = self._files[:n]
        if dropped:
            del self._files[:n]
            self._recompute_pieces()
        return dropped

    # ----- snapshots and truncation
    def save_snapshot(self, index: int, term: int, config: bytes, data: bytes) -> SnapshotMeta:
        """Write a snapshot durably (tmp, fsync, rename, dir fsync); blocking.
        Keeps the previous snapshot file as a fallback, deletes older ones."""
        with self._mgr._lock:
            self._check()
            cur = self._snapshot
            if index < 1 or term < 0:
                raise ValueError(f"snapshot index must be >= 1 and term >= 0, got {index}/{term}")
            if cur is not None and index < cur.index:
                raise ValueError(
                    f"group {self.group_id!r}: snapshot {index} is older than current {cur.index}"
                )
        snapdir = os.path.join(self.path, "snapshots")
        name = f"{index:020d}_{term:020d}{SNAP_SUFFIX}"
        head = codec.encode_snapshot_header(index, term, config, data)
        write_file_atomic(os.path.join(snapdir, name), [head, config, data], self._mgr._do_sync)
        meta = SnapshotMeta(index, term, bytes(config))
        with self._mgr._lock:
            if self._snapshot is None or self._snapshot.index <= index:
                self._snapshot = meta
                self._reconcile_with_snapshot()
        _prune_snapshots(snapdir, keep=2)
        return meta

    def latest_snapshot(self) -> Snapshot | None:
        """The newest valid snapshot on disk (config + data), or None.

        Falling back to an older snapshot (the newest is unreadable) is only
        allowed while the log still holds every entry after the older one;
        otherwise entries would be silently skipped, so the group stops with
        CorruptSnapshotError."""
        with self._mgr._lock:
            self._check()
        found = _load_latest_snapshot(os.path.join(self.path, "snapshots"))
        with self._mgr._lock:
            want = self._snapshot
            if want is not None and (found is None or found.meta.index < want.index):
                have = found.meta.index if found is not None else 0
                if not self._holds_all_after(have):
                    exc = CorruptSnapshotError(
                        f"group {self.group_id!r}: snapshot {want.index} is unreadable and the log "
                        f"no longer holds the entries after {'snapshot ' + str(have) if have else 'the start'}")
                    self._fail(exc)
                    raise exc
        return found

    def release(self, smallest_live_index: int) -> int:
        """Delete whole segment files whose entries all lie below
        min(smallest_live_index, snapshot index + 1). Returns files deleted."""
        with self._mgr._lock:
            self._check()
            snap = self._snapshot
            if snap is None:
                return 0
            bound = min(smallest_live_index, snap.index + 1)
            self._release_bound = max(self._release_bound, bound)
            dropped = self._drop_leading(self._release_bound)
            for f in dropped:
                self._mgr._evict(f.path)
        self._mgr._unlink_segments(self.path, dropped)
        return len(dropped)

    def _holds_all_after(self, have: int) -> bool:
        """Lock held: does the log hold every entry after index `have` (none
        released, none compacted away)? Decides whether falling back to an
        older snapshot at `have` is sound."""
        first = self._log_first()
        if first is None or first > have + 1:
            return False
        return not any(f.sparse and hi > have for _lo, hi, f in self._pieces)

    def compaction_span(self) -> int:
        """Index range of the not yet compacted leading segment files wholly
        below the snapshot index (what compact() could free); cheap, no file
        I/O. A caller compares it with its live count to decide whether
        compact() is worth computing the live indexes for (0: nothing to do)."""
        with self._mgr._lock:
            self._check()
            return sum(n for _f, _lo, _hi, n in self._compactable_prefix())

    def _compactable_prefix(self) -> list[tuple[_SegFile, int, int, int]]:
        """Lock held: (file, lo, hi, entries) of the leading segment files, in
        seq order, whose surviving entries all lie below the snapshot index
        (and below the memory table), with no void file among them."""
        snap = self._snapshot
        if snap is None:
            return []
        bound = snap.index  # entry snap.index itself is always kept
        if self._mem:
            bound = min(bound, self._mem_first)
        out: list[tuple[_SegFile, int, int, int]] = []
        for k, (lo, hi, f) in enumerate(self._pieces):
            if k >= len(self._files) or self._files[k] is not f or hi >= bound:
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
        mgr = self._mgr
        with mgr._lock:
            self._check()
            prefix = self._compactable_prefix()
        if not prefix:
            return 0
        lo_all, hi_all = prefix[0][1], prefix[-1][2]
        keep = sorted({i for i in live_indexes if lo_all < i < hi_all})
        cap = 65535 - 2  # u16 max_count
        # plan: per file, only the index slots needed (first, last, kept ones;
        # the whole index of a compacted file, which is small); then choose
        # the prefix length that frees most
        Slot = codec.SegmentSlot
        plans: list[tuple[_SegFile, int, int, list[_Slot], _Slot | None, int]] = []
        ki = 0
        try:
            for k, (f, lo, hi, _n) in enumerate(prefix):
                mine = [lo] if k == 0 else []
                while ki < len(keep) and keep[ki] <= hi:
                    if keep[ki] >= lo:
                        mine.append(keep[ki])
                    ki += 1
                want = mine if mine and mine[-1] == hi else [*mine, hi]
                found: dict[int, _Slot | None] = {}
                fd = os.open(f.path, os.O_RDONLY)
                try:
                    size = os.fstat(fd).st_size
                    flags, _max, count = codec.decode_segment_header(
                        os.pread(fd, codec.SEG_HEADER_SIZE, 0), f.path)
                    if flags & codec.SEG_FLAG_SPARSE:
                        by_idx = {x.idx: x for x in codec.decode_segment_index(
                            os.pread(fd, count * codec.SEG_SLOT_SIZE, codec.SEG_HEADER_SIZE),
                            count, size, f.path, True)}
                        found = {i: by_idx.get(i) for i in want}
                    else:
                        for i in want:
                            pos = i - f.first
                            if not 0 <= pos < count:
                                raise CorruptSegmentError(f"{f.path}: no slot for entry {i}")
                            x = Slot._make(codec.SEG_SLOT.unpack(os.pread(
                                fd, codec.SEG_SLOT_SIZE,
                                codec.SEG_HEADER_SIZE + pos * codec.SEG_SLOT_SIZE)))
                            if x.idx != i or x.length < 1 or x.offset + x.length > size:
                                raise CorruptSegmentError(f"{f.path}: bad index slot for entry {i}")
                            found[i] = x
                finally:
                    os.close(fd)
                got = [y for y in (found[i] for i in mine) if y is not None]
                plans.append((f, lo, hi, got, found[hi], size))
        except FileNotFoundError:
            return 0  # released meanwhile
        except CorruptionError as bad:
            self._fail(bad)
            raise
        best_k, best_gain = 0, 0
        old_bytes = 0
        kept_n = 0
        kept_bytes = 0
        for k, (_f, _lo, hi, got, hi_slot, size) in enumerate(plans):
            old_bytes += size
            kept_n += len(got)
            kept_bytes += sum(x.length for x in got)
            if hi_slot is None:
                break  # the range must end on a held entry
            extra = 0 if got and got[-1].idx == hi else 1
            n = kept_n + extra
            if n > cap:
                break
            new_bytes = (codec.SEG_HEADER_SIZE + n * codec.SEG_SLOT_SIZE + kept_bytes
                         + (hi_slot.length if extra else 0))
            gain = old_bytes - new_bytes
            if gain > 0 and gain >= min_gain * old_bytes and gain > best_gain:
                best_k, best_gain = k + 1, gain
        if best_k == 0:
            return 0
        plans = plans[:best_k]
        slots_kept: list[_Slot] = []
        where: list[_SegFile] = []  # the file each kept slot is in
        for f, _lo, _hi, got, _h, _z in plans:
            slots_kept.extend(got)
            where.extend(f for _ in got)
        last_f, _lo, last_hi, _got, last_slot, _size = plans[-1]
        if not slots_kept or slots_kept[-1].idx != last_hi:
            assert last_slot is not None
            slots_kept.append(last_slot)
            where.append(last_f)
        # read and verify the kept entries
        entries: list[tuple[int, int, int, bytes]] = []
        fds: dict[str, int] = {}
        try:
            for s, f in zip(slots_kept, where, strict=True):
                rfd = fds.get(f.path)
                if rfd is None:
                    rfd = fds[f.path] = os.open(f.path, os.O_RDONLY)
                stored = os.pread(rfd, s.length, s.offset)
                if len(stored) != s.length or codec.entry_crc(s.idx, s.term, stored) != s.crc:
                    damaged = CorruptSegmentError(f"{f.path}: entry {s.idx} checksum mismatch")
                    self._fail(damaged)
                    raise damaged
                entries.append((s.idx, s.term, stored[0], stored[1:]))
        except FileNotFoundError:
            return 0
        finally:
            for rfd in fds.values():
                os.close(rfd)
        hook = self._compact_hook
        path = last_f.path
        tmp = path + ".compact.tmp"
        data = codec.encode_segment(len(entries), entries, reset=True, sparse=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data, 0)
            if mgr._do_sync:
                os.fdatasync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        if hook is not None:
            hook("written")
        new = _SegFile(last_f.seq, path, lo_all, last_hi, True, True)
        old = [p[0] for p in plans]
        with mgr._lock:
            ok = (self._failed is None and not self._closed and len(self._files) >= len(old)
                  and all(a is b for a, b in zip(self._files, old, strict=False)))
            if ok:
                # the composition of everything after the replaced files must not change
                runs = [(f.first, f.last, f.reset) for f in self._files]
                before = codec.compose(runs)
                after = codec.compose([(new.first, new.last, True), *runs[len(old):]])
                ok = after[0] == (lo_all, last_hi) and after[1:] == before[len(old):]
            if ok:
                try:
                    os.rename(tmp, path)
                except BaseException:
                    os.unlink(tmp)
                    raise
                for f in old:
                    mgr._evict(f.path)
                self._files[: len(old)] = [new]
                self._recompute_pieces()
        if not ok:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass  # the group was deleted meanwhile
            return 0
        if hook is not None:
            hook("renamed")
        segdir = os.path.join(self.path, "segments")
        if mgr._do_sync:
            fsync_dir(segdir)
        if hook is not None:
            hook("dir_synced")
        for n, f in enumerate(old[:-1]):
            try:
                os.unlink(f.path)
            except FileNotFoundError:
                pass
            if n == 0 and hook is not None:
                hook("unlinked")
        if len(old) > 1 and mgr._do_sync:
            fsync_dir(segdir)
        return len(old)

    def segment_files(self) -> list[str]:
        """Paths of this group's segment files (for tests and the audit)."""
        with self._mgr._lock:
            return [f.path for f in self._files]

    def close(self) -> None:
        """Stop using this handle. Unflushed entries stay safe in the WAL."""
        with self._mgr._lock:
            self._closed = True


# ------------------------------------------------------------- snapshots io
def _snapshot_files(snapdir: str) -> list[tuple[int, str]]:
    out = []
    try:
        names = os.listdir(snapdir)
    except FileNotFoundError:
        return []
    for name in names:
        if name.endswith(SNAP_SUFFIX):
            stem = name[: -len(SNAP_SUFFIX)].split("_")
            if len(stem) == 2 and stem[0].isdigit():
                out.append((int(stem[0]), os.path.join(snapdir, name)))
    out.sort(reverse=True)
    return out


def _load_latest_snapshot(snapdir: str) -> Snapshot | None:
    for _index, path in _snapshot_files(snapdir):
        try:
            index, term, config, data = codec.decode_snapshot(read_file(path), path)
        except (CorruptSnapshotError, OSError) as exc:
            log.warning("storage: skipping invalid snapshot: %s", exc)
            continue
        return Snapshot(SnapshotMeta(index, term, config), data)
    return None


def _prune_snapshots(snapdir: str, keep: int) -> None:
    valid = 0
    for _index, path in _snapshot_files(snapdir):
        if valid >= keep:
            try:
                os.unlink(path)
            except OSError:
                pass
            continue
        try:
            codec.decode_snapshot(read_file(path), path)
            valid += 1
        except (CorruptSnapshotError, OSError):
            pass


# --------------------------------------------------------------- LogManager
class LogManager:
    """Storage of one node: the shared WAL (group commit), per-group segment
    files and snapshots, under `data_dir`. Recovery runs in the constructor."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        config: StorageConfig | None = None,
        on_durable: OnDurable | None = None,
        on_error: OnError | None = None,
        rng: RandomSource | None = None,
    ) -> None:
        self.config = config if config is not None else StorageConfig()
        cfg = self.config
        self._roll_at = cfg.wal_max_size_bytes
        if cfg.stagger_first_roll_over:
            rand = rng if rng is not None else random.Random()
            self._roll_at = rand.randint(max(1, cfg.wal_max_size_bytes // 2), cfg.wal_max_size_bytes)
        self.data_dir = os.fspath(data_dir)
        self._wal_dir = os.path.join(self.data_dir, "wal")
        self._groups_dir = os.path.join(self.data_dir, "groups")
        self._on_durable = on_durable
        self._on_error = on_error
        self._do_sync = self.config.sync_method != "none"
        self._lock = threading.Lock()
        self._delete_lock = threading.Lock()
        self._closed = False
        self._groups: dict[str, GroupLog] = {}
        self._refs: dict[str, int] = {}
        self._readers: collections.OrderedDict[str, _SegReader] = collections.OrderedDict()
        self._queue: collections.deque[_Pending] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        # writer-thread state
        self._hs_records: dict[int, bytes] = {}  # ref -> latest durable HARD_STATE record
        self._def_records: dict[int, bytes] = {}  # ref -> GROUP record
        self._defined: set[int] = set()  # refs defined in the current WAL file
        self._carry_needed = False
        self._pending_flush: list[int] = []
        self._barriers: list[threading.Event] = []
        # counters (read by bench/metrics)
        self.stats = {"batches": 0, "fsyncs": 0, "records": 0, "bytes": 0, "write_errors": 0,
                      "rollovers": 0, "flushes": 0}
        self._recovered_hs: dict[str, HardState] = {}
        self._corrupt: dict[str, str] = {}
        self._deleted: dict[str, bytes] = {}  # group -> incarnation a DELETE record names
        makedirs_durable(self._wal_dir)
        makedirs_durable(self._groups_dir)
        self._gen = 0
        self._fd = -1
        self._offset = 0
        self._dir_lock = _lock_dir(self.data_dir)
        try:
            self._recover()
        except BaseException as exc:
            if self._fd >= 0:
                os.close(self._fd)
            os.close(self._dir_lock)
            if isinstance(exc, OSError) and not isinstance(exc, StorageError):
                raise StorageIOError(
                    exc.errno or 5,
                    f"recovery of {self.data_dir} failed (nothing was deleted): {exc}",
                ) from exc
            raise
        self._flushed_upto = self._gen - 1
        self._flushed_cv = threading.Condition()
        self._flush_q: queue.Queue[int | None] = queue.Queue()
        self._flush_stop = threading.Event()
        self._writer = threading.Thread(target=self._writer_loop, name="qq-wal-writer", daemon=True)
        self._flusher = threading.Thread(target=self._flusher_loop, name="qq-segment-writer",
                                         daemon=True)
        self._writer.start()
        self._flusher.start()

    # ----- paths / ids
    def group_dir(self, group_id: str) -> str:
        return os.path.join(self._groups_dir, codec.encode_group_dir(group_id))

    def _ref_for(self, group_id: str) -> int:
        ref = self._refs.get(group_id)
        if ref is None:
            ref = len(self._refs) + 1
            self._refs[group_id] = ref
            self._def_records[ref] = codec.encode_group_def(ref, group_id)
        return ref

    def group_ids(self) -> list[str]:
        """Ids of every group with a directory on this node."""
        out = []
        for name in sorted(os.listdir(self._groups_dir)):
            if name.startswith("."):
                continue  # a deletion in progress
            try:
                out.append(read_file(os.path.join(self._groups_dir, name, GROUP_FILE)).decode())
            except OSError:
                continue
        return out

    def _ensure_group_dir(self, group_id: str) -> str:
        path = self.group_dir(group_id)
        makedirs_durable(os.path.join(path, "segments"))
        makedirs_durable(os.path.join(path, "snapshots"))
        gfile = os.path.join(path, GROUP_FILE)
        if not os.path.exists(gfile):
            inc = os.path.join(path, INCARNATION_FILE)
            write_file_atomic(inc, [os.urandom(8).hex().encode()], self._do_sync)
            write_file_atomic(gfile, [group_id.encode("utf-8")], self._do_sync)
        return path

    def _incarnation(self, group_id: str) -> bytes:
        try:
            return read_file(os.path.join(self.group_dir(group_id), INCARNATION_FILE))
        except FileNotFoundError:
            return b""

    # ----- recovery
    def _recover(self) -> None:
        wal_files = sorted(
            (seq, os.path.join(self._wal_dir, n))
            for n in os.listdir(self._wal_dir)
            if (seq := _seq_of(n, WAL_SUFFIX)) is not None
        )
        for n in os.listdir(self._wal_dir):
            if n.endswith(".tmp"):
                os.unlink(os.path.join(self._wal_dir, n))
        runs: dict[str, _Run] = {}
        for _seq, path in wal_files:
            self._replay(path, runs)
        # finish deletions a crash interrupted (the DELETE record is durable)
        for gid, inc in self._deleted.items():
            if os.path.isdir(self.group_dir(gid)) and self._incarnation(gid) == inc:
                self._remove_group_dir(gid)
        for name in os.listdir(self._groups_dir):
            if name.startswith(".deleted-"):
                shutil.rmtree(os.path.join(self._groups_dir, name), ignore_errors=True)
        # flush recovered entries into segments so the old WAL files can go
        jobs = []
        for gid, run in runs.items():
            if gid in self._corrupt or not run.entries:
                continue
            path = self._ensure_group_dir(gid)
            segdir = os.path.join(path, "segments")
            seqs = [q for name in os.listdir(segdir) if (q := _seq_of(name, SEG_SUFFIX)) is not None]
            nxt = max(seqs, default=0) + 1
            per = self.config.segment_max_entries
            chunks = [run.entries[k : k + per] for k in range(0, len(run.entries), per)]
            jobs.append((segdir, chunks, run.reset, list(range(nxt, nxt + len(chunks)))))
        self._write_segment_jobs(jobs)
        for gid, reason in self._corrupt.items():
            path = self._ensure_group_dir(gid)
            marker = os.path.join(path, CORRUPT_MARKER)
            if not os.path.exists(marker):
                write_file_atomic(marker, [reason.encode("utf-8")], self._do_sync)
        # a fresh WAL carrying every group's hard state, then drop the old files
        self._gen = (wal_files[-1][0] + 1) if wal_files else 1
        for gid, hs in self._recovered_hs.items():
            if gid not in self._corrupt:
                ref = self._ref_for(gid)
                self._hs_records[ref] = codec.encode_hard_state(ref, hs.term, hs.voted_for, hs.commit)
        self._open_wal(self._gen)
        self._carry_needed = True
        self._write_batch([])
        if self._carry_needed:
            raise StorageIOError(28, "could not write the new WAL after recovery")
        for _seq, path in wal_files:
            os.unlink(path)
        if wal_files and self._do_sync:
            fsync_dir(self._wal_dir)

    def _replay(self, path: str, runs: dict[str, _Run]) -> None:
        buf = read_file(path)
        if codec.decode_wal_header(buf) is None:
            return  # torn header: the file was just created, holds nothing durable
        refs: dict[int, str] = {}
        pos = codec.WAL_HEADER_SIZE
        n = len(buf)
        while pos < n:
            rec = codec.decode_record(buf, pos)
            if rec is None:
                self._check_corruption(buf, pos, refs, path)
                return
            pos = rec.end
            self._apply_record(rec, refs, runs)

    def _apply_record(self, rec: codec.WalRecord, refs: dict[int, str], runs: dict[str, _Run]) -> None:
        if rec.rtype == codec.REC_GROUP:
            refs[rec.ref] = rec.payload.decode("utf-8")
            return
        gid = refs.get(rec.ref)
        if gid is None:
            return
        if rec.rtype == codec.REC_DELETE:
            runs.pop(gid, None)
            self._recovered_hs.pop(gid, None)
            self._corrupt.pop(gid, None)
            self._deleted[gid] = rec.payload
            return
        self._deleted.pop(gid, None)
        if rec.rtype == codec.REC_HARD_STATE:
            vote = rec.payload.decode("utf-8") if rec.flags & codec.HS_HAS_VOTE else None
            self._recovered_hs[gid] = HardState(rec.term, vote, rec.index)
        else:
            e = Entry(rec.index, rec.term, rec.payload, rec.flags)
            flag = bool(rec.reserved & codec.REC_FLAG_RESET)
            run = runs.get(gid)
            if run is None:
                run = runs[gid] = _Run(e.index, flag)
                run.entries.append(e)
            else:
                run.add(e, flag)

    def _check_corruption(self, buf: bytes, pos: int, refs: dict[int, str], path: str) -> None:
        """A bad record at `pos`: a torn tail, unless valid records follow it,
        in which case the groups that lost records are marked corrupt."""
        end = codec.record_length_at(buf, pos)
        if end is None or codec.decode_record(buf, end) is None:
            # the length field may be the damaged part: look a little further
            end = _scan_for_record(buf, pos + 1, min(len(buf), pos + _SCAN_LIMIT))
            if end is None:
                return  # torn tail: cut here
        affected: set[str] = set()
        unknown = False
        (bad_ref,) = struct.unpack_from("<I", buf, pos + 12)
        if bad_ref in refs:
            affected.add(refs[bad_ref])
        p = end
        while (rec := codec.decode_record(buf, p)) is not None:
            if rec.rtype == codec.REC_GROUP:
                refs[rec.ref] = rec.payload.decode("utf-8")
            elif rec.ref in refs:
                affected.add(refs[rec.ref])
            else:  # its GROUP record was in the damaged bytes: cannot tell whose
                unknown = True
            p = rec.end
        if unknown:  # any group of this node may have lost records: stop them all
            affected.update(refs.values())
            affected.update(self.group_ids())
        reason = f"{path}: corrupt WAL record at offset {pos}; later records of this group lost"
        for gid in affected:
            self._corrupt.setdefault(gid, reason)

    # ----- segments io
    def _write_segment_jobs(
        self, jobs: list[tuple[str, list[list[Entry]], bool, list[int]]]
    ) -> list[list[_SegFile]]:
        """Write segment files for several groups: all data first, then one
        fdatasync per file (cheap after the first: the journal commit carries
        them), renames, and one fsync per directory. Tmp files go on failure."""
        opened: list[tuple[int, str, str]] = []  # fd, tmp, final
        out: list[list[_SegFile]] = []
        try:
            for segdir, chunks, reset, seqs in jobs:
                files = []
                for n, (chunk, seq) in enumerate(zip(chunks, seqs, strict=True)):
                    data = codec.encode_segment(
                        self.config.segment_max_entries,
                        [(e.index, e.term, e.kind, e.data) for e in chunk],
                        reset and n == 0,
                    )
                    path = os.path.join(segdir, f"{seq:020d}{SEG_SUFFIX}")
                    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    opened.append((fd, path + ".tmp", path))
                    write_all(fd, data, 0)
                    files.append(
                        _SegFile(seq, path, chunk[0].index, chunk[-1].index, reset and n == 0)
                    )
                out.append(files)
            if self._do_sync:
                for fd, _tmp, _path in opened:
                    os.fdatasync(fd)
            for fd, tmp, path in opened:
                os.close(fd)
                os.rename(tmp, path)
            opened = []
        except BaseException:
            for fd, tmp, _path in opened:
                try:
                    os.close(fd)
                except OSError:
                    pass
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            raise
        if self._do_sync:
            for segdir, chunks, _reset, _seqs in jobs:
                if chunks:
                    fsync_dir(segdir)
        return out

    def _load_segments(self, segdir: str) -> list[_SegFile]:
        files = []
        for name in os.listdir(segdir):
            if name.endswith(".tmp"):
                os.unlink(os.path.join(segdir, name))
                continue
            seq = _seq_of(name, SEG_SUFFIX)
            if seq is None:
                continue
            path = os.path.join(segdir, name)
            fd = os.open(path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                head = os.pread(fd, codec.SEG_HEADER_SIZE, 0)
                flags, max_count, count = codec.decode_segment_header(head, path)
                idx = os.pread(fd, count * codec.SEG_SLOT_SIZE, codec.SEG_HEADER_SIZE)
                sparse = bool(flags & codec.SEG_FLAG_SPARSE)
                slots = codec.decode_segment_index(idx, count, size, path, sparse)
            finally:
                os.close(fd)
            if slots[0].offset < codec.SEG_HEADER_SIZE + max_count * codec.SEG_SLOT_SIZE:
                raise CorruptSegmentError(f"{path}: entry data overlaps the index")
            files.append(_SegFile(seq, path, slots[0].idx, slots[-1].idx,
                                  bool(flags & codec.SEG_FLAG_RESET), sparse))
        files.sort(key=lambda f: f.seq)
        return files

    def _segment_reader(self, f: _SegFile) -> _SegReader:
        """Open + fully verify a segment file (lock held); LRU-cached."""
        r = self._readers.get(f.path)
        if r is not None:
            if r.seg is f:
                self._readers.move_to_end(f.path)
                return r
            # the path now names another file (re-created group): never serve the old one
            del self._readers[f.path]
            os.close(r.fd)
        fd = os.open(f.path, os.O_RDONLY)
        try:
            buf = read_file(f.path)
            flags, _max, count = codec.decode_segment_header(buf, f.path)
            if bool(flags & codec.SEG_FLAG_SPARSE) != f.sparse:
                raise CorruptSegmentError(f"{f.path}: segment flags changed on disk")
            slots = codec.decode_segment_index(buf[codec.SEG_HEADER_SIZE:], count, len(buf), f.path,
                                               f.sparse)
            for s in slots:
                stored = buf[s.offset : s.offset + s.length]
                if codec.entry_crc(s.idx, s.term, stored) != s.crc:
                    raise CorruptSegmentError(f"{f.path}: entry {s.idx} checksum mismatch")
            if slots[0].idx != f.first or slots[-1].idx != f.last:
                raise CorruptSegmentError(f"{f.path}: index range changed on disk")
        except BaseException:
            os.close(fd)
            raise
        r = _SegReader(fd, slots, f)
        self._readers[f.path] = r
        while len(self._readers) > self.config.segment_cache_size:
            _path, old = self._readers.popitem(last=False)
            os.close(old.fd)
        return r

    def _evict(self, path: str) -> None:
        r = self._readers.pop(path, None)
        if r is not None:
            os.close(r.fd)

    def _unlink_segments(self, group_path: str, files: list[_SegFile]) -> None:
        for f in files:
            try:
                os.unlink(f.path)
            except FileNotFoundError:
                pass
        if files and self._do_sync:
            fsync_dir(os.path.join(group_path, "segments"))

    # ----- groups
    def open_group(
        self,
        group_id: str,
        on_durable: OnDurable | None = None,
        on_error: OnError | None = None,
    ) -> GroupLog:
        """Open (recovering) the log of `group_id`. Raises CorruptSegmentError /
        CorruptWalError if its files are corrupt: that group stays stopped,
        others are unaffected. Callbacks default to the LogManager's."""
        path = self.group_dir(group_id)  # validates the id
        on_durable = on_durable or self._on_durable
        on_error = on_error or self._on_error
        with self._lock:
            if self._closed:
                raise GroupClosedError("LogManager is closed")
            g = self._groups.get(group_id)
            if g is not None:
                if not g._closed:
                    raise GroupAlreadyOpenError(f"group {group_id!r} is already open")
                g._closed = False
                g._on_durable, g._on_error = on_durable, on_error
                return g
        try:
            self._ensure_group_dir(group_id)
        except OSError as exc:  # a full disk, an I/O error: this group stays stopped
            raise StorageIOError(exc.errno or 5, f"group {group_id!r}: creating its directory: "
                                            f"{exc.strerror or exc}") from exc
        marker = os.path.join(path, CORRUPT_MARKER)
        if os.path.exists(marker):
            raise CorruptWalError(read_file(marker).decode("utf-8", "replace"))
        files = self._load_segments(os.path.join(path, "segments"))
        snapdir = os.path.join(path, "snapshots")
        for name in os.listdir(snapdir):
            if name.endswith(".tmp"):
                os.unlink(os.path.join(snapdir, name))
        snap = _load_latest_snapshot(snapdir)
        with self._lock:
            if group_id in self._groups:
                raise GroupAlreadyOpenError(f"group {group_id!r} is already open")
            ref = self._ref_for(group_id)
            g = GroupLog(self, group_id, ref, path, files,
                         snap.meta if snap is not None else None,
                         self._recovered_hs.get(group_id, HardState()), on_durable, on_error)
            newest = _snapshot_files(snapdir)
            have = snap.meta.index if snap is not None else 0
            if newest and newest[0][0] > have:
                # The newest snapshot is unreadable. Falling back is only sound
                # if the log still holds every entry after the older one (none
                # released, none compacted away).
                if not g._holds_all_after(have):
                    raise CorruptSnapshotError(
                        f"group {group_id!r}: snapshot {newest[0][1]} is unreadable and the log no "
                        f"longer holds the entries after {'snapshot ' + str(have) if have else 'the start'}")
            dropped = g._drop_leading(0)
            self._groups[group_id] = g
        self._unlink_segments(path, dropped)
        return g

    def delete_group(self, group_id: str) -> None:
        """Remove a group from this node for good (queue deleted, member
        removed): its log, segments, snapshots and hard state. Blocking: a
        DELETE record is made durable in the WAL first (so replay forgets the
        group's older records), then the directory is renamed away and removed.
        Raises StorageIOError if the DELETE record cannot be written."""
        if threading.current_thread() is self._writer:
            raise StorageError("delete_group() called from a callback would deadlock")
        path = self.group_dir(group_id)
        with self._delete_lock:
            done = threading.Event()
            with self._lock:
                if self._closed:
                    raise GroupClosedError("LogManager is closed")
                g = self._groups.pop(group_id, None)
                if g is not None:
                    g._closed = True
                    g._failed = GroupClosedError(f"group {group_id!r} was deleted")
                    for f in g._files:
                        self._evict(f.path)
                ref = self._ref_for(group_id)
                self._hs_records.pop(ref, None)
                self._recovered_hs.pop(group_id, None)
                rec = codec.encode_record(
                    codec.REC_DELETE, 0, ref, 0, 0, self._incarnation(group_id)
                )
                item = _Pending(None, 0, [rec], len(rec), None, None, None, done, ref)
                self._enqueue(item)
            done.wait()
            with self._lock:
                # every write of the old incarnation is done: close its cached
                # readers (an open fd would keep the deleted files' space)
                prefix = os.path.join(path, "")
                for p in [p for p in self._readers if p.startswith(prefix)]:
                    self._evict(p)
            if item.error is not None:
                raise item.error
            if os.path.isdir(path):
                self._remove_group_dir(group_id)

    def _remove_group_dir(self, group_id: str) -> None:
        """Atomic rename out of the way (so no half-deleted group is ever seen), then rmtree."""
        path = self.group_dir(group_id)
        tomb = os.path.join(self._groups_dir, f".deleted-{os.path.basename(path)}-{os.getpid()}")
        shutil.rmtree(tomb, ignore_errors=True)
        os.rename(path, tomb)
        if self._do_sync:
            fsync_dir(self._groups_dir)
        shutil.rmtree(tomb, ignore_errors=True)

    # ----- WAL writer thread
    def _enqueue(self, item: _Pending) -> None:
        """Lock held: FIFO order == generation order."""
        self._queue.append(item)
        if not self._wake.is_set():
            self._wake.set()

    def _open_wal(self, seq: int) -> None:
        path = os.path.join(self._wal_dir, f"{seq:020d}{WAL_SUFFIX}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, codec.encode_wal_header(seq), 0)
            _sync(fd, self.config.sync_method)
            if self._do_sync:
                fsync_dir(self._wal_dir)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._offset = codec.WAL_HEADER_SIZE
        self._defined = set()

    def _writer_loop(self) -> None:
        q = self._queue
        cfg = self.config
        while True:
            if not q:
                self._wake.clear()
                if not q:
                    if self._stopping:
                        return
                    self._wake.wait()
                    continue
            batch: list[_Pending] = []
            nbytes = 0
            while q and len(batch) < cfg.max_batch_records and nbytes < cfg.max_batch_bytes:
                item = q.popleft()
                batch.append(item)
                nbytes += item.nbytes
            try:
                self._write_batch(batch)
                if self._offset >= self._roll_at:
                    self._rollover()
            except Exception:  # pragma: no cover - a bug; keep the node's WAL alive
                log.exception("storage: WAL writer error")
            finally:
                for ev in self._barriers:
                    ev.set()
                self._barriers.clear()

    def _write_batch(self, batch: list[_Pending]) -> None:
        parts: list[bytes] = []
        new_refs: set[int] = set()
        carry = self._carry_needed
        if carry:
            for ref, rec in self._hs_records.items():
                parts.append(self._def_records[ref])
                new_refs.add(ref)
                parts.append(rec)
        touched: dict[GroupLog, list[_Pending]] = {}
        barriers: list[threading.Event] = []
        raw: list[_Pending] = []
        nrec = 0
        for item in batch:
            g = item.group
            if g is None:
                if item.parts:  # a node-level record (DELETE) for item.ref
                    if item.ref not in self._defined and item.ref not in new_refs:
                        parts.append(self._def_records[item.ref])
                        new_refs.add(item.ref)
                    parts.extend(item.parts)
                    raw.append(item)
                if item.barrier is not None:
                    barriers.append(item.barrier)
                continue
            if item.epoch != g._epoch:
                continue  # dropped by an earlier write error
            ref = g._ref
            if ref not in self._defined and ref not in new_refs:
                parts.append(self._def_records[ref])
                new_refs.add(ref)
            parts.extend(item.parts)
            nrec += len(item.parts)
            touched.setdefault(g, []).append(item)
        # barriers are released by the writer loop after any roll-over step
        self._barriers.extend(barriers)
        if parts:
            err = self._write_parts(parts, new_refs, carry, nrec, touched)
            for item in raw:
                item.error = err
        elif carry:
            self._carry_done()

    def _write_parts(
        self,
        parts: list[bytes],
        new_refs: set[int],
        carry: bool,
        nrec: int,
        touched: dict[GroupLog, list[_Pending]],
    ) -> StorageIOError | None:
        buf = b"".join(parts)
        try:
            write_all(self._fd, buf, self._offset)
            _sync(self._fd, self.config.sync_method)
        except OSError as exc:
            return self._write_error(exc, touched)
        self._offset += len(buf)
        self._defined |= new_refs
        st = self.stats
        st["batches"] += 1
        st["fsyncs"] += 1
        st["records"] += nrec
        st["bytes"] += len(buf)
        if carry:
            self._carry_done()
        notify: list[tuple[GroupLog, int, int]] = []
        with self._lock:
            for g, items in touched.items():
                if self._groups.get(g.group_id) is not g:
                    # Deleted while this batch was written (its records precede the
                    # DELETE record). Touch nothing of it: its hard state must not
                    # re-enter _hs_records (carried into the next WAL file, past the
                    # DELETE, it would be replayed as the re-created group's), and
                    # reading its term could cache a reader of a file whose path
                    # the re-created group reuses.
                    continue
                last_entry = None
                hs = None
                for item in items:
                    if item.last_entry is not None:
                        last_entry = item.last_entry
                    if item.hs is not None:
                        hs = item.hs
                        assert item.hs_record is not None
                        self._hs_records[g._ref] = item.hs_record
                index, term = g._batch_durable(last_entry, hs)
                notify.append((g, index, term))
        for g, index, term in notify:
            cb = g._on_durable
            if cb is not None:
                try:
                    cb(g.group_id, index, term)
                except Exception:
                    log.exception("storage: on_durable callback failed")
        return None

    def _carry_done(self) -> None:
        """The new WAL holds every group's hard state: old WAL files may be flushed."""
        self._carry_needed = False
        for gen in self._pending_flush:
            self._flush_q.put(gen)
        self._pending_flush.clear()

    def _write_error(
        self, exc: OSError, touched: dict[GroupLog, list[_Pending]]
    ) -> StorageIOError:
        self.stats["write_errors"] += 1
        try:
            os.ftruncate(self._fd, self._offset)
        except OSError:
            pass
        err = StorageIOError(exc.errno or 5, f"WAL write failed: {exc.strerror or exc}")
        err.__cause__ = exc
        with self._lock:
            for g in touched:
                g._write_failed()
        for g in touched:
            cb = g._on_error
            if cb is not None:
                try:
                    cb(g.group_id, err)
                except Exception:
                    log.exception("storage: on_error callback failed")
        return err

    def _rollover(self) -> None:
        """Start WAL gen+1; entries queued so far (gen) go into the old file,
        which the segment writer then flushes and deletes."""
        old_gen = self._gen
        old_fd = self._fd
        path = os.path.join(self._wal_dir, f"{old_gen + 1:020d}{WAL_SUFFIX}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                write_all(fd, codec.encode_wal_header(old_gen + 1), 0)
                _sync(fd, self.config.sync_method)
                if self._do_sync:
                    fsync_dir(self._wal_dir)
            except BaseException:
                os.close(fd)
                os.unlink(path)
                raise
        except OSError as exc:
            log.warning("storage: WAL roll-over failed, retrying later: %s", exc)
            return
        with self._lock:
            self._gen = old_gen + 1
            n_old = len(self._queue)
        old = [self._queue.popleft() for _ in range(n_old)]
        cfg = self.config
        while old:
            batch, old = old[: cfg.max_batch_records], old[cfg.max_batch_records :]
            self._write_batch(batch)
        self._fd = fd
        os.close(old_fd)
        self._offset = codec.WAL_HEADER_SIZE
        self._defined = set()
        self.stats["rollovers"] += 1
        self._roll_at = self.config.wal_max_size_bytes
        self._carry_needed = True
        self._pending_flush.append(old_gen)
        self._write_batch([])  # carry group ids + hard states into the new file

    # ----- segment writer thread
    def _flusher_loop(self) -> None:
        while True:
            gen = self._flush_q.get()
            if gen is None:
                return
            while True:
                try:
                    self._flush_gen(gen)
                    break
                except OSError as exc:
                    log.warning("storage: flushing WAL %d failed, will retry: %s", gen, exc)
                    if self._flush_stop.wait(0.5):
                        return

    def _flush_gen(self, gen: int) -> None:
        with self._delete_lock:  # a group is never deleted while its WAL data is flushed
            self._flush_gen_locked(gen)

    def _flush_gen_locked(self, gen: int) -> None:
        with self._lock:
            groups = list(self._groups.values())
        todo: list[GroupLog] = []
        jobs = []
        n = self.config.segment_max_entries
        for g in groups:
            with self._lock:
                got = g._flush_portion(gen)
            if got is None:
                continue
            portion, reset, seqs = got
            chunks = [portion[k : k + n] for k in range(0, len(portion), n)]
            todo.append(g)
            jobs.append((os.path.join(g.path, "segments"), chunks, reset, seqs))
        written = self._write_segment_jobs(jobs)
        for g, files in zip(todo, written, strict=True):
            with self._lock:
                dropped = g._install(gen, files)
                for f in dropped:
                    self._evict(f.path)
            self._unlink_segments(g.path, dropped)
        path = os.path.join(self._wal_dir, f"{gen:020d}{WAL_SUFFIX}")
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        if self._do_sync:
            fsync_dir(self._wal_dir)
        self.stats["flushes"] += 1
        with self._flushed_cv:
            self._flushed_upto = gen
            self._flushed_cv.notify_all()

    def wait_flushed(self, timeout: float | None = None) -> bool:
        """Block until every WAL file before the current one has been flushed
        into segments and deleted. Returns False on timeout."""
        with self._flushed_cv:
            return self._flushed_cv.wait_for(lambda: self._flushed_upto >= self._gen - 1, timeout)

    def wal_files(self) -> list[str]:
        return sorted(n for n in os.listdir(self._wal_dir) if n.endswith(WAL_SUFFIX))

    def sync(self, timeout: float | None = None) -> None:
        """Block until everything queued so far is written and fsynced (or failed)."""
        if threading.current_thread() is self._writer:
            raise StorageError("sync() called from an on_durable/on_error callback would deadlock")
        done = threading.Event()
        with self._lock:
            if self._closed:
                raise GroupClosedError("LogManager is closed")
            self._queue.append(_Pending(None, 0, [], 0, None, None, None, done))
            self._wake.set()
        done.wait(timeout)

    def close(self) -> None:
        """Write what is queued, stop the threads, close files. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stopping = True
        self._wake.set()
        self._writer.join()
        self._flush_stop.set()
        self._flush_q.put(None)
        self._flusher.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with self._lock:
            for r in self._readers.values():
                os.close(r.fd)
            self._readers.clear()
        os.close(self._dir_lock)

    def __enter__(self) -> LogManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
