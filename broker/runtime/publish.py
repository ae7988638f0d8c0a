"""The publish -> forward -> confirm path of one channel and one queue.

Where it sits: an AMQP channel in confirm mode owns one `PublisherSession`
per target queue (keyed by the queue's identity: vhost, name and the
incarnation of its declaration, never by a Python object, so a queue process
replaced by a membership change keeps its numbering). The session numbers
the channel's publishes to that queue 1, 2, 3, ..., hands each enqueue to
`submit` (the node routes it: a local leader proposes it, anything else
forwards it to the leader) and reports one outcome per publish, which the
channel turns into basic.ack/basic.nack in publish order.

The invariant this module exists for (issue 10): **a publisher confirm means
the message was enqueued**. The queue machine accepts a publisher's numbers
strictly one after the other and refuses a gap (`OutOfOrder`), so a number
at or below the last accepted one (`DUPLICATE`) was enqueued before; the
session therefore confirms ACCEPTED and DUPLICATE, and for every outcome that
does not say what happened to the entry (a refusal by a node that is not the
leader, an entry replaced by a new leader, a lost connection, a gap) it
re-sends every unresolved publish **in order** from the oldest, which the
machine's de-duplication makes safe. Only two outcomes are final failures:
REJECTED (overflow reject-publish: the number is consumed) and the queue
being gone (`QueueGone`). A channel therefore never nacks because of leader
churn; it waits (bounded by the client's own timeout) and confirms once the
message is committed.

Everything here is plain callbacks on the event loop; `submit` and the
timer function are injected, so unit tests drive it with their own futures
(tests/runtime/test_publish.py).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import broker.runtime.wire as wire
from broker.queue.effects import EnqueueResult, OutOfOrder

from .backoff import Backoff
from .errors import QueueGone

log = logging.getLogger("broker.publish")

#: Backoff between re-sends that made no progress (seconds): the first re-send
#: is immediate, then 10 ms, doubling up to this.
MAX_BACKOFF_S = 1.0

Done = Callable[[bool], None]
"""Outcome of one publish: True = enqueued (confirm), False = not (nack)."""


class PublisherSession:
    """One confirm-mode channel publishing to one queue (see module docstring).

    Invariants:
    - `next_seq - 1` numbers were handed out, each exactly once, and every
      number below the smallest pending one has a final outcome;
    - `pending` holds the unresolved publishes in number order; an entry
      leaves it only with a final outcome (ACCEPTED/DUPLICATE -> True,
      REJECTED or QueueGone -> False) or when the session closes;
    - while a re-send is scheduled, new publishes are not sent ahead of it
      (they would only be refused as out of order).
    """

    __slots__ = ("publisher", "_submit", "_later", "name", "next_seq", "pending", "gen",
                 "_resync_scheduled", "_backoff", "closed", "epoch", "_base")

    def __init__(self, publisher: str, submit: Callable[[list[Any]], asyncio.Future[object]],
                 later: Callable[[float, Callable[[], None]], object], name: str = "") -> None:
        self._base = publisher
        self.publisher = publisher
        self._submit = submit
        self._later = later  # later(delay_s, fn): the event loop's call_later
        self.name = name
        self.next_seq = 1
        self.pending: dict[int, tuple[list[Any], Done]] = {}
        self.gen = 0  # bumped by every re-send round; older non-final outcomes are stale
        self._resync_scheduled = False
        self._backoff = Backoff(0.01, MAX_BACKOFF_S, immediate=True)
        self.closed = False
        self.epoch = 0

    # ------------------------------------------------------------ publishing
    def publish(self, size: int, priority: int | None, expiration_ms: int | None,
                props_raw: bytes, body: bytes, exchange: str, routing_key: str,
                done: Done) -> None:
        seq = self.next_seq
        self.next_seq = seq + 1
        payload = wire.enqueue_payload(self.publisher, seq, props_raw, body, exchange, routing_key,
                                       priority, expiration_ms, size)
        self.pending[seq] = (payload, done)
        if not self._resync_scheduled:
            self._send(seq, payload)

    def pending_sizes(self) -> list[int]:
        """The body sizes of the unresolved publishes."""
        return [wire.enqueue_size(payload) for payload, _done in self.pending.values()]

    def close(self) -> None:
        """The channel is gone: nothing more is sent or reported."""
        self.closed = True
        self.pending.clear()

    # ------------------------------------------------------------ internals
    def _send(self, seq: int, payload: list[Any]) -> bool:
        gen = self.gen
        try:
            fut = self._submit(payload)
        except QueueGone as gone:
            self._fail_all(gone)
            return False
        except Exception as exc:  # noqa: BLE001 - not leader now, group stopping: re-send later
            log.debug("%s: publish %d not submitted: %s", self.name, seq, exc)
            self._retry(gen)
            return False
        epoch = self.epoch
        fut.add_done_callback(lambda f: self._outcome(seq, gen, epoch, f))
        return True

    def _outcome(self, seq: int, gen: int, epoch: int, fut: asyncio.Future[object]) -> None:
        if self.closed or epoch != self.epoch:
            return  # numbers of an earlier identity mean nothing now
        if fut.cancelled():
            self._retry(gen)
            return
        exc = fut.exception()
        if exc is not None:
            if isinstance(exc, QueueGone):
                self._fail_all(exc)
            else:
                # Not applied, or not known to be (replaced, refused, lost):
                # re-sending in order is safe (de-duplication).
                log.debug("%s: publish %d to be re-sent: %s", self.name, seq, exc)
                self._retry(gen)
            return
        r = fut.result()
        # A final result is the truth whichever attempt it answers.
        if r is EnqueueResult.ACCEPTED or r is EnqueueResult.DUPLICATE:
            self._resolve(seq, True)
        elif r is EnqueueResult.REJECTED:
            self._resolve(seq, False)
        elif isinstance(r, OutOfOrder):
            first = next(iter(self.pending), None)
            if first is not None and r.expected < first:
                # Numbers below `first` all had final outcomes here, yet the
                # machine never saw `expected`: only a failure this session
                # reported as final can leave such a hole. Continue under a
                # new publisher identity (numbering from 1) rather than stall;
                # everything in flight belongs to the old identity now, so
                # the re-send is due whatever round this reply answers.
                self._new_epoch(r.expected, first)
                self._retry(self.gen)
                return
            self._retry(gen)
        else:  # pragma: no cover - the machine has no other enqueue reply
            log.error("%s: unexpected enqueue reply %r for %d", self.name, r, seq)
            self._resolve(seq, False)

    def _resolve(self, seq: int, ok: bool) -> None:
        entry = self.pending.pop(seq, None)
        if entry is not None:
            self._backoff.reset()  # progress
            entry[1](ok)

    def _fail_all(self, exc: BaseException) -> None:
        log.debug("%s: queue gone, %d publishes fail: %s", self.name, len(self.pending), exc)
        pending, self.pending = self.pending, {}
        for _payload, done in pending.values():
            done(False)

    def _retry(self, gen: int) -> None:
        """Schedule one in-order re-send of everything pending (coalesced)."""
        if self.closed or gen != self.gen or self._resync_scheduled or not self.pending:
            return
        self._resync_scheduled = True
        self._later(self._backoff.next(), self._resync)

    def _resync(self) -> None:
        self._resync_scheduled = False
        if self.closed:
            return
        self.gen += 1
        for seq, (payload, _done) in list(self.pending.items()):
            if seq in self.pending and not self._send(seq, payload):
                break  # a re-send is scheduled again (or everything failed)

    def _new_epoch(self, expected: int, first: int) -> None:
        log.error("%s: publisher %s: the queue expects number %d but the oldest unresolved "
                  "publish is %d; renumbering under a new publisher identity",
                  self.name, self.publisher, expected, first)
        self.epoch += 1
        self.publisher = f"{self._base}~{self.epoch}"
        renumbered: dict[int, tuple[list[Any], Done]] = {}
        for n, (payload, done) in enumerate(self.pending.values(), start=1):
            renumbered[n] = (wire.renumbered(payload, self.publisher, n), done)
        self.pending = renumbered
        self.next_seq = len(renumbered) + 1


__all__ = ["Done", "MAX_BACKOFF_S", "PublisherSession"]
