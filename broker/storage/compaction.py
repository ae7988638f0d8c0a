"""The file work of compaction (docs/STORAGE.md "Compaction"): choosing how
many leading segment files to rewrite, reading their kept entries, writing
the compacted (SPARSE + RESET) file as `.compact.tmp`, and removing the
replaced files after the rename.

`GroupLog.compact` (group.py) drives it: it takes the compactable prefix
under the node lock, calls `plan` and `write_tmp` without the lock, swaps
the new file in under the lock, and calls `finish`. Nothing here touches a
group's in-memory state or takes a lock.

Imports: `codec`, `files`, `segments` (SegFile), `errors`.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import broker.storage.codec as codec

from .errors import CorruptSegmentError
from .files import fsync_dir, write_parts
from .segments import SegFile

_Slot = codec.SegmentSlot


@dataclass(frozen=True, slots=True)
class Plan:
    """A compaction worth doing: `old` (leading files, seq order) become one
    file covering [first, last] holding `entries` (index, term, kind, data)."""

    old: list[SegFile]
    first: int
    last: int
    entries: list[tuple[int, int, int, bytes]]


def plan(prefix: list[tuple[SegFile, int, int, int]], live_indexes: Iterable[int],
         min_gain: float) -> Plan | None:
    """Choose the prefix length that frees most bytes (at least `min_gain` of
    them) and read its kept entries (each checked against its crc). None:
    nothing worth doing, or a file was released meanwhile. Raises
    CorruptionError (the caller stops the group)."""
    lo_all, hi_all = prefix[0][1], prefix[-1][2]
    keep = sorted({i for i in live_indexes if lo_all < i < hi_all})
    cap = 65535 - 2  # u16 max_count
    # plan: per file, only the index slots needed (first, last, kept ones;
    # the whole index of a compacted file, which is small); then choose
    # the prefix length that frees most
    Slot = codec.SegmentSlot
    plans: list[tuple[SegFile, int, int, list[_Slot], _Slot | None, int]] = []
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
        return None  # released meanwhile
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
        return None
    plans = plans[:best_k]
    slots_kept: list[_Slot] = []
    where: list[SegFile] = []  # the file each kept slot is in
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
            codec.check_stored(s, stored, f.path)
            entries.append((s.idx, s.term, stored[0], stored[1:]))
    except FileNotFoundError:
        return None
    finally:
        for rfd in fds.values():
            os.close(rfd)
    return Plan([p[0] for p in plans], lo_all, last_hi, entries)


def write_tmp(path: str, entries: list[tuple[int, int, int, bytes]], do_sync: bool) -> str:
    """Write the compacted file as `<path>.compact.tmp` (fdatasync'd); its name."""
    tmp = path + ".compact.tmp"
    data = codec.segment_parts(len(entries), entries, reset=True, sparse=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_parts(fd, data, 0)
        if do_sync:
            os.fdatasync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def finish(segdir: str, old: list[SegFile], do_sync: bool,
           hook: Callable[[str], None] | None) -> None:
    """After the rename: fsync the directory, delete the replaced files before
    the last one (which the new file took the name of), fsync again."""
    if hook is not None:
        hook("renamed")
    if do_sync:
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
    if len(old) > 1 and do_sync:
        fsync_dir(segdir)
