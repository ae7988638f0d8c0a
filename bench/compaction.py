"""Disk use of a pinned log before and after compaction (issue 13 item 4).

A quorum queue's log where one old message (index `--pinned`) is still live
and every other entry was consumed: `release()` cannot delete any segment
after the pinned one; `compact()` rewrites the live entries and deletes the
rest. Uses the storage layer directly (real files, real fdatasync):

    .venv/bin/python -m bench.compaction                 # 1,000,000 entries
    .venv/bin/python -m bench.compaction --entries 100000 --size 200
    .venv/bin/python -m bench.compaction --broker 100000    # a real broker process

Prints segment files and bytes (apparent and allocated) at each step. With
--broker: one broker process (WAL roll-over at 4 MiB so segments appear,
default snapshot interval), a quorum queue gets N messages with confirms,
one is fetched and held unacknowledged, the other N-1 are consumed and
acked; the queue's segment files are sampled while that runs and after the
queue went idle (idle snapshot + release + compaction).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time

from broker.storage import Entry, LogManager, StorageConfig

GROUP = "%2F/pinned/1"


def usage(seg_dir: str) -> tuple[int, int, int]:
    """(files, apparent bytes, allocated bytes) of the segment directory."""
    files = apparent = allocated = 0
    for name in os.listdir(seg_dir):
        if name.endswith(".segment"):
            st = os.stat(os.path.join(seg_dir, name))
            files += 1
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return files, apparent, allocated


def broker_run(n: int, size: int) -> None:
    import threading
    from pathlib import Path

    import pika

    from bench.load import consume, publish
    from tests.e2e.broker_proc import BrokerProcess

    qname = "pinned"
    with tempfile.TemporaryDirectory(prefix="qq-compaction-broker-") as d:
        b = BrokerProcess(Path(d) / "n1", env={"QQ_LOG_LEVEL": "WARNING"},
                          config="raft.wal_max_size_bytes = 4194304\n").start()
        try:
            groups = Path(b.data_dir) / "raft" / "groups"

            def seg_usage() -> tuple[int, int]:
                files = total = 0
                for g in groups.iterdir():
                    gf = g / "GROUP"
                    if gf.exists() and f"/{qname}/" in gf.read_text():
                        for f in (g / "segments").iterdir():
                            if f.name.endswith(".segment"):
                                files += 1
                                total += f.stat().st_size
                return files, total

            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
            ch = conn.channel()
            ch.queue_declare(qname, durable=True, arguments={"x-queue-type": "quorum"})
            t0 = time.monotonic()
            publish("127.0.0.1", b.port, [qname], size, 500, count=n)
            t1 = time.monotonic()
            held = conn.channel()
            method, _p, body = held.basic_get(qname, auto_ack=False)
            assert method is not None
            peak = seg_usage()
            stop = threading.Event()

            def sample() -> None:
                nonlocal peak
                while not stop.wait(0.25):
                    u = seg_usage()
                    if u[0] > peak[0]:
                        peak = u
            th = threading.Thread(target=sample, daemon=True)
            th.start()
            consume("127.0.0.1", b.port, [qname], 1000, 100, count=n - 1)
            t2 = time.monotonic()
            stop.set()
            th.join()
            done = seg_usage()
            deadline = time.monotonic() + 60
            while seg_usage()[0] > 3 and time.monotonic() < deadline:
                time.sleep(0.25)
            t3 = time.monotonic()
            idle = seg_usage()
            conn.close()  # the held message goes back to the queue
            c2 = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
            m2, _p, again = c2.channel().basic_get(qname, auto_ack=True)
            assert m2 is not None and again == body
            c2.close()
        finally:
            b.stop()
    print(f"real broker: {n} messages of {size} B into a quorum queue, 1 held unacked, "
          f"{n - 1} consumed and acked (publish {t1 - t0:.1f} s, consume {t2 - t1:.1f} s)")
    print(f"  {'':36} {'files':>7} {'bytes':>14}")
    for label, (files, nbytes) in (("most while consuming", peak),
                                   ("when the consumer finished", done),
                                   (f"idle ({t3 - t2:.1f} s later)", idle)):
        print(f"  {label:36} {files:>7} {nbytes:>14,}")
    print("  the held message was then delivered again intact")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=64, help="data bytes per entry")
    ap.add_argument("--segment-max-entries", type=int, default=4096)
    ap.add_argument("--wal-max-size", type=int, default=64 << 20)
    ap.add_argument("--pinned", type=int, default=17, help="index of the one live message")
    ap.add_argument("--dir", default=None, help="data directory (default: a temporary one)")
    ap.add_argument("--broker", type=int, default=0, metavar="N",
                    help="instead: N messages through a real broker process")
    args = ap.parse_args()
    if args.broker:
        broker_run(args.broker, max(args.size, 16))
        return

    path = args.dir or tempfile.mkdtemp(prefix="qq-compaction-")
    cfg = StorageConfig(wal_max_size_bytes=args.wal_max_size,
                        segment_max_entries=args.segment_max_entries)
    rng = random.Random(13)
    data = bytes(rng.getrandbits(8) for _ in range(args.size))
    n = args.entries
    try:
        t0 = time.monotonic()
        with LogManager.open(path, cfg, rng=rng) as m:
            log = m.open_group(GROUP)
            batch = 2000
            for lo in range(1, n + 1, batch):
                hi = min(lo + batch, n + 1)
                log.append([Entry(i, 1, data) for i in range(lo, hi)])
                if (lo // batch) % 16 == 0:
                    m.sync()
            m.sync()
        # a restart flushes the WAL into segments: the whole log is on disk as segments
        with LogManager.open(path, cfg, rng=rng) as m:
            log = m.open_group(GROUP)
            seg_dir = os.path.join(log.path, "segments")
            t1 = time.monotonic()
            snap_at = n - 10
            log.save_snapshot(snap_at, 1, b"", b"queue state: 1 live message")
            released = log.release(args.pinned)
            before = usage(seg_dir)
            t2 = time.monotonic()
            replaced = log.compact([args.pinned])
            t3 = time.monotonic()
            after = usage(seg_dir)
            assert log.entries(args.pinned, args.pinned + 1)[0].data == data
            assert [e.index for e in log.entries(snap_at, n + 1)] == list(range(snap_at, n + 1))
        with LogManager.open(path, cfg, rng=rng) as m:  # and after a restart
            log = m.open_group(GROUP)
            assert log.entries(args.pinned, args.pinned + 1)[0].data == data
            restarted = usage(seg_dir)
    finally:
        if args.dir is None:
            shutil.rmtree(path, ignore_errors=True)

    print(f"pinned log: {n} entries of {args.size} B, segment_max_entries "
          f"{args.segment_max_entries}, 1 live message at index {args.pinned}, "
          f"snapshot at {snap_at}")
    print(f"  write + flush: {t1 - t0:.1f} s; release({args.pinned}) deleted {released} files")
    print(f"  {'':24} {'files':>7} {'bytes':>14} {'allocated':>14}")
    for label, (files, apparent, alloc) in (("before compaction", before),
                                            ("after compaction", after),
                                            ("after restart", restarted)):
        print(f"  {label:24} {files:>7} {apparent:>14,} {alloc:>14,}")
    print(f"  compact(): replaced {replaced} files in {t3 - t2:.2f} s")


if __name__ == "__main__":
    main()
