"""Dead lettering: building dead-lettered messages, and the at-least-once worker.

Where it sits: a queue's machine decides *that* messages die (expired,
rejected, over the delivery limit or the length limit) and emits effects;
this module turns them into publishes to the dead-letter exchange's queues.

- At-most-once (the default strategy): `Node.dead_letter` republishes once,
  without confirms (`dead_letter_message` builds each message).
- At-least-once (`dead-letter-strategy=at-least-once`, only with
  `overflow=reject-publish`, as in RabbitMQ 4.x): the dead letters stay in the
  source queue (counted against its limits and its smallest live index) until
  every target queue confirmed them. `DlxWorker` is the internal dead-letter
  consumer: it runs on the source queue's leader, attaches with
  `DlxCheckout(prefetch=32)` (the machine then hands it up to 32 dead
  letters), publishes each one to every routed target through a
  `PublisherSession` (confirmed, re-sent in order on any doubtful outcome),
  and proposes `DlxSettle` once all targets confirmed. A message with no
  route yet (target queue missing), or refused by a target (REJECTED), is
  tried again after `RETRY_S`. Leadership moving means a new worker on the
  new leader: its `DlxCheckout` hands out again whatever the old one held, so
  a dead letter may reach a target twice, never zero times.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import broker.amqp.codec as acodec
import broker.metadata as md
import broker.queue as qm
import broker.queue.effects as qe

from .publish import PublisherSession

if TYPE_CHECKING:
    from .queues import Message, QueueUid

log = logging.getLogger("broker.dead_letter")

#: Re-route / re-publish a dead letter that had no route or was refused after this.
RETRY_S = 2.0
DLX_PREFETCH = 32
_WORKER_IDS = itertools.count(1)


def dead_letter_message(msg: Message, death: dict[str, Any], routing_key: str | None
                        ) -> tuple[bytes, bytes, str, dict[str, Any], int | None]:
    """(properties, body, routing key, headers, priority) of a dead-lettered copy
    of `msg`: x-death headers as RabbitMQ writes them, expiration moved into
    x-death, routing key replaced when the queue sets one."""
    props_raw, body, orig_exchange, orig_rk = msg
    rk = routing_key if routing_key is not None else orig_rk
    props = acodec.decode_properties(props_raw)
    headers = dict(props.headers or {})
    headers = qm.x_death_headers(
        headers, queue=death["queue"], reason=qm.DeadLetterReason(death["reason"]),
        exchange=orig_exchange, routing_keys=[orig_rk], time_ms=int(time.time() * 1000),
        expiration=props.expiration)
    props.headers = headers
    props.expiration = None  # RabbitMQ moves it to x-death's original-expiration
    return acodec.encode_properties(props), body, rk, headers, props.priority


def dl_cycle(queue: str, deaths: object) -> bool:
    """rabbit_dead_letter's cycle check: dead lettering into `queue` cycles if
    the message already died there (x-death, newest first, including this
    death) and no death since then was a rejection (a client's decision)."""
    def text(v: object) -> object:
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else v

    since: list[dict[Any, Any]] = []  # x-death tables: AMQP field tables
    for d in deaths if isinstance(deaths, list) else []:
        if isinstance(d, dict) and text(d.get("queue")) == queue:
            return all(text(x.get("reason")) != "rejected" for x in [*since, d])
        since.append(d if isinstance(d, dict) else {})
    return False


class _Metadata(Protocol):
    @property
    def state(self) -> md.MetadataState: ...


class _Target(Protocol):
    """A queue a dead letter is routed to."""

    @property
    def uid(self) -> QueueUid: ...
    @property
    def name(self) -> str: ...
    @property
    def deleted(self) -> bool: ...


class _Source(Protocol):
    """The source queue: its identity and the bodies of its messages."""

    @property
    def uid(self) -> QueueUid: ...
    @property
    def name(self) -> str: ...
    @property
    def vhost(self) -> str: ...
    def message(self, index: int) -> Message: ...


class DlxHost(Protocol):
    """What the worker needs from its node (a structural type, see Node)."""

    @property
    def meta(self) -> _Metadata: ...
    @property
    def incarnation(self) -> str: ...
    def queue(self, vhost: str, name: str) -> _Target | None: ...
    # payload: a queue payload (runtime/wire.py); the future's result, the enqueue reply
    def submit_enqueue(self, uid: QueueUid, payload: list[Any]) -> asyncio.Future[Any]: ...
    def call_later(self, delay: float, fn: Callable[[], None]) -> object: ...


class _Letter:
    __slots__ = ("msg_id", "index", "reason", "count", "waiting", "failed", "settling")

    def __init__(self, msg_id: int, index: int, reason: qe.DeadLetterReason, count: int) -> None:
        self.msg_id = msg_id
        self.index = index
        self.reason = reason
        self.count = count
        self.waiting = 0  # targets not confirmed yet
        self.failed = False  # some target refused it, or it had no route
        self.settling = False


class DlxWorker:
    """The at-least-once dead-letter consumer of one source queue, on its
    leader (see module docstring). One worker per leadership term: `stop()`
    when leadership or the strategy goes."""

    def __init__(self, host: DlxHost, source: _Source,
                 propose: Callable[[qm.Command], asyncio.Future[Any]]) -> None:
        self.host = host
        self.source = source  # the QuorumQueue (reads bodies, vhost, name, uid)
        self._propose = propose
        self.letters: dict[int, _Letter] = {}
        self.sessions: dict[QueueUid, PublisherSession] = {}
        self.stopped = False
        # One identity per worker, never reused: a new worker (leadership came
        # back, strategy switched) numbering from 1 under an old identity
        # would have its dead letters answered DUPLICATE and settled unsent.
        self.publisher = (f"{host.incarnation}/dlx/{source.uid[0]}/{source.uid[1]}/"
                          f"{source.uid[2]}/{next(_WORKER_IDS)}")

    def attach(self) -> None:
        self._command(qm.DlxCheckout(DLX_PREFETCH))

    def stop(self) -> None:
        self.stopped = True
        for s in self.sessions.values():
            s.close()
        self.sessions.clear()
        self.letters.clear()

    # ------------------------------------------------------------ effects
    def deliver(self, eff: qe.DeadLetterDeliver) -> None:
        """The machine handed this worker dead letters (DeadLetterDeliver)."""
        for msg_id, index, reason, count in eff.messages:
            letter = _Letter(msg_id, index, reason, count)
            self.letters[msg_id] = letter
            self._publish(letter, eff.exchange, eff.routing_key)

    def _publish(self, letter: _Letter, exchange: str, routing_key: str | None) -> None:
        if self.stopped or letter.msg_id not in self.letters:
            return
        src = self.source
        try:
            msg = src.message(letter.index)
        except Exception as exc:  # noqa: BLE001 - the body is gone: nothing to deliver
            log.error("%s: dead letter %d unreadable (%s): settled without delivery",
                      src.name, letter.index, exc)
            self._settle(letter)
            return
        death = {"reason": letter.reason.value, "queue": src.name, "count": letter.count}
        props, body, rk, headers, priority = dead_letter_message(msg, death, routing_key)
        routed = md.route(self.host.meta.state, md.VhostName(src.vhost), exchange, rk, headers)
        targets: list[_Target] = []
        if not isinstance(routed, md.MetadataError):
            for name in routed:
                if letter.reason is not qe.DeadLetterReason.REJECTED and dl_cycle(name, headers.get("x-death")):
                    continue
                q = self.host.queue(src.vhost, name)
                if q is not None and not q.deleted:
                    targets.append(q)
        if not targets:
            # No route (yet): keep it, try again later (at-least-once never drops).
            self.host.call_later(RETRY_S, lambda: self._publish(letter, exchange, routing_key))
            return
        letter.waiting = len(targets)
        letter.failed = False
        for q in targets:
            uid = q.uid
            session = self.sessions.get(uid)
            if session is None:
                session = self.sessions[uid] = PublisherSession(
                    self.publisher, functools.partial(self.host.submit_enqueue, uid),
                    self.host.call_later, f"{src.name}-dlx->{q.name}")
            session.publish(len(body), priority, None, props, body, exchange, rk,
                            functools.partial(self._confirmed, letter, exchange=exchange,
                                              routing_key=routing_key))

    def _confirmed(self, letter: _Letter, ok: bool, exchange: str, routing_key: str | None) -> None:
        if self.stopped:
            return
        letter.waiting -= 1
        letter.failed = letter.failed or not ok
        if letter.waiting > 0:
            return
        if letter.failed:
            # A target refused it (full) or vanished: publish again later;
            # targets that took it may get it twice (allowed), none loses it.
            self.host.call_later(RETRY_S, lambda: self._publish(letter, exchange, routing_key))
            return
        self._settle(letter)

    def _settle(self, letter: _Letter) -> None:
        if letter.settling:
            return
        letter.settling = True
        self.letters.pop(letter.msg_id, None)
        self._command(qm.DlxSettle((letter.msg_id,)))

    def _command(self, cmd: qm.Command) -> None:
        if self.stopped:
            return
        try:
            fut = self._propose(cmd)
        except Exception as exc:  # noqa: BLE001 - not leader any more: the next worker redoes it
            log.debug("%s: dead-letter worker command not proposed: %s", self.source.name, exc)
            return
        fut.add_done_callback(_retrieve)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


__all__ = ["DLX_PREFETCH", "DlxWorker", "RETRY_S", "dead_letter_message", "dl_cycle"]
