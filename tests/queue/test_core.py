"""Table tests for the core rules: enqueue/checkout/settle/return/discard/
dequeue, delivery limit, round robin, consumer priority, release cursor."""
from __future__ import annotations

import pytest

from broker.queue import (
    OK,
    Cancel,
    ChannelDown,
    ChannelRef,
    Checkout,
    ConsumerDown,
    ConsumerId,
    Credit,
    CreditMode,
    CreditReply,
    DeadLetter,
    DeadLetterReason,
    Dequeue,
    Dequeued,
    DequeueEmpty,
    Discard,
    Enqueue,
    EnqueueResult,
    Modify,
    NotFound,
    OutOfOrder,
    Purge,
    Purged,
    QueueCommandError,
    ReleaseCursor,
    Return,
    Settle,
    Tick,
    key_index,
    msg_key,
    pack,
)
from broker.queue.machine import RELEASE_CURSOR_INTERVAL
from broker.queue.types import DEQUEUE_TAG

from .harness import Harness, cid, delivered, delivered_indexes, of_type


def test_messages_are_delivered_in_fifo_order_to_a_consumer() -> None:
    h = Harness()
    idx = h.enqueue(5)
    _, eff = h.consume(prefetch=10)
    assert delivered_indexes(eff) == idx
    assert [d[0] for d in delivered(eff)] == [0, 1, 2, 3, 4]  # msg ids per consumer
    assert all(d[2] == 0 and d[3] is False for d in delivered(eff))


def test_enqueue_reply_is_accepted_and_resend_with_old_seq_is_duplicate() -> None:
    h = Harness()
    pub = ChannelRef("p")
    assert h.run(Enqueue(pub, 1, 5))[0] is EnqueueResult.ACCEPTED
    assert h.run(Enqueue(pub, 2, 5))[0] is EnqueueResult.ACCEPTED
    assert h.run(Enqueue(pub, 2, 5))[0] is EnqueueResult.DUPLICATE
    assert h.run(Enqueue(pub, 1, 5))[0] is EnqueueResult.DUPLICATE
    assert h.run(Enqueue(pub, 3, 5))[0] is EnqueueResult.ACCEPTED
    assert h.state.messages_ready() == 3
    # untracked publishers are never de-duplicated
    assert h.run(Enqueue(None, 1, 5))[0] is EnqueueResult.ACCEPTED
    assert h.run(Enqueue(None, 1, 5))[0] is EnqueueResult.ACCEPTED
    assert h.state.messages_ready() == 5


def test_a_gap_in_a_publishers_sequence_is_refused_not_skipped() -> None:
    """Issue 10 defect 2: a later publish must never make an earlier one a
    duplicate. seq 2 arriving before seq 1 is refused (nothing enqueued);
    seq 1 then 2 re-sent in order are both enqueued exactly once."""
    h = Harness()
    pub = ChannelRef("p")
    assert h.run(Enqueue(pub, 2, 5))[0] == OutOfOrder(1)
    assert h.state.messages_ready() == 0 and pub not in h.state.publishers
    assert h.run(Enqueue(pub, 1, 5))[0] is EnqueueResult.ACCEPTED
    assert h.run(Enqueue(pub, 3, 5))[0] == OutOfOrder(2)
    assert h.run(Enqueue(pub, 2, 5))[0] is EnqueueResult.ACCEPTED
    assert h.run(Enqueue(pub, 2, 5))[0] is EnqueueResult.DUPLICATE
    assert h.state.messages_ready() == 2


def test_suspected_channel_down_keeps_the_publishers_dedup_entry() -> None:
    """Issue 10 defect 10: a publisher whose node was unreachable for a while
    keeps its de-duplication entry, so its re-sends are not enqueued twice."""
    h = Harness()
    pub = ChannelRef("p")
    h.run(Enqueue(pub, 1, 5))
    h.run(ChannelDown(pub, keep_publisher=True))
    assert h.run(Enqueue(pub, 1, 5))[0] is EnqueueResult.DUPLICATE
    h.run(ChannelDown(pub))
    assert pub not in h.state.publishers


def test_prefetch_limits_unacked_deliveries_and_settle_refills() -> None:
    h = Harness()
    h.enqueue(5)
    _, eff = h.consume(prefetch=2)
    assert len(delivered(eff)) == 2
    _, eff = h.run(Settle(cid(), (0,)))
    assert delivered_indexes(eff) == [msg_key(3)]
    assert h.state.messages_checked_out() == 2
    assert h.state.messages_ready() == 2


