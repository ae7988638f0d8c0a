"""Snapshot files of one group (`groups/<g>/snapshots/<index>_<term>.snapshot`).

Owns: the snapshot file names, writing one durably (tmp, fsync, rename,
directory fsync), listing them newest first, loading the newest valid one,
pruning all but the newest valid ones, and removing unfinished `.tmp` files.
Knows nothing of a group's log: the Raft rule that reconciles a snapshot with
the log, and the fallback check, are `GroupLog`'s (group.py).

Imports: `codec` (the header format), `files`, `types`, `errors`; nothing
else of broker/storage. No lock: callers hold none while these run.
"""
from __future__ import annotations

import logging
import os

import broker.storage.codec as codec

from .errors import CorruptSnapshotError
from .files import SNAP_SUFFIX, read_file, write_file_atomic
from .types import Snapshot, SnapshotMeta

log = logging.getLogger(__name__)


def snapshot_files(snapdir: str) -> list[tuple[int, str]]:
    """(index, path) of every snapshot file, highest index first (unchecked)."""
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


def load_latest_snapshot(snapdir: str) -> Snapshot | None:
    """The newest snapshot that passes every check (invalid ones are skipped)."""
    for _index, path in snapshot_files(snapdir):
        try:
            index, term, config, data = codec.decode_snapshot(read_file(path), path)
        except (CorruptSnapshotError, OSError) as exc:
            log.warning("storage: skipping invalid snapshot: %s", exc)
            continue
        return Snapshot(SnapshotMeta(index, term, config), data)
    return None


def prune_snapshots(snapdir: str, keep: int) -> None:
    """Delete every snapshot file after the newest `keep` valid ones."""
    valid = 0
    for _index, path in snapshot_files(snapdir):
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


def write_snapshot(snapdir: str, index: int, term: int, config: bytes, data: bytes,
                   sync: bool) -> SnapshotMeta:
    """Write one snapshot file (tmp, fsync, rename, dir fsync); blocking."""
    name = f"{index:020d}_{term:020d}{SNAP_SUFFIX}"
    head = codec.encode_snapshot_header(index, term, config, data)
    write_file_atomic(os.path.join(snapdir, name), [head, config, data], sync)
    return SnapshotMeta(index, term, bytes(config))


def remove_tmp_files(snapdir: str) -> None:
    """Delete unfinished snapshot writes (`*.tmp`) left by a crash."""
    for name in os.listdir(snapdir):
        if name.endswith(".tmp"):
            os.unlink(os.path.join(snapdir, name))
