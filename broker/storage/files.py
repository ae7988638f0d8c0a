"""Durable-file helpers and the data directory's names for broker/storage
(the only package touching files): file suffixes, the per-group files, the
node's LOCK, and `GroupDirs` (a group's directory: name, creation, deletion).

Imports: only `codec` (group id encoding) and `errors`; every other storage
module may import this one.

Invariant: a file that must survive a crash is written to `<name>.tmp`,
fsynced, renamed over its final name, and its directory is fsynced; so a
final name always holds a complete file (or nothing).
"""
from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Sequence

import broker.storage.codec as codec

from .errors import StorageError

WAL_SUFFIX = ".wal"
SEG_SUFFIX = ".segment"
SNAP_SUFFIX = ".snapshot"
CORRUPT_MARKER = "CORRUPT"
GROUP_FILE = "GROUP"
#: Random id of one incarnation of a group directory; a DELETE record names
#: the incarnation it deletes, so a re-created group is not removed on replay.
INCARNATION_FILE = "INCARNATION"


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """pwrite everything (retrying short writes); raises OSError on failure."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:  # pragma: no cover - pwrite raises instead on Linux
            raise OSError("short write")
        view = view[n:]
        offset += n


#: most buffers one pwritev takes (the kernel refuses more with EINVAL)
IOV_MAX = 1024


def write_parts(fd: int, parts: Sequence[bytes | memoryview], offset: int) -> int:
    """pwritev the parts back to back from `offset`, IOV_MAX at a time,
    retrying short writes; returns the bytes written. The parts are not
    joined first: a WAL batch or segment file of big bodies is written from
    the buffers that already hold them. Raises OSError on failure."""
    written = 0
    for start in range(0, len(parts), IOV_MAX):
        batch = parts[start : start + IOV_MAX]
        want = sum(map(len, batch))
        done = os.pwritev(fd, batch, offset) if want else 0
        if done < want:  # short write: finish this batch part by part
            skip = done
            for part in batch:
                size = len(part)
                if skip >= size:
                    skip -= size
                    continue
                write_all(fd, memoryview(part)[skip:], offset + done)
                done += size - skip
                skip = 0
        offset += want
        written += want
    return written


def write_file_atomic(path: str, chunks: list[bytes], sync: bool = True) -> None:
    """tmp + fsync + rename + directory fsync. Removes the tmp file on failure."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            off = 0
            for chunk in chunks:
                write_all(fd, chunk, off)
                off += len(chunk)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync:
        fsync_dir(os.path.dirname(path) or ".")


def makedirs_durable(path: str) -> None:
    """mkdir -p, fsyncing each parent whose entry was created."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path.rstrip("/"))
    if parent and not os.path.isdir(parent):
        makedirs_durable(parent)
    try:
        os.mkdir(path)
    except FileExistsError:
        return
    fsync_dir(parent or ".")


def read_file(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def seq_of(name: str, suffix: str) -> int | None:
    """The sequence number of a `<seq><suffix>` file name, or None."""
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    return int(stem) if stem.isdigit() else None


def lock_dir(path: str) -> int:
    """Exclusive flock on <data_dir>/LOCK: one LogManager per directory."""
    fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise StorageError(f"{path} is in use by another LogManager") from exc
    return fd


class GroupDirs:
    """The `groups/` directory of a node: one directory per group (GROUP,
    INCARNATION, segments/, snapshots/), created durably, removed atomically."""

    def __init__(self, groups_dir: str, do_sync: bool) -> None:
        self.root = groups_dir
        self._do_sync = do_sync

    def path(self, group_id: str) -> str:
        return os.path.join(self.root, codec.encode_group_dir(group_id))

    def ids(self) -> list[str]:
        """Ids of every group with a directory on this node."""
        out = []
        for name in sorted(os.listdir(self.root)):
            if name.startswith("."):
                continue  # a deletion in progress
            try:
                out.append(read_file(os.path.join(self.root, name, GROUP_FILE)).decode())
            except OSError:
                continue
        return out

    def ensure(self, group_id: str) -> str:
        path = self.path(group_id)
        makedirs_durable(os.path.join(path, "segments"))
        makedirs_durable(os.path.join(path, "snapshots"))
        gfile = os.path.join(path, GROUP_FILE)
        if not os.path.exists(gfile):
            inc = os.path.join(path, INCARNATION_FILE)
            write_file_atomic(inc, [os.urandom(8).hex().encode()], self._do_sync)
            write_file_atomic(gfile, [group_id.encode("utf-8")], self._do_sync)
        return path

    def incarnation(self, group_id: str) -> bytes:
        try:
            return read_file(os.path.join(self.path(group_id), INCARNATION_FILE))
        except FileNotFoundError:
            return b""

    def remove(self, group_id: str) -> None:
        """Atomic rename out of the way (so no half-deleted group is ever seen), then rmtree."""
        path = self.path(group_id)
        tomb = os.path.join(self.root, f".deleted-{os.path.basename(path)}-{os.getpid()}")
        shutil.rmtree(tomb, ignore_errors=True)
        os.rename(path, tomb)
        if self._do_sync:
            fsync_dir(self.root)
        shutil.rmtree(tomb, ignore_errors=True)
