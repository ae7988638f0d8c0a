"""Forwarding (runtime/forwarding.py) against fakes: where a queue's commands
go, serving as leader, and the drain of forwarded commands when this node
becomes the leader (in order, before anything newer, never re-entered)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker import metadata as md
from broker import queue as qm
from broker.raft import Role
from broker.runtime.cluster import NotLeaderHere
from broker.runtime.forwarding import Forwarding
from broker.runtime.metastore import META_GROUP
from broker.runtime.queues import QuorumQueue, RemoteQueue


class FakeGroup:
    def __init__(self, leader: str | None, me: str = "a") -> None:
        self.leader = leader
        self.me = me
        self.proposed: list[Any] = []

    @property
    def role(self) -> Role:
        return Role.LEADER if self.leader == self.me else Role.FOLLOWER

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def propose_indexed(self, payload: Any) -> tuple[int, asyncio.Future[Any]]:
        self.proposed.append(payload)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(md.Ok())  # the machine's reply
        return 41 + len(self.proposed), fut


class FakeQuorumQueue(QuorumQueue):
    """The real `_submit` and `is_leader` over a fake group; `propose` records."""

    def __init__(self, host: Any, name: str, leader: str | None) -> None:  # no storage, no Raft
        self.host, self.vhost, self.name = host, "/", name
        self.group = FakeGroup(leader)  # type: ignore[assignment]
        self.proposals: list[Any] = []
        self.submits = 0
        self.delivered: list[Any] = []  # remote_deliveries' arguments

    def propose(self, payload: list[Any]) -> asyncio.Future[Any]:
        self.proposals.append(payload)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(("applied", payload))
        return fut

    def _submit(self, payload: list[Any]) -> asyncio.Future[Any]:
        self.submits += 1
        return super()._submit(payload)

    def remote_deliveries(self, *args: Any) -> None:
        self.delivered.append(args)


class Req:
    def __init__(self, payload: Any) -> None:
        self.payload = payload
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()


class FakeCluster:
    def __init__(self) -> None:
        self.pending: dict[tuple[str, str], list[Req]] = {}
        self.requests: list[tuple[str, str, str, Any]] = []
        self.deliveries: list[Any] = []

    def request(self, target: str, vhost: str, queue: str, payload: Any) -> asyncio.Future[Any]:
        self.requests.append((target, vhost, queue, payload))
        r = Req(payload)
        self.pending.setdefault((vhost, queue), []).append(r)
        return r.future

    def has_pending(self, vhost: str, queue: str) -> bool:
        return (vhost, queue) in self.pending

    def take_pending(self, vhost: str, queue: str) -> list[Req]:
        return self.pending.pop((vhost, queue), [])

    def send_deliveries(self, *a: Any) -> None:
        self.deliveries.append(a)


class FakeRegistry:
    def __init__(self) -> None:
        self.queues: dict[tuple[str, str], Any] = {}
        self.records: dict[tuple[str, str], md.QueueRecord] = {}

    def queue(self, vhost: str, name: str) -> Any:
        return self.queues.get((vhost, name))

    def queue_record(self, vhost: str, name: str) -> md.QueueRecord | None:
        return self.records.get((vhost, name))


class CountingForwarding(Forwarding):
    """The real forwarding, counting its drains."""

    def __init__(self, host: Any) -> None:
        super().__init__(host)
        self.flushes = 0

    def flush_forwarded(self, vhost: str, name: str) -> None:
        self.flushes += 1
        super().flush_forwarded(vhost, name)


class FakeNode:
    node_name = "a"

    def __init__(self, cluster: FakeCluster | None = None) -> None:
        self.cluster = cluster
        self.registry = FakeRegistry()
        self.meta_group = FakeGroup("b")
        self.unreachable: frozenset[str] = frozenset()
        self.executed: list[Any] = []
        self.forwarding = CountingForwarding(self)

    @property
    def flushes(self) -> int:
        """Drains asked for (a leader's queue asks the forwarding directly)."""
        return self.forwarding.flushes

    @flushes.setter
    def flushes(self, n: int) -> None:
        self.forwarding.flushes = n

    async def meta_execute(self, cmd: Any) -> Any:
        self.executed.append(cmd)
        return None


    def record(self, name: str, leader: str | None, term: int = 1) -> None:
        self.registry.records[("/", name)] = md.QueueRecord(
            md.VhostName("/"), md.QueueName(name), "quorum", True, False, None, md.freeze_table({}),
            (md.NodeName("a"), md.NodeName("b"), md.NodeName("c")),
            md.NodeName(leader) if leader else None, 1, leader_term=term)


def test_commands_go_to_the_local_leader_the_members_view_or_the_record() -> None:
    node = FakeNode()
    f = node.forwarding
    node.record("here", "c")
    node.registry.queues[("/", "here")] = FakeQuorumQueue(node, "here", "a")
    assert f.queue_leader("/", "here") == "a"
    node.registry.queues[("/", "here")].group.leader = "b"
    assert f.queue_leader("/", "here") == "b"  # the member's view beats the record
    node.registry.queues[("/", "here")].group.leader = None
    assert f.queue_leader("/", "here") == "c"
    node.record("stale", "a")  # the record names this node, whose member does not lead
    assert f.queue_leader("/", "stale") is None and f.recorded_leader("/", "stale") == "a"
    assert f.queue_leader("/", "nowhere") is None
    assert f.queue_leader("", META_GROUP) == "b"
    node.meta_group.leader = "a"
    assert f.queue_leader("", META_GROUP) == "a"


def test_forward_goes_through_the_cluster_and_waits_for_a_leader_when_it_is_this_node() -> None:
    async def body() -> None:
        lone = FakeNode()
        with pytest.raises(RuntimeError, match="has no leader"):
            await lone.forwarding.forward("b", "/", "q", ["x"])
        node = FakeNode(FakeCluster())
        node.forwarding.forward("a", "/", "q", ["x"])
        node.forwarding.forward("b", "/", "q", ["y"])
        assert node.cluster.requests == [("", "/", "q", ["x"]), ("b", "/", "q", ["y"])]  # type: ignore[union-attr]
    asyncio.run(body())


def test_serving_as_leader_only_where_this_node_leads() -> None:
    async def body() -> None:
        node = FakeNode(FakeCluster())
        node.registry.queues[("/", "f")] = FakeQuorumQueue(node, "f", "b")
        node.registry.queues[("/", "r")] = RemoteQueue(node, "/", "r", qm.parse_queue_arguments({}, "r", "/"))
        for name in ("f", "r", "missing"):
            with pytest.raises(NotLeaderHere):
                node.forwarding.submit_as_leader("/", name, ["x"])
        with pytest.raises(NotLeaderHere):
            node.forwarding.submit_as_leader("", META_GROUP, b"cmd")
        node.meta_group.leader = "a"
        # its index, and the reply (the forwarder's replica may not compute it)
        assert await node.forwarding.submit_as_leader("", META_GROUP, b"cmd") == [42, md.reply_to_bytes(md.Ok())]
        q = FakeQuorumQueue(node, "l", "a")
        node.registry.queues[("/", "l")] = q
        assert await node.forwarding.submit_as_leader("/", "l", ["x"]) == ("applied", ["x"])
        assert q.submits == 1  # a served command goes through the queue's _submit
    asyncio.run(body())


def test_a_new_leader_proposes_the_forwarded_commands_first_in_order_without_reentry() -> None:
    async def body() -> None:
        cluster = FakeCluster()
        node = FakeNode(cluster)
        q = FakeQuorumQueue(node, "q", "b")
        node.registry.queues[("/", "q")] = q
        node.record("q", "b")
        pending = [node.forwarding.forward("b", "/", "q", [f"p{i}"]) for i in (1, 2, 3)]
        node.forwarding.flush_forwarded("/", "q")  # not the leader yet: nothing moves
        assert q.proposals == [] and cluster.has_pending("/", "q")
        node.flushes = 0  # from here on, the queue's own
        q.group.leader = "a"  # elected here
        local = q._submit(["new"])
        assert q.proposals == [["p1"], ["p2"], ["p3"], ["new"]]
        assert node.flushes == 1 and q.submits == 1  # the drain never went through _submit
        assert [await p for p in pending] == [("applied", [f"p{i}"]) for i in (1, 2, 3)]
        assert await local == ("applied", ["new"]) and not cluster.has_pending("/", "q")
    asyncio.run(body())


def test_a_drained_command_that_fails_fails_its_waiter() -> None:
    async def body() -> None:
        cluster = FakeCluster()
        node = FakeNode(cluster)

        class Failing(FakeQuorumQueue):
            def propose(self, payload: list[Any]) -> asyncio.Future[Any]:
                fut = asyncio.get_running_loop().create_future()
                fut.set_exception(qm.QueueArgumentError("boom"))
                return fut
        node.registry.queues[("/", "q")] = Failing(node, "q", "a")
        waiter = node.forwarding.forward("b", "/", "q", ["p"])
        node.forwarding.flush_forwarded("/", "q")
        with pytest.raises(qm.QueueArgumentError):
            await waiter
    asyncio.run(body())


def test_a_leader_records_itself_once_per_term_and_deliveries_pass_through() -> None:
    async def body() -> None:
        cluster = FakeCluster()
        node = FakeNode(cluster)
        node.record("q", "b", term=3)
        node.forwarding.leader_elected("/", "q", 4)
        node.record("same", "a", term=4)
        node.forwarding.leader_elected("/", "same", 4)
        await asyncio.sleep(0)
        assert node.executed == [md.SetQueueLeader(md.VhostName("/"), md.QueueName("q"),
                                                   md.NodeName("a"), 4)]
        node.forwarding.send_deliveries("b", "/", "q", "ch", "t", [1], {})
        assert cluster.deliveries == [("b", "/", "q", "ch", "t", [1], {})]
        got: list[Any] = []
        q = FakeQuorumQueue(node, "q", "a")
        q.delivered = got
        node.registry.queues[("/", "q")] = q
        node.forwarding.remote_deliveries("/", "q", "ch", "t", [1], {})
        assert got == [("ch", "t", [1], {})]
    asyncio.run(body())
