"""The short chaos schedule CI runs (needs root: network namespaces).

Fixed seeds, a few minutes in all: 3 nodes with partitions, kills, pauses and
membership changes; 5 nodes with rings, one-way cuts, kills and membership
changes; 3 nodes with message TTL and at-least-once dead lettering (the
dead-letter queue is drained and checked too). Each must
lose nothing confirmed and deliver nothing never published. A failure names
the seed, the results directory (history.jsonl, summary.json, node logs) and
the command that replays the schedule. Long schedules: `make chaos`.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from tests.chaos.runner import RunConfig, one_line, run_once

pytestmark = [pytest.mark.root, pytest.mark.slow]

# Not tmp_path: pytest prunes old base temp dirs while other sessions run, and a
# failing run's history must stay for whoever reads the failure.
OUT = Path(os.environ.get("QQ_CHAOS_OUT", Path(tempfile.gettempdir()) / "qq-chaos-results"))

SCHEDULES = {
    "3-nodes": RunConfig(nodes=3, seed=101, duration=60,
                         nemesis="partition-halves,isolate-leader,kill,pause,membership"),
    "5-nodes": RunConfig(nodes=5, seed=202, duration=45,
                         nemesis="partition-ring,one-way,isolate-leader,kill,membership"),
    "3-nodes-ttl-dlx": RunConfig(nodes=3, seed=303, duration=30, variant="ttl-alo",
                                 nemesis="isolate-random,kill,membership", consumers=1, getters=0),
}


@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_chaos_schedule(name: str) -> None:
    if os.geteuid() != 0:
        pytest.fail("the chaos suite needs root (network namespaces); CI runs as root")
    cfg = SCHEDULES[name]
    s = run_once(cfg, OUT / "ci")
    print("\n" + one_line(s))
    assert s["ops"] > 100 and s["confirmed"] > 50, f"too little traffic to prove anything: {one_line(s)}"
    assert s["nemesis_ops"] - s["membership_ops"] >= 1 and s["membership_ops"] >= 1, (
        f"the nemesis did next to nothing: {one_line(s)}")
    assert s["valid"] and s["healthy"], (
        f"chaos schedule {name} (seed {cfg.seed}) lost confirmed messages, delivered unexpected "
        f"ones, left messages undrainable or stopped a Raft group:\n{one_line(s)}\n"
        f"node errors (first): {s['node_errors'][:5]}\nlost (first): {s['lost'][:30]}\nunexpected: {s['unexpected'][:30]}\n"
        f"details: {json.dumps(s['lost_details'][:5], default=str)}\n"
        f"results: {s['results']}\nreplay:  {s['replay']}")
