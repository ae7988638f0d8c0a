"""The publish -> confirm path of one channel and one queue (runtime/publish.py),
driven without processes: a real queue machine stands behind a scripted
router whose futures the tests resolve, fail or reorder, as leader changes,
refusals and lost connections would.

Every scenario checks the invariant of issue 10: a publish reported as
enqueued (confirm) is in the queue, exactly the confirmed ones plus possibly
some unconfirmed ones are enqueued, and nothing is enqueued twice.
"""
from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from broker import queue as qm
from broker.queue.types import ChannelRef, Meta
from broker.runtime.errors import QueueGone
from broker.runtime.publish import PublisherSession
from broker.runtime.queues import QueueProcess
from broker.runtime.raft_group import ProposalReplaced, ProposalUnknown


class Machine:
    """A real quorum-queue state machine applying enqueues in arrival order."""

    def __init__(self) -> None:
        self.state = qm.new_state(qm.parse_queue_arguments({}, "q", "/"))
        self.index = 0
        self.bodies: list[bytes] = []

    def apply(self, payload: list[Any]) -> Any:
        _, pub, seq, size, prio, exp, _props, body, _x, _rk = payload
        self.index += 1
        before = self.state.messages_ready()
        self.state, reply, _ = qm.apply(Meta(self.index, 1, 0), qm.Enqueue(
            ChannelRef(pub), seq, size, prio, exp), self.state)
        if self.state.messages_ready() > before:
            self.bodies.append(body)
        return reply


class Router:
    """What `submit` reaches: each call returns a future the test settles."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls: list[tuple[list[Any], asyncio.Future[Any]]] = []
        self.gone = False

    def submit(self, payload: list[Any]) -> asyncio.Future[Any]:
        if self.gone:
            raise QueueGone("deleted")
        fut: asyncio.Future[Any] = self.loop.create_future()
        self.calls.append((payload, fut))
        return fut

    def take(self) -> list[tuple[list[Any], asyncio.Future[Any]]]:
        calls, self.calls = self.calls, []
        return calls


class Clock:
    """call_later stand-in: the test runs due callbacks explicitly."""

    def __init__(self) -> None:
        self.due: list[Callable[[], None]] = []

    def later(self, _delay: float, fn: Callable[[], None]) -> None:
        self.due.append(fn)

    def run(self) -> None:
        due, self.due = self.due, []
        for fn in due:
            fn()


def body(payload: list[Any]) -> bytes:
    return payload[7]


async def settle_all() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.fixture
async def rig() -> tuple[PublisherSession, Router, Clock, Machine, dict[bytes, bool]]:
    loop = asyncio.get_running_loop()
    router, clock, machine = Router(loop), Clock(), Machine()
    session = PublisherSession("node|x/1/1", router.submit, clock.later, "test")
    return session, router, clock, machine, {}


def publish(session: PublisherSession, outcomes: dict[bytes, bool], b: bytes) -> None:
    session.publish(len(b), None, None, b"", b, "", "q", lambda ok: outcomes.__setitem__(b, ok))


async def test_refused_publish_overtaken_by_a_later_one_is_resent_and_both_enqueued(rig: Any) -> None:
    """Defect 2: R1 refused (target still campaigning), R2 accepted by the
    same node once it won: R1 must not become a 'duplicate'."""
    session, router, clock, machine, out = rig
    publish(session, out, b"m1")
    publish(session, out, b"m2")
    (p1, f1), (p2, f2) = router.take()
    f1.set_exception(ProposalReplaced("not leader yet"))
    f2.set_result(machine.apply(p2))  # the gap: refused by the machine
    await settle_all()
    assert out == {} and machine.bodies == []
    clock.run()  # one in-order re-send of everything pending
    resent = router.take()
    assert [body(p) for p, _ in resent] == [b"m1", b"m2"]
    for p, f in resent:
        f.set_result(machine.apply(p))
    await settle_all()
    assert out == {b"m1": True, b"m2": True}
    assert machine.bodies == [b"m1", b"m2"]


async def test_unknown_outcome_is_resent_and_a_duplicate_is_confirmed_once_enqueued(rig: Any) -> None:
    """Defect 4: the proposal was applied but its waiter failed (snapshot
    installed over it): the re-send comes back DUPLICATE and is confirmed,
    and the message is in the queue exactly once."""
    session, router, clock, machine, out = rig
    publish(session, out, b"m1")
    ((p1, f1),) = router.take()
    machine.apply(p1)
    f1.set_exception(ProposalUnknown("snapshot installed"))
    await settle_all()
    clock.run()
    ((p1b, f1b),) = router.take()
    f1b.set_result(machine.apply(p1b))
    await settle_all()
    assert out == {b"m1": True}
    assert machine.bodies == [b"m1"]


async def test_publishes_made_while_a_resend_is_due_wait_for_it(rig: Any) -> None:
    session, router, clock, machine, out = rig
    publish(session, out, b"m1")
    ((_p1, f1),) = router.take()
    f1.set_exception(ConnectionError("lost"))
    await settle_all()
    publish(session, out, b"m2")
    assert router.take() == []  # not sent ahead of the re-send of m1
    clock.run()
    assert [body(p) for p, _ in router.take()] == [b"m1", b"m2"]


async def test_stale_failure_of_an_older_round_does_not_resend_again(rig: Any) -> None:
    session, router, clock, machine, out = rig
    publish(session, out, b"m1")
    publish(session, out, b"m2")
    (_a, fa), (_b, fb) = router.take()
    fa.set_exception(ProposalReplaced("x"))
    await settle_all()
    clock.run()
    round2 = router.take()
    fb.set_exception(ProposalReplaced("x"))  # older round: ignored
    await settle_all()
    assert clock.due == []
    for p, f in round2:
        f.set_result(machine.apply(p))
    await settle_all()
    assert out == {b"m1": True, b"m2": True}


async def test_rejected_is_nacked_and_queue_gone_fails_everything_pending(rig: Any) -> None:
    session, router, clock, machine, out = rig
    publish(session, out, b"m1")
    publish(session, out, b"m2")
    (_p1, f1), (_p2, f2) = router.take()
    f1.set_result(qm.EnqueueResult.REJECTED)
    f2.set_exception(ProposalReplaced("x"))
    await settle_all()
    assert out == {b"m1": False}
    router.gone = True
    clock.run()
    assert out == {b"m1": False, b"m2": False}


async def test_random_schedule_never_confirms_a_message_that_is_not_enqueued(rig: Any) -> None:
    """Seeded random interleavings of refusals, losses, unknown outcomes (some
    applied, some not) and reordered replies: every confirmed message is in
    the queue, nothing is enqueued twice, and everything ends confirmed."""
    for seed in range(60):
        rng = random.Random(seed)
        loop = asyncio.get_running_loop()
        router, clock, machine = Router(loop), Clock(), Machine()
        session = PublisherSession("node|x/1/1", router.submit, clock.later, "test")
        out: dict[bytes, bool] = {}
        n = rng.randint(5, 40)
        made = 0
        for _step in range(2000):
            if made < n and rng.random() < 0.3:
                publish(session, out, b"m%d" % made)
                made += 1
            calls = router.take()
            rng.shuffle(calls)  # replies and arrivals in any order
            for p, f in calls:
                r = rng.random()
                if r < 0.55:
                    f.set_result(machine.apply(p))
                elif r < 0.7:
                    f.set_exception(ProposalReplaced("refused"))
                elif r < 0.8:
                    machine.apply(p)  # applied, reply lost
                    f.set_exception(ProposalUnknown("reply lost"))
                elif r < 0.9:
                    f.set_exception(ConnectionError("request lost"))
                else:
                    router.calls.append((p, f))  # still in flight
            await settle_all()
            clock.run()
            if made == n and len(out) == n:
                break
        assert len(out) == n, f"seed {seed}: {len(out)}/{n} resolved"
        confirmed = {b for b, ok in out.items() if ok}
        assert confirmed == {b"m%d" % i for i in range(n)}, f"seed {seed}"
        assert sorted(machine.bodies) == sorted(confirmed), f"seed {seed}"
        assert len(machine.bodies) == len(set(machine.bodies)), f"seed {seed}: enqueued twice"
        # the machine saw them in publish order
        assert machine.bodies == [b"m%d" % i for i in range(n)], f"seed {seed}"


class _FakeQueue(QueueProcess):
    """A queue process whose submissions fail `fail` times (replaced by a new
    leader, refused) before one is applied."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fail: int) -> None:
        self.loop, self.fail, self.calls = loop, fail, 0
        self.uid = ("/", "q", 1)
        self.deleted = False

    def _submit(self, payload: list[Any]) -> asyncio.Future[Any]:
        self.calls += 1
        fut: asyncio.Future[Any] = self.loop.create_future()
        if self.calls <= self.fail:
            fut.set_exception(ProposalReplaced("new leader"))
        else:
            fut.set_result(qm.OK)
        return fut


