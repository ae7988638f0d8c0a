"""A tiny driver for table tests: numbers raft indexes, advances the clock
explicitly and collects effects, so tests read like transcripts. Messages are
named by their keys (`msg_key`: an entry of one enqueue is position 0)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from broker.queue import (
    ChannelRef,
    Checkout,
    ConsumerId,
    Deliver,
    Effect,
    Enqueue,
    Meta,
    QueueConfig,
    QueueState,
    Reply,
    apply,
    msg_key,
    new_state,
)
from broker.queue.commands import Command


def cid(channel: str = "ch1", tag: str = "c1") -> ConsumerId:
    return ConsumerId(ChannelRef(channel), tag)


class Harness:
    def __init__(self, config: QueueConfig | None = None, **kw: Any) -> None:
        self.config = config if config is not None else QueueConfig(name="q", **kw)
        self.now = 1_000
        self.index = 0
        self.term = 1
        self.state: QueueState = new_state(self.config, created_ms=self.now)
        self.effects: list[Effect] = []
        self.replies: list[Reply] = []
        self.seq = 0

    def run(self, cmd: Command, advance_ms: int = 0, pos: int = 0) -> tuple[Reply, list[Effect]]:
        """Apply `cmd` as a new entry (pos 0), or at `pos` > 0 of the last one
        (a batch entry)."""
        if pos == 0:
            self.index += 1
        self.now += advance_ms
        st, reply, effects = apply(Meta(self.index, self.term, self.now, pos), cmd, self.state)
        assert st is self.state
        self.effects.extend(effects)
        self.replies.append(reply)
        return reply, effects

    def enqueue(self, n: int = 1, size: int = 10, priority: int | None = None,
                expiration_ms: int | None = None, publisher: str | None = "pub") -> list[int]:
        """Enqueue n messages, one entry each; returns their keys."""
        out = []
        for _ in range(n):
            self.seq += 1
            self.run(Enqueue(ChannelRef(publisher) if publisher else None, self.seq, size,
                             priority, expiration_ms))
            out.append(msg_key(self.index))
        return out

    def enqueue_batch(self, n: int, size: int = 10, publisher: str | None = "pub") -> list[int]:
        """Enqueue n messages as one batch entry (positions 0..n-1); returns their keys."""
        out = []
        for pos in range(n):
            self.seq += 1
            self.run(Enqueue(ChannelRef(publisher) if publisher else None, self.seq, size), pos=pos)
            out.append(msg_key(self.index, pos))
        return out

    def consume(self, consumer: ConsumerId | None = None, prefetch: int = 10,
                priority: int = 0) -> tuple[Reply, list[Effect]]:
        return self.run(Checkout(consumer or cid(), prefetch, priority))

    def reconfigure(self, **kw: Any) -> QueueConfig:
        self.config = replace(self.config, **kw)
        return self.config


def delivered(effects: list[Effect], consumer: ConsumerId | None = None
              ) -> list[tuple[int, int, int, bool]]:
    """All (msg_id, message key, delivery_count, redelivered) delivered (to one consumer)."""
    out = []
    for e in effects:
        if isinstance(e, Deliver) and (consumer is None or e.consumer == consumer):
            out.extend(e.deliveries)
    return out


def delivered_indexes(effects: list[Effect], consumer: ConsumerId | None = None) -> list[int]:
    return [d[1] for d in delivered(effects, consumer)]


def of_type(effects: list[Effect], t: type) -> list[Any]:
    return [e for e in effects if isinstance(e, t)]
