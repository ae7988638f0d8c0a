"""What this machine's disk takes: sequential writes, each followed by
fdatasync, from one writer and from several at once (the 3-node rows run
three nodes, three WAL writers, on one disk).

The 3-node 64 KiB and 1 MiB rows write about one body a message per node
(`qq_wal_bytes`; released bodies never reach segment files), so their
ceiling is this figure divided by three nodes and the body size:

    .venv/bin/python bench/disk_bandwidth.py
    .venv/bin/python bench/disk_bandwidth.py --dir /var/lib/data --seconds 10 --writers 1,3,5

Writes real files under --dir (default: the working directory) and deletes
them.
"""
from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path


def writer(path: Path, size: int, seconds: float, out: list[float]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        buf = os.urandom(size)
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < seconds:
            os.write(fd, buf)
            os.fdatasync(fd)
            n += 1
        out.append(n * size / (time.monotonic() - start))
    finally:
        os.close(fd)
        path.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=".", help="where to write (the broker's data disk)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--writers", default="1,3", help="comma-separated writer counts")
    ap.add_argument("--sizes", default="65536,1048576,4194304", help="bytes per write, comma-separated")
    args = ap.parse_args()
    for k in (int(x) for x in args.writers.split(",")):
        for size in (int(x) for x in args.sizes.split(",")):
            out: list[float] = []
            threads = [threading.Thread(target=writer, args=(Path(args.dir) / f".disk_bw.{os.getpid()}.{i}",
                                                               size, args.seconds, out)) for i in range(k)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            print(f"{k} writer(s), {size // 1024:>5} KiB write + fdatasync: {sum(out) / 2**20:7.1f} MiB/s in all",
                  flush=True)


if __name__ == "__main__":
    main()
