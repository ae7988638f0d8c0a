"""Table tests for TTL, queue expiry, length limits and overflow, dead
lettering (at-most-once and at-least-once), priorities, single active
consumer and runtime configuration changes."""
from __future__ import annotations

from broker.queue import (
    ActiveConsumerChanged,
    Cancel,
    ChannelRef,
    Checkout,
    ConsumerDown,
    DeadLetter,
    DeadLetterDeliver,
    DeadLetterReason,
    DeleteQueue,
    Dequeue,
    Dequeued,
    DequeueEmpty,
    DequeueRefused,
    Discard,
    DlxCheckout,
    DlxSettle,
    Enqueue,
    EnqueueResult,
    RejectPublish,
    ReleaseCursor,
    ResumePublish,
    Return,
    SetTimer,
    Settle,
    Tick,
    UpdateConfig,
    key_index,
)
from broker.queue import restore as qm_restore
from broker.queue import snapshot as qm_snapshot

from .harness import Harness, cid, delivered, delivered_indexes, of_type

R = DeadLetterReason

# ------------------------------------------------------------------ TTL


def test_message_ttl_expires_at_the_head_and_dead_letters_expired() -> None:
    h = Harness(message_ttl_ms=100, dead_letter_exchange="dlx")
    idx = h.enqueue(2)
    assert of_type(h.effects, SetTimer)[0] == SetTimer(h.now + 101, 101)
    _, eff = h.run(Tick(), advance_ms=101)
    assert of_type(eff, DeadLetter) == [DeadLetter(R.EXPIRED, ((idx[0], 0), (idx[1], 0)),
                                                   "dlx", None)]
    assert h.state.messages_total() == 0 and h.state.extra == {}


def test_message_not_expired_before_its_ttl_is_delivered() -> None:
    h = Harness(message_ttl_ms=100)
    (i,) = h.enqueue(1)
    _, eff = h.consume(prefetch=1)
    assert delivered_indexes(eff) == [i]


def test_ttl_zero_message_is_delivered_to_a_waiting_consumer_else_expires() -> None:
    h = Harness(message_ttl_ms=0)
    h.consume(prefetch=1)
    (i,) = h.enqueue(1)
    assert delivered_indexes(h.effects) == [i]
    (j,) = h.enqueue(1)  # consumer is full
    h.run(Tick(), advance_ms=1)
    assert h.state.messages_ready() == 0 and h.state.dead_lettered_total == 1
    assert j not in delivered_indexes(h.effects)


def test_per_message_expiration_and_queue_ttl_take_the_lower() -> None:
    h = Harness(message_ttl_ms=1000, dead_letter_exchange="dlx")
    (a,) = h.enqueue(1, expiration_ms=50)
    (b,) = h.enqueue(1, expiration_ms=5000)
    h.run(Tick(), advance_ms=51)
    assert [m for e in of_type(h.effects, DeadLetter) for m in e.messages] == [(a, 0)]
    h.run(Tick(), advance_ms=1000)
    assert [m for e in of_type(h.effects, DeadLetter) for m in e.messages] == [(a, 0), (b, 0)]


def test_expired_messages_are_only_removed_at_the_head() -> None:
    h = Harness(dead_letter_exchange="dlx")
    (a,) = h.enqueue(1, expiration_ms=10_000)
    (b,) = h.enqueue(1, expiration_ms=10)
    h.run(Tick(), advance_ms=100)
    assert h.state.messages_ready() == 2  # b expired but is behind a live head
    r, _ = h.run(Dequeue(ChannelRef("g"), settled=True))
    assert isinstance(r, Dequeued) and r.key == a
    r, eff = h.run(Dequeue(ChannelRef("g"), settled=True))
    assert isinstance(r, DequeueEmpty)
    assert of_type(eff, DeadLetter)[0].messages == ((b, 0),)


def test_returned_message_keeps_its_expiry() -> None:
    h = Harness(message_ttl_ms=100, dead_letter_exchange="dlx")
    (i,) = h.enqueue(1)
    h.consume(prefetch=1)
    h.run(Cancel(cid()))
    h.run(Return(cid(), (0,)), advance_ms=200)
    h.run(Tick(), advance_ms=1)
    assert of_type(h.effects, DeadLetter) == [DeadLetter(R.EXPIRED, ((i, 1),), "dlx", None)]


