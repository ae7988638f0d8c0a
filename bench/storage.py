"""Benchmark: durable 1 KiB log entries/s through broker.storage's shared WAL.

For 1, 10 and 100 groups appending concurrently it prints durable entries/s,
MB/s, WAL fdatasyncs/s and the mean group-commit batch; then the raw
fdatasync rate of the same disk (4 KiB write + fdatasync in a loop: the
physical limit one writer gets without group commit).

Load model: one driver thread (like the runtime's event loop) keeps up to
--inflight entries in flight in total (split evenly over the groups), appending --chunk entries per call, and
learns about durability only from on_durable callbacks. An entry counts once
on_durable reports it durable (after its fdatasync).

    .venv/bin/python bench/storage.py [--seconds 3] [--groups 1,10,100]
        [--inflight 16384] [--chunk 32] [--dir DIR] [--wal-max-mib 64] [--sync none]
    .venv/bin/python bench/storage.py --raw-only --raw-writers 1,3   # the disk alone
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time

from broker.storage import Entry, LogManager, StorageConfig

ENTRY = 1024


def raw_fdatasync_rate(directory: str, seconds: float, block_size: int = 4096,
                       name: str = "raw-fdatasync") -> float:
    """Appends of `block_size` bytes, each followed by fdatasync: syncs per second."""
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    block = os.urandom(block_size)
    n = 0
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            os.write(fd, block)
            os.fdatasync(fd)
            n += 1
    finally:
        os.close(fd)
        os.unlink(path)
    return n / (time.perf_counter() - t0)


def raw_bandwidth(directory: str, seconds: float, writers: int, block_size: int) -> float:
    """MiB/s of `writers` concurrent appenders of `block_size` + fdatasync, in
    all (three nodes of a 3-node row on one disk are three writers)."""
    rates: list[float] = []
    threads = [threading.Thread(target=lambda k=k: rates.append(
        raw_fdatasync_rate(directory, seconds, block_size, f"raw-fdatasync.{k}"))) for k in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(rates) * block_size / 2**20


def run(directory: str, ngroups: int, seconds: float, window: int, chunk: int,
        wal_max: int, sync: str = "fdatasync") -> dict[str, float]:
    data_dir = tempfile.mkdtemp(prefix="qq-bench-", dir=directory)
    cv = threading.Condition()
    durable: dict[str, int] = {}

    def on_durable(group: str, index: int, term: int) -> None:
        with cv:
            durable[group] = index
            cv.notify()

    cfg = StorageConfig(wal_max_size_bytes=wal_max, sync_method=sync)  # type: ignore[arg-type]
    mgr = LogManager.open(data_dir, cfg, on_durable=on_durable)
    try:
        names = [f"%2F/bench-{n}" for n in range(ngroups)]
        logs = [mgr.open_group(g) for g in names]
        last = dict.fromkeys(names, 0)
        for g in names:
            durable[g] = 0
        body = os.urandom(ENTRY)
        start_stats = dict(mgr.stats)
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while True:
            now = time.perf_counter()
            if now >= deadline:
                break
            progressed = False
            for g, log in zip(names, logs, strict=True):
                if last[g] - durable[g] < window:
                    lo = last[g] + 1
                    log.append([Entry(i, 1, body) for i in range(lo, lo + chunk)])
                    last[g] = lo + chunk - 1
                    progressed = True
            if not progressed:
                with cv:
                    cv.wait(0.01)
        with cv:
            done = sum(durable.values())
        elapsed = time.perf_counter() - t0
        fsyncs = mgr.stats["fsyncs"] - start_stats["fsyncs"]
        records = mgr.stats["records"] - start_stats["records"]
        rollovers = mgr.stats["rollovers"]
    finally:
        mgr.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    return {
        "entries_s": done / elapsed,
        "mb_s": done * ENTRY / elapsed / 1e6,
        "fsyncs_s": fsyncs / elapsed,
        "batch": records / 2 / max(fsyncs, 1),  # 2 parts (header, data) per entry
        "rollovers": rollovers,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--groups", default="1,10,100")
    ap.add_argument("--inflight", type=int, default=16384,
                    help="max entries appended but not yet durable, over all groups")
    ap.add_argument("--chunk", type=int, default=32, help="entries per append() call")
    ap.add_argument("--dir", default=os.path.dirname(os.path.abspath(__file__)),
                    help="directory on the disk to measure (default: next to this script)")
    ap.add_argument("--wal-max-mib", type=int, default=64)
    ap.add_argument("--sync", default="fdatasync", choices=["fdatasync", "fsync", "none"],
                    help="'none' measures the software cost alone (NOT durable)")
    ap.add_argument("--raw-writers", default="",
                    help="also the raw bandwidth of this many concurrent writers, comma-separated "
                         "(e.g. 1,3: a 3-node row's three WALs on one disk)")
    ap.add_argument("--raw-only", action="store_true", help="only the raw figures, no groups")
    args = ap.parse_args()
    if args.raw_only:
        args.groups = ""
    print(f"1 KiB entries, {args.inflight} in flight, {args.chunk} entries/append, "
          f"WAL roll-over at {args.wal_max_mib} MiB, sync {args.sync}, dir {args.dir}")
    for n in (int(x) for x in args.groups.split(",") if x):
        window = max(args.inflight // n, args.chunk)
        r = run(args.dir, n, args.seconds, window, args.chunk, args.wal_max_mib * 1024 * 1024,
                args.sync)
        print(f"groups={n:4d}  durable entries/s={r['entries_s']:9.0f}  MB/s={r['mb_s']:6.1f}  "
              f"fdatasyncs/s={r['fsyncs_s']:6.0f}  entries/batch={r['batch']:7.0f}  "
              f"roll-overs={r['rollovers']:.0f}")
    raw = raw_fdatasync_rate(args.dir, min(args.seconds, 2.0))
    print(f"raw fdatasync (4 KiB write + fdatasync, same disk): {raw:.0f}/s "
          f"= {raw:.0f} durable 1 KiB entries/s without group commit")
    big = raw_fdatasync_rate(args.dir, min(args.seconds, 2.0), 4 << 20)
    print(f"raw bandwidth (4 MiB write + fdatasync, same disk): {big * 4 * 1.048576:.0f} MB/s "
          f"= {big * 4096:.0f} 1 KiB entries/s upper bound")
    for w in (int(x) for x in args.raw_writers.split(",") if x):
        for size in (1 << 20, 4 << 20):
            mib = raw_bandwidth(args.dir, min(args.seconds, 5.0), w, size)
            print(f"raw bandwidth, {w} writer(s) of {size >> 20} MiB + fdatasync at once: {mib:.0f} MiB/s in all")


if __name__ == "__main__":
    main()
