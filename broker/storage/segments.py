"""Segment files (`groups/<g>/segments/<seq>.segment`): writing, loading,
verifying, reading, and one group's composition of them.

Owns:
- `SegFile` (one immutable file on disk) and `SegReader` (an open file whose
  header and index were checked: fd + index slots; a slot's term is served
  once its entry's crc was checked; compacted files are checked whole);
- `SegmentCache`: the node's LRU of open readers (`segment_cache_size`);
- `write_segment_files` (several groups at once: all data, then one
  fdatasync per file, renames, one fsync per directory), `load_segments`
  (headers + indexes, structure checks), `unlink_segments`;
- `SegmentSet`: one group's files in seq order and the piece of each that is
  visible (the composition rule of docs/STORAGE.md, cut at `clip`);
- `read_range`: entries of one file, each checked against its crc.

Locking: `SegmentCache` and `SegmentSet` hold no lock of their own; every
call is made with the node lock held (the same lock as before the split).
The file functions run without it.

Imports: `codec`, `files`, `types`, `errors`; nothing else of broker/storage.
"""
from __future__ import annotations

import bisect
import collections
import os
from dataclasses import dataclass

import broker.storage.codec as codec

from .errors import CompactedError, CorruptSegmentError, InvariantError
from .files import SEG_SUFFIX, fsync_dir, seq_of, write_parts
from .types import Entry

#: SegmentSet.clip when no later write shadows any segment entry
NO_CLIP = 1 << 63


@dataclass(frozen=True, slots=True)
class SegFile:
    """One segment file on disk (immutable once renamed into place)."""

    seq: int
    path: str
    first: int
    last: int
    reset: bool
    #: a compacted segment: slots hold strictly increasing indexes in
    #: [first, last]; an index without a slot is compacted away
    sparse: bool = False


class SegReader:
    """An open segment file whose header and index passed the structure
    checks: fd + index slots.

    An index slot has no checksum of its own: its term, offset and length
    are covered by its entry's crc. So entries are checked when read
    (`read_range`), and a slot's term is served only once its entry has been
    checked (`checked_term`). A compacted (sparse) file is checked whole
    when opened, so that a slot whose index went bad cannot pass for a
    compacted hole.

    `seg` is the very SegFile it was opened for: a path can name another
    file later (a deleted and re-created group numbers its segments from 1
    again), so the cache only answers for that object."""

    __slots__ = ("fd", "slots", "first", "seg", "idxs", "checked")

    def __init__(self, fd: int, slots: list[codec.SegmentSlot], seg: SegFile) -> None:
        self.fd = fd
        self.slots = slots
        self.first = slots[0].idx
        self.seg = seg
        # sparse (compacted) segments: the slot indexes, for bisection
        self.idxs: list[int] | None = [s.idx for s in slots] if seg.sparse else None
        #: per slot: its entry's crc was checked (1)
        self.checked = bytearray(len(slots))

    def checked_term(self, index: int) -> int | None:
        """The term of entry `index` from its slot, after checking that
        entry's crc once (None: no slot, a compacted hole). Raises
        CorruptSegmentError."""
        idxs = self.idxs
        if idxs is None:
            k = index - self.first
            if not 0 <= k < len(self.slots):
                return None
        else:
            k = bisect.bisect_left(idxs, index)
            if k >= len(idxs) or idxs[k] != index:
                return None
        if not self.checked[k]:
            self._check(k)
        return self.slots[k].term

    def check_all(self) -> None:
        """Check every entry's crc. Raises CorruptSegmentError."""
        for k in range(len(self.slots)):
            if not self.checked[k]:
                self._check(k)

    def _check(self, k: int) -> None:
        s = self.slots[k]
        codec.check_stored(s, os.pread(self.fd, s.length, s.offset), self.seg.path)
        self.checked[k] = 1


