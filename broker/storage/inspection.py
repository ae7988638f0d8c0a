"""Offline, read-only view of a node's data directory (for the Spark audit,
the management API and operators): which segment files each group has, what
range each still serves, and where its snapshot is. Reads only headers and
indexes, never entry data, and needs no running LogManager.

Pipeline position: beside the LogManager, never in the write path.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import broker.storage.codec as codec

from .errors import CorruptionError, CorruptSegmentError
from .files import GROUP_FILE, SEG_SUFFIX, seq_of
from .snapshots import snapshot_files


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment file. `live` is the [lo, hi] range of its entries that are
    still part of the log after composition (None: void, awaiting deletion);
    WAL contents not yet flushed are not considered."""

    group_id: str
    path: str
    seq: int
    first: int
    last: int
    count: int
    max_count: int
    reset: bool
    file_bytes: int
    data_bytes: int
    live: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class GroupInfo:
    group_id: str
    path: str
    segments: list[SegmentInfo]
    snapshot_index: int | None
    snapshot_term: int | None
    corrupt: str | None  # reason, if a segment header/index or the WAL was damaged


def read_segment_info(path: str, group_id: str = "") -> SegmentInfo:
    """Header + index of one segment file; raises CorruptSegmentError."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        flags, max_count, count = codec.decode_segment_header(
            os.pread(fd, codec.SEG_HEADER_SIZE, 0), path
        )
        idx = os.pread(fd, count * codec.SEG_SLOT_SIZE, codec.SEG_HEADER_SIZE)
        slots = codec.decode_segment_index(idx, count, size, path,
                                           bool(flags & codec.SEG_FLAG_SPARSE))
    finally:
        os.close(fd)
    name = os.path.basename(path)
    seq = seq_of(name, SEG_SUFFIX)
    if seq is None:
        raise CorruptSegmentError(f"{path}: not a segment file name")
    return SegmentInfo(
        group_id=group_id, path=path, seq=seq, first=slots[0].idx, last=slots[-1].idx,
        count=count, max_count=max_count, reset=bool(flags & codec.SEG_FLAG_RESET),
        file_bytes=size, data_bytes=sum(s.length for s in slots), live=None,
    )


def scan_group(group_path: str) -> GroupInfo:
    """Segments (with live ranges) and snapshot of one group directory."""
    try:
        with open(os.path.join(group_path, GROUP_FILE), "rb") as f:
            gid = f.read().decode("utf-8")
    except FileNotFoundError:
        gid = codec.decode_group_dir(os.path.basename(group_path)) or ""
    corrupt: str | None = None
    marker = os.path.join(group_path, "CORRUPT")
    if os.path.exists(marker):
        with open(marker, "rb") as f:
            corrupt = f.read().decode("utf-8", "replace")
    infos: list[SegmentInfo] = []
    segdir = os.path.join(group_path, "segments")
    for name in sorted(os.listdir(segdir)) if os.path.isdir(segdir) else []:
        if seq_of(name, SEG_SUFFIX) is None:
            continue
        try:
            infos.append(read_segment_info(os.path.join(segdir, name), gid))
        except (CorruptionError, OSError) as exc:
            corrupt = corrupt or str(exc)
    infos.sort(key=lambda i: i.seq)
    comp = codec.compose([(i.first, i.last, i.reset) for i in infos])
    segments = [
        SegmentInfo(i.group_id, i.path, i.seq, i.first, i.last, i.count, i.max_count, i.reset,
                    i.file_bytes, i.data_bytes, live)
        for i, live in zip(infos, comp, strict=True)
    ]
    snap = _latest_snapshot_header(os.path.join(group_path, "snapshots"))
    return GroupInfo(gid, group_path, segments,
                     snap[0] if snap else None, snap[1] if snap else None, corrupt)


def _latest_snapshot_header(snapdir: str) -> tuple[int, int] | None:
    """(index, term) of the newest snapshot whose header and length check out
    (the body checksum is not verified here: that needs the whole file)."""
    for _index, path in snapshot_files(snapdir):
        try:
            with open(path, "rb") as f:
                head = f.read(codec.SNAP_HEADER_SIZE)
                size = os.fstat(f.fileno()).st_size
        except OSError:
            continue
        if len(head) < codec.SNAP_HEADER_SIZE:
            continue
        magic, version, index, term, clen, dlen, _body_crc = codec.SNAP_HEADER.unpack_from(head)
        (hcrc,) = codec.REC_CRC.unpack_from(head, codec.SNAP_HEADER.size)
        if (magic, version) != (codec.SNAP_MAGIC, codec.SNAP_VERSION):
            continue
        if codec.crc32(head[: codec.SNAP_HEADER.size]) != hcrc:
            continue
        if size != codec.SNAP_HEADER_SIZE + clen + dlen:
            continue
        return int(index), int(term)
    return None


def scan_node(data_dir: str) -> list[GroupInfo]:
    """Every group directory under `data_dir/groups` (deletions in progress skipped)."""
    groups_dir = os.path.join(data_dir, "groups")
    out = []
    for name in sorted(os.listdir(groups_dir)) if os.path.isdir(groups_dir) else []:
        if not name.startswith("."):
            out.append(scan_group(os.path.join(groups_dir, name)))
    return out