class _FakeNode:
    def __init__(self, q: _FakeQueue) -> None:
        self.q: _FakeQueue | None = q
        self.finished: list[Any] = []  # what Commands.commands_settled counts down

    def live_queue(self, uid: Any) -> _FakeQueue | None:
        return self.q

    def _reliable_finished(self, uid: Any) -> None:
        self.finished.append(uid)


async def test_settles_and_channel_down_are_resent_until_applied() -> None:
    """Issue 10 defect 5: an ack (or a channel-down notice) whose proposal is
    replaced by a new leader is re-sent, not dropped; once applied it is not
    sent again; and it stops when the queue is gone."""
    from broker.runtime.commands import _ReliableCommand

    loop = asyncio.get_running_loop()
    q = _FakeQueue(loop, fail=3)
    node = _FakeNode(q)
    applied: list[int] = []
    _ReliableCommand(node, q.uid, ["S", "ch", "tag", [1]], lambda: applied.append(1)).submit()  # type: ignore[arg-type]

    async def wait() -> None:
        while not applied:
            await asyncio.sleep(0.005)
    await asyncio.wait_for(wait(), 5)
    assert q.calls == 4 and applied == [1]
    assert node.finished == [q.uid]  # ended once, when applied (not per re-send)
    await asyncio.sleep(0.05)
    assert q.calls == 4

    gone = _FakeQueue(loop, fail=10**6)
    node2 = _FakeNode(gone)
    _ReliableCommand(node2, gone.uid, ["S", "ch", "tag", [1]], None).submit()  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    node2.q = None  # deleted
    calls = gone.calls
    await asyncio.sleep(1.2)
    assert gone.calls <= calls + 1
    assert node2.finished == [gone.uid]  # ended once the queue was gone