def test_prefetch_zero_means_unlimited() -> None:
    h = Harness()
    h.enqueue(50)
    _, eff = h.consume(prefetch=0)
    assert len(delivered(eff)) == 50


def test_round_robin_among_consumers_of_equal_priority() -> None:
    h = Harness()
    a, b, c = cid("ch1", "a"), cid("ch2", "b"), cid("ch3", "c")
    for x in (a, b, c):
        h.consume(x, prefetch=10)
    idx = h.enqueue(6)
    got = {x: delivered_indexes(h.effects, x) for x in (a, b, c)}
    assert got == {a: [idx[0], idx[3]], b: [idx[1], idx[4]], c: [idx[2], idx[5]]}


def test_consumer_priority_higher_first_lower_only_when_higher_is_blocked() -> None:
    h = Harness()
    low, high = cid("ch1", "low"), cid("ch2", "high")
    h.consume(low, prefetch=10, priority=0)
    h.consume(high, prefetch=2, priority=5)
    idx = h.enqueue(4)
    assert delivered_indexes(h.effects, high) == idx[:2]
    assert delivered_indexes(h.effects, low) == idx[2:]


def test_settle_of_unknown_ids_or_consumer_is_ignored() -> None:
    h = Harness()
    h.enqueue(1)
    h.consume(prefetch=1)
    assert h.run(Settle(cid(), (99,)))[0] is OK
    assert h.state.messages_checked_out() == 1
    assert isinstance(h.run(Settle(cid("nope", "x"), (0,)))[0], NotFound)


def test_return_counts_a_failed_delivery_and_redelivers_near_the_head() -> None:
    h = Harness()
    idx = h.enqueue(3)
    h.consume(prefetch=1)
    h.effects.clear()
    _, eff = h.run(Return(cid(), (0,)))
    # the returned message comes back before the other ready ones
    assert delivered(eff) == [(1, idx[0], 1, True)]


def test_returned_messages_go_to_the_back_when_delivery_limit_is_disabled() -> None:
    h = Harness(delivery_limit=None)
    idx = h.enqueue(3)
    h.consume(prefetch=1)
    _, eff = h.run(Return(cid(), (0,)))
    assert delivered(eff) == [(1, idx[1], 0, False)]
    h.run(Settle(cid(), (1,)))
    h.run(Settle(cid(), (2,)))
    assert delivered(h.effects)[-1] == (3, idx[0], 1, True)


def test_default_delivery_limit_is_20_then_dead_lettered_delivery_limit() -> None:
    h = Harness(dead_letter_exchange="dlx")
    (i,) = h.enqueue(1)
    h.consume(prefetch=1)
    deliveries = 1
    for mid in range(20):
        _, eff = h.run(Return(cid(), (mid,)))
        assert delivered(eff) == [(mid + 1, i, mid + 1, True)]
        deliveries += 1
    _, eff = h.run(Return(cid(), (20,)))
    assert delivered(eff) == []
    assert of_type(eff, DeadLetter) == [
        DeadLetter(DeadLetterReason.DELIVERY_LIMIT, ((i, 21),), "dlx", None)]
    assert deliveries == 21 and h.state.messages_total() == 0


def test_past_the_delivery_limit_without_dlx_the_message_is_dropped() -> None:
    h = Harness(delivery_limit=1)
    h.enqueue(1)
    h.consume(prefetch=1)
    h.run(Return(cid(), (0,)))
    _, eff = h.run(Return(cid(), (1,)))
    assert eff == [] and h.state.messages_total() == 0


def test_channel_down_returns_checked_out_messages_and_counts_a_delivery() -> None:
    h = Harness()
    idx = h.enqueue(3)
    h.consume(cid("ch1", "a"), prefetch=2)
    h.run(ChannelDown(ChannelRef("ch1")))
    assert h.state.consumers == {}
    _, eff = h.consume(cid("ch2", "b"), prefetch=10)
    # msg ids continue above the ones the removed consumer used (a late settle
    # of those must never match these)
    assert delivered(eff) == [(2, idx[0], 1, True), (3, idx[1], 1, True), (4, idx[2], 0, False)]


def test_consumer_down_returns_only_that_consumers_messages() -> None:
    h = Harness()
    h.enqueue(2)
    a, b = cid("ch1", "a"), cid("ch1", "b")
    h.consume(a, prefetch=1)
    h.consume(b, prefetch=1)
    h.run(ConsumerDown(a))
    assert a not in h.state.consumers and b in h.state.consumers
    assert h.state.messages_checked_out() == 1 and h.state.messages_ready() == 1


