"""The total-queue checker (Jepsen's `checker/total-queue`) over a history.

A history is a list of events (dicts, one JSON line each in history.jsonl):

    {"t": 12.345, "process": "w3", "type": "invoke"|"ok"|"info"|"fail",
     "f": "enqueue"|"dequeue"|<nemesis op>, "value": ..., "node": 1, ...}

- enqueue: an `invoke` before the publish, then `ok` (basic.ack),
  or `info` (basic.nack, channel/connection error, 5 s without a confirm:
  the outcome is unknown, never "failed").
- dequeue: one `ok` per message received (basic.deliver or basic.get-ok),
  with "queue": "main" or "dlq" (the dead-letter queue of the TTL variant).
- nemesis: `info` events from process "nemesis" with "phase": "start" or
  "stop"; a start that cut the queue's leader off carries "leader_cut": true.

Results: **lost** = confirmed, never dequeued; **unexpected** = dequeued,
never attempted; **duplicated** = dequeued more than once; **recovered** =
outcome unknown, dequeued anyway. Valid iff lost and unexpected are empty.

With message TTL and at-most-once dead lettering a message that stayed in the
queue longer than the TTL may legitimately vanish; pass `ttl_s` and the
checker moves confirmed-not-dequeued values published at least `ttl_s`
before `end_t` (the end of the drain) from lost to `expired_maybe_dropped`.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any


def _active_faults(nemesis: list[dict[str, Any]], t: float) -> list[str]:
    """Nemesis operations in effect at time t (started, not yet stopped)."""
    active: dict[str, str] = {}
    for e in nemesis:
        if e["t"] > t:
            break
        key = str(e.get("id", e["f"]))
        if e.get("phase") == "start":
            active[key] = f"{e['f']}({e.get('value')})"
        elif e.get("phase") == "stop":
            active.pop(key, None)
    return list(active.values())


def check(history: Iterable[dict[str, Any]], ttl_s: float | None = None,
          end_t: float | None = None, detail_limit: int = 50) -> dict[str, Any]:
    events = sorted(history, key=lambda e: e["t"])
    attempted: set[int] = set()
    confirmed: dict[int, dict[str, Any]] = {}
    invoked: dict[int, dict[str, Any]] = {}
    unknown: set[int] = set()
    nacked: set[int] = set()
    dequeued: Counter[Any] = Counter()
    dequeued_dlq: set[Any] = set()
    first_dequeue: dict[Any, dict[str, Any]] = {}
    nemesis: list[dict[str, Any]] = []
    observed: list[dict[str, Any]] = []
    confirm_times: list[float] = []
    for e in events:
        f, typ = e.get("f"), e.get("type")
        if e.get("process") == "nemesis":
            nemesis.append(e)
        elif e.get("process") == "observer":
            observed.append(e)
        elif f == "enqueue":
            v = int(e["value"])
            if typ == "invoke":
                attempted.add(v)
                invoked[v] = e
            elif typ == "ok":
                confirmed[v] = e
                confirm_times.append(e["t"])
            elif typ == "info":
                unknown.add(v)
                if e.get("error") == "nack":
                    nacked.add(v)
        elif f == "dequeue" and typ == "ok":
            v = e["value"]  # an int, or the text of a body that was not one of ours
            dequeued[v] += 1
            first_dequeue.setdefault(v, e)
            if e.get("queue") == "dlq":
                dequeued_dlq.add(v)
    lost = sorted(set(confirmed) - set(dequeued))
    expired: list[int] = []
    if ttl_s is not None and end_t is not None:
        keep = []
        for v in lost:
            (expired if invoked[v]["t"] + ttl_s <= end_t else keep).append(v)
        lost = keep
    unexpected = sorted(set(dequeued) - attempted, key=str)
    duplicated = {v: c for v, c in dequeued.items() if c > 1}
    recovered = sorted(unknown & set(dequeued))

    def seen_at(t: float) -> Any:
        """The leader/members the observer last saw at time t."""
        out = None
        for e in observed:
            if e["t"] > t:
                break
            out = e.get("value")
        return out

    def detail(v: int) -> dict[str, Any]:
        inv, ok = invoked.get(v, {}), confirmed.get(v, {})
        return {"value": v, "process": inv.get("process"), "node": inv.get("node"),
                "invoke_t": inv.get("t"), "ok_t": ok.get("t"),
                "confirm_latency_s": (round(ok["t"] - inv["t"], 4) if ok and inv else None),
                "faults_at_invoke": _active_faults(nemesis, inv.get("t", 0.0)),
                "faults_at_confirm": _active_faults(nemesis, ok.get("t", 0.0)) if ok else None,
                "observed_at_confirm": seen_at(ok.get("t", 0.0)) if ok else None}

    return {
        "valid": not lost and not unexpected,
        "attempted": len(attempted),
        "confirmed": len(confirmed),
        "unknown": len(unknown),
        "nacked": len(nacked),
        "dequeued": sum(dequeued.values()),
        "dequeued_unique": len(dequeued),
        "dead_lettered": len(dequeued_dlq),
        "lost_count": len(lost),
        "unexpected_count": len(unexpected),
        "duplicated_count": len(duplicated),
        "recovered_count": len(recovered),
        "expired_maybe_dropped_count": len(expired),
        "lost": lost[:1000],
        "unexpected": unexpected[:1000],
        "duplicated_sample": dict(sorted(duplicated.items())[:50]),
        "lost_details": [detail(v) for v in lost[:detail_limit]],
        "unexpected_details": [first_dequeue[v] for v in unexpected[:detail_limit]],
        **confirm_gaps(events, invoked, confirmed, confirm_times, nemesis),
    }


def confirm_gaps(events: list[dict[str, Any]], invoked: dict[int, dict[str, Any]],
                 confirmed: dict[int, dict[str, Any]], confirm_times: list[float],
                 nemesis: list[dict[str, Any]]) -> dict[str, Any]:
    """Availability numbers. For each fault that cut the queue's leader off
    (isolated, killed, paused, on the minority side): the time from the
    fault to the first confirm of a publish invoked after it (if none came
    before the fault ended, the gap runs to the end of the fault and is
    marked open). Also the longest stretch between two confirms while the
    clients ran."""
    ok_by_invoke = sorted((invoked[v]["t"], e["t"]) for v, e in confirmed.items() if v in invoked)
    stops = {str(e.get("id")): e["t"] for e in nemesis if e.get("phase") == "stop"}
    gaps = []
    for e in nemesis:
        if e.get("phase") != "start" or not e.get("leader_cut"):
            continue
        t0 = e["t"]
        firsts = [ok for inv, ok in ok_by_invoke if inv >= t0]
        first = min(firsts) if firsts else None
        end = stops.get(str(e.get("id")))
        if first is not None and (end is None or first <= end + 60):
            gaps.append({"fault": e["f"], "at": round(t0, 3), "gap_s": round(first - t0, 3),
                         "open": False})
        else:
            gaps.append({"fault": e["f"], "at": round(t0, 3),
                         "gap_s": round((end if end is not None else t0) - t0, 3), "open": True})
    client_span = [e["t"] for e in events if e.get("f") == "enqueue"]
    longest = 0.0
    if client_span:
        prev = min(client_span)
        # ...up to the last publish attempt: a queue that never confirms again counts
        for t in [*sorted(confirm_times), max(client_span)]:
            longest = max(longest, t - prev)
            prev = max(prev, t)
    return {
        "leader_cut_faults": len(gaps),
        "max_no_confirm_after_leader_cut_s": max((g["gap_s"] for g in gaps), default=None),
        "no_confirm_after_leader_cut": gaps,
        "longest_confirm_gap_s": round(longest, 3),
    }
