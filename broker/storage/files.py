"""Small durable-file helpers for broker/storage (the only package touching files).

Invariant: a file that must survive a crash is written to `<name>.tmp`,
fsynced, renamed over its final name, and its directory is fsynced; so a
final name always holds a complete file (or nothing).
"""
from __future__ import annotations

import os


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
