"""`python -m spark.audit`: what each quorum queue holds on disk, why, and how
fast it grows. See docs/AUDIT.md.

    python -m spark.audit --data ./data --api http://127.0.0.1:15672 --out audit-out
    spark-submit --master k8s://... spark/audit.py --api http://quorumq:15672 --all-nodes ...

Where it sits: the entry point. It reads inputs with `spark.io`, computes
with `spark.transforms`, writes Parquet/JSON/HTML and prints the console
table; `--fail-on` thresholds give exit status 1 (for alerting). Local mode
(`local[*]`) unless a master is given (`--master`, or spark-submit's).

Exit status: 0 done (also for an empty input), 1 a threshold breached,
2 bad arguments.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import operator
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: make `spark` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark.sql import SparkSession  # noqa: E402

from spark import io as sio  # noqa: E402
from spark import report  # noqa: E402
from spark import transforms as T  # noqa: E402

SIZE_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
              "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
       "==": operator.eq, "=": operator.eq}
_THRESHOLD = re.compile(r"^\s*([a-z_]+)\s*(>=|<=|==|=|>|<)\s*([0-9.]+)\s*([a-zA-Z]*)\s*$")


@dataclass(frozen=True)
class Threshold:
    metric: str
    op: str
    value: float
    text: str

    def breached(self, v: Any) -> bool:
        return v is not None and bool(OPS[self.op](v, self.value))


def parse_threshold(text: str) -> Threshold:
    """`pinned_bytes>1GiB`, `days_to_full<7`, `orphan_bytes>=0`..."""
    m = _THRESHOLD.match(text)
    if not m:
        raise ValueError(f"--fail-on {text!r}: expected METRIC OP NUMBER[UNIT], e.g. pinned_bytes>1GiB")
    metric, op, num, unit = m.groups()
    if unit.lower() not in SIZE_UNITS:
        raise ValueError(f"--fail-on {text!r}: unknown unit {unit!r}")
    return Threshold(metric, op, float(num) * SIZE_UNITS[unit.lower()], text.strip())


def breaches(thresholds: list[Threshold], queues: list[dict[str, Any]],
             nodes: list[dict[str, Any]]) -> list[str]:
    out = []
    for t in thresholds:
        for kind, rows in (("queue", queues), ("node", nodes)):
            for r in rows:
                if t.metric in r and t.breached(r[t.metric]):
                    who = (f"{r.get('vhost') or ''}/{r['queue']}" if kind == "queue" else r["node"])
                    out.append(f"{t.text}: {kind} {who} has {t.metric}={r[t.metric]}")
    return out


def build_session(master: str | None, app: str = "quorumq-storage-audit") -> SparkSession:
    """The session: `master` if given, else spark-submit's (its conf is
    visible to SparkConf), else local mode on every core."""
    from pyspark import SparkConf

    b = SparkSession.builder.appName(app)
    if master:
        b = b.master(master)
    elif not SparkConf().contains("spark.master"):
        b = b.master(os.environ.get("QQ_AUDIT_MASTER", "local[*]"))
    return (b.config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", os.environ.get("QQ_AUDIT_PARTITIONS", "4"))
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m spark.audit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", action="append", default=[], metavar="[NODE=]PATH_OR_URI",
                    help="a broker data directory (local path, file://, s3a://, hdfs://...); "
                         "a node's dir, its raft/ dir, or a parent of several; repeatable")
    ap.add_argument("--api", action="append", default=[], metavar="URL",
                    help="a node's management API base URL (repeatable, or comma-separated)")
    ap.add_argument("--all-nodes", action="store_true",
                    help="also reach every node /api/nodes lists, at its host name on the "
                         "first --api URL's port")
    ap.add_argument("--user", default=os.environ.get("QQ_AUDIT_USER", "guest"))
    ap.add_argument("--password", default=os.environ.get("QQ_AUDIT_PASSWORD", "guest"))
    ap.add_argument("--out", default=os.environ.get("QQ_AUDIT_OUT", "audit-out"),
                    help="output directory or URI (Parquet frames, report.json, report.html)")
    ap.add_argument("--history", default=None,
                    help="history location (Parquet partitioned by run_date); default OUT/history")
    ap.add_argument("--fail-on", action="append", default=[], metavar="METRIC OP VALUE",
                    help="e.g. 'pinned_bytes>1GiB', 'days_to_full<7' (queue and node rows); "
                         "exit 1 when any row breaches")
    ap.add_argument("--top", type=int, default=20, help="queues shown in the console table")
    ap.add_argument("--master", default=None, help="Spark master (default local[*])")
    ap.add_argument("--now", default=None,
                    help="the run's time (ISO 8601, UTC if no zone; default now): for replays")
    ap.add_argument("--no-html", action="store_true")
    args = ap.parse_args(argv)
    args.api = [u.strip() for a in args.api for u in a.split(",") if u.strip()]
    return args


def run(spark: SparkSession, args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    thresholds = [parse_threshold(t) for t in args.fail_on]
    now = (dt.datetime.fromisoformat(args.now) if args.now else dt.datetime.now(dt.UTC))
    if now.tzinfo is None:
        now = now.replace(tzinfo=dt.UTC)
    now_ms = int(now.timestamp() * 1000)
    run_date = now.strftime("%Y-%m-%d")
    history_uri = args.history or sio._join(args.out, "history")

    api = sio.manifest_frames(spark, sio.fetch_manifests(args.api, args.user, args.password,
                                                         args.all_nodes))
    roots = [r for spec in args.data for r in sio.discover(spec)]
    sio.resolve_node_names(roots, api.known_nodes,
                           {n["node"]: n["data_dir"] for n in api.nodes})
    disk = sio.read_data_dirs(spark, roots)
    segments = T.merge_segments(disk.segments, api.segments)
    groups = T.merge_groups(disk.groups, api.groups)
    disk_nodes = {n["node"] for n in disk.nodes}
    wal_files = disk.wal_files.unionByName(api.wal_files.where(~api.wal_files.node.isin(
        list(disk_nodes) or [""])))
    deleting = disk.deleting.unionByName(api.deleting.where(~api.deleting.node.isin(
        list(disk_nodes) or [""])))
    node_info: dict[str, dict[str, Any]] = {}
    for n in disk.nodes + api.nodes:
        prev = node_info.get(n["node"], {})
        node_info[n["node"]] = {**n, **{k: v for k, v in prev.items() if v is not None}}
    problems = disk.problems + api.problems
    unreachable_urls = {p[0] for p in api.problems if p[1] == "unreachable_node"}
    for url in unreachable_urls:
        node_info.setdefault(url, {"node": url, "source": "api", "reachable": False,
                                   "error": next(p[3] for p in api.problems if p[0] == url),
                                   "data_dir": None, "total_bytes": None, "free_bytes": None})
    nodes_df = spark.createDataFrame(
        [(n["node"], n["source"], n["reachable"], n["error"], n["data_dir"], n["total_bytes"],
          n["free_bytes"]) for n in node_info.values()], T.NODES)

    classified = T.classify_segments(segments, groups).cache()
    members = T.member_usage(classified, groups, disk.wal_groups, api.cluster_groups, now_ms,
                             api.metadata_known).cache()
    queues = T.queue_usage(members.where("group_id != '__metadata__'"), nodes_df)
    nodes = T.node_usage(members, wal_files, deleting, nodes_df)
    hist_q = sio.read_history(spark, history_uri, "queues", T.HISTORY_QUEUES)
    hist_n = sio.read_history(spark, history_uri, "nodes", T.HISTORY_NODES)
    queues = T.offenders(T.with_growth(queues, hist_q, ["vhost", "queue"], now_ms,
                                       "min_free_bytes")).cache()
    nodes = T.with_growth(nodes, hist_n, ["node"], now_ms, "free_bytes").orderBy("node").cache()

    queue_rows = sio.rows(queues)
    node_rows = sio.rows(nodes)
    member_rows = sio.rows(members.orderBy("node", "group_id"))
    empty = not member_rows and not any(r["wal_files"] for r in node_rows)
    problem_rows = [{"node": p[0], "kind": p[1], "path": p[2], "error": p[3]} for p in problems]
    totals = {
        "nodes": len(node_rows), "queues": len(queue_rows),
        "segments": sum(m["segments"] for m in member_rows),
        "bytes": sum(n["bytes"] for n in node_rows),
        "pinned_bytes": sum(n["pinned_bytes"] for n in node_rows),
        "reclaimable_bytes": sum(n["reclaimable_bytes"] for n in node_rows),
        "orphan_bytes": sum(n["orphan_bytes"] for n in node_rows),
        "wal_bytes": sum(n["wal_bytes"] for n in node_rows),
        "bytes_read": sum(n["segment_bytes_read"] for n in node_rows),
    }
    summary: dict[str, Any] = {
        "run_ts": now.isoformat(), "run_ts_ms": now_ms, "empty": empty, "totals": totals,
        "nodes": node_rows, "queues": queue_rows, "members": member_rows,
        "problems": problem_rows,
        "breaches": breaches(thresholds, queue_rows, node_rows),
    }
    if not empty:
        sio.write_parquet({
            "segments": classified, "members": members, "queues": queues, "nodes": nodes,
            "problems": spark.createDataFrame(problems, T.PROBLEMS)}, args.out)
        sio.append_history(T.history_rows(queues, ["vhost", "queue"], now_ms, run_date),
                           history_uri, "queues")
        sio.append_history(T.history_rows(nodes, ["node"], now_ms, run_date), history_uri, "nodes")
    sio.write_text(args.out, "report.json", json.dumps(summary, indent=1, default=str))
    if not args.no_html:
        hist_rows = sio.rows(sio.read_history(spark, history_uri, "nodes", T.HISTORY_NODES))
        sio.write_text(args.out, "report.html", report.html_report(summary, hist_rows))
    return (1 if summary["breaches"] else 0), summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        for t in args.fail_on:
            parse_threshold(t)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not args.data and not args.api:
        print("nothing to audit: give --data and/or --api", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    spark = build_session(args.master)
    spark.sparkContext.setLogLevel(os.environ.get("QQ_AUDIT_LOG_LEVEL", "ERROR"))
    try:
        code, summary = run(spark, args)
    finally:
        if os.environ.get("QQ_AUDIT_KEEP_SESSION") != "1":
            spark.stop()
    print(report.console(summary, args.top))
    print(f"\noutputs in {args.out} ({time.monotonic() - t0:.1f}s)")
    return code


if __name__ == "__main__":
    sys.exit(main())
