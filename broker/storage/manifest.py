"""The storage manifest of one node: every WAL and segment file with its
index range and size, and each group's snapshot index. Read-only, headers and
indexes only (never entry data); safe to call while the node's LogManager is
writing (a file deleted between listing and reading is simply left out).

Pipeline position: beside the LogManager, never in the write path. The
management API serves it (`GET /api/nodes/{node}/storage`, after adding the
queue machine's live-message accounting) and the Spark audit consumes it.
"""
from __future__ import annotations

import os
import shutil
from typing import Any

import broker.storage.codec as codec

from .errors import CorruptionError
from .files import CORRUPT_MARKER, GROUP_FILE, SEG_SUFFIX, WAL_SUFFIX, seq_of
from .inspection import _latest_snapshot_header, read_segment_info


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def _read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += _size(os.path.join(root, name)) or 0
    return total


def group_manifest(group_path: str) -> dict[str, Any]:
    """One group directory: its segment files (with the composed live range:
    entries still part of the log, not counting unflushed WAL records),
    snapshot and any corruption found in headers/indexes."""
    gid = _read_text(os.path.join(group_path, GROUP_FILE))
    if gid is None:
        gid = codec.decode_group_dir(os.path.basename(group_path)) or ""
    corrupt = _read_text(os.path.join(group_path, CORRUPT_MARKER))
    segdir = os.path.join(group_path, "segments")
    infos = []
    errors = []
    for name in _listdir(segdir):
        if seq_of(name, SEG_SUFFIX) is None:
            continue
        try:
            infos.append(read_segment_info(os.path.join(segdir, name), gid))
        except FileNotFoundError:
            continue  # released or voided while we listed
        except (CorruptionError, OSError) as exc:
            errors.append({"file": name, "bytes": _size(os.path.join(segdir, name)) or 0,
                           "error": str(exc)})
    infos.sort(key=lambda i: i.seq)
    comp = codec.compose([(i.first, i.last, i.reset) for i in infos])
    segments = [{
        "file": os.path.basename(i.path), "seq": i.seq, "first_index": i.first,
        "last_index": i.last, "entries": i.count, "max_entries": i.max_count,
        "reset": i.reset, "bytes": i.file_bytes, "data_bytes": i.data_bytes,
        "log_first": live[0] if live else None, "log_last": live[1] if live else None,
    } for i, live in zip(infos, comp, strict=True)]
    snap = _latest_snapshot_header(os.path.join(group_path, "snapshots"))
    snap_bytes = group_usage(group_path)["snapshot_bytes"]
    return {
        "group_id": gid, "dir": os.path.basename(group_path), "corrupt": corrupt,
        "snapshot_index": snap[0] if snap else None,
        "snapshot_term": snap[1] if snap else None,
        "snapshot_bytes": snap_bytes,
        "segments": segments, "unreadable_segments": errors,
    }


def group_usage(group_path: str) -> dict[str, int]:
    """One group directory's files, sizes only (stat()s, no header read):
    segment files and bytes, snapshot bytes."""
    segdir, snapdir = os.path.join(group_path, "segments"), os.path.join(group_path, "snapshots")
    seg = [s for n in _listdir(segdir) if seq_of(n, SEG_SUFFIX) is not None
           and (s := _size(os.path.join(segdir, n))) is not None]
    snap = sum(_size(os.path.join(snapdir, n)) or 0 for n in _listdir(snapdir))
    return {"segment_files": len(seg), "segment_bytes": sum(seg), "snapshot_bytes": snap}


def node_usage(data_dir: str) -> dict[str, int]:
    """A node's storage, sizes only: WAL bytes, and segment files, segment
    bytes and snapshot bytes over every group (deletions in progress left
    out). The cheap sibling of `node_manifest`, for the management API's
    node figures."""
    waldir, groups_dir = os.path.join(data_dir, "wal"), os.path.join(data_dir, "groups")
    out = {"wal_bytes": sum(_size(os.path.join(waldir, n)) or 0 for n in _listdir(waldir)
                            if seq_of(n, WAL_SUFFIX) is not None),
           "segment_files": 0, "segment_bytes": 0, "snapshot_bytes": 0}
    for name in _listdir(groups_dir):
        if not name.startswith("."):
            for k, v in group_usage(os.path.join(groups_dir, name)).items():
                out[k] += v
    return out


def node_manifest(data_dir: str) -> dict[str, Any]:
    """Every group of a node's storage directory (the LogManager's
    `data_dir`), its WAL files, deletions in progress and the volume's size."""
    wal = []
    for name in _listdir(os.path.join(data_dir, "wal")):
        seq = seq_of(name, WAL_SUFFIX)
        size = _size(os.path.join(data_dir, "wal", name))
        if seq is not None and size is not None:
            wal.append({"file": name, "seq": seq, "bytes": size})
    groups_dir = os.path.join(data_dir, "groups")
    groups = []
    deleting = []
    for name in _listdir(groups_dir):
        path = os.path.join(groups_dir, name)
        if name.startswith("."):
            deleting.append({"dir": name, "bytes": _dir_bytes(path)})
        elif os.path.isdir(path):
            groups.append(group_manifest(path))
    disk: dict[str, int | None]
    try:
        usage = shutil.disk_usage(data_dir)
        disk = {"total_bytes": usage.total, "free_bytes": usage.free}
    except OSError:
        disk = {"total_bytes": None, "free_bytes": None}
    return {"data_dir": data_dir, "wal": wal, "groups": groups, "deleting": deleting, **disk}


__all__ = ["group_manifest", "group_usage", "node_manifest", "node_usage"]