def test_discard_dead_letters_rejected() -> None:
    h = Harness(dead_letter_exchange="dlx", dead_letter_routing_key="rk")
    (i,) = h.enqueue(1)
    h.consume(prefetch=1)
    _, eff = h.run(Discard(cid(), (0,)))
    assert eff == [DeadLetter(DeadLetterReason.REJECTED, ((i, 0),), "dlx", "rk")]


@pytest.mark.parametrize("failed,undeliverable,count,ready", [
    (False, False, 0, 1),   # modified: back to the queue, not counted
    (True, False, 1, 1),    # delivery failed: counted
    (False, True, None, 0),  # undeliverable here: discarded
])
def test_modify_outcomes(failed: bool, undeliverable: bool, count: int | None,
                         ready: int) -> None:
    h = Harness(dead_letter_exchange="dlx")
    (i,) = h.enqueue(1)
    h.consume(prefetch=1)
    h.run(Cancel(cid()))
    _, eff = h.run(Modify(cid(), (0,), failed, undeliverable))
    assert h.state.messages_ready() == ready
    if count is None:
        assert of_type(eff, DeadLetter)[0].reason is DeadLetterReason.REJECTED
    else:
        _, eff = h.run(Dequeue(ChannelRef("g"), settled=True))
        assert isinstance(eff, list)
        r = h.replies[-1]
        assert isinstance(r, Dequeued) and r.delivery_count == count and r.redelivered


def test_dequeue_settled_unsettled_and_empty() -> None:
    h = Harness()
    idx = h.enqueue(2)
    r, _ = h.run(Dequeue(ChannelRef("g"), settled=True))
    assert r == Dequeued(0, idx[0], 0, False, 1)
    r, _ = h.run(Dequeue(ChannelRef("g"), settled=False))
    assert isinstance(r, Dequeued) and r.key == idx[1]
    assert h.state.messages_checked_out() == 1
    r2, _ = h.run(Dequeue(ChannelRef("g"), settled=False))
    assert isinstance(r2, DequeueEmpty)
    # the unsettled get is settled through the channel's pseudo-consumer
    h.run(Settle(cid("g", ""), (r.msg_id,)))
    assert h.state.messages_total() == 0 and h.state.consumers == {}


def test_cancel_keeps_unacked_messages_which_can_still_be_settled() -> None:
    h = Harness()
    h.enqueue(3)
    h.consume(prefetch=2)
    assert h.run(Cancel(cid()))[0] is OK
    _, eff = h.run(Settle(cid(), (0,)))
    assert delivered(eff) == []  # no more deliveries after cancel
    assert h.state.messages_checked_out() == 1
    h.run(Return(cid(), (1,)))
    assert h.state.consumers == {} and h.state.messages_ready() == 2


def test_purge_removes_ready_but_not_checked_out_messages() -> None:
    h = Harness()
    h.enqueue(5)
    h.consume(prefetch=2)
    r, eff = h.run(Purge())
    assert r == Purged(3)
    assert h.state.messages_ready() == 0 and h.state.messages_checked_out() == 2
    assert of_type(eff, ReleaseCursor)


def test_credited_consumer_gets_exactly_its_credit_and_drain_consumes_the_rest() -> None:
    h = Harness()
    h.enqueue(3)
    c = cid()
    _, eff = h.run(Checkout(c, 0, mode=CreditMode.CREDITED))
    assert delivered(eff) == []
    _, eff = h.run(Credit(c, 2))
    assert len(delivered(eff)) == 2
    h.run(Settle(c, (0, 1)))  # settling does not grant credit
    assert len(delivered(h.effects)) == 2
    r, eff = h.run(Credit(c, 5, drain=True))
    assert len(delivered(eff)) == 1
    assert r == CreditReply(c, 0, 0, 4)


def test_release_cursor_is_the_smallest_live_raft_index() -> None:
    h = Harness()
    idx = h.enqueue(4)
    h.consume(prefetch=2)
    _, eff = h.run(Tick())
    assert of_type(eff, ReleaseCursor) == [ReleaseCursor(h.index, key_index(idx[0]))]
    h.run(Settle(cid(), (0,)))  # idx[0] settled; idx[1] still out
    _, eff = h.run(Tick())
    assert of_type(eff, ReleaseCursor)[0].smallest_live_index == key_index(idx[1])
    h.run(Settle(cid(), (1, 2)))  # frees credit: idx[3] is delivered as msg id 3
    assert h.state.smallest_live_index() == key_index(idx[3])
    h.run(Settle(cid(), (3,)))
    _, eff = h.run(Tick())
    assert of_type(eff, ReleaseCursor) == [ReleaseCursor(h.index, h.index + 1)]


