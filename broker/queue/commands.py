"""Commands of the quorum-queue state machine (what Raft replicates).

Pipeline position: the runtime builds one of these per client action, Raft
commits it, and `broker.queue.machine.apply(meta, command, state)` applies it
on every replica. Commands never carry message bodies: the body of an enqueued
message *is* the log entry at `meta.index`, and the runtime reads it back from
its local log when the machine asks it to deliver that index.

Every command is a frozen, slotted dataclass so it can be logged, compared and
encoded (see `encode_command`/`decode_command`) without surprises.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from .config import QueueConfig
from .errors import QueueCommandError
from .types import ChannelRef, ConsumerId, MsgId


class CreditMode(StrEnum):
    """How a consumer's credit is managed.

    SIMPLE_PREFETCH: AMQP 0-9-1 ``basic.qos`` prefetch: credit is refilled by
    every settle/return/discard (prefetch 0 means unlimited).
    CREDITED: AMQP 1.0-style link credit, granted explicitly by `Credit`.
    """

    SIMPLE_PREFETCH = "simple_prefetch"
    CREDITED = "credited"


# One per message: its __init__ is written out (init=False) because the one
# dataclasses generates runs interpreted even in the compiled build (five
# times slower there than this one; see broker/compiled.py).
@dataclass(frozen=True, slots=True, init=False)
class Enqueue:
    """basic.publish routed to this queue.

    `publisher`/`seq`: the publishing channel and its publish sequence number;
    a `seq` not above the last one accepted from that publisher is a resend
    and is dropped (reply DUPLICATE). `publisher=None` means untracked (no
    de-duplication, no flow notifications).
    `size`: body size in bytes (counts toward x-max-length-bytes).
    `priority`: AMQP priority property (> 4 is high), `expiration_ms`: the
    AMQP ``expiration`` property already parsed to milliseconds.
    """

    publisher: ChannelRef | None
    seq: int
    size: int
    priority: int | None
    expiration_ms: int | None

    def __init__(self, publisher: ChannelRef | None, seq: int, size: int,
                 priority: int | None = None, expiration_ms: int | None = None) -> None:
        object.__setattr__(self, "publisher", publisher)
        object.__setattr__(self, "seq", seq)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "expiration_ms", expiration_ms)


@dataclass(frozen=True, slots=True)
class Checkout:
    """basic.consume: register (or update) a consumer.

    `prefetch`: for SIMPLE_PREFETCH the max unacknowledged deliveries (0 =
    unlimited); for CREDITED the initial credit. `priority`: ``x-priority``.
    """

    consumer: ConsumerId
    prefetch: int
    priority: int = 0
    mode: CreditMode = CreditMode.SIMPLE_PREFETCH


@dataclass(frozen=True, slots=True)
class Credit:
    """Grant credit to a CREDITED consumer (absolute, like AMQP 1.0 flow; the
    link delivery-count handshake is the channel's business). For a
    SIMPLE_PREFETCH consumer it sets a new prefetch.

    With `drain`, whatever credit is left after delivering what is ready is
    consumed (set to 0) and reported in the reply.
    """

    consumer: ConsumerId
    credit: int
    drain: bool = False


@dataclass(frozen=True, slots=True)
class Cancel:
    """basic.cancel: stop deliveries; unacked messages stay checked out and
    can still be settled or returned."""

    consumer: ConsumerId


@dataclass(frozen=True, slots=True)
class Dequeue:
    """basic.get. `settled=True` is no-ack (the message is removed at once);
    otherwise it is checked out to the channel's pseudo-consumer
    ``ConsumerId(channel, DEQUEUE_TAG)`` and settled like a delivery."""

    channel: ChannelRef
    settled: bool


@dataclass(frozen=True, slots=True)
class Settle:
    """basic.ack of the given msg ids of one consumer."""

    consumer: ConsumerId
    msg_ids: tuple[MsgId, ...]


@dataclass(frozen=True, slots=True)
class Return:
    """basic.nack/basic.reject with requeue=true: counts as a failed delivery."""

    consumer: ConsumerId
    msg_ids: tuple[MsgId, ...]


@dataclass(frozen=True, slots=True)
class Discard:
    """basic.nack/basic.reject with requeue=false: dead-letter ``rejected``."""

    consumer: ConsumerId
    msg_ids: tuple[MsgId, ...]


@dataclass(frozen=True, slots=True)
class Modify:
    """AMQP 1.0 ``modified`` outcome: return (counting a failed delivery only
    when `delivery_failed`) or, when `undeliverable_here`, discard. Message
    annotations are not supported (the state holds no message headers)."""

    consumer: ConsumerId
    msg_ids: tuple[MsgId, ...]
    delivery_failed: bool
    undeliverable_here: bool


@dataclass(frozen=True, slots=True)
class Purge:
    """queue.purge: drop every ready message (not the checked-out ones)."""


@dataclass(frozen=True, slots=True)
class ConsumerDown:
    """A consumer vanished without cancelling: its checked-out messages are
    returned (each counts as a failed delivery) and it is removed."""

    consumer: ConsumerId


@dataclass(frozen=True, slots=True)
class ChannelDown:
    """A channel (or its connection or node) went away: every consumer of it is
    treated as `ConsumerDown`, and it stops being a tracked publisher.

    `keep_publisher`: the channel is only suspected gone (its node has been
    unreachable for a while) and may still re-send publishes: its consumers'
    messages are returned but its de-duplication entry stays, so a re-sent
    publish is recognised as a duplicate instead of being enqueued twice."""

    channel: ChannelRef
    keep_publisher: bool = False
    #: Messages the channel actually delivered to its client, per consumer tag
    #: ((tag, (msg ids...)), ...): only their return counts as a failed
    #: delivery (towards the delivery limit). A message checked out to the
    #: channel but never delivered (its consume was applied after the channel
    #: had closed) returns uncounted. None: not known (the channel's node is
    #: gone), every return counts.
    delivered: tuple[tuple[str, tuple[int, ...]], ...] | None = None


@dataclass(frozen=True, slots=True)
class UpdateConfig:
    """A policy change: the new effective configuration. The queue's identity
    and x-single-active-consumer (declaration-only) are kept."""

    config: QueueConfig


@dataclass(frozen=True, slots=True)
class Tick:
    """Periodic/timer command: expires TTL'd messages at the head, checks
    x-expires and reports the release cursor. Time is `meta.timestamp_ms`."""


@dataclass(frozen=True, slots=True)
class DlxCheckout:
    """The leader's internal at-least-once dead-letter worker (re)attaches.
    Whatever the previous worker had checked out is handed out again."""

    prefetch: int = 32


@dataclass(frozen=True, slots=True)
class DlxSettle:
    """The dead-letter worker got confirms from every target for these ids."""

    msg_ids: tuple[int, ...]


Command = (
    Enqueue | Checkout | Credit | Cancel | Dequeue | Settle | Return | Discard | Modify |
    Purge | ConsumerDown | ChannelDown | UpdateConfig | Tick | DlxCheckout | DlxSettle
)

COMMAND_TYPES: tuple[type, ...] = (
    Enqueue, Checkout, Credit, Cancel, Dequeue, Settle, Return, Discard, Modify,
    Purge, ConsumerDown, ChannelDown, UpdateConfig, Tick, DlxCheckout, DlxSettle,
)
_BY_NAME: dict[str, type] = {t.__name__: t for t in COMMAND_TYPES}


def _plain(value: Any) -> Any:
    if isinstance(value, ConsumerId):
        return [value.channel, value.tag]
    if isinstance(value, QueueConfig):
        return value.to_dict()
    if isinstance(value, CreditMode):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


def encode_command(command: Command) -> dict[str, Any]:
    """A msgpack/JSON-friendly dict for the log entry payload."""
    out: dict[str, Any] = {"t": type(command).__name__}
    for f in fields(command):
        out[f.name] = _plain(getattr(command, f.name))
    return out


def decode_command(data: dict[str, Any]) -> Command:
    """Inverse of `encode_command`; raises QueueCommandError on bad input."""
    try:
        cls = _BY_NAME[data["t"]]
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            v = data[f.name]
            if f.name == "consumer":
                v = ConsumerId(ChannelRef(v[0]), v[1])
            elif f.name == "config":
                v = QueueConfig.from_dict(v)
            elif f.name == "mode":
                v = CreditMode(v)
            elif f.name == "msg_ids":
                v = tuple(v)
            elif f.name == "delivered" and v is not None:
                v = tuple((str(tag), tuple(int(i) for i in ids)) for tag, ids in v)
            kwargs[f.name] = v
        cmd: Command = cls(**kwargs)
        return cmd
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise QueueCommandError(f"undecodable queue command {data!r}: {exc}") from exc
