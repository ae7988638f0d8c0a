"""Effects and replies of the quorum-queue state machine.

Pipeline position: `apply` returns `(state, reply, effects)`; the runtime's
effect interpreter (only on the leader, except where noted) executes the
effects in list order. Effects are data and idempotent enough to re-run after
a leader change: deliveries are identified by (consumer, msg_id) and dead
letters by message key (raft index and position, `types.msg_key`).

What the runtime must do with each effect:

- `Deliver(consumer, deliveries)`: for every `(msg_id, key,
  delivery_count, redelivered)` read the body with that message key (its
  entry's raft index and position, `types.msg_key`) from the local
  log and send basic.deliver on the consumer's channel, with
  ``x-delivery-count`` = delivery_count when it is > 0 and the redelivered
  flag as given. (The consumer's node does it, from its own replica.)
- `DeadLetter(reason, messages, exchange, routing_key)`: at-most-once: read
  each body, add the x-death headers (`broker.queue.deadletter.x_death_headers`)
  and publish to `exchange` with `routing_key` (or the message's own routing
  keys when None). Nothing is confirmed back.
- `DeadLetterDeliver(messages, exchange, routing_key)`: at-least-once: the
  internal dead-letter worker publishes each message with publisher confirms
  and sends `DlxSettle(ids)` once *every* target confirmed; unconfirmed ones
  are retried by re-sending `DlxCheckout` (duplicates possible at targets).
- `RejectPublish(publisher)` / `ResumePublish(publisher)`: overflow
  reject-publish: the channel nacks publishes to this queue locally until
  resumed (messages already in flight may still be accepted: the documented
  overshoot).
- `SetTimer(at_ms, delay_ms)`: propose a `Tick` after `delay_ms`; a newer
  SetTimer replaces the pending one.
- `DeleteQueue(reason)`: delete the queue through the metadata store
  (x-expires elapsed; reason ``"expired"``).
- `ReleaseCursor(index, smallest_live_index)`: the state as of applied index
  `index` may be snapshotted; log entries below `smallest_live_index` hold
  no live message, so segments wholly below it can be deleted.
- `ActiveConsumerChanged(consumer, active)`: single active consumer status
  changed (management/metrics; AMQP 0-9-1 clients are not told).
- `ConsumerCancelled(consumer)`: the consumer stopped consuming (basic.cancel,
  consumer or channel down): update consumer metrics/events (RabbitMQ's
  consumer_deleted). Clients are not told (the channel already answered
  basic.cancel-ok, or is gone).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .types import ChannelRef, ConsumerId, MsgId


class DeadLetterReason(StrEnum):
    """The x-death ``reason`` values RabbitMQ writes."""

    REJECTED = "rejected"
    EXPIRED = "expired"
    MAXLEN = "maxlen"
    DELIVERY_LIMIT = "delivery_limit"


# (msg_id, message key, delivery_count, redelivered)
Delivery = tuple[MsgId, int, int, bool]


@dataclass(frozen=True, slots=True, init=False)
class Deliver:
    consumer: ConsumerId
    deliveries: tuple[Delivery, ...]

    # written out: the generated __init__ runs interpreted in the compiled
    # build (commands.Enqueue says more)
    def __init__(self, consumer: ConsumerId, deliveries: tuple[Delivery, ...]) -> None:
        object.__setattr__(self, "consumer", consumer)
        object.__setattr__(self, "deliveries", deliveries)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: DeadLetterReason
    # (message key, delivery_count)
    messages: tuple[tuple[int, int], ...]
    exchange: str
    routing_key: str | None


@dataclass(frozen=True, slots=True)
class DeadLetterDeliver:
    # (dlx_msg_id, message key, reason, delivery_count)
    messages: tuple[tuple[int, int, DeadLetterReason, int], ...]
    exchange: str
    routing_key: str | None


@dataclass(frozen=True, slots=True)
class RejectPublish:
    publisher: ChannelRef


@dataclass(frozen=True, slots=True)
class ResumePublish:
    publisher: ChannelRef


@dataclass(frozen=True, slots=True)
class SetTimer:
    at_ms: int
    delay_ms: int


@dataclass(frozen=True, slots=True)
class DeleteQueue:
    reason: str


@dataclass(frozen=True, slots=True)
class ReleaseCursor:
    index: int
    smallest_live_index: int


@dataclass(frozen=True, slots=True)
class ActiveConsumerChanged:
    consumer: ConsumerId
    active: bool


@dataclass(frozen=True, slots=True)
class ConsumerCancelled:
    consumer: ConsumerId


Effect = (
    Deliver | DeadLetter | DeadLetterDeliver | RejectPublish | ResumePublish | SetTimer |
    DeleteQueue | ReleaseCursor | ActiveConsumerChanged | ConsumerCancelled
)


# ----------------------------------------------------------------- replies


class EnqueueResult(StrEnum):
    """Reply to `Enqueue`. ACCEPTED and DUPLICATE are confirmed (basic.ack) to
    the publisher once the entry is committed; REJECTED is basic.nack'ed.

    Invariant that makes a DUPLICATE safe to confirm: a tracked publisher's
    sequence numbers are accepted strictly one after the other (1, 2, 3, ...),
    so a number at or below the last accepted one was itself accepted (or
    rejected) before. A number beyond the next expected one is refused with
    `OutOfOrder` and changes nothing: the sender re-sends from the gap."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class OutOfOrder:
    """Reply to an `Enqueue` whose sequence number is beyond the next one this
    publisher may use (`expected`): an earlier publish has not arrived (it
    was refused, lost or overtaken). Nothing was enqueued; re-send in order
    from `expected`."""

    expected: int


class Ok(StrEnum):
    OK = "ok"


OK = Ok.OK


@dataclass(frozen=True, slots=True)
class Dequeued:
    """basic.get-ok: read the body with message key `key`; settle `msg_id` with the
    channel's pseudo-consumer unless the get was settled (no-ack)."""

    msg_id: MsgId
    key: int
    delivery_count: int
    redelivered: bool
    messages_ready: int


@dataclass(frozen=True, slots=True)
class DequeueEmpty:
    """basic.get-empty."""


@dataclass(frozen=True, slots=True)
class DequeueRefused:
    """basic.get is not allowed (single active consumer queues)."""

    reply_code: int
    reply_text: str


@dataclass(frozen=True, slots=True)
class CheckoutOk:
    consumer: ConsumerId
    active: bool
    messages_ready: int


@dataclass(frozen=True, slots=True)
class CreditReply:
    consumer: ConsumerId
    credit: int
    available: int
    drained: int


@dataclass(frozen=True, slots=True)
class Purged:
    count: int


@dataclass(frozen=True, slots=True)
class NotFound:
    """The command named a consumer this queue does not know (ignored)."""


Reply = (
    EnqueueResult | OutOfOrder | Ok | Dequeued | DequeueEmpty | DequeueRefused | CheckoutOk |
    CreditReply | Purged | NotFound
)
