"""Benchmark: audit 10,000 segment files written by the real storage writer.

    .venv/bin/python bench/spark_audit.py [--files 10000] [--master local[*]] [--dir DIR]

Writes a node's data directory with broker.storage.LogManager (100 groups,
tiny segments), then parses every segment file's header and index twice:
with a single-process Python loop (spark.formats, the same decoder) and with
the Spark job's reader (spark.io.read_data_dirs: parallel tasks over the
files). Prints files/s and bytes read against bytes on disk for both, Spark's
fixed cost per job, and from what fleet size (segment files) Spark wins on
this machine and on clusters with more cores. Numbers only; not a test.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from broker.storage import Entry, LogManager, StorageConfig  # noqa: E402
from spark import formats as fm  # noqa: E402
from spark import io as sio  # noqa: E402


def segment_files(root: Path) -> list[Path]:
    return sorted(root.glob("groups/*/segments/*.segment"))


def write(root: Path, target: int, groups: int = 100, seed: int = 7) -> None:
    rng = random.Random(seed)
    mgr = LogManager.open(root, StorageConfig(wal_max_size_bytes=1 << 20, segment_max_entries=16,
                                         sync_method="none"), rng=random.Random(seed))
    logs = [mgr.open_group(f"/bench-{g}/1") for g in range(groups)]
    nxt = [1] * groups
    payload = rng.randbytes(4096)
    while True:
        for _ in range(20):
            for g, log in enumerate(logs):
                log.append([Entry(nxt[g] + k, 1, payload[: rng.randint(100, 400)])
                            for k in range(16)])
                nxt[g] += 16
        mgr.sync()
        mgr.wait_flushed()
        if len(segment_files(root)) >= target:
            break
    mgr.close()


def python_scan(files: list[Path]) -> tuple[float, int]:
    t = time.perf_counter()
    read = 0
    for p in files:
        r = fm.LocalReader(str(p))
        try:
            read += fm.read_segment(r, p.name).bytes_read
        finally:
            r.close()
    return time.perf_counter() - t, read


def spark_scan(spark: object, root: Path) -> tuple[float, int, int]:
    from pyspark.sql import functions as F

    t = time.perf_counter()
    frames = sio.read_data_dirs(spark, sio.discover(str(root)))  # type: ignore[arg-type]
    row = frames.segments.agg(F.count("*").alias("n"), F.sum("bytes_read").alias("r")).collect()[0]
    return time.perf_counter() - t, int(row["n"]), int(row["r"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--dir", default=None, help="reuse/keep the data here")
    args = ap.parse_args()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="qq-bench-audit-"))
    root = base / "node" / "raft"
    t = time.perf_counter()
    if len(segment_files(root)) < args.files:
        write(root, args.files)
    files = segment_files(root)
    on_disk = sum(p.stat().st_size for p in files)
    print(f"data: {len(files)} segment files, {on_disk / 2**20:.1f} MiB on disk "
          f"(written/found in {time.perf_counter() - t:.1f}s) under {root}")

    python_scan(files)  # warm the page cache for both contenders
    py_s, py_read = python_scan(files)
    py_rate = len(files) / py_s
    print(f"python, 1 process: {py_s:.2f}s, {py_rate:,.0f} files/s, read {py_read / 2**20:.2f} MiB "
          f"of {on_disk / 2**20:.1f} MiB on disk ({100 * py_read / on_disk:.2f}%)")

    from spark.audit import build_session

    t = time.perf_counter()
    spark = build_session(args.master, app="bench-spark-audit")
    spark.sparkContext.setLogLevel("ERROR")
    start_s = time.perf_counter() - t
    cores = spark.sparkContext.defaultParallelism
    spark_scan(spark, root)  # warm-up: Python workers started, JIT
    sp_s, n, sp_read = spark_scan(spark, root)
    assert n == len(files), (n, len(files))
    sp_rate = n / sp_s
    print(f"spark {args.master} ({cores} cores), session start {start_s:.1f}s (once): "
          f"{sp_s:.2f}s, {sp_rate:,.0f} files/s, read {sp_read / 2**20:.2f} MiB of "
          f"{on_disk / 2**20:.1f} MiB on disk ({100 * sp_read / on_disk:.2f}%)")

    small = base / "small" / "raft"
    if not small.exists():
        write(small, 1, groups=1)
    overhead = min(spark_scan(spark, small)[0] for _ in range(3))
    spark.stop()
    per_file_core = sp_s / n * cores  # seconds per file on one Spark core, overhead included
    print(f"spark fixed cost per audit job (1 tiny group): {overhead:.2f}s; "
          f"per file per core: {1e6 * per_file_core:.0f} us; python per file: {1e6 * py_s / n:.0f} us")

    def crossover(k: int) -> str:
        spark_per_file = max(per_file_core - overhead * cores / n, 1e-9) / k
        gain = py_s / n - spark_per_file
        return "never (python is faster per file)" if gain <= 0 else f"{overhead / gain:,.0f} files"

    for k in sorted({cores, 8, 32, 128}):
        print(f"spark wins from: {crossover(k)} with {k} cores"
              f"{' (this machine)' if k == cores else ''}")
    print("(plus the session start once per run; fleet audits also save the copy of every "
          "volume to one machine, which the python scan needs and Spark does not)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
