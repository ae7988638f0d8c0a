"""Snapshot/restore, command encoding and x-death headers."""
from __future__ import annotations

import msgpack
import pytest

from broker.queue import (
    COMMAND_TYPES,
    Cancel,
    ChannelDown,
    ChannelRef,
    Checkout,
    ConsumerDown,
    Credit,
    CreditMode,
    DeadLetterReason,
    Dequeue,
    Discard,
    DlxCheckout,
    DlxSettle,
    Enqueue,
    Modify,
    Purge,
    QueueCommandError,
    QueueConfig,
    Return,
    Settle,
    SnapshotError,
    Tick,
    UpdateConfig,
    decode_command,
    encode_command,
    restore,
    snapshot,
    to_plain,
    x_death_headers,
)

from .harness import Harness, cid


def _busy() -> Harness:
    h = Harness(message_ttl_ms=10_000, dead_letter_exchange="dlx", max_length=50,
                single_active_consumer=False)
    h.enqueue(10, priority=9)
    h.enqueue(10)
    h.consume(cid("a", "1"), prefetch=3)
    h.consume(cid("b", "2"), prefetch=2, priority=3)
    h.run(Return(cid("a", "1"), (0,)))
    h.run(Discard(cid("b", "2"), (0,)))
    h.run(Dequeue(ChannelRef("g"), settled=False))
    return h


def test_restore_of_snapshot_is_equal_and_behaves_identically() -> None:
    h = _busy()
    copy = Harness(h.config)
    copy.state = restore(snapshot(h.state))
    copy.index, copy.now, copy.seq = h.index, h.now, h.seq
    assert to_plain(copy.state) == to_plain(h.state)
    script = [Settle(cid("a", "1"), (1, 2)), Return(cid("b", "2"), (1,)), Tick(),
              Enqueue(ChannelRef("p"), 99, 3), Cancel(cid("a", "1")), Purge()]
    for cmd in script:
        r1, e1 = h.run(cmd, advance_ms=7)
        r2, e2 = copy.run(cmd, advance_ms=7)
        assert (r1, e1) == (r2, e2)
    assert to_plain(copy.state) == to_plain(h.state)


def test_corrupt_snapshot_is_refused() -> None:
    with pytest.raises(SnapshotError):
        restore(b"\x00garbage")
    with pytest.raises(SnapshotError):
        restore(msgpack.packb({"v": 999}))


def test_every_command_round_trips_through_encoding() -> None:
    c = cid()
    cmds = [Enqueue(ChannelRef("p"), 1, 2, 9, 100), Checkout(c, 5, 2, CreditMode.CREDITED),
            Credit(c, 3, True), Cancel(c), Dequeue(ChannelRef("g"), True), Settle(c, (1, 2)),
            Return(c, (3,)), Discard(c, (4,)), Modify(c, (5,), True, False), Purge(),
            ConsumerDown(c), ChannelDown(ChannelRef("x")), UpdateConfig(QueueConfig("q")),
            Tick(), DlxCheckout(32), DlxSettle((1,))]
    assert {type(x) for x in cmds} == set(COMMAND_TYPES)
    for cmd in cmds:
        wire = msgpack.unpackb(msgpack.packb(encode_command(cmd)))
        assert decode_command(wire) == cmd
    with pytest.raises(QueueCommandError):
        decode_command({"t": "Nope"})


def test_x_death_first_dead_lettering() -> None:
    hdr = x_death_headers({"a": 1}, queue="src", reason=DeadLetterReason.DELIVERY_LIMIT,
                          exchange="", routing_keys=["src"], time_ms=1_700_000_000_123,
                          expiration="100000")
    assert hdr == {
        "a": 1,
        "x-death": [{"count": 1, "reason": "delivery_limit", "queue": "src",
                     "time": 1_700_000_000, "exchange": "", "routing-keys": ["src"],
                     "original-expiration": "100000"}],
        "x-first-death-queue": "src", "x-first-death-reason": "delivery_limit",
        "x-first-death-exchange": "",
        "x-last-death-queue": "src", "x-last-death-reason": "delivery_limit",
        "x-last-death-exchange": "",
    }


def test_x_death_same_queue_and_reason_increments_and_moves_to_front() -> None:
    h1 = x_death_headers(None, queue="a", reason=DeadLetterReason.REJECTED, exchange="e",
                         routing_keys=["k"], time_ms=1000)
    h2 = x_death_headers(h1, queue="b", reason=DeadLetterReason.EXPIRED, exchange="dlx",
                         routing_keys=["k"], time_ms=2000)
    h3 = x_death_headers(h2, queue="a", reason=DeadLetterReason.REJECTED, exchange="e",
                         routing_keys=["k"], time_ms=3000)
    assert [(d["queue"], d["reason"], d["count"], d["time"]) for d in h3["x-death"]] == \
        [("a", "rejected", 2, 3), ("b", "expired", 1, 2)]
    assert h3["x-first-death-queue"] == "a" and h3["x-last-death-queue"] == "a"
    assert h2["x-last-death-reason"] == "expired" and h2["x-first-death-reason"] == "rejected"
    assert h1["x-death"][0]["count"] == 1  # inputs are not mutated


def test_snapshot_of_messages_with_a_real_wall_clock_expiry() -> None:
    """A record with an expiry holds the expiry (ms since 1970) above bit 96:
    the snapshot split it in two 64-bit halves and the upper half overflowed
    msgpack, so a queue with a TTL could never be snapshotted (found by the
    chaos suite: the group stopped at its first snapshot)."""
    from broker.queue import (
        Enqueue,
        Meta,
        apply,
        new_state,
        parse_queue_arguments,
        restore,
        snapshot,
    )
    from broker.queue.types import ChannelRef

    st = new_state(parse_queue_arguments({"x-message-ttl": 8000}, "q", "/"))
    now = 1_795_470_000_000  # November 2026
    for i in range(1, 4):
        st, _, _ = apply(Meta(10**9 + i, 3, now), Enqueue(ChannelRef("p"), i, 5), st)
    again = restore(snapshot(st))
    assert list(again.lo) == list(st.lo) and again.smallest_live_index() == 10**9 + 1
