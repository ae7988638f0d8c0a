"""The total-queue checker on hand-written histories (no processes)."""
from __future__ import annotations

from typing import Any

from tests.chaos.checker import check


def enq(t: float, v: int, outcome: str = "ok", **kw: Any) -> list[dict[str, Any]]:
    out = [{"t": t, "process": "w0", "type": "invoke", "f": "enqueue", "value": v, "node": 0}]
    if outcome:
        out.append({"t": t + 0.01, "process": "w0", "type": outcome, "f": "enqueue", "value": v,
                    "node": 0, **kw})
    return out


def deq(t: float, v: Any, queue: str = "main") -> dict[str, Any]:
    return {"t": t, "process": "w1", "type": "ok", "f": "dequeue", "value": v, "queue": queue}


def test_all_confirmed_dequeued_is_valid() -> None:
    h = enq(0, 1) + enq(1, 2) + [deq(2, 1), deq(3, 2)]
    r = check(h)
    assert r["valid"] and r["lost_count"] == 0 and r["confirmed"] == 2


def test_confirmed_never_dequeued_is_lost() -> None:
    h = enq(0, 1) + enq(1, 2) + [deq(2, 1)]
    r = check(h)
    assert not r["valid"] and r["lost"] == [2]
    assert r["lost_details"][0]["node"] == 0


def test_dequeued_never_attempted_is_unexpected() -> None:
    h = enq(0, 1) + [deq(2, 1), deq(3, 99), deq(4, "garbage")]
    r = check(h)
    assert not r["valid"] and r["unexpected_count"] == 2


def test_unknown_outcomes_are_not_lost_and_recovered_when_seen() -> None:
    h = enq(0, 1, "info", error="timeout") + enq(1, 2, "info", error="nack") + [deq(2, 1)]
    r = check(h)
    assert r["valid"] and r["recovered_count"] == 1 and r["nacked"] == 1 and r["unknown"] == 2


def test_duplicates_counted_not_failed() -> None:
    h = enq(0, 1) + [deq(1, 1), deq(2, 1)]
    r = check(h)
    assert r["valid"] and r["duplicated_count"] == 1


def test_ttl_moves_possibly_expired_values_out_of_lost() -> None:
    h = enq(0, 1) + enq(50, 2)
    r = check(h, ttl_s=10, end_t=55)
    assert r["expired_maybe_dropped_count"] == 1 and r["lost"] == [2] and not r["valid"]


def test_gap_after_leader_cut_and_active_faults() -> None:
    nem = [{"t": 10.0, "process": "nemesis", "type": "info", "f": "isolate-leader", "id": "1",
            "phase": "start", "leader_cut": True, "value": "isolate 0"},
           {"t": 20.0, "process": "nemesis", "type": "info", "f": "isolate-leader", "id": "1",
            "phase": "stop", "value": None}]
    # invoked before the cut, confirmed after it: not the first post-cut confirm
    h = nem + enq(9.9, 1) + enq(10.5, 2) + [deq(30, 1)]
    h[-2]["t"] = 13.0  # value 2 confirmed 2.5 s after its invoke
    r = check(h)
    assert r["max_no_confirm_after_leader_cut_s"] == 3.0
    assert r["lost_details"][0]["faults_at_invoke"] == ["isolate-leader(isolate 0)"]


def test_longest_gap_runs_to_the_last_attempt_when_confirms_stop() -> None:
    h = enq(0, 1) + enq(1, 2) + enq(10, 3, "info", error="timeout") + [deq(11, 1), deq(11, 2)]
    r = check(h)
    # last confirm at 1.01; the last enqueue event (the timeout) at 10.01
    assert r["valid"] and r["longest_confirm_gap_s"] == 9.0
