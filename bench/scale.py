"""Scale: many quorum queues and many connections on a 3-node cluster.

    .venv/bin/python bench/scale.py                      # 10,000 queues, 1,000 connections
    .venv/bin/python bench/scale.py --queues 2000 --connections 300 --idle 10

Starts a cluster of ours on free ports (tests/cluster's, warnings only) and
prints, phase by phase:

1. **declare**: `--queues` quorum queues declared by `--declarers` raw-frame
   clients spread over the nodes; the declare rate of every tenth of them, so
   a rate that falls as the count grows (work that grows faster than
   linearly) shows;
2. **idle queues**: RSS and CPU of every node over `--idle` s with all the
   queues idle, per queue against the empty cluster; the time of
   `GET /api/queues` and of the Prometheus scrape with every queue;
3. **connections**: `--connections` AMQP connections (one channel each)
   opened over the nodes: open rate, RSS and idle CPU per connection;
4. **restart**: every node stopped (SIGTERM) and started again: time until
   the nodes are up and until every queue has a leader; then the same after
   kill -9 of every node (recovery);
5. **election storm**: kill -9 of the node leading the most queues: time
   until every queue has a leader on a live node.

Numbers, not assertions: docs/OPERATIONS.md ("Scale") quotes a run.
`--json PATH` writes them too.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
import urllib.request
from base64 import b64encode
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import load, report  # noqa: E402
from bench.amqp_raw import RawClient  # noqa: E402
from tests.cluster.conftest import Cluster  # noqa: E402
from tests.e2e.broker_proc import free_port, in_parallel, start_all  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss(pid: int) -> int:
    return load.RssSampler.rss([pid])


def settle(pids: list[int], limit: float = 120.0) -> list[int]:
    """Each node's RSS once their sum has settled (`report.settle_rss`)."""
    report.settle_rss(pids, limit=limit)
    return [rss(p) for p in pids]


def idle_cpu(pids: list[int], seconds: float) -> list[float]:
    """Each node's CPU use over `seconds` of wall time, as a fraction of one core."""
    before = [cpu_seconds(p) for p in pids]
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    return [(cpu_seconds(p) - b) / wall for p, b in zip(pids, before, strict=True)]


class Api:
    """The management API of one node (guest/guest on loopback)."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.auth = "Basic " + b64encode(b"guest:guest").decode()

    def get(self, path: str, timeout: float = 120.0) -> Any:
        req = urllib.request.Request(self.base + path, headers={"Authorization": self.auth})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def raw(self, url: str, timeout: float = 120.0) -> bytes:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            data: bytes = r.read()
            return data


def wait_leaders(api: Api, live: set[str], expect: int, limit: float) -> float | None:
    """Seconds until `api`'s node sees `expect` queues, each led by a node in
    `live`; None if that does not happen within `limit`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        try:
            qs = api.get("/api/queues", timeout=limit)
        except OSError:
            time.sleep(0.2)
            continue
        if len(qs) == expect and all(q.get("leader") in live for q in qs):
            return time.monotonic() - t0
        time.sleep(1.0)  # listing 10,000 queues costs the node ~0.6 s of CPU
    return None


