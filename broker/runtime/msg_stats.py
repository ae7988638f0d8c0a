"""Message counters and rates: per channel, per queue (this node's channels'
share) and per node, as RabbitMQ's management API shows them
(`message_stats`).

Where it sits: channels (runtime/channel.py) bump plain integer fields on the
hot path; `NodeStats` samples them every STATS_INTERVAL into per-second
rates; the management API reads `node.msg_stats`. Imports nothing of the
runtime (the node is reached through its attributes).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Mapping
from typing import Any, Protocol

#: Seconds between two samples of the message counters (RabbitMQ's
#: collect_statistics_interval is 5 s too).
STATS_INTERVAL = 5.0
STAT_FIELDS = ("publish", "confirm", "return_unroutable", "deliver", "deliver_no_ack", "get",
               "get_no_ack", "ack", "redeliver")


class MsgCounters:
    """Message counts of one channel, one queue (this node's channels' share) or
    the whole node: plain integer increments on the hot path; `sample` (every
    STATS_INTERVAL) turns them into per-second rates."""

    __slots__ = (*STAT_FIELDS, "_prev", "_prev_t", "rates")

    def __init__(self) -> None:
        self.publish = self.confirm = self.return_unroutable = 0
        self.deliver = self.deliver_no_ack = self.get = self.get_no_ack = 0
        self.ack = self.redeliver = 0
        self._prev: tuple[int, ...] = (0,) * len(STAT_FIELDS)
        self._prev_t = time.monotonic()
        self.rates: dict[str, float] = {}

    def counts(self) -> tuple[int, ...]:
        return (self.publish, self.confirm, self.return_unroutable, self.deliver,
                self.deliver_no_ack, self.get, self.get_no_ack, self.ack, self.redeliver)

    def sample(self, now: float) -> None:
        cur = self.counts()
        dt = now - self._prev_t
        if dt <= 0:
            return
        self.rates = {f: round((c - p) / dt, 1) for f, c, p in zip(STAT_FIELDS, cur, self._prev,
                                                                    strict=True)}
        self._prev, self._prev_t = cur, now

    def message_stats(self) -> dict[str, Any]:
        """RabbitMQ's `message_stats` object: counts and `<field>_details: {rate}`."""
        out: dict[str, Any] = {}  # JSON: counts (int) and {"rate": float} objects
        counts = dict(zip(STAT_FIELDS, self.counts(), strict=True))
        counts["deliver_get"] = self.deliver + self.deliver_no_ack + self.get + self.get_no_ack
        rates = self.rates
        rates_dg = (rates.get("deliver", 0.0) + rates.get("deliver_no_ack", 0.0)
                    + rates.get("get", 0.0) + rates.get("get_no_ack", 0.0))
        for name, value in counts.items():
            out[name] = value
            rate = rates_dg if name == "deliver_get" else rates.get(name, 0.0)
            out[f"{name}_details"] = {"rate": round(rate, 1)}
        return out


#: a queue's identity (runtime/queues.py's QueueUid): vhost, name, incarnation
QueueUid = tuple[str, str, int]


class _Channel(Protocol):
    @property
    def stats(self) -> MsgCounters: ...


class _Connection(Protocol):
    @property
    def channels(self) -> Mapping[int, _Channel]: ...


class StatsHost(Protocol):
    """What the counters read of the node: its queues and its connections."""

    @property
    def queues(self) -> Mapping[tuple[str, str], object]: ...
    @property
    def connections(self) -> Collection[_Connection]: ...


class NodeStats:
    """A node's message counters: totals and per queue (counted by this node's
    channels), sampled every STATS_INTERVAL by a timer started with the first
    AMQP connection. Read by the management API as `node.msg_stats`."""

    def __init__(self, node: StatsHost) -> None:
        self.node = node
        self.totals = MsgCounters()
        self.queues: dict[QueueUid, MsgCounters] = {}
        self._timer: asyncio.TimerHandle | None = None

    def queue(self, uid: QueueUid) -> MsgCounters:
        c = self.queues.get(uid)
        if c is None:
            c = self.queues[uid] = MsgCounters()
        return c

    def start(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(STATS_INTERVAL, self._tick)

    def _tick(self) -> None:
        now = time.monotonic()
        self.totals.sample(now)
        queues = self.node.queues
        for uid in list(self.queues):
            q = queues.get((uid[0], uid[1]))
            if q is None or getattr(q, "uid", uid) != uid:
                del self.queues[uid]  # deleted (or deleted and declared again)
            else:
                self.queues[uid].sample(now)
        for conn in list(self.node.connections):
            for ch in list(conn.channels.values()):
                ch.stats.sample(now)
        self._timer = asyncio.get_running_loop().call_later(STATS_INTERVAL, self._tick)


def node_stats(node: StatsHost) -> NodeStats:
    stats: NodeStats | None = getattr(node, "msg_stats", None)
    if stats is None:
        stats = NodeStats(node)
        node.msg_stats = stats  # type: ignore[attr-defined]
    return stats
