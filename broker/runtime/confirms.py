"""Publisher confirms and consumer acknowledgements: a channel's bookkeeping
rules as pure functions (no asyncio, no sockets, no clocks).

Where it sits: `runtime/channel.py` keeps the state (its `outstanding` deque
of `Confirm`s, its `unacked` delivery tags) and calls these functions; they
take that state and return what to send or settle, as data. Tested as
transcripts in tests/runtime/test_confirms.py.

- Confirm sequencing (`settled_confirms`): a confirm-mode publish gets the
  channel's next sequence number and one `Confirm`, settled once every target
  queue has reported. Confirms go out in sequence order: the settled head of
  the deque is popped, consecutive acks fold into one basic.ack with
  `multiple`, and a nack (any target refused the message) is sent on its own
  after the acks before it, so an ack's `multiple` only ever covers seqs the
  client still has unconfirmed and that were all accepted.
- Delivery tags (`take_acked`): basic.ack/nack/reject name one tag or, with
  `multiple`, every tag up to it (0: all of them); an unknown tag is
  PRECONDITION_FAILED "unknown delivery tag N" (`unknown_tag_text`).
- Nack grouping (`group_by_consumer`): returned or discarded deliveries go to
  their queue as one command per (queue, consumer), ids in delivery order.
- Acknowledgement timeouts (`first_timed_out`, `ack_timeout_text`).

Imports: only `broker.queue.types` (pure) and the standard library.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVar

from broker.queue.types import ConsumerId, MsgId

#: The kinds of a confirm frame: basic.ack or basic.nack.
ACK = "ack"
NACK = "nack"

#: (ACK or NACK, delivery tag (the publish sequence number), multiple)
ConfirmFrame = tuple[str, int, bool]

T = TypeVar("T")


class Confirm:
    """One confirm-mode publish: its sequence number, how many target queues
    have not reported yet, and whether any of them refused it."""

    __slots__ = ("seq", "remaining", "nack")

    def __init__(self, seq: int, remaining: int) -> None:
        self.seq = seq
        self.remaining = remaining
        self.nack = False

    def __repr__(self) -> str:
        return f"Confirm({self.seq}, remaining={self.remaining}, nack={self.nack})"


def settled_confirms(outstanding: deque[Confirm]) -> tuple[list[ConfirmFrame], int]:
    """Pop the settled head of `outstanding` (oldest first, up to the first
    publish still waiting for a queue) and return the frames to send, in order,
    and how many publishes they ack.

    Acks fold: the last of a run of acks goes out with `multiple`; a nack
    first flushes the run before it, then goes alone (`multiple` false)."""
    frames: list[ConfirmFrame] = []
    acked = 0
    ack_upto = 0
    while outstanding and outstanding[0].remaining == 0:
        c = outstanding.popleft()
        if c.nack:
            if ack_upto:
                frames.append((ACK, ack_upto, ack_upto > 1))
                ack_upto = 0
            frames.append((NACK, c.seq, False))
        else:
            ack_upto = c.seq
            acked += 1
    if ack_upto:
        frames.append((ACK, ack_upto, True))
    return frames, acked


def unconfirmed(outstanding: Iterable[Confirm]) -> int:
    """Publishes still waiting for a target queue (the management API's
    `messages_unconfirmed`)."""
    return sum(1 for c in outstanding if c.remaining)


def take_acked(unacked: dict[int, T], tag: int, multiple: bool) -> list[T] | None:
    """Remove and return the deliveries a basic.ack/nack/reject of `tag`
    settles, oldest first; None when the tag is unknown (nothing is removed).

    `unacked` is in delivery-tag order (tags grow as deliveries are made).
    `multiple` with tag 0 takes everything (even nothing); `multiple` with a
    tag that is not outstanding is unknown, even when lower tags are
    (RabbitMQ's `collect_acks` looks for the tag itself: 406, nothing
    settled)."""
    if multiple:
        taken: list[T] = []
        if tag == 0:
            taken = list(unacked.values())
            unacked.clear()
            return taken
        if tag not in unacked:
            return None
        while unacked:
            first = next(iter(unacked))
            if first > tag:
                break
            taken.append(unacked.pop(first))
        return taken
    item = unacked.pop(tag, None)
    if item is None:
        return None
    return [item]


def claim_acked(unacked: Mapping[int, object], claimed: set[int], tag: int,
                multiple: bool) -> list[int] | None:
    """In a transaction: the delivery tags a basic.ack/nack/reject of `tag`
    will settle at tx.commit, checked now, at the method, as RabbitMQ checks
    them: a bad tag closes the channel before any of the transaction is
    applied. Tags this transaction already claimed (`claimed`, updated) are
    no longer outstanding. None when `tag` is unknown (nothing claimed)."""
    if multiple and tag == 0:
        tags = [t for t in unacked if t not in claimed]
    elif tag not in unacked or tag in claimed:
        return None
    elif multiple:
        tags = [t for t in unacked if t <= tag and t not in claimed]
    else:
        tags = [tag]
    claimed.update(tags)
    return tags


def take_tags(unacked: dict[int, T], tags: Iterable[int]) -> list[T]:
    """Remove and return the deliveries of `tags` still outstanding (a
    committed transaction's claimed tags), in the order given."""
    taken = []
    for t in tags:
        item = unacked.pop(t, None)
        if item is not None:
            taken.append(item)
    return taken


def unknown_tag_text(tag: int) -> str:
    """The channel's close text for an unknown delivery tag (code 406; the
    codec adds the PRECONDITION_FAILED prefix)."""
    return f"unknown delivery tag {tag}"


class _Queue(Protocol):
    @property
    def uid(self) -> tuple[str, str, int]: ...  # the queue's QueueUid


def group_by_consumer(
        entries: Iterable[tuple[_Queue, ConsumerId, MsgId, Any, Any]],
) -> dict[tuple[tuple[str, str, int], ConsumerId], list[MsgId]]:
    """Unacked entries (queue, consumer, msg id, ...) grouped into one list of
    msg ids per (queue uid, consumer), groups and ids in the entries' order."""
    groups: dict[tuple[tuple[str, str, int], ConsumerId], list[MsgId]] = {}
    for q, cid, msg_id, _, _ in entries:
        key = (q.uid, cid)
        ids = groups.get(key)
        if ids is None:
            groups[key] = [msg_id]
        else:
            ids.append(msg_id)
    return groups


def first_timed_out(unacked: Mapping[int, tuple[Any, Any, Any, float, int]], now: float,
                    in_order: bool) -> tuple[int, int] | None:
    """(delivery tag, timeout ms) of the oldest delivery whose acknowledgement
    deadline (entry[3], a monotonic time) has passed at `now`, else None.

    `in_order`: every delivery has the same timeout, so deadlines grow with
    the tags and only the first entry needs a look (RabbitMQ likewise peeks
    at the head of its unacked queue)."""
    for tag, entry in unacked.items():
        if entry[3] <= now:
            return tag, entry[4]
        if in_order:
            return None
    return None


def ack_timeout_text(channel: int, timeout_ms: int) -> str:
    """RabbitMQ's close text (rabbit_channel evaluate_consumer_timeout; the
    codec adds the PRECONDITION_FAILED prefix)."""
    return (f"delivery acknowledgement on channel {channel} timed out. Timeout value used: "
            f"{timeout_ms} ms. This timeout value can be configured, see consumers doc guide to "
            f"learn more")


__all__ = ["ACK", "NACK", "Confirm", "ConfirmFrame", "ack_timeout_text", "first_timed_out",
           "group_by_consumer", "settled_confirms", "take_acked", "unconfirmed", "unknown_tag_text"]