def test_queue_expires_when_unused_and_not_while_consumed() -> None:
    h = Harness(expires_ms=1000)
    h.consume(prefetch=1)
    _, eff = h.run(Tick(), advance_ms=5000)
    assert of_type(eff, DeleteQueue) == []
    h.run(Cancel(cid()))
    _, eff = h.run(Tick(), advance_ms=999)
    assert of_type(eff, DeleteQueue) == []
    _, eff = h.run(Tick(), advance_ms=1)
    assert of_type(eff, DeleteQueue) == [DeleteQueue("expired")]
    _, eff = h.run(Tick(), advance_ms=1000)
    assert of_type(eff, DeleteQueue) == []  # reported once


def test_basic_get_renews_the_queue_ttl_but_publishing_does_not() -> None:
    h = Harness(expires_ms=1000)
    h.run(Dequeue(ChannelRef("g"), settled=True), advance_ms=800)
    h.enqueue(1)
    _, eff = h.run(Tick(), advance_ms=900)
    assert of_type(eff, DeleteQueue) == []
    _, eff = h.run(Tick(), advance_ms=100)
    assert of_type(eff, DeleteQueue) == [DeleteQueue("expired")]


# ------------------------------------------------------------ length limits


def test_max_length_drop_head_dead_letters_maxlen_from_the_head() -> None:
    h = Harness(max_length=2, dead_letter_exchange="dlx")
    idx = h.enqueue(4)
    assert [m for e in of_type(h.effects, DeadLetter) for m in e.messages] == \
        [(idx[0], 0), (idx[1], 0)]
    assert all(e.reason is R.MAXLEN for e in of_type(h.effects, DeadLetter))
    _, eff = h.consume(prefetch=10)
    assert delivered_indexes(eff) == idx[2:]


def test_max_length_bytes_drop_head() -> None:
    h = Harness(max_length_bytes=25)
    idx = h.enqueue(3, size=10)
    assert h.state.messages_ready() == 2 and h.state.ready_bytes == 20
    _, eff = h.consume()
    assert delivered_indexes(eff) == idx[1:]


def test_max_length_counts_only_ready_messages() -> None:
    h = Harness(max_length=1)
    h.consume(prefetch=3)
    h.enqueue(4)
    assert h.state.messages_checked_out() == 3 and h.state.messages_ready() == 1


def test_reject_publish_overshoots_by_one_then_rejects_and_resumes_below_80_percent() -> None:
    h = Harness(max_length=5, overflow="reject-publish")
    results = [h.run(Enqueue(ChannelRef("p"), s, 1))[0] for s in range(1, 9)]
    assert results == [EnqueueResult.ACCEPTED] * 6 + [EnqueueResult.REJECTED] * 2
    assert of_type(h.effects, RejectPublish) == [RejectPublish(ChannelRef("p"))]
    # a new publisher learns it is blocked on its first publish
    assert h.run(Enqueue(ChannelRef("p2"), 1, 1))[0] is EnqueueResult.REJECTED
    assert RejectPublish(ChannelRef("p2")) in h.effects
    h.effects.clear()
    g = ChannelRef("g")
    h.run(Dequeue(g, settled=True))  # 5 left: still > 4
    assert of_type(h.effects, ResumePublish) == []
    h.run(Dequeue(g, settled=True))  # 4 left == 80% of 5
    assert of_type(h.effects, ResumePublish) == [ResumePublish(ChannelRef("p")),
                                                  ResumePublish(ChannelRef("p2"))]
    assert h.run(Enqueue(ChannelRef("p"), 9, 1))[0] is EnqueueResult.ACCEPTED


def test_lowering_max_length_by_policy_drops_from_the_head_at_once() -> None:
    h = Harness(dead_letter_exchange="dlx")
    idx = h.enqueue(5)
    _, eff = h.run(UpdateConfig(h.reconfigure(max_length=2)))
    assert [m[0] for e in of_type(eff, DeadLetter) for m in e.messages] == idx[:3]
    assert h.state.config.max_length == 2


# ------------------------------------------------------------ dead lettering


def _alo(**kw: object) -> Harness:
    return Harness(dead_letter_exchange="dlx", dead_letter_strategy="at-least-once",
                   overflow="reject-publish", **kw)  # type: ignore[arg-type]


