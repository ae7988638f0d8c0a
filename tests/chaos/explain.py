"""Explain a run's lost values: `python -m tests.chaos.explain RESULTS_DIR`.

Groups the lost (confirmed, never dequeued) values into runs of consecutive
time, and prints for each group the publishers and nodes that confirmed
them, the confirm latency, the leader/members the observer saw, and the
nemesis events from a few seconds before the first to after the last.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def explain(rundir: Path, window: float = 3.0, gap: float = 2.0) -> str:
    summary = json.loads((rundir / "summary.json").read_text())
    events = [json.loads(line) for line in (rundir / "history.jsonl").open()]
    lost = set(summary.get("lost", []))
    ok = {e["value"]: e for e in events if e.get("f") == "enqueue" and e.get("type") == "ok"}
    inv = {e["value"]: e for e in events if e.get("f") == "enqueue" and e.get("type") == "invoke"}
    out = [f"{rundir.name}: lost {summary.get('lost_count')} unexpected "
           f"{summary.get('unexpected_count')} stuck-until-restart "
           f"{summary.get('stuck_until_restart_count', 0)} (commit {summary.get('commit')})"]
    items = sorted((ok[v]["t"], v) for v in lost if v in ok)
    groups: list[list[tuple[float, int]]] = []
    for t, v in items:
        if groups and t - groups[-1][-1][0] <= gap:
            groups[-1].append((t, v))
        else:
            groups.append([(t, v)])
    confirmed_in = lambda a, b: sum(1 for e in ok.values() if a <= e["t"] <= b)  # noqa: E731
    for g in groups:
        t0, t1 = g[0][0], g[-1][0]
        by: dict[str, int] = {}
        for _, v in g:
            key = f"{ok[v]['process']}@node{ok[v]['node']}"
            by[key] = by.get(key, 0) + 1
        lat = [ok[v]["t"] - inv[v]["t"] for _, v in g if v in inv]
        out.append(f"\n== {len(g)} lost confirmed between t={t0:.3f} and t={t1:.3f} "
                   f"(of {confirmed_in(t0, t1)} confirmed then); values {g[0][1]}..{g[-1][1]}")
        out.append(f"   confirmed by (publisher@node): {by}")
        out.append(f"   confirm latency: min {min(lat):.4f}s max {max(lat):.4f}s")
        for e in events:
            if e.get("process") in ("nemesis", "observer", "runner") and \
                    t0 - window * 3 <= e["t"] <= t1 + window:
                val: Any = e.get("value")
                out.append(f"   t={e['t']:8.3f} {e['process']:8} {e.get('f')} {e.get('phase', '')} "
                           f"{json.dumps(val, default=str)[:160]}"
                           + (f" leader={e.get('leader')}" if e.get("process") == "nemesis" else ""))
    return "\n".join(out)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(explain(Path(arg)))