def test_release_cursor_counts_returned_messages() -> None:
    h = Harness(delivery_limit=None)
    idx = h.enqueue(3)
    h.consume(prefetch=1)
    h.run(Return(cid(), (0,)))  # idx[0] goes to the back; idx[1] delivered
    h.run(Settle(cid(), (1,)))
    assert h.state.smallest_live_index() == key_index(idx[0])


def test_release_cursor_is_reported_every_interval_commands() -> None:
    h = Harness()
    n = 0
    for _ in range(RELEASE_CURSOR_INTERVAL):
        _, eff = h.run(Enqueue(None, 0, 1))
        n += len(of_type(eff, ReleaseCursor))
    assert n == 1


def test_bad_commands_are_refused_with_a_typed_error() -> None:
    h = Harness()
    with pytest.raises(QueueCommandError):
        h.run(Enqueue(None, 1, -1))
    with pytest.raises(QueueCommandError):
        h.run(Checkout(cid(), -1))
    with pytest.raises(QueueCommandError):
        h.run("not a command")  # type: ignore[arg-type]


def test_record_packs_index_and_size() -> None:
    assert pack(7, 100) >> 32 == 7 and pack(7, 100) & 0xFFFFFFFF == 100


def test_consumer_cancelled_is_reported_once_on_cancel_or_down() -> None:
    from broker.queue import ConsumerCancelled
    h = Harness()
    a, b = cid("ch1", "a"), cid("ch2", "b")
    h.consume(a)
    h.consume(b)
    _, eff = h.run(Cancel(a))
    assert of_type(eff, ConsumerCancelled) == [ConsumerCancelled(a)]
    _, eff = h.run(ChannelDown(ChannelRef("ch2")))
    assert of_type(eff, ConsumerCancelled) == [ConsumerCancelled(b)]
    _, eff = h.run(Cancel(a))
    assert of_type(eff, ConsumerCancelled) == []


def test_record_carries_an_expiry_above_the_index() -> None:
    from broker.queue import rec_expiry, rec_key
    r = pack(2**40 + 3, 77, 123_456)
    assert (rec_key(r), r & 0xFFFFFFFF, rec_expiry(r)) == (2**40 + 3, 77, 123_456)
    assert rec_expiry(pack(5, 1)) is None and rec_expiry(pack(5, 1, 0)) == 0


def test_channel_down_counts_only_deliveries_that_reached_the_client() -> None:
    """A consume applied after its channel had closed delivers into the void;
    returning those messages must not count towards the delivery limit (a
    chaos run lost messages to twenty such zombie consumers). Messages the
    channel did deliver count as before; an unknown channel (node gone) counts
    everything."""
    h = Harness(delivery_limit=1)
    h.enqueue(2)
    for _ in range(5):  # five zombie consumers in a row
        h.consume(prefetch=2)
        h.run(ChannelDown(cid().channel, delivered=()))
    assert h.state.messages_ready() == 2
    h.consume(prefetch=2)  # this one did deliver both (msg ids 10 and 11): counted
    h.run(ChannelDown(cid().channel, delivered=(("c1", (10, 11)),)))
    assert h.state.messages_ready() == 2
    h.consume(prefetch=2)
    h.run(ChannelDown(cid().channel))  # delivered unknown: counted again, over the limit
    assert h.state.messages_total() == 0


def test_a_late_settle_never_settles_a_new_consumers_message_with_the_same_id() -> None:
    """Chaos run n3-s1012 (issue 10): a basic.get's ack was re-sent after a
    leader change; by then the channel's next basic.get had checked out
    another message under the same pseudo-consumer and msg id 0, and the late
    settle removed it: a confirmed message never reached any client."""
    h = Harness()
    idx = h.enqueue(2)
    g = ChannelRef("getter")
    first = h.run(Dequeue(g, settled=False))[0]
    h.run(Settle(ConsumerId(g, DEQUEUE_TAG), (first.msg_id,)))
    second = h.run(Dequeue(g, settled=False))[0]
    assert second.key == idx[1] and second.msg_id != first.msg_id
    h.run(Settle(ConsumerId(g, DEQUEUE_TAG), (first.msg_id,)))  # the re-sent ack
    assert h.state.messages_checked_out() == 1