def test_at_least_once_keeps_dead_letters_until_the_worker_settles_them() -> None:
    h = _alo()
    idx = h.enqueue(3)
    h.consume(prefetch=3)
    _, eff = h.run(Discard(cid(), (0, 1, 2)))
    assert of_type(eff, DeadLetter) == []
    assert h.state.messages_dlx() == 3
    assert h.state.smallest_live_index() == key_index(idx[0])
    _, eff = h.run(DlxCheckout(prefetch=2))
    (dd,) = of_type(eff, DeadLetterDeliver)
    assert dd == DeadLetterDeliver(((0, idx[0], R.REJECTED, 0), (1, idx[1], R.REJECTED, 0)),
                                   "dlx", None)
    _, eff = h.run(DlxSettle((0,)))
    assert of_type(eff, DeadLetterDeliver)[0].messages == ((2, idx[2], R.REJECTED, 0),)
    h.run(DlxSettle((1, 2)))
    assert h.state.messages_total() == 0 and h.state.smallest_live_index() is None


def test_at_least_once_worker_prefetch_defaults_to_32_and_new_worker_gets_unsettled_again() -> None:
    h = _alo(message_ttl_ms=10)
    h.enqueue(40)
    h.run(Tick(), advance_ms=11)
    _, eff = h.run(DlxCheckout())
    assert len(of_type(eff, DeadLetterDeliver)[0].messages) == 32
    _, eff = h.run(DlxCheckout())  # leader changed: a new worker re-attaches
    msgs = of_type(eff, DeadLetterDeliver)[0].messages
    assert len(msgs) == 32 and all(m[2] is R.EXPIRED for m in msgs)


def test_at_least_once_dead_letters_count_against_the_length_limit() -> None:
    h = _alo(max_length=2)
    h.enqueue(2)
    h.consume(prefetch=2)
    h.run(Cancel(cid()))
    h.run(Discard(cid(), (0, 1)))
    assert h.state.messages_ready() == 0 and h.state.messages_dlx() == 2
    assert h.run(Enqueue(ChannelRef("pub2"), 1, 1))[0] is EnqueueResult.ACCEPTED
    assert h.run(Enqueue(ChannelRef("pub2"), 2, 1))[0] is EnqueueResult.REJECTED


def test_at_least_once_falls_back_to_at_most_once_with_drop_head() -> None:
    h = Harness(dead_letter_exchange="dlx", dead_letter_strategy="at-least-once")
    (i,) = h.enqueue(1)
    h.consume(prefetch=1)
    _, eff = h.run(Discard(cid(), (0,)))
    assert of_type(eff, DeadLetter) == [DeadLetter(R.REJECTED, ((i, 0),), "dlx", None)]
    assert h.state.messages_dlx() == 0


def test_switching_away_from_at_least_once_drops_unconfirmed_dead_letters() -> None:
    h = _alo()
    h.enqueue(2)
    h.consume(prefetch=2)
    h.run(Discard(cid(), (0, 1)))
    h.run(DlxCheckout(prefetch=1))
    h.run(UpdateConfig(h.reconfigure(overflow="drop-head")))
    assert h.state.messages_dlx() == 0 and h.state.dlx_bytes == 0


# ------------------------------------------------------------ priorities


def test_high_priority_favoured_two_to_one() -> None:
    h = Harness()
    lo = h.enqueue(4, priority=1)
    hi = h.enqueue(6, priority=9)
    _, eff = h.consume(prefetch=0)
    assert delivered_indexes(eff) == [hi[0], hi[1], lo[0], hi[2], hi[3], lo[1], hi[4], hi[5],
                                      lo[2], lo[3]]


def test_high_priority_message_published_before_a_normal_one_is_always_first() -> None:
    h = Harness()
    hi = h.enqueue(4, priority=5)
    lo = h.enqueue(2)
    _, eff = h.consume(prefetch=0)
    assert delivered_indexes(eff) == hi + lo


def test_priority_four_and_below_is_normal() -> None:
    h = Harness()
    a = h.enqueue(1, priority=4)
    b = h.enqueue(1, priority=0)
    c = h.enqueue(1)
    assert len(h.state.hi) == 0 and list(h.state.lo) == [x << 32 | 10 for x in a + b + c]


# ------------------------------------------------------------ single active consumer


def test_single_active_consumer_only_one_gets_messages_and_hands_over_on_cancel() -> None:
    h = Harness(single_active_consumer=True)
    a, b = cid("ch1", "a"), cid("ch2", "b")
    h.consume(a, prefetch=1)
    h.consume(b, prefetch=10)
    idx = h.enqueue(3)
    assert delivered_indexes(h.effects, a) == idx[:1]
    assert delivered_indexes(h.effects, b) == []
    h.effects.clear()
    h.run(Cancel(a))
    assert ActiveConsumerChanged(b, True) in h.effects
    assert delivered_indexes(h.effects, b) == idx[1:]


