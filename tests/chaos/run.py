"""Command-line runner for long chaos schedules (needs root).

    sudo .venv/bin/python -m tests.chaos.run --nodes 3 --seed 7 --duration 120 \\
        --nemesis all --runs 20 --out chaos-results/

Runs seeds seed, seed+1, ..., seed+runs-1 one after the other; prints one
line per run, a replay command for each invalid one, and writes
`<out>/index.jsonl` (one summary line per run). Exit status 1 if any run was
invalid (lost or unexpected values), unhealthy (a queue that could not be
drained even after a full restart, a Raft group stopped by a broken
invariant, or a queue whose member list in the metadata differs from its
Raft configuration) or failed to run.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from .nemesis import ALL, GROUPS, parse_kinds
from .runner import VARIANTS, RunConfig, one_line, run_once


def _pair(text: str) -> tuple[float, float]:
    a, _, b = text.partition(",")
    return float(a), float(b or a)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--duration", type=float, default=120.0, help="seconds of faults and traffic")
    p.add_argument("--nemesis", default="all",
                   help=f"comma-separated: {', '.join(ALL)}, or {', '.join(GROUPS)}, or none")
    p.add_argument("--variant", default="plain", choices=VARIANTS,
                   help="plain; ttl-amo: message TTL + at-most-once dead lettering; ttl-alo: "
                        "TTL + at-least-once dead lettering (x-overflow=reject-publish)")
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--getters", type=int, default=1)
    p.add_argument("--rate", type=float, default=20.0, help="ops/s per worker (0: unpaced)")
    p.add_argument("--ttl-ms", type=int, default=8000)
    p.add_argument("--fault-s", type=_pair, default=(3.0, 8.0), help="min,max fault duration")
    p.add_argument("--quiet-s", type=_pair, default=(2.0, 5.0), help="min,max quiet time")
    p.add_argument("--keep-data", action="store_true", help="keep broker data even when valid")
    p.add_argument("--out", default="chaos-results")
    a = p.parse_args(argv)
    try:
        parse_kinds(a.nemesis)
    except ValueError as exc:
        p.error(str(exc))
    # SIGTERM (and SIGINT, even when a background shell ignored it) end the
    # current run through its clean-up: brokers killed, namespaces deleted
    def _stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    bad = 0
    rows = []
    for k in range(a.runs):
        cfg = RunConfig(nodes=a.nodes, seed=a.seed + k, duration=a.duration, nemesis=a.nemesis,
                        variant=a.variant, publishers=a.publishers, consumers=a.consumers,
                        getters=a.getters, rate=a.rate, ttl_ms=a.ttl_ms, fault_s=a.fault_s,
                        quiet_s=a.quiet_s, keep_data=a.keep_data)
        try:
            s = run_once(cfg, out)
        except Exception as exc:  # noqa: BLE001 - one broken run must not stop the others
            print(f"ERROR   nodes={cfg.nodes} seed={cfg.seed}: {exc!r}", flush=True)
            print(f"        replay: {cfg.replay_command(str(out))}", flush=True)
            bad += 1
            continue
        line = one_line(s)
        print(line, flush=True)
        rows.append(s)
        with (out / "index.jsonl").open("a") as f:
            f.write(json.dumps({k2: s.get(k2) for k2 in (
                "run", "commit", "valid", "ops", "attempted", "confirmed", "unknown",
                "dequeued", "lost_count", "unexpected_count", "duplicated_count",
                "recovered_count", "stuck_until_restart_count", "dead_lettered",
                "expired_maybe_dropped_count",
                "max_no_confirm_after_leader_cut_s", "longest_confirm_gap_s",
                "nemesis_ops", "membership_ops", "drain_complete", "healthy", "members_agree",
                "groups_stopped", "elapsed_s", "results",
                "replay")} | {"seed": cfg.seed, "nodes": cfg.nodes, "nemesis": cfg.nemesis,
                              "variant": cfg.variant}) + "\n")
        if s.get("valid") and not s.get("healthy"):
            bad += 1
            print(f"        seed {cfg.seed} UNHEALTHY: drain complete "
                  f"{s.get('drain_complete_after_restart')}, groups stopped "
                  f"{s.get('groups_stopped')}, member lists agree with Raft "
                  f"{s.get('members_agree')}; {s.get('node_errors', [])[:3]}", flush=True)
            print(f"        results: {s.get('results')}", flush=True)
            print(f"        replay:  {s.get('replay')}", flush=True)
        if not s.get("valid"):
            bad += 1
            print(f"        seed {cfg.seed} INVALID: lost {s.get('lost')[:20]} "
                  f"unexpected {s.get('unexpected')[:20]}", flush=True)
            for d in s.get("lost_details", [])[:10]:
                print(f"        lost {d}", flush=True)
            print(f"        results: {s.get('results')}", flush=True)
            print(f"        replay:  {s.get('replay')}", flush=True)
    print(f"{len(rows)} runs, {bad} invalid or failed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
