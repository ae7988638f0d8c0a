"""Shared helpers for tests/storage (and the other tests that fill a disk):
deterministic payloads, a durability waiter, a small tmpfs and filling it."""
from __future__ import annotations

import hashlib
import random
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from broker.storage import Entry, GroupLog, LogManager, StorageConfig

TINY = StorageConfig(wal_max_size_bytes=4096, segment_max_entries=8)


def payload(group: str, index: int, term: int, size: int | None = None) -> bytes:
    """Deterministic data for (group, index, term): lets a checker tell
    written content from anything that was never written."""
    seed = hashlib.blake2b(f"{group}/{index}/{term}".encode(), digest_size=16).digest()
    n = size if size is not None else seed[0] % 97
    return (seed * (n // 16 + 1))[:n]


def entries(group: str, lo: int, hi: int, term: int, kind: int = 0) -> list[Entry]:
    return [Entry(i, term, payload(group, i, term), kind) for i in range(lo, hi)]


class Durable:
    """Collects on_durable / on_error callbacks; wait for a condition without sleeping."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.latest: dict[str, tuple[int, int]] = {}
        self.calls: list[tuple[str, int, int]] = []
        self.errors: list[tuple[str, BaseException]] = []

    def on_durable(self, group: str, index: int, term: int) -> None:
        with self.cv:
            self.latest[group] = (index, term)
            self.calls.append((group, index, term))
            self.cv.notify_all()

    def on_error(self, group: str, exc: BaseException) -> None:
        with self.cv:
            self.errors.append((group, exc))
            self.cv.notify_all()

    def wait_index(self, group: str, index: int, timeout: float = 10.0) -> bool:
        with self.cv:
            return self.cv.wait_for(
                lambda: self.latest.get(group, (0, 0))[0] >= index, timeout
            )

    def wait_error(self, timeout: float = 10.0) -> bool:
        with self.cv:
            return self.cv.wait_for(lambda: bool(self.errors), timeout)


@contextmanager
def manager(path: Path, config: StorageConfig = TINY, durable: Durable | None = None
            ) -> Iterator[LogManager]:
    d = durable
    m = LogManager.open(path, config,
                   on_durable=d.on_durable if d else None,
                   on_error=d.on_error if d else None,
                   rng=random.Random(len(str(path))))
    try:
        yield m
    finally:
        m.close()


def read_all(log: GroupLog) -> list[Entry]:
    first, last = log.first_index(), log.last_entry_index()
    return log.entries(first, last + 1) if last >= first else []


@contextmanager
def tmpfs(path: Path, size: str = "1m", name: str = "tmpfs") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (created) for the block; needs
    root (the tests that use it are marked `root`)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", name, str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill_disk(path: Path) -> None:
    """Write zeros to `path` until its file system is full (ENOSPC)."""
    import errno
    import os

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while os.write(fd, b"\0" * 4096) > 0:
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
