"""x-death headers for dead-lettered messages, written as RabbitMQ writes them.

Pipeline position: the machine emits `DeadLetter`/`DeadLetterDeliver`
effects that carry message keys only; the runtime reads each body and its
properties from the log and calls `x_death_headers` to build the headers of
the republished copy. Pure: time is passed in.

Rules (RabbitMQ's dead-lettering guide, 3.13+/4.x):
- ``x-death`` is an array of tables, most recent first; an entry is keyed by
  (queue, reason): dead-lettering again for the same pair increments its
  ``count``, refreshes ``time`` and moves it to the front;
- an entry holds ``count``, ``reason``, ``queue``, ``time`` (AMQP timestamp,
  seconds), ``exchange``, ``routing-keys`` (routing key plus CC/BCC) and, when
  the message had a per-message TTL, ``original-expiration`` (the
  ``expiration`` property is then removed from the copy);
- ``x-first-death-{queue,reason,exchange}`` are set once, on the first dead
  lettering; ``x-last-death-{queue,reason,exchange}`` on every one.
"""
from __future__ import annotations

from typing import Any

from .effects import DeadLetterReason


def x_death_headers(headers: dict[str, Any] | None, *, queue: str, reason: DeadLetterReason,
                    exchange: str, routing_keys: list[str], time_ms: int,
                    expiration: str | None = None) -> dict[str, Any]:
    """Return a new headers table for the dead-lettered copy of a message.

    `headers` is the message's current headers (not modified); `exchange` and
    `routing_keys` are where the message was originally published; `time_ms`
    is the dead-lettering time (the log entry's timestamp); `expiration` the
    message's ``expiration`` property if it had one (the caller must clear the
    property on the copy).
    """
    out = dict(headers or {})
    deaths_in = out.get("x-death")
    deaths: list[dict[str, Any]] = [dict(d) for d in deaths_in] if isinstance(deaths_in, list) \
        else []
    seconds = time_ms // 1000
    for i, d in enumerate(deaths):
        if d.get("queue") == queue and d.get("reason") == reason.value:
            d["count"] = int(d.get("count", 0)) + 1
            d["time"] = seconds
            deaths.insert(0, deaths.pop(i))
            break
    else:
        entry: dict[str, Any] = {"count": 1, "reason": reason.value, "queue": queue,
                                 "time": seconds, "exchange": exchange,
                                 "routing-keys": list(routing_keys)}
        if expiration is not None:
            entry["original-expiration"] = expiration
        deaths.insert(0, entry)
    out["x-death"] = deaths
    if "x-first-death-queue" not in out:
        out["x-first-death-queue"] = queue
        out["x-first-death-reason"] = reason.value
        out["x-first-death-exchange"] = exchange
    out["x-last-death-queue"] = queue
    out["x-last-death-reason"] = reason.value
    out["x-last-death-exchange"] = exchange
    return out
