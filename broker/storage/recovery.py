"""Recovery of a node's data directory at start (docs/STORAGE.md "Recovery").

Owns: replaying every WAL file in seq order (`Run`: one group's replayed
entries; the replay rules for ENTRY / HARD_STATE / DELETE records), telling a
torn tail from corruption (and marking the groups that lost records
`CORRUPT`), finishing deletions a crash interrupted, writing the replayed
entries into segment files, and starting the new WAL that carries every
group's hard state before the old WAL files are deleted (last, so a crash
anywhere in between replays the same log again).

Runs once, from `LogManager.open`, before the writer and segment-writer
threads start; takes no lock.

Imports: `codec`, `files`, `types`, `segments` (write_segment_files),
`wal` (Wal.begin starts the new file); never `group` or `manager`.
"""
from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import broker.storage.codec as codec

from .files import (
    CORRUPT_MARKER,
    SEG_SUFFIX,
    WAL_SUFFIX,
    GroupDirs,
    fsync_dir,
    read_file,
    seq_of,
    write_file_atomic,
)
from .segments import write_segment_files
from .types import Entry, HardState, StorageConfig
from .wal import Wal

#: How far past a bad WAL record recovery looks for a valid one (which would
#: make the bad record corruption rather than a torn tail).
SCAN_LIMIT = 256 * 1024


class Run:
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


def scan_for_record(buf: bytes, lo: int, hi: int) -> int | None:
    """Offset of the first valid WAL record starting in [lo, hi), if any."""
    types = codec.REC_TYPES
    for q in range(lo, hi):
        if q + codec.REC_HEADER_SIZE <= len(buf) and buf[q + 8] in types:
            if codec.decode_record(buf, q) is not None:
                return q
    return None


@dataclass(slots=True)
class Replay:
    """What replaying the WAL files found, per group id."""

    runs: dict[str, Run] = field(default_factory=dict)
    hard_states: dict[str, HardState] = field(default_factory=dict)
    #: group -> why it is corrupt (a WAL record of it was lost)
    corrupt: dict[str, str] = field(default_factory=dict)
    #: group -> the INCARNATION its last DELETE record names
    deleted: dict[str, bytes] = field(default_factory=dict)


def recover(wal: Wal, dirs: GroupDirs, config: StorageConfig, do_sync: bool,
            remove_dir: Callable[[str], None]) -> dict[str, HardState]:
    """Replay `wal.dir`, flush the result into segments, start the next WAL
    file (`wal.begin`), delete the old ones; `remove_dir(group_id)` finishes
    an interrupted deletion (the LogManager's, so tests can stop it). Returns
    each group's recovered hard state. Raises OSError (nothing deleted) or
    StorageError."""
    wal_dir = wal.dir
    wal_files = sorted(
        (seq, os.path.join(wal_dir, n))
        for n in os.listdir(wal_dir)
        if (seq := seq_of(n, WAL_SUFFIX)) is not None
    )
    for n in os.listdir(wal_dir):
        if n.endswith(".tmp"):
            os.unlink(os.path.join(wal_dir, n))
    state = Replay()
    for _seq, path in wal_files:
        _replay(path, state, dirs.ids)
    # finish deletions a crash interrupted (the DELETE record is durable)
    for gid, inc in state.deleted.items():
        if os.path.isdir(dirs.path(gid)) and dirs.incarnation(gid) == inc:
            remove_dir(gid)
    for name in os.listdir(dirs.root):
        if name.startswith(".deleted-"):
            shutil.rmtree(os.path.join(dirs.root, name), ignore_errors=True)
    # flush recovered entries into segments so the old WAL files can go
    jobs = []
    for gid, run in state.runs.items():
        if gid in state.corrupt or not run.entries:
            continue
        path = dirs.ensure(gid)
        segdir = os.path.join(path, "segments")
        seqs = [q for name in os.listdir(segdir) if (q := seq_of(name, SEG_SUFFIX)) is not None]
        nxt = max(seqs, default=0) + 1
        per = config.segment_max_entries
        chunks = [run.entries[k : k + per] for k in range(0, len(run.entries), per)]
        jobs.append((segdir, chunks, run.reset, list(range(nxt, nxt + len(chunks)))))
    write_segment_files(jobs, config.segment_max_entries, do_sync)
    for gid, reason in state.corrupt.items():
        path = dirs.ensure(gid)
        marker = os.path.join(path, CORRUPT_MARKER)
        if not os.path.exists(marker):
            write_file_atomic(marker, [reason.encode("utf-8")], do_sync)
    # a fresh WAL carrying every group's hard state, then drop the old files
    wal.begin((wal_files[-1][0] + 1) if wal_files else 1,
              {gid: hs for gid, hs in state.hard_states.items() if gid not in state.corrupt})
    for _seq, path in wal_files:
        os.unlink(path)
    if wal_files and do_sync:
        fsync_dir(wal_dir)
    return state.hard_states


def _replay(path: str, state: Replay, group_ids: Callable[[], list[str]]) -> None:
    buf = read_file(path)
    if codec.decode_wal_header(buf) is None:
        return  # torn header: the file was just created, holds nothing durable
    refs: dict[int, str] = {}
    pos = codec.WAL_HEADER_SIZE
    n = len(buf)
    while pos < n:
        rec = codec.decode_record(buf, pos)
        if rec is None:
            _check_corruption(buf, pos, refs, path, state, group_ids)
            return
        pos = rec.end
        _apply_record(rec, refs, state)


def _apply_record(rec: codec.WalRecord, refs: dict[int, str], state: Replay) -> None:
    if rec.rtype == codec.REC_GROUP:
        refs[rec.ref] = rec.payload.decode("utf-8")
        return
    gid = refs.get(rec.ref)
    if gid is None:
        return
    if rec.rtype == codec.REC_DELETE:
        state.runs.pop(gid, None)
        state.hard_states.pop(gid, None)
        state.corrupt.pop(gid, None)
        state.deleted[gid] = rec.payload
        return
    state.deleted.pop(gid, None)
    if rec.rtype == codec.REC_HARD_STATE:
        vote = rec.payload.decode("utf-8") if rec.flags & codec.HS_HAS_VOTE else None
        state.hard_states[gid] = HardState(rec.term, vote, rec.index)
    else:
        e = Entry(rec.index, rec.term, rec.payload, rec.flags)
        flag = bool(rec.reserved & codec.REC_FLAG_RESET)
        run = state.runs.get(gid)
        if run is None:
            run = state.runs[gid] = Run(e.index, flag)
            run.entries.append(e)
        else:
            run.add(e, flag)


def _check_corruption(buf: bytes, pos: int, refs: dict[int, str], path: str, state: Replay,
                      group_ids: Callable[[], list[str]]) -> None:
    """A bad record at `pos`: a torn tail, unless valid records follow it,
    in which case the groups that lost records are marked corrupt."""
    end = codec.record_length_at(buf, pos)
    if end is None or codec.decode_record(buf, end) is None:
        # the length field may be the damaged part: look a little further
        end = scan_for_record(buf, pos + 1, min(len(buf), pos + SCAN_LIMIT))
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
        affected.update(group_ids())
    reason = f"{path}: corrupt WAL record at offset {pos}; later records of this group lost"
    for gid in affected:
        state.corrupt.setdefault(gid, reason)