def declare_all(ports: list[int], names: list[str], declarers: int) -> list[float]:
    """Declare every queue; returns each declare's completion time (monotonic)."""
    done: list[float] = []
    lock = threading.Lock()
    parts = [names[i::declarers] for i in range(declarers)]

    def work(i: int) -> None:
        c = RawClient("127.0.0.1", ports[i % len(ports)])
        for n in parts[i]:
            c.declare_quorum_queue(n)
            with lock:
                done.append(time.monotonic())
        c.close()
    in_parallel(work, range(declarers))
    return sorted(done)


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"queues": args.queues, "connections": args.connections,
                           "nodes": args.nodes}
    c = Cluster(base, size=args.nodes)
    mports = []
    for n in c.nodes:
        n.env["QQ_LOG_LEVEL"] = "WARNING"
        n.management_port = free_port()
        n.metrics_port = free_port()
        mports.append(n.management_port)
    apis = [Api(p) for p in mports]
    t0 = time.monotonic()
    c.start()
    print(f"cluster of {args.nodes} up in {time.monotonic() - t0:.1f} s", flush=True)
    try:
        pids = [n.proc.pid for n in c.nodes if n.proc]
        ports = [n.port for n in c.nodes]
        base_rss = settle(pids)
        base_cpu = idle_cpu(pids, args.idle)
        out["empty"] = {"rss_mib": [r / MiB for r in base_rss], "cpu": base_cpu}
        print(f"empty cluster: RSS {', '.join(f'{r / MiB:.0f}' for r in base_rss)} MiB, "
              f"idle CPU {', '.join(f'{x:.1%}' for x in base_cpu)}", flush=True)

        # 1. declare
        names = [f"scale-{i}" for i in range(args.queues)]
        t0 = time.monotonic()
        times = declare_all(ports, names, args.declarers)
        total = time.monotonic() - t0
        tenth = max(1, len(times) // 10)
        rates = []
        prev = t0
        for k in range(tenth - 1, len(times), tenth):
            rates.append(tenth / max(1e-9, times[k] - prev))
            prev = times[k]
        out["declare"] = {"seconds": total, "rate": args.queues / total, "rate_by_tenth": rates}
        print(f"declare {args.queues} quorum queues ({args.declarers} clients): {total:.1f} s, "
              f"{args.queues / total:.0f}/s; by tenth: {', '.join(f'{r:.0f}' for r in rates)}/s",
              flush=True)

        # 2. idle queues
        q_rss = settle(pids)
        q_cpu = idle_cpu(pids, args.idle)
        per_q = [(a - b) / args.queues for a, b in zip(q_rss, base_rss, strict=True)]
        t = time.monotonic()
        listed = apis[0].get("/api/queues")
        list_s = time.monotonic() - t
        t = time.monotonic()
        scrape = apis[0].raw(f"http://127.0.0.1:{c.nodes[0].metrics_port}/metrics")
        scrape_s = time.monotonic() - t
        out["idle_queues"] = {"rss_mib": [r / MiB for r in q_rss], "cpu": q_cpu,
                              "rss_per_queue_kib": [p / KiB for p in per_q],
                              "api_queues_s": list_s, "metrics_s": scrape_s,
                              "metrics_bytes": len(scrape)}
        print(f"{args.queues} idle queues: RSS {', '.join(f'{r / MiB:.0f}' for r in q_rss)} MiB "
              f"({', '.join(f'{p / KiB:.1f}' for p in per_q)} KiB a queue a node), idle CPU "
              f"{', '.join(f'{x:.1%}' for x in q_cpu)}; GET /api/queues ({len(listed)}) "
              f"{list_s:.2f} s, /metrics ({len(scrape) / MiB:.1f} MiB) {scrape_s:.2f} s", flush=True)

        # 3. connections
        conns: list[RawClient] = []
        t0 = time.monotonic()
        for i in range(args.connections):
            conns.append(RawClient("127.0.0.1", ports[i % len(ports)]))
        open_s = time.monotonic() - t0
        c_rss = settle(pids)
        c_cpu = idle_cpu(pids, args.idle)
        per_c = (sum(c_rss) - sum(q_rss)) / args.connections
        out["connections_phase"] = {"open_seconds": open_s, "rate": args.connections / open_s,
                                    "rss_mib": [r / MiB for r in c_rss], "cpu": c_cpu,
                                    "rss_per_connection_kib": per_c / KiB}
        print(f"{args.connections} connections: opened in {open_s:.1f} s "
              f"({args.connections / open_s:.0f}/s), {per_c / KiB:.1f} KiB RSS a connection, "
              f"idle CPU {', '.join(f'{x:.1%}' for x in c_cpu)}", flush=True)
        for conn in conns:
            conn.close()

        # 4. restart, then kill -9 and recover
        live = set(c.names)
        for how in ("restart", "kill -9"):
            if how == "restart":
                in_parallel(lambda n: n.stop(), c.nodes)
            else:
                c.kill_all()
            t0 = time.monotonic()
            start_all(c.nodes, timeout=600)
            up = time.monotonic() - t0
            led = wait_leaders(apis[0], live, args.queues, args.limit)
            total_s = None if led is None else up + led
            out[how] = {"up_seconds": up, "all_led_seconds": total_s}
            print(f"{how} of every node: up in {up:.1f} s, every queue led after "
                  f"{'-' if total_s is None else f'{total_s:.1f}'} s", flush=True)
        pids = [n.proc.pid for n in c.nodes if n.proc]

        # 5. election storm
        counts = {n: 0 for n in c.names}
        for q in apis[0].get("/api/queues"):
            if q.get("leader") in counts:
                counts[q["leader"]] += 1
        victim = max(counts, key=lambda n: counts[n])
        vi = c.names.index(victim)
        survivor = next(i for i in range(len(c.nodes)) if i != vi)
        t0 = time.monotonic()
        c.nodes[vi].kill()
        led = wait_leaders(apis[survivor], live - {victim}, args.queues, args.limit)
        out["storm"] = {"victim_led": counts[victim], "all_led_seconds": led}
        print(f"election storm: kill -9 of {victim} (leader of {counts[victim]} queues): "
              f"every queue led by a live node after {'-' if led is None else f'{led:.1f}'} s",
              flush=True)
    finally:
        c.kill_all()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--connections", type=int, default=1_000)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--declarers", type=int, default=8)
    ap.add_argument("--idle", type=float, default=20.0, help="seconds of each idle CPU sample")
    ap.add_argument("--limit", type=float, default=600.0, help="longest wait for leaders, s")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.connections + 256
    if soft < need:  # the client end of every connection is in this process
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))
    with TemporaryDirectory(prefix="qqscale") as d:
        out = run(args, Path(d))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
