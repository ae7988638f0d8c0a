"""WAL records, batches and fsyncs a message, and the disk bytes a message,
on a cluster of ours under rows of bench/report.py (the node's `qq_wal_*`
counters and the kernel's /proc/<pid>/io write_bytes, read before and after
each row), and how long the WAL's batch write + fdatasync took and how late
the node's event loop ran its timers during the row (the
`qq_wal_sync_duration_seconds` and `qq_event_loop_lag_seconds` histograms;
quantiles are bucket bounds, so "<= 4 ms" means in the bucket up to 4 ms):

    .venv/bin/python bench/wal_records.py --rows 1KiB-100q,1KiB-10q
    .venv/bin/python bench/wal_records.py --nodes 3 --rows 64KiB,1MiB

The 100-queue row writes about one WAL record a message (one queue's
entries batch few publishes there); a record per Raft hard state whose only
change is the commit index was 0.4 more before queue groups stopped writing
those (bench/PERF_NOTES.md).
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import load  # noqa: E402
from bench.report import ROWS  # noqa: E402
from tests.cluster.conftest import Cluster  # noqa: E402
from tests.e2e.broker_proc import free_port  # noqa: E402


def wal_counters(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return {k: float(v) for k, v in re.findall(r"^qq_wal_(\w+?)(?:_total)? ([0-9.e+]+)$", text, re.M)}


def buckets(port: int, metric: str) -> dict[float, float]:
    """Cumulative counts of a histogram by upper bound (inf for +Inf)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return {float(le): float(n) for le, n in
            re.findall(rf'^{metric}_bucket{{le="([^"]+)"}} ([0-9.e+]+)$', text, re.M)}


def quantiles(before: dict[float, float], after: dict[float, float], qs: tuple[float, ...]) -> list[float]:
    """Upper bounds of the buckets holding quantiles `qs` of what was
    observed between two scrapes (inf: past the last bound; nan: nothing)."""
    bounds = sorted(after)
    delta = [after[b] - before.get(b, 0.0) for b in bounds]
    total = delta[-1] if delta else 0.0
    if total <= 0:
        return [float("nan")] * len(qs)
    return [next(b for b, n in zip(bounds, delta, strict=True) if n >= q * total) for q in qs]


def ms(x: float) -> str:
    return "-" if x != x else ">8 s" if x == float("inf") else f"{x * 1000:g} ms"


def disk_written(pid: int) -> int:
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["write_bytes"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--rows", default="1KiB-100q,1KiB-10q,1KiB", help="row names of bench/report.py")
    args = ap.parse_args()
    rows = {r.name: r for r in ROWS}
    with tempfile.TemporaryDirectory(prefix="wal-records-") as d:
        cluster = Cluster(Path(d), size=args.nodes)
        for node in cluster.nodes:
            node.env["QQ_LOG_LEVEL"] = "WARNING"
            node.metrics_port = free_port()
        cluster.start()
        try:
            ports = [n.port for n in cluster.nodes]
            pids = [n.proc.pid for n in cluster.nodes]
            for name in args.rows.split(","):
                before = [wal_counters(n.metrics_port) for n in cluster.nodes]
                hist = ("qq_wal_sync_duration_seconds", "qq_event_loop_lag_seconds")
                h_before = [[buckets(n.metrics_port, h) for h in hist] for n in cluster.nodes]
                io_before = [disk_written(p) for p in pids]
                r = load.run(rows[name], "127.0.0.1", ports, pids)
                after = [wal_counters(n.metrics_port) for n in cluster.nodes]
                h_after = [[buckets(n.metrics_port, h) for h in hist] for n in cluster.nodes]
                io_after = [disk_written(p) for p in pids]
                m = max(1, r["consumed"])
                print(f"{name}: {r['rate']:,.0f} msg/s, {r['consumed']:,} messages, "
                      f"p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms", flush=True)
                for k in range(args.nodes):
                    per = {key: (after[k].get(key, 0) - before[k].get(key, 0)) / m
                           for key in ("records", "batches", "fsyncs", "bytes")}
                    print(f"  node {k + 1}: a message: {per['records']:.3f} WAL records, {per['batches']:.4f} "
                          f"batches, {per['fsyncs']:.4f} fsyncs, {per['bytes']:,.0f} WAL bytes, "
                          f"{(io_after[k] - io_before[k]) / m:,.0f} disk bytes", flush=True)
                    sync = quantiles(h_before[k][0], h_after[k][0], (0.5, 0.99, 1.0))
                    lag = quantiles(h_before[k][1], h_after[k][1], (0.5, 0.99, 1.0))
                    print(f"          WAL write + sync p50/p99/max <= {' / '.join(map(ms, sync))}; "
                          f"event-loop lag <= {' / '.join(map(ms, lag))}", flush=True)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
