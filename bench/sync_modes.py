"""Benchmark: what a WAL write + fdatasync costs on this disk, by how the
file's blocks came to be: appended (the file grows at every write, as our
WAL files do), preallocated with posix_fallocate (blocks reserved, but
unwritten: the first write to each still changes the extent map), or
overwritten (blocks already written: the sync flushes data only, no
journal commit). The last is what recycling WAL files would give.

Prints syncs/s, wall microseconds per write + sync and the process's CPU
microseconds per write + sync, for each mode, in `--rounds` interleaved
rounds.

    .venv/bin/python bench/sync_modes.py [--dir .] [--size 32768] [--count 400] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

MODES = ("append", "fallocate", "overwrite")


def measure(directory: str, mode: str, count: int, size: int) -> tuple[float, float, float]:
    """(syncs/s, wall us per sync, CPU us per sync) of `count` writes of
    `size` bytes at the end of what was written, each followed by fdatasync."""
    fd, path = tempfile.mkstemp(dir=directory, prefix="sync-modes-")
    try:
        block = os.urandom(size)
        if mode == "overwrite":
            for i in range(count):
                os.pwrite(fd, block, i * size)
            os.fsync(fd)
        elif mode == "fallocate":
            os.posix_fallocate(fd, 0, count * size)
            os.fsync(fd)
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(count):
            os.pwrite(fd, block, i * size)
            os.fdatasync(fd)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        os.close(fd)
        os.unlink(path)
    return count / wall, wall / count * 1e6, cpu / count * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=".", help="a directory on the disk to measure")
    ap.add_argument("--size", type=int, default=32 * 1024, help="bytes per write")
    ap.add_argument("--count", type=int, default=400, help="writes per mode and round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"{args.size}-byte pwrite + fdatasync, {args.count} per mode and round, in {args.dir}")
    for r in range(args.rounds):
        for mode in MODES:
            rate, wall, cpu = measure(args.dir, mode, args.count, args.size)
            print(f"round {r + 1}  {mode:9s}  {rate:8,.0f} syncs/s  {wall:6.0f} us wall  {cpu:5.0f} us CPU",
                  flush=True)


if __name__ == "__main__":
    main()
