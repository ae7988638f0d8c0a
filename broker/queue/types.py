"""Identifiers and log metadata shared by the queue state machine's commands,
effects and state.

Pipeline position: `broker.runtime` turns AMQP traffic into commands
(`broker.queue.commands`), Raft commits them, and every replica applies them
with the `Meta` of the log entry that carried them; nothing here does I/O.
"""
from __future__ import annotations

from typing import NamedTuple, NewType

ChannelRef = NewType("ChannelRef", str)
"""Opaque, cluster-unique name of an AMQP channel (e.g. ``"node1/conn7/ch1"``).
Publishers are channels; a consumer belongs to exactly one channel."""

MsgId = NewType("MsgId", int)
"""Per-consumer delivery id, assigned by the machine from 0 upwards. The
channel maps it to its own delivery tag."""

RaftIndex = NewType("RaftIndex", int)

#: A message's key names the log entry that holds it and its place in that
#: entry: ``raft_index << KEY_POS_BITS | position``. One entry may carry a
#: batch of up to `BATCH_MAX` enqueues (runtime/queues.py); an entry of one
#: enqueue is position 0. Keys increase with enqueue order, like the indexes
#: they replace.
KEY_POS_BITS = 5
BATCH_MAX = 1 << KEY_POS_BITS
_POS_MASK = BATCH_MAX - 1


def msg_key(raft_index: int, pos: int = 0) -> int:
    """The key of the message at `pos` in the entry at `raft_index`."""
    return (raft_index << KEY_POS_BITS) | pos


def key_index(key: int) -> int:
    """The raft index of the entry that holds the message with `key`."""
    return key >> KEY_POS_BITS


def key_pos(key: int) -> int:
    """The position of the message with `key` within its entry."""
    return key & _POS_MASK

DEQUEUE_TAG = ""
"""Consumer tag of a channel's basic.get pseudo-consumer: AMQP clients never
get an empty consumer tag (the server names unnamed consumers), so it cannot
clash with a real consumer."""


class ConsumerId(NamedTuple):
    """A consumer is (channel, consumer tag); unique within one queue.

    A NamedTuple rather than a dataclass: it is hashed several times per
    delivery, and tuple hashing is done in C."""

    channel: ChannelRef
    tag: str


class Meta(NamedTuple):
    """Metadata of the committed log entry a command was carried in.

    `timestamp_ms` is the leader's wall clock when it appended the entry: it is
    the machine's only notion of time, so every replica computes the same
    expiries. Invariant: `index` strictly increases across applied commands.
    (A NamedTuple: one is built per applied entry, on the hot path.)
    """

    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose
    term: int
    timestamp_ms: int
    #: the command's position within a batch entry (0 for an entry of one)
    pos: int = 0