class SegmentCache:
    """The node's open segment readers (header and index checked; each entry is
    checked when read), least recently used first.
    Every method is called with the node lock held."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._readers: collections.OrderedDict[str, SegReader] = collections.OrderedDict()

    def reader(self, f: SegFile) -> SegReader:
        """Open a segment file and check its header and index (lock held);
        LRU-cached."""
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
            # the header and index only: each entry's crc is checked when it is
            # read (read_range); reading and checking the whole file here cost
            # a 512 MiB read for one 1 MiB body (a WAL's worth of them)
            flags, slots = _read_index(fd, f.path)
            if bool(flags & codec.SEG_FLAG_SPARSE) != f.sparse:
                raise CorruptSegmentError(f"{f.path}: segment flags changed on disk")
            if slots[0].idx != f.first or slots[-1].idx != f.last:
                raise CorruptSegmentError(f"{f.path}: index range changed on disk")
            r = SegReader(fd, slots, f)
            if f.sparse:  # compacted: checked whole (see SegReader)
                r.check_all()
        except BaseException:
            os.close(fd)
            raise
        self._readers[f.path] = r
        while len(self._readers) > self._capacity:
            _path, old = self._readers.popitem(last=False)
            os.close(old.fd)
        return r

    def evict(self, path: str) -> None:
        r = self._readers.pop(path, None)
        if r is not None:
            os.close(r.fd)

    def evict_under(self, prefix: str) -> None:
        """Close every cached reader whose path starts with `prefix` (a group directory)."""
        for p in [p for p in self._readers if p.startswith(prefix)]:
            self.evict(p)

    def close_all(self) -> None:
        for r in self._readers.values():
            os.close(r.fd)
        self._readers.clear()


# ----------------------------------------------------------------- files io
def write_segment_files(
    jobs: list[tuple[str, list[list[Entry]], bool, list[int]]], max_entries: int, do_sync: bool
) -> list[list[SegFile]]:
    """Write segment files for several groups: all data first, then one
    fdatasync per file (cheap after the first: the journal commit carries
    them), renames, and one fsync per directory. Tmp files go on failure.
    A job is (segments dir, chunks of entries, reset flag of the first file,
    the seq of each file)."""
    opened: list[tuple[int, str, str]] = []  # fd, tmp, final
    out: list[list[SegFile]] = []
    try:
        for segdir, chunks, reset, seqs in jobs:
            files = []
            for n, (chunk, seq) in enumerate(zip(chunks, seqs, strict=True)):
                data = codec.segment_parts(
                    max_entries,
                    [(e.index, e.term, e.kind, e.data) for e in chunk],
                    reset and n == 0,
                )
                path = os.path.join(segdir, f"{seq:020d}{SEG_SUFFIX}")
                fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                opened.append((fd, path + ".tmp", path))
                write_parts(fd, data, 0)
                files.append(
                    SegFile(seq, path, chunk[0].index, chunk[-1].index, reset and n == 0)
                )
            out.append(files)
        if do_sync:
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
    if do_sync:
        for segdir, chunks, _reset, _seqs in jobs:
            if chunks:
                fsync_dir(segdir)
    return out


def load_segments(segdir: str) -> list[SegFile]:
    """Every segment file of a group, in seq order, after the structure checks
    (magic, version, header crc, index slots, data inside the file); deletes
    unfinished `.tmp` writes. Raises CorruptSegmentError."""
    files = []
    for name in os.listdir(segdir):
        if name.endswith(".tmp"):
            os.unlink(os.path.join(segdir, name))
            continue
        seq = seq_of(name, SEG_SUFFIX)
        if seq is None:
            continue
        path = os.path.join(segdir, name)
        fd = os.open(path, os.O_RDONLY)
        try:
            flags, slots = _read_index(fd, path)
        finally:
            os.close(fd)
        sparse = bool(flags & codec.SEG_FLAG_SPARSE)
        files.append(SegFile(seq, path, slots[0].idx, slots[-1].idx,
                             bool(flags & codec.SEG_FLAG_RESET), sparse))
    files.sort(key=lambda f: f.seq)
    return files


def _read_index(fd: int, path: str) -> tuple[int, list[codec.SegmentSlot]]:
    """A segment file's flags and index slots, after the structure checks
    (magic, version, header crc, index slots, data inside the file and after
    the index). Raises CorruptSegmentError."""
    size = os.fstat(fd).st_size
    head = os.pread(fd, codec.SEG_HEADER_SIZE, 0)
    flags, max_count, count = codec.decode_segment_header(head, path)
    idx = os.pread(fd, count * codec.SEG_SLOT_SIZE, codec.SEG_HEADER_SIZE)
    slots = codec.decode_segment_index(idx, count, size, path, bool(flags & codec.SEG_FLAG_SPARSE))
    if slots[0].offset < codec.SEG_HEADER_SIZE + max_count * codec.SEG_SLOT_SIZE:
        raise CorruptSegmentError(f"{path}: entry data overlaps the index")
    return flags, slots


def unlink_segments(group_path: str, files: list[SegFile], do_sync: bool) -> None:
    for f in files:
        try:
            os.unlink(f.path)
        except FileNotFoundError:
            pass
    if files and do_sync:
        fsync_dir(os.path.join(group_path, "segments"))


def read_range(
    reader: SegReader, group_id: str, lo: int, hi: int, size: int, max_bytes: int | None,
    have: bool,
) -> tuple[list[Entry], int, bool]:
    """Entries [lo, hi] of one file, each checked against its crc, until the
    data passes `max_bytes` (`size` so far; `have`: entries already read).
    Returns (entries, size, full). Raises CompactedError (a compacted hole),
    InvariantError (the slots do not hold [lo, hi]: a bug) or
    CorruptSegmentError; the caller stops the group on the last two."""
    path = reader.seg.path
    if reader.idxs is not None:  # compacted: only whole runs of kept entries
        k = bisect.bisect_left(reader.idxs, lo)
        slots = reader.slots[k : k + hi - lo + 1]
        if len(slots) != hi - lo + 1 or not slots or slots[0].idx != lo or slots[-1].idx != hi:
            raise CompactedError(
                f"group {group_id!r}: [{lo}, {hi}] not all held (compacted segment)")
    else:
        k = lo - reader.first
        slots = reader.slots[k : hi - reader.first + 1] if k >= 0 else []
    if len(slots) != hi - lo + 1 or slots[0].idx != lo or slots[-1].idx != hi:
        raise InvariantError(
            f"group {group_id!r}: {path}: slots do not hold entries [{lo}, {hi}]")
    start = slots[0].offset
    end = slots[-1].offset + slots[-1].length
    buf = os.pread(reader.fd, end - start, start)
    out: list[Entry] = []
    for s in slots:
        stored = buf[s.offset - start : s.offset - start + s.length]
        codec.check_stored(s, stored, path)
        size += s.length - 1
        if max_bytes is not None and size > max_bytes and (have or out):
            return out, size, True
        out.append(Entry(s.idx, s.term, stored[1:], stored[0]))
    return out, size, False


# ------------------------------------------------------ one group's files
class SegmentSet:
    """One group's segment files, in seq order, and the visible piece of each:
    `pieces` = (lo, hi, file) after the composition rule, cut at `clip`.
    Called with the node lock held.

    Invariant: segment entries with index > clip are shadowed by later writes
    (the memory table); `pieces`/`piece_los` always match `files` and `clip`."""

    __slots__ = ("files", "next_seq", "clip", "pieces", "piece_los")

    def __init__(self, files: list[SegFile]) -> None:
        # segment files on disk, by sequence number (write order)
        self.files = files
        self.next_seq = (files[-1].seq + 1) if files else 1
        self.clip = NO_CLIP
        self.pieces: list[tuple[int, int, SegFile]] = []
        self.piece_los: list[int] = []
        self.recompute()

    def recompute(self) -> None:
        comp = codec.compose([(f.first, f.last, f.reset) for f in self.files])
        pieces = []
        for f, p in zip(self.files, comp, strict=True):
            if p is not None and p[0] <= self.clip:
                pieces.append((p[0], min(p[1], self.clip), f))
        self.pieces = pieces
        self.piece_los = [p[0] for p in pieces]

    def set_clip(self, clip: int) -> None:
        self.clip = clip
        self.recompute()

    def take_seqs(self, nfiles: int) -> list[int]:
        """Reserve the sequence numbers of `nfiles` new files."""
        seqs = list(range(self.next_seq, self.next_seq + nfiles))
        self.next_seq += nfiles
        return seqs

    def add(self, files: list[SegFile], clip: int | None) -> None:
        """Add flushed files (and move the clip, if given)."""
        self.files.extend(files)
        self.files.sort(key=lambda f: f.seq)
        if clip is not None:
            self.clip = clip
        self.recompute()

    def replace_prefix(self, n: int, new: SegFile) -> None:
        """The first `n` files were compacted into `new`."""
        self.files[:n] = [new]
        self.recompute()

    def drop_leading(self, bound: int) -> list[SegFile]:
        """Remove (from the list) leading files that are void in the segment-only
        composition, or whose surviving entries all lie below `bound`."""
        comp = codec.compose([(f.first, f.last, f.reset) for f in self.files])
        n = 0
        for p in comp:
            if p is None or p[1] < bound:
                n += 1
            else:
                break
        dropped = self.files[:n]
        if dropped:
            del self.files[:n]
            self.recompute()
        return dropped
