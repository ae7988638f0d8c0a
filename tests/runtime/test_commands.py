"""Queue commands (runtime/commands.py) against fake queue processes and the
real metadata machine for routing: one-shot commands follow the queue's
current process and retry replaced proposals, reliable ones are counted
until applied, gets find their bodies, and at-most-once dead letters are
routed without cycles."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker import metadata as md
from broker import queue as qm
from broker.amqp import codec as acodec
from broker.runtime.commands import Commands
from broker.runtime.errors import ChannelError, QueueGone
from broker.runtime.queues import QueueProcess
from broker.runtime.raft_group import ProposalReplaced


class FakeQueue(QueueProcess):
    """A queue process (a subclass: compiled code checks the type) answering from `outcomes`."""

    def __init__(self, name: str, created: int = 1, outcomes: list[Any] | None = None) -> None:
        self.vhost, self.name, self.uid = "/", name, ("/", name, created)
        self.deleted = False
        self.outcomes = list(outcomes or [])
        self.submitted: list[Any] = []
        self.bodies: dict[int, Any] = {}

    def _answer(self, payload: Any) -> asyncio.Future[Any]:
        self.submitted.append(payload)
        fut = asyncio.get_running_loop().create_future()
        out = self.outcomes.pop(0) if self.outcomes else "ok"
        if isinstance(out, BaseException):
            fut.set_exception(out)
        else:
            fut.set_result(out)
        return fut

    def _submit(self, payload: Any) -> asyncio.Future[Any]:
        return self._answer(payload)

    def command(self, cmd: Any) -> asyncio.Future[Any]:
        return self._answer(cmd)

    def enqueue(self, publisher: Any, seq: int, props: bytes, body: bytes, exchange: str,
                rk: str, priority: Any, expiration: Any) -> asyncio.Future[Any]:
        return self._answer(("enqueue", body, rk))

    def message(self, index: int) -> Any:
        return self.bodies[index]


class FakeRegistry:
    def __init__(self, *queues: FakeQueue) -> None:
        self.queues = {q.name: q for q in queues}

    def queue(self, vhost: str, name: str) -> Any:
        return self.queues.get(name)

    def live_queue(self, uid: Any) -> Any:
        q = self.queues.get(uid[1])
        return q if q is not None and q.uid == uid and not q.deleted else None


class FakeNode:
    def __init__(self, *queues: FakeQueue) -> None:
        self.registry = FakeRegistry(*queues)
        self.meta_state = md.new_state()
        self.index = 0
        for cmd in (md.Bootstrap(md.hash_password("g", b"salt"), md.UserName("g"), md.VhostName("/")),
                    *(md.DeclareQueue(md.VhostName("/"), md.QueueName(q.name), members=(md.NodeName("a"),))
                      for q in queues)):
            self.index += 1
            self.meta_state, reply, _ = md.apply(md.CommandMeta(self.index, 1), cmd, self.meta_state)
            assert not isinstance(reply, md.MetadataError), reply


def test_a_replaced_proposal_is_proposed_again_through_the_current_process() -> None:
    async def body() -> None:
        old = FakeQueue("q", outcomes=[ProposalReplaced("new leader")])
        node = FakeNode(old)
        c = Commands(node)
        new = FakeQueue("q", outcomes=["purged"])

        async def replace() -> None:  # a membership change replaces the process meanwhile
            await asyncio.sleep(0.01)
            node.registry.queues["q"] = new
        asyncio.ensure_future(replace())
        assert await c.queue_command(old, qm.Purge()) == "purged"
        assert old.submitted == [qm.Purge()] and new.submitted == [qm.Purge()]
        new.outcomes.append(RuntimeError("boom"))
        with pytest.raises(ChannelError, match="unavailable: boom") as err:
            await c.queue_command(old, qm.Purge())
        assert err.value.code == 404
        new.deleted = True
        with pytest.raises(ChannelError, match="is gone"):
            await c.queue_command(new, qm.Purge())
    asyncio.run(body())


def test_reliable_commands_are_counted_until_applied_and_settled_waits_for_them() -> None:
    async def body() -> None:
        q = FakeQueue("q", outcomes=[ProposalReplaced("x"), RuntimeError("not leader"), "ok", "ok"])
        c = Commands(FakeNode(q))
        applied: list[int] = []
        c.queue_command_reliable(q.uid, qm.Cancel(qm.ConsumerId("ch", "t")), lambda: applied.append(1))
        c.queue_command_reliable(q.uid, qm.Cancel(qm.ConsumerId("ch", "u")))
        await asyncio.wait_for(c.commands_settled(q.uid), 5)
        assert applied == [1] and len(q.submitted) == 4 and not c._reliable_open
        await c.commands_settled(("/", "other", 1))  # nothing open: at once
    asyncio.run(body())


def test_a_reliable_command_to_a_gone_queue_ends() -> None:
    async def body() -> None:
        q = FakeQueue("q", outcomes=[QueueGone("gone")])
        c = Commands(FakeNode(q))
        c.queue_command_reliable(q.uid, qm.Cancel(qm.ConsumerId("ch", "t")))
        c.queue_command_reliable(("/", "never", 1), qm.Cancel(qm.ConsumerId("ch", "t")))
        await asyncio.wait_for(c.commands_settled(q.uid), 1)
        assert not c._reliable_open and len(q.submitted) == 1
    asyncio.run(body())


def test_enqueues_go_to_the_current_process_and_fail_once_the_queue_is_gone() -> None:
    async def body() -> None:
        q = FakeQueue("q")
        c = Commands(FakeNode(q))
        assert await c.submit_enqueue(q.uid, ["E"]) == "ok"
        with pytest.raises(QueueGone):
            c.submit_enqueue(("/", "q", 2), ["E"])  # another incarnation
    asyncio.run(body())


def test_a_gets_body_comes_with_the_reply_or_from_the_replica() -> None:
    q = FakeQueue("q")
    q.bodies[7] = (b"p", b"local", "", "rk")
    c = Commands(FakeNode(q))
    c.remember_dequeued("/", "q", 9, (b"p", b"shipped", "", "rk"))
    assert c.dequeued_message(q, 9) == (b"p", b"shipped", "", "rk")  # type: ignore[arg-type]
    assert c.dequeued_message(q, 7) == (b"p", b"local", "", "rk")  # type: ignore[arg-type]
    assert c.dequeued_message(q, 9) is None  # taken once  # type: ignore[arg-type]
    for i in range(1100):
        c.remember_dequeued("/", "q", 100 + i, (b"", b"", "", ""))
    assert len(c._dequeued_bodies) == 1024


def test_dead_letters_are_routed_once_and_an_automatic_cycle_is_dropped() -> None:
    async def body() -> None:
        src, dlq = FakeQueue("src"), FakeQueue("dlq")
        c = Commands(FakeNode(src, dlq))
        msg = (acodec.encode_properties(None), b"body", "", "src")

        def death(queue: str, reason: str) -> dict[str, Any]:
            return {"queue": queue, "reason": reason}
        # the default exchange routes by name
        c.dead_letter("/", "", "dlq", [(msg, death("src", "expired"))])
        assert dlq.submitted == [("enqueue", b"body", "dlq")]
        # back into the queue it died in, with no rejection since: a cycle, dropped
        c.dead_letter("/", "", "src", [(msg, death("src", "expired"))])
        assert src.submitted == []
        c.dead_letter("/", "", "src", [(msg, death("src", "rejected"))])  # a client's decision
        assert src.submitted == [("enqueue", b"body", "src")]
    asyncio.run(body())
