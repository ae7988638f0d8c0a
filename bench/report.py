"""`make bench-report`: our broker and RabbitMQ side by side on this machine,
1 node and 3 nodes of each (started and stopped here, on their own ports),
every workload row of issue 16, then figures for ours alone (memory per
ready message and per idle queue, recovery after kill -9 with a backlog,
failover). Writes docs/PERFORMANCE.md with the tables and matplotlib charts
(docs/img/perf-*.png) and keeps the raw numbers in bench-results/report.json.

    .venv/bin/python bench/report.py                  # the whole table, 3 runs a row (~40 min)
    .venv/bin/python bench/report.py --quick          # 4 s rows, 100k backlog (~15 min)
    .venv/bin/python bench/report.py --rows 1KiB,16B --setups ours-3,rabbitmq-3
    .venv/bin/python bench/report.py --from-json bench-results/report.json  # rewrite the doc only

Clients connect to the first node of each cluster (both brokers place a new
queue's leader on the node the declaring client is connected to, so clients
talk to the leader). The load generator is bench/load.py (raw frames, one OS
process per publisher and per consumer).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import load, rabbitmq_local  # noqa: E402
from bench.amqp_raw import RawClient  # noqa: E402
from bench.load import Workload  # noqa: E402

KiB, MiB = 1024, 1 << 20

ROWS = [
    Workload("16B", 16),
    Workload("1KiB", KiB),
    Workload("64KiB", 64 * KiB),
    Workload("1MiB", MiB),
    Workload("1KiB-10q", KiB, queues=10),
    Workload("1KiB-100q", KiB, queues=100),
    Workload("1KiB-10p", KiB, pairs=10),
    Workload("1KiB-10q-10p", KiB, queues=10, pairs=10),
    Workload("1KiB-100q-10p", KiB, queues=100, pairs=10),
    Workload("backlog-1M", KiB, backlog=1_000_000),
]
SETUPS = ["ours-1", "rabbitmq-1", "ours-3", "rabbitmq-3"]
GOAL_RATIO = 1.5


def describe(wl: Workload) -> str:
    size = f"{wl.size // MiB} MiB" if wl.size >= MiB else f"{wl.size // KiB} KiB" if wl.size >= KiB \
        else f"{wl.size} B"
    what = f"{size}, {wl.queues} queue{'s' if wl.queues > 1 else ''}, " \
           f"{wl.pairs} pair{'s' if wl.pairs > 1 else ''}"
    if wl.backlog:
        what = f"backlog {wl.backlog:,} x {size}, published then consumed"
    return what


@contextlib.contextmanager
def ours(nodes: int, base: Path) -> Iterator[tuple[list[int], list[int], Any]]:
    """A cluster of `nodes` of ours (tests/cluster's, warnings only): yields
    AMQP ports, OS pids and the Cluster; stopped on the way out."""
    from tests.cluster.conftest import Cluster

    c = Cluster(base, size=nodes)
    for n in c.nodes:
        n.env["QQ_LOG_LEVEL"] = "WARNING"
    c.start()
    try:
        yield [n.port for n in c.nodes], [n.proc.pid for n in c.nodes if n.proc], c
    finally:
        c.stop()


@contextlib.contextmanager
def rabbitmq(nodes: int, base: Path) -> Iterator[tuple[list[int], list[int], Any]]:
    started: list[rabbitmq_local.RabbitNode] = []
    try:
        for i in range(nodes):
            started.append(rabbitmq_local.start_node(
                base / f"r{i}", 5700 + i, f"qqreport{os.getpid()}r{i}@localhost"))
        for n in started[1:]:
            for cmd in (["stop_app"], ["join_cluster", started[0].name], ["start_app"]):
                r = n.ctl(*cmd)
                if r.returncode != 0:
                    raise RuntimeError(f"rabbitmqctl {' '.join(cmd)}: {r.stderr}")
        pids = [int((n.base / "pid").read_text().strip()) for n in started]
        yield [n.port for n in started], pids, started
    finally:
        for n in reversed(started):
            n.stop()


def settle_rss(pids: list[int], quiet: float = 3.0, limit: float = 60.0) -> int:
    """The brokers' RSS once it has stopped moving by more than 1% for `quiet` s."""
    deadline = time.monotonic() + limit
    last = load.RssSampler.rss(pids)
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = load.RssSampler.rss(pids)
        if abs(now - last) > last * 0.01:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last


def idle_queue_memory(ports: list[int], pids: list[int], count: int) -> float:
    """Bytes of broker RSS (all nodes together) per idle quorum queue."""
    before = settle_rss(pids)
    c = RawClient("127.0.0.1", ports[0])
    for i in range(count):
        c.declare_quorum_queue(f"idle-{i}")
    after = settle_rss(pids)
    for i in range(count):
        c.delete_queue(f"idle-{i}")
    c.close()
    return (after - before) / count


def recovery_after_kill(cluster: Any, backlog: int) -> dict[str, float]:
    """Publish `backlog` 1 KiB messages, kill -9 every node, restart them all:
    seconds until the nodes accept connections and until the queue answers
    with its whole backlog."""
    from tests.e2e.broker_proc import start_all

    ports = [n.port for n in cluster.nodes]
    wl = Workload("recovery", KiB, backlog=backlog)
    res = load.run(wl, "127.0.0.1", ports, [], consume=False)
    q = "bench-recovery-0"
    cluster.kill_all()
    t0 = time.monotonic()
    start_all(cluster.nodes)
    up = time.monotonic() - t0
    depth = -1
    while time.monotonic() - t0 < 600:
        try:
            c = RawClient("127.0.0.1", ports[0])
            depth = c.depth(q)
            if depth >= res["confirmed"]:
                c.delete_queue(q)
                c.close()
                break
            c.close()
        except (OSError, ConnectionError):
            pass
        time.sleep(0.1)
    return {"backlog": res["confirmed"], "nodes_up_s": up,
            "queue_available_s": time.monotonic() - t0, "depth_after": depth}


def failover_once(base: Path) -> float:
    """kill -9 of the queue leader's node while a publisher on another node
    publishes one message at a time with confirms: seconds to the next confirm."""
    with ours(3, base) as (_ports, _pids, c):
        setup = RawClient("127.0.0.1", c.nodes[0].port)
        setup.declare_quorum_queue("failover")  # leader: node 1 (client-local)
        setup.close()
        pub = RawClient("127.0.0.1", c.nodes[1].port)
        pub.confirm_select()
        killed = 0.0
        for i in range(1000):
            if i == 200:
                c.nodes[0].kill()
                killed = time.monotonic()
            pub.sock.sendall(RawClient.publish_frames(b"failover", b"x" * KiB))
            acked = False
            while not acked:
                for ftype, _ch, p in pub.read_frames():
                    if ftype == 1 and struct.unpack_from(">HH", p) in ((60, 80), (60, 120)):
                        acked = True
            if killed:
                return time.monotonic() - killed
    raise RuntimeError("no confirm came back after the kill")


def machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError):
        mem = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    rmq = "not installed"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"],
                           capture_output=True, text=True, timeout=10)
        rmq = r.stdout.strip() or rmq
    return {"cpu": cpu, "cores": str(os.cpu_count()), "memory": f"{mem / 2**30:.0f} GiB",
            "kernel": platform.release(), "python": platform.python_version(),
            "rabbitmq": rmq, "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "ours": ours_build()}


def ours_build() -> str:
    """How our brokers run here: compiled (make native) or pure Python, and why
    (they inherit this process's environment, QQ_PURE_PYTHON included)."""
    from broker import compiled

    current, why = compiled.build_is_current()
    if os.environ.get(compiled.PURE_ENV, "") not in ("", "0"):
        current, why = False, f"{compiled.PURE_ENV} is set"
    if current:
        return f"compiled (mypyc, {len(compiled.COMPILED)} modules)"
    return f"pure Python ({why})"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows = [r for r in ROWS if not args.rows or r.name in args.rows.split(",")]
    if args.quick:
        rows = [replace(r, duration=4.0, backlog=min(r.backlog, 100_000)) for r in rows]
    elif args.duration:
        rows = [replace(r, duration=args.duration) for r in rows]
    setups = [s for s in args.setups.split(",") if s]
    out: dict[str, Any] = {"machine": machine(), "command": " ".join(sys.argv[1:]) or "(defaults)",
                           "rows": {r.name: {"what": describe(r), "window": r.window,
                                             "duration": r.duration, "backlog": r.backlog}
                                    for r in rows},
                           "results": {}, "idle_rss": {}, "idle_queue_bytes": {}, "ours": {}}
    out["repeat"] = args.repeat
    out["warmup_s"] = args.warmup
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for turn in range(args.repeat):
        measure_turn(args, setups, rows, out, runs, first=turn == 0)
    for setup, by_row in runs.items():  # each row: its median run by throughput
        out["results"][setup] = {}
        for name, rs in by_row.items():
            median = dict(sorted(rs, key=lambda r: r["rate"])[len(rs) // 2])
            median["rates"] = [r["rate"] for r in rs]
            out["results"][setup][name] = median
    if args.failover:
        times = []
        for i in range(args.failover):
            with tempfile.TemporaryDirectory(prefix="qq-report-fo-") as d:
                times.append(failover_once(Path(d)))
            print(f"failover {i + 1}: {times[-1]:.2f} s", flush=True)
        out["ours"]["failover_s"] = times
    from bench.queue_machine import memory_per_message

    out["ours"]["state_per_ready_message"] = memory_per_message(args.state_messages)
    print(f"queue machine state per ready message: "
          f"{out['ours']['state_per_ready_message']:.1f} B", flush=True)
    return out


def measure_turn(args: argparse.Namespace, setups: list[str], rows: list[Workload], out: dict[str, Any],
                 runs: dict[str, dict[str, list[dict[str, Any]]]], first: bool) -> None:
    """Every setup in turn, each running every row once (into `runs`); the
    first turn also measures idle memory and recovery."""
    for setup in setups:
        kind, _, n = setup.partition("-")
        if kind == "rabbitmq" and not rabbitmq_local.installed():
            print(f"{setup}: rabbitmq-server is not installed; skipped", flush=True)
            continue
        with tempfile.TemporaryDirectory(prefix=f"qq-report-{setup}-") as d:
            ctx = ours(int(n), Path(d)) if kind == "ours" else rabbitmq(int(n), Path(d))
            with ctx as (ports, pids, handle):
                if first:
                    out["idle_rss"][setup] = settle_rss(pids) / 2**20
                if args.idle_queues and first:  # first: later rows leave freed heap that new queues reuse
                    b = idle_queue_memory(ports, pids, args.idle_queues)
                    out["idle_queue_bytes"][setup] = b
                    print(f"{setup:>11} idle queue: {b / KiB:.1f} KiB RSS per queue "
                          f"({args.idle_queues} queues)", flush=True)
                if args.warmup > 0:
                    warm_up(setup, ports, pids, args.warmup)
                for wl in rows:
                    r = run_row(setup, wl, ports, pids)
                    runs.setdefault(setup, {}).setdefault(wl.name, []).append(r)
                    print(f"{setup:>11} {wl.name:>14}: {r['rate']:10,.0f} msg/s "
                          f"(publish {r['publish_rate']:,.0f}/s) p50 {r['p50']:.1f} ms "
                          f"p99 {r['p99']:.1f} ms rss {r['rss_peak_mib']:.0f} MiB "
                          f"[{r['confirmed']:,} confirmed, {r['consumed']:,} consumed]", flush=True)
                if setup == "ours-3" and args.recovery and first:
                    rec = recovery_after_kill(handle, args.recovery)
                    out["ours"]["recovery"] = rec
                    print(f"recovery after kill -9 of all 3 nodes with {rec['backlog']:,} ready: "
                          f"nodes up {rec['nodes_up_s']:.1f} s, queue available with its backlog "
                          f"{rec['queue_available_s']:.1f} s", flush=True)


ROW_ATTEMPTS = 3
#: the untimed run every setup gets before its rows, in every turn
WARMUP_ROW = "1KiB"


def warm_up(setup: str, ports: list[int], pids: list[int], seconds: float) -> None:
    """One untimed run of the 1 KiB row, its result thrown away; both brokers
    get the same. Added because the first rows after a heavy setup looked
    like a transient of the machine: in the report at `d6ff403` ours-1's
    16 B p99 was 72 ms in the first turn and 204 and 335 ms in the turns
    that followed rabbitmq-3's 1,000,000-message backlog (an isolated rerun
    after that backlog: 133 ms in the first run, 79-82 in the next two). In
    the report with it (`344d11f`) the 1 KiB row's later turns were fine and
    the 16 B row's were not (bench/PERF_NOTES.md, "Where the table stands")."""
    wl = replace(next(r for r in ROWS if r.name == WARMUP_ROW), duration=seconds)
    r = run_row(setup, wl, ports, pids)
    print(f"{setup:>11} {'(warm-up)':>14}: {r['rate']:10,.0f} msg/s, not counted", flush=True)


def run_row(setup: str, wl: Workload, ports: list[int], pids: list[int]) -> dict[str, Any]:
    """One run of `wl`, tried again (up to `ROW_ATTEMPTS` in all) when the
    broker refuses it: RabbitMQ 3.10 sometimes answers a quorum queue's
    declare with 541 INTERNAL_ERROR while its Ra cluster starts under load,
    and one refusal should not cost the other rows of a 48-minute report."""
    for attempt in range(1, ROW_ATTEMPTS):
        try:
            return load.run(wl, "127.0.0.1", ports, pids)
        except (ConnectionError, OSError) as exc:
            print(f"{setup:>11} {wl.name:>14}: attempt {attempt} failed ({exc}); again in 5 s",
                  flush=True)
            time.sleep(5)
    return load.run(wl, "127.0.0.1", ports, pids)  # the last attempt's error is the report's


def _fmt_rate(x: float) -> str:
    return "-" if x != x else f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def _fmt_runs(r: dict[str, Any]) -> str:
    """A row's throughput; with several runs, their range after it."""
    rates = r.get("rates", [])
    if len(rates) < 2:
        return _fmt_rate(r["rate"])
    return f"{_fmt_rate(r['rate'])} ({_fmt_rate(min(rates))}-{_fmt_rate(max(rates))})"


def _fmt_ms(x: float) -> str:
    return "-" if x != x else f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def charts(data: dict[str, Any], img: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = [s for s in SETUPS if s in data["results"]]
    rows = list(data["rows"])
    colors = {"ours-1": "#2b6cb0", "rabbitmq-1": "#dd6b20", "ours-3": "#63b3ed", "rabbitmq-3": "#f6ad55"}
    img.mkdir(parents=True, exist_ok=True)
    names = []
    for key, title, ylabel, log in (
            ("rate", "End-to-end throughput", "messages/s (log scale)", True),
            ("p99", "p99 publish->deliver latency", "ms (log scale)", True),
            ("rss_peak_mib", "Peak broker memory (RSS, all nodes)", "MiB", False)):
        fig, ax = plt.subplots(figsize=(11, 4.2))
        width = 0.8 / max(1, len(setups))
        for i, s in enumerate(setups):
            ys = [data["results"][s].get(r, {}).get(key, float("nan")) for r in rows]
            ax.bar([x + i * width for x in range(len(rows))], ys, width, label=s, color=colors.get(s))
        ax.set_xticks([x + width * (len(setups) - 1) / 2 for x in range(len(rows))])
        ax.set_xticklabels(rows, rotation=25, ha="right", fontsize=8)
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        name = f"perf-{key.split('_')[0]}.png"
        fig.savefig(img / name, dpi=90)
        plt.close(fig)
        names.append(name)
    return names


def write_doc(data: dict[str, Any], path: Path, notes: Path) -> None:
    m = data["machine"]
    res = data["results"]
    lines = [
        "# Performance: our broker and RabbitMQ side by side",
        "",
        "Written by `make bench-report` (bench/report.py); do not edit by hand: the analysis "
        "at the end comes from `bench/PERF_NOTES.md`. Raw numbers: `bench-results/report.json`.",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}, Linux {m['kernel']}; "
        f"Python {m['python']}; RabbitMQ {m['rabbitmq']} (Debian). Measured {m['date']}.",
        f"- Ours: {m.get('ours', 'pure Python (before the compiled build)')} "
        "(broker/compiled.py; each node logs which path it took).",
        f"- Command: `bench/report.py {data['command']}`.",
        "- Each row: persistent messages, publisher confirms (1,000 in flight per publisher, "
        "fewer for big bodies: at most 64 MiB in flight), consumers with the same prefetch acking "
        "with `multiple` every 100 (or prefetch/10); one OS process per publisher and per "
        "consumer on raw frames (bench/load.py), all on this machine and connected to the "
        "first node. Throughput is messages consumed per second end to end; latency is "
        "publish->deliver. A confirm from either broker means fsynced on a quorum.",
        f"- Goal (issue 16): at least {GOAL_RATIO}x RabbitMQ's throughput with p99 no higher.",
    ]
    if data.get("warmup_s"):
        lines.append(f"- Before its rows, in every turn, each setup ran the {WARMUP_ROW} row untimed for "
                     f"{data['warmup_s']:g} s (not counted).")
    if data.get("repeat", 1) > 1:
        lines.append(f"- Every setup ran every row {data['repeat']} times, the setups in turn; each "
                     "row shows its median run by throughput (its latency and memory too), with "
                     "the range of the runs' throughput in brackets.")
    lines += [
        "",
    ]
    for n in ("1", "3"):
        o, r = f"ours-{n}", f"rabbitmq-{n}"
        if o not in res:
            continue
        lines += [f"## {n} node{'s' if n != '1' else ''}", "",
                  "| workload | in flight | ours msg/s | RabbitMQ msg/s | ratio | ours p50 / p99 ms "
                  "| RabbitMQ p50 / p99 ms | ours / RabbitMQ peak RSS MiB | goal |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, row in data["rows"].items():
            a = res[o].get(name)
            b = res.get(r, {}).get(name)
            if not a:
                continue
            ratio = a["rate"] / b["rate"] if b and b["rate"] == b["rate"] and b["rate"] else float("nan")
            if row["backlog"]:
                lat_a = lat_b = "-"
                rate_a = f"{_fmt_rate(a['publish_rate'])} in, {_fmt_rate(a['rate'])} out"
                rate_b = f"{_fmt_rate(b['publish_rate'])} in, {_fmt_rate(b['rate'])} out" if b else "-"
                ok = (b is not None and a["rate"] >= GOAL_RATIO * b["rate"]
                      and a["publish_rate"] >= GOAL_RATIO * b["publish_rate"])
                ratio_s = f"{ratio:.2f} out, {a['publish_rate'] / b['publish_rate']:.2f} in" if b else "-"
            else:
                lat_a = f"{_fmt_ms(a['p50'])} / {_fmt_ms(a['p99'])}"
                lat_b = f"{_fmt_ms(b['p50'])} / {_fmt_ms(b['p99'])}" if b else "-"
                rate_a, rate_b = _fmt_runs(a), _fmt_runs(b) if b else "-"
                ok = b is not None and ratio >= GOAL_RATIO and a["p99"] <= b["p99"]
                ratio_s = f"{ratio:.2f}" if b else "-"
            mem = f"{a['rss_peak_mib']:.0f} / {b['rss_peak_mib']:.0f}" if b else f"{a['rss_peak_mib']:.0f} / -"
            lines.append(f"| {row['what']} | {row['window']} | {rate_a} | {rate_b} | {ratio_s} | "
                         f"{lat_a} | {lat_b} | {mem} | {'met' if ok else '**short**'} |")
        lines.append("")
    lines += ["## Memory and recovery", ""]
    if data["idle_rss"]:
        lines.append("| setup | idle RSS (all nodes) MiB | RSS per idle queue KiB |")
        lines.append("| --- | --- | --- |")
        for s, v in data["idle_rss"].items():
            q = data["idle_queue_bytes"].get(s)
            lines.append(f"| {s} | {v:.0f} | {q / KiB:.1f} |" if q is not None else f"| {s} | {v:.0f} | - |")
        lines.append("")
    ours_ = data["ours"]
    lines.append(f"- Queue machine state per ready message (bench/queue_machine.py, tracemalloc): "
                 f"**{ours_['state_per_ready_message']:.1f} B** (goal <= 16 B).")
    for n in ("1", "3"):
        b = res.get(f"ours-{n}", {}).get("backlog-1M")
        if b and b.get("backlog_rss_mib"):
            per = (b["backlog_rss_mib"] - data["idle_rss"][f"ours-{n}"]) * MiB / max(1, b["depth"]) / int(n)
            lines.append(f"- Ours, {n} node(s): RSS per ready message with the backlog in place "
                         f"(each node): {per:.0f} B.")
    if "recovery" in ours_:
        rc = ours_["recovery"]
        lines.append(f"- Recovery after kill -9 of all 3 nodes with {rc['backlog']:,} ready 1 KiB "
                     f"messages: nodes accept connections after {rc['nodes_up_s']:.1f} s, the queue "
                     f"answers with its whole backlog after {rc['queue_available_s']:.1f} s.")
    if "failover_s" in ours_:
        fo = ours_["failover_s"]
        lines.append(f"- Failover (kill -9 of the leader's node -> next confirm on another node), "
                     f"{len(fo)} runs: median {statistics.median(fo):.2f} s, worst {max(fo):.2f} s "
                     f"(goal < 1 s).")
    lines.append("")
    names = charts(data, path.parent / "img")
    lines += ["## Charts", ""] + [f"![{n}](img/{n})" for n in names] + [""]
    if notes.exists():
        lines += [notes.read_text().rstrip(), ""]
    path.write_text("\n".join(lines))


def main() -> int:
    # SIGTERM unwinds like Ctrl-C, so the brokers this script started are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    ap.add_argument("--quick", action="store_true", help="4 s rows and a 100k backlog")
    ap.add_argument("--duration", type=float, default=6.0,
                    help="seconds of publishing per row (0: bench/load.py's default)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of every row per setup, the setups in turn; the median is shown")
    ap.add_argument("--warmup", type=float, default=3.0,
                    help="seconds of an untimed 1 KiB run before each setup's rows, every turn (0: off)")
    ap.add_argument("--idle-queues", type=int, default=300)
    ap.add_argument("--recovery", type=int, default=1_000_000, help="backlog for the kill -9 test (0: off)")
    ap.add_argument("--failover", type=int, default=3, help="failover repetitions (0: off)")
    ap.add_argument("--state-messages", type=int, default=1_000_000)
    ap.add_argument("--from-json", type=Path)
    ap.add_argument("--json", type=Path, default=ROOT / "bench-results" / "report.json")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "PERFORMANCE.md")
    args = ap.parse_args()
    if args.quick:
        args.recovery = min(args.recovery, 100_000)
        args.repeat = 1
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.from_json:
        data = json.loads(args.from_json.read_text())
    else:
        data = measure(args)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1))
    write_doc(data, args.doc, ROOT / "bench" / "PERF_NOTES.md")
    print(f"wrote {args.doc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
