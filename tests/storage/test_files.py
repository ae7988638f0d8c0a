"""files.write_parts: vectored writes of many buffers (more than one pwritev
takes), and what reaches the file when the disk fills in the middle."""
from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from broker.storage.files import IOV_MAX, write_parts

from .helpers import tmpfs


def _parts(rng: random.Random, count: int, biggest: int) -> list[bytes]:
    return [rng.randbytes(rng.randrange(0, biggest)) for _ in range(count)]


def test_many_parts_land_back_to_back_at_the_offset(tmp_path: Path) -> None:
    rng = random.Random(16)
    parts = _parts(rng, 3 * IOV_MAX + 17, 300)  # four pwritev calls
    parts[5] = memoryview(b"xx" + parts[5])[2:]  # a view is written too
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"H" * 10)
        written = write_parts(fd, parts, 10)
        os.fsync(fd)
    finally:
        os.close(fd)
    expected = b"".join(bytes(p) for p in parts)
    assert written == len(expected)
    assert path.read_bytes() == b"H" * 10 + expected


@pytest.mark.root
def test_a_disk_filling_mid_batch_raises_and_leaves_a_prefix(tmp_path: Path) -> None:
    """ENOSPC after a short write: the short write is retried from where it
    stopped (so the next write meets the full disk and raises), and what the
    file holds is an exact prefix of the parts, never bytes out of order."""
    rng = random.Random(17)
    parts = _parts(rng, 40, 128 * 1024)  # ~2.5 MiB into a 1 MiB file system
    expected = b"".join(parts)
    with tmpfs(tmp_path / "mnt") as mnt:
        fd = os.open(mnt / "f", os.O_RDWR | os.O_CREAT)
        try:
            with pytest.raises(OSError) as caught:
                write_parts(fd, parts, 0)
        finally:
            os.close(fd)
        assert caught.value.errno == errno.ENOSPC
        got = (mnt / "f").read_bytes()
    assert 0 < len(got) < len(expected)
    assert got == expected[: len(got)]