def test_single_active_consumer_hands_over_when_the_active_goes_down() -> None:
    h = Harness(single_active_consumer=True)
    a, b = cid("ch1", "a"), cid("ch2", "b")
    h.consume(a, prefetch=1)
    h.consume(b, prefetch=1)
    (i,) = h.enqueue(1)
    h.effects.clear()
    h.run(ConsumerDown(a))
    assert delivered(h.effects, b) == [(0, i, 1, True)]
    assert h.state.sac_active == b


def test_higher_priority_waiting_consumer_takes_over_once_active_has_no_unacked() -> None:
    h = Harness(single_active_consumer=True)
    a, b = cid("ch1", "a"), cid("ch2", "b")
    h.consume(a, prefetch=1, priority=0)
    idx = h.enqueue(2)
    h.consume(b, prefetch=5, priority=10)
    assert h.state.sac_active == a  # a still holds an unacked message
    assert delivered_indexes(h.effects, a) == idx[:1]
    h.effects.clear()
    h.run(Settle(a, (0,)))
    assert ActiveConsumerChanged(a, False) in h.effects
    assert ActiveConsumerChanged(b, True) in h.effects
    assert delivered_indexes(h.effects, a) == []
    assert delivered_indexes(h.effects, b) == idx[1:]


def test_higher_priority_consumer_takes_over_at_once_when_active_is_idle() -> None:
    h = Harness(single_active_consumer=True)
    a, b = cid("ch1", "a"), cid("ch2", "b")
    h.consume(a, prefetch=1, priority=0)
    h.consume(b, prefetch=1, priority=1)
    assert h.state.sac_active == b and h.state.sac_waiting == [a]


def test_basic_get_is_refused_with_single_active_consumer() -> None:
    h = Harness(single_active_consumer=True)
    h.enqueue(1)
    r, _ = h.run(Dequeue(ChannelRef("g"), settled=True))
    assert r == DequeueRefused(405, "RESOURCE_LOCKED - cannot obtain access to locked queue "
                                    "'q' in vhost '/'. basic.get operations are not supported "
                                    "by quorum queues with single active consumer")


def test_single_active_consumer_cannot_be_changed_by_policy() -> None:
    h = Harness(single_active_consumer=True)
    h.run(UpdateConfig(h.reconfigure(single_active_consumer=False)))
    assert h.state.config.single_active_consumer is True


def test_reconsume_with_new_prefetch_updates_the_consumer() -> None:
    h = Harness()
    h.enqueue(5)
    h.consume(prefetch=1)
    _, eff = h.run(Checkout(cid(), 3))
    assert len(delivered(eff)) == 2 and h.state.messages_checked_out() == 3


def test_release_cursor_counts_messages_dead_lettered_by_the_same_command() -> None:
    """Issue 10 defect 7: a Tick that expires messages into the at-least-once
    dead-letter list emits a ReleaseCursor; its smallest live index must
    include them, or a snapshot there would release their bodies."""
    h = _alo(message_ttl_ms=10)
    idx = h.enqueue(3)
    _, eff = h.run(Tick(), advance_ms=11)
    assert h.state.messages_dlx() == 3
    cursors = of_type(eff, ReleaseCursor)
    assert cursors, eff
    assert all(c.smallest_live_index == key_index(idx[0]) for c in cursors)


def test_a_rejected_publish_sent_again_is_rejected_again_not_a_duplicate() -> None:
    """Safety review of issue 10: a REJECTED number consumed the sequence, so a
    re-send of it (its reply lost with a connection) answered DUPLICATE and
    was confirmed although never enqueued."""
    h = Harness(max_length=1, overflow="reject-publish")
    p = ChannelRef("p")
    assert [h.run(Enqueue(p, s, 1))[0] for s in (1, 2, 3)] == [
        EnqueueResult.ACCEPTED, EnqueueResult.ACCEPTED, EnqueueResult.REJECTED]
    assert h.run(Enqueue(p, 3, 1))[0] is EnqueueResult.REJECTED
    assert h.run(Enqueue(p, 2, 1))[0] is EnqueueResult.DUPLICATE
    h.run(Dequeue(ChannelRef("g"), settled=True))
    h.run(Dequeue(ChannelRef("g"), settled=True))
    assert h.run(Enqueue(p, 4, 1))[0] is EnqueueResult.ACCEPTED
    assert h.run(Enqueue(p, 3, 1))[0] is EnqueueResult.REJECTED  # still remembered
    snap = qm_restore(qm_snapshot(h.state))
    assert snap.rejected == h.state.rejected
