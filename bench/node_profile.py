"""Where a message's time goes: a 3-node cluster of ours under the 1 KiB
steady-state load of bench/report.py, each node sampled with py-spy (on-CPU
samples only, every thread, the process not paused), then each sample charged
to the deepest frame of our own code on its stack (so time in msgpack, struct,
os.write or the event loop counts for the broker step that called it) and
that frame's file to one step of the message path.

    .venv/bin/python bench/node_profile.py                       # 1 KiB, 1 pair, 20 s
    .venv/bin/python bench/node_profile.py --size 16 --pairs 10 --nodes 1
    .venv/bin/python bench/node_profile.py --json bench-results/profile.json --top 15

Prints, per node (node 1 leads the queue and holds the client connections):
CPU microseconds per consumed message in each step, and the hottest
functions. Needs ptrace permission (root) for py-spy.

With the compiled build (make native) most of the message path has no
Python frames, and py-spy charges it to the nearest interpreted caller.
`--perf` samples each node with Linux perf instead (cpu-clock, DWARF
call graphs; on-CPU only) and charges a sample to the innermost compiled
function of ours on its stack. Interpreted code of ours is one opaque
frame to perf on Python 3.11, so samples without a compiled frame are
told apart by thread only: the event loop's (uvloop and the interpreted
modules: transport, storage appends, timers) or the storage threads'.

    .venv/bin/python bench/node_profile.py --perf --nodes 1 --size 16

`--perf` is the default when the brokers will run compiled and perf (Debian's
linux-perf) is installed; `--no-perf` forces py-spy.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import load  # noqa: E402
from bench.load import Workload  # noqa: E402
from bench.report import ours, ours_build  # noqa: E402

# (pattern on "file:function", step); first match wins.
STEPS: list[tuple[str, str]] = [
    (r"broker/amqp/codec\.py:(\d+:)?(encode|_encode|marshal|deliver|frame_)", "AMQP encode (deliveries, acks)"),
    (r"broker/amqp/", "AMQP decode and connection state"),
    (r"broker/runtime/(amqp_server|channel)\.py:.*(write|deliver|_flush|send)", "delivery and socket writes"),
    (r"broker/runtime/(amqp_server|channel|confirms|msg_stats)\.py", "AMQP channel handlers"),
    (r"broker/metadata/routing", "routing"),
    (r"broker/runtime/(publish|cluster_local|cluster)\.py", "forwarding and confirms"),
    (r"broker/runtime/(transport|peer_wire|raft_wire|wire)\.py", "replication encode/decode and peer I/O"),
    (r"broker/raft/", "Raft"),
    (r"broker/runtime/raft_group\.py", "Raft group (runtime)"),
    (r"broker/storage/", "WAL, segments, snapshots"),
    (r"broker/queue/", "queue machine apply"),
    (r"broker/runtime/queues\.py", "queue effects (runtime)"),
    # main() runs the event loop: a sample whose deepest frame of ours is main
    # is uvloop's own work (socket reads and writes, callbacks' bookkeeping)
    (r"broker/(runtime/app\.py:(\d+:)?main|__main__\.py)", "event loop and socket I/O (uvloop)"),
    (r"broker/runtime/(node|peer_events|joining|node_calls)\.py", "node (timers, routing of callbacks)"),
    (r"broker/", "other broker code"),
]
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*)\)$")
# A compiled module's function as a native frame: mypyc names it
# CPyDef_<the module's shortest unique name suffix, dots as ___>___<name>
# (CPyPy_ for its Python-callable wrapper).
_MYPYC = re.compile(r"^CPy(?:Def|Py)_(?P<sym>\w+)")


def _mypyc_modules() -> list[tuple[str, str]]:
    """(symbol prefix, source path) of every compiled module, longest first."""
    from broker.compiled import COMPILED

    out = []
    for m in COMPILED:
        parts = m.split(".")
        for k in range(1, len(parts) + 1):
            suffix = parts[-k:]
            if sum(1 for o in COMPILED if o.split(".")[-k:] == suffix) == 1:
                out.append(("___".join(suffix) + "___", "/".join(parts) + ".py"))
                break
    return sorted(out, key=lambda x: -len(x[0]))


_MYPYC_MODULES = _mypyc_modules()


def _owner(frame: str) -> tuple[str, str] | None:
    """(broker source path, function) of a Python frame of ours or of a
    native frame of a compiled module of ours; None for anything else."""
    m = _FRAME.match(frame)
    if m and "broker/" in m["file"]:
        f = m["file"]
        return f[f.index("broker/"):], m["func"]
    n = _MYPYC.match(m["func"] if m else frame)
    if n:
        sym = n["sym"]
        for prefix, path in _MYPYC_MODULES:
            if sym.startswith(prefix):
                return path, sym[len(prefix):].replace("___", ".")
    return None


def step_of(file: str, func: str) -> str:
    key = f"{file}:{func}"
    for pat, step in STEPS:
        if re.search(pat, key):
            return step
    return "other broker code"


def attribute(raw: str) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """py-spy raw (collapsed) stacks -> samples per step and per function."""
    steps: collections.Counter[str] = collections.Counter()
    funcs: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        owner = None
        for fr in reversed(frames):
            owner = _owner(fr)
            if owner is not None:
                break
        if owner is None:
            leaf = frames[-1]
            step = "event loop, no broker frame" if ("asyncio" in stack or "uvloop" in stack) \
                else "interpreter/other threads"
            steps[step] += n
            funcs[leaf[:90]] += n
            continue
        steps[step_of(*owner)] += n
        funcs[f"{owner[0]}:{owner[1]}"] += n
    return steps, funcs, total


def attribute_perf(script: str, pid: int) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """`perf script -F tid,ip,sym` output of one node -> samples per step and
    per function (see --perf in the module docstring)."""
    steps: collections.Counter[str] = collections.Counter()
    funcs: collections.Counter[str] = collections.Counter()
    total = 0
    for block in script.split("\n\n"):
        lines = [ln.strip() for ln in block.strip().splitlines()]
        if not lines or not lines[0].split()[0].isdigit():
            continue
        tid = int(lines[0].split()[0])
        syms = [ln.split(None, 1)[1] if " " in ln else "?" for ln in lines[1:]]
        syms = [re.sub(r"\+0x[0-9a-f]+$", "", sym) for sym in syms]
        total += 1
        owner = next((o for o in map(_owner, syms) if o is not None), None)
        if owner is not None:
            steps[step_of(*owner)] += 1
            funcs[f"{owner[0]}:{owner[1]}"] += 1
            continue
        leaf = syms[0] if syms else "?"
        if tid != pid:
            steps["other threads (WAL writer, segment flusher; interpreted)"] += 1
        elif any("_PyEval_EvalFrameDefault" in sym for sym in syms):
            steps["interpreted code on the event loop (transport, storage appends, timers)"] += 1
        else:
            steps["event loop and socket I/O (uvloop)"] += 1
        funcs[leaf[:90]] += 1
    return steps, funcs, total


def record_perf(pid: int, seconds: float, rate: int, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(rate), "--call-graph", "dwarf,16384",
         "-p", str(pid), "-o", str(out), "--", "sleep", str(seconds)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def perf_script(data: Path) -> str:
    return subprocess.run(["perf", "script", "-i", str(data), "-F", "tid,ip,sym"],
                          capture_output=True, text=True, check=True).stdout


def record(pid: int, seconds: float, rate: int, out: Path, lines: bool,
           native: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid), "-d", str(int(seconds)),
         "-r", str(rate), "-f", "raw", *([] if lines else ["--nolineno"]), "--threads",
         *(["--native"] if native else ["--nonblocking"]), "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--queues", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds of load (profiled: all but 4)")
    ap.add_argument("--rate", type=int, help="samples per second (py-spy 250, perf 199)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--lines", action="store_true", help="hottest lines instead of functions")
    ap.add_argument("--native", action="store_true",
                    help="py-spy with C frames too (pauses each node per sample, and counts threads "
                         "blocked in C as busy); --perf sees the compiled modules better")
    ap.add_argument("--perf", action=argparse.BooleanOptionalAction, default=None,
                    help="sample with Linux perf (see the module docstring); the default when the "
                         "brokers run compiled and perf is installed, py-spy otherwise")
    ap.add_argument("--keep", type=Path, help="copy the raw py-spy stacks into this directory")
    args = ap.parse_args()
    build = ours_build()
    if args.perf is None:
        args.perf = build.startswith("compiled") and not args.native and shutil.which("perf") is not None
    print(f"brokers: {build}; sampled with {'perf' if args.perf else 'py-spy'}")
    if args.rate is None:
        args.rate = 199 if args.perf else 250
    wl = Workload("profile", args.size, args.queues, args.pairs, duration=args.seconds)
    with tempfile.TemporaryDirectory(prefix="qq-profile-") as d, ours(args.nodes, Path(d)) as (ports, pids, _c):
        result: dict[str, float] = {}
        t = threading.Thread(target=lambda: result.update(load.run(wl, "127.0.0.1", ports, pids)))
        t.start()
        time.sleep(2.0)  # past connection set-up and the first burst
        window = args.seconds - 4.0
        outs = [Path(d) / f"n{i + 1}.{'perf' if args.perf else 'raw'}" for i in range(len(pids))]
        procs = [record_perf(pid, window, args.rate, o) if args.perf
                 else record(pid, window, args.rate, o, args.lines, args.native)
                 for pid, o in zip(pids, outs, strict=True)]
        for p in procs:
            _, err = p.communicate()
            if p.returncode != 0:
                print(f"{'perf' if args.perf else 'py-spy'} failed: {err.decode(errors='replace')[-500:]}",
                      file=sys.stderr)
                return 1
        t.join()
        raws = [perf_script(o) if args.perf else o.read_text() for o in outs]
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for o, raw in zip(outs, raws, strict=True):
                (args.keep / o.name).write_text(raw)
    msgs = result["rate"] * window
    print(f"{args.nodes} node(s), {args.size} B, {args.queues} queue(s), {args.pairs} pair(s): "
          f"{result['rate']:,.0f} msg/s end to end, p99 {result['p99']:.0f} ms; profiled "
          f"{window:.0f} s (~{msgs:,.0f} messages) at {args.rate} samples/s per node")
    report = {"rate": result["rate"], "p99": result["p99"], "window_s": window, "nodes": []}
    per_sample_us = 1e6 / args.rate
    for i, raw in enumerate(raws):
        steps, funcs, total = attribute_perf(raw, pids[i]) if args.perf else attribute(raw)
        busy = total / (args.rate * window)
        print(f"\nnode {i + 1}{' (leader, clients)' if i == 0 else ''}: CPU busy {busy * 100:.0f}% "
              f"of one core, {total * per_sample_us / msgs:.1f} us per message")
        for step, n in steps.most_common():
            print(f"  {n * per_sample_us / msgs:7.1f} us  {n / total * 100:5.1f}%  {step}")
        print("  hottest functions (with what they call):")
        for fn, n in funcs.most_common(args.top):
            print(f"  {n * per_sample_us / msgs:7.1f} us  {fn}")
        report["nodes"].append({
            "busy": busy, "us_per_msg": total * per_sample_us / msgs,
            "steps": {s: n * per_sample_us / msgs for s, n in steps.most_common()},
            "functions": {f: n * per_sample_us / msgs for f, n in funcs.most_common(40)}})
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("bench/node_profile.py: py-spy needs root (ptrace) to attach to the broker", file=sys.stderr)
    sys.exit(main())
