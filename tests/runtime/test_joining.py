"""Joining (runtime/joining.py) against a fake node: a new node asks the seeds
until it is a metadata voter; the metadata leader records the joiner's
address and adds it as a learner (one admission at a time, retried by the
joiner's next request); a follower passes the request on. No process."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from broker import metadata as md
from broker.raft import ConfChange, ConfChangeKind, NodeId
from broker.runtime import peer_wire as pw
from broker.runtime.joining import Joining
from broker.runtime.metastore import CLUSTER_NODES


@dataclass
class FakeConfig:
    voters: set[str] = field(default_factory=set)
    learners: set[str] = field(default_factory=set)

    @property
    def members(self) -> set[str]:
        return self.voters | self.learners


class FakeGroup:
    def __init__(self, me: str, leader: str | None, voters: set[str]) -> None:
        self.me = me
        self.leader = leader
        self.node = SimpleNamespace(config=FakeConfig(set(voters)))
        self.proposed: list[ConfChange] = []
        self.refuse: Exception | None = None
        self.gate: asyncio.Future[None] | None = None  # holds a proposal until set

    @property
    def is_leader(self) -> bool:
        return self.leader == self.me

    def propose_conf(self, cc: ConfChange) -> asyncio.Future[Any]:
        if self.refuse is not None:
            raise self.refuse
        self.proposed.append(cc)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def applied(_: Any = None) -> None:
            self.node.config.learners.add(str(cc.node))
            fut.set_result(None)
        if self.gate is None:
            applied()
        else:
            self.gate.add_done_callback(applied)
        return fut


class FakeMeta:
    def __init__(self, group: FakeGroup) -> None:
        self.group = group
        self.bootstrapped = True
        self.state = SimpleNamespace(parameters={})
        self.executed: list[Any] = []

    async def execute(self, cmd: Any) -> Any:
        self.executed.append(cmd)
        key = (cmd.vhost, cmd.component, cmd.name)
        self.state.parameters[key] = SimpleNamespace(value=cmd.value)
        return None


class FakeCluster:
    def __init__(self) -> None:
        self.joins: list[tuple[str, int]] = []
        self.sent: list[tuple[str, Any]] = []
        self.added: list[tuple[str, str, int]] = []

    def send_join(self, host: str, port: int) -> None:
        self.joins.append((host, port))

    def send_to(self, peer: str, msg: Any) -> None:
        self.sent.append((peer, msg))

    def add_peer(self, name: str, host: str, port: int) -> None:
        self.added.append((name, host, port))


class FakeNode:
    def __init__(self, name: str, leader: str | None, voters: set[str],
                 cluster: FakeCluster | None = None) -> None:
        self.node_name = name
        self.cluster: FakeCluster | None = cluster if cluster is not None else FakeCluster()
        self.meta = FakeMeta(FakeGroup(name, leader, voters))


def addr_param(meta: FakeMeta, name: str) -> Any:
    return meta.state.parameters.get((md.VhostName("/"), CLUSTER_NODES, name))


def test_advertised_address_is_the_host_part_of_the_name_and_the_peer_port() -> None:
    node = FakeNode("rabbit-4@10.0.0.4", None, set())
    assert Joining(node, 25672).advertised() == ("10.0.0.4", 25672)


def test_a_new_node_asks_the_seeds_until_it_is_a_voter() -> None:
    async def body() -> None:
        node = FakeNode("d@hostd", None, {"a", "b", "c"})
        node.meta.bootstrapped = False
        joining = Joining(node, 4000, retry_s=0.001)
        task = asyncio.ensure_future(joining.join())
        while len(node.cluster.joins) < 3:  # type: ignore[union-attr]
            await asyncio.sleep(0.001)
        node.meta.bootstrapped = True
        node.meta.group.leader = "a"
        await asyncio.sleep(0.01)
        assert not task.done()  # a learner so far: it keeps asking
        node.meta.group.node.config.voters.add("d@hostd")
        await asyncio.wait_for(task, 1)
        assert set(node.cluster.joins) == {("hostd", 4000)}  # type: ignore[union-attr]
    asyncio.run(body())


def test_the_leader_records_the_address_and_adds_a_learner() -> None:
    async def body() -> None:
        node = FakeNode("a", "a", {"a", "b", "c"})
        joining = Joining(node, 4000)
        joining.handle_join("d", "hostd", 4444)
        assert node.cluster.added == [("d", "hostd", 4444)]  # type: ignore[union-attr]
        await asyncio.sleep(0.01)
        assert addr_param(node.meta, "d").value == "hostd:4444"
        assert node.meta.group.proposed == [ConfChange(ConfChangeKind.ADD_LEARNER, NodeId("d"))]
        # asked again (the joiner's retry): nothing to do any more
        joining.handle_join("d", "hostd", 4444)
        await asyncio.sleep(0.01)
        assert len(node.meta.executed) == 1 and len(node.meta.group.proposed) == 1
        # the same node at a new address: the record changes, no second learner
        joining.handle_join("d", "hostd2", 4444)
        await asyncio.sleep(0.01)
        assert addr_param(node.meta, "d").value == "hostd2:4444"
        assert len(node.meta.group.proposed) == 1
    asyncio.run(body())


def test_one_admission_at_a_time_and_a_failed_one_is_retried_by_the_next_request() -> None:
    async def body() -> None:
        node = FakeNode("a", "a", {"a", "b", "c"})
        joining = Joining(node, 4000)
        g = node.meta.group
        g.gate = asyncio.get_running_loop().create_future()
        joining.handle_join("d", "hostd", 4444)
        await asyncio.sleep(0.01)
        joining.handle_join("d", "hostd", 4444)  # the first is still waiting
        await asyncio.sleep(0.01)
        assert len(g.proposed) == 1
        g.gate.set_result(None)
        await asyncio.sleep(0.01)
        assert "d" in g.node.config.members

        g.gate = None
        g.refuse = RuntimeError("a membership change is pending")
        joining.handle_join("e", "hoste", 4445)
        await asyncio.sleep(0.01)
        assert "e" not in g.node.config.members  # failed, logged, not stuck:
        g.refuse = None
        joining.handle_join("e", "hoste", 4445)
        await asyncio.sleep(0.01)
        assert "e" in g.node.config.learners
    asyncio.run(body())


def test_a_follower_passes_the_request_to_the_leader() -> None:
    node = FakeNode("b", "a", {"a", "b", "c"})
    joining = Joining(node, 4000)
    joining.handle_join("d", "hostd", 4444)
    assert node.cluster.sent == [("a", pw.Join("d", "hostd", 4444))]  # type: ignore[union-attr]
    assert node.cluster.added == []  # type: ignore[union-attr]
    node.meta.group.leader = None  # no leader known: dropped (the joiner asks again)
    joining.handle_join("d", "hostd", 4444)
    assert len(node.cluster.sent) == 1  # type: ignore[union-attr]


def test_without_a_cluster_a_join_is_ignored() -> None:
    node = FakeNode("a", "a", {"a"})
    node.cluster = None
    joining = Joining(node, 4000)
    joining.handle_join("d", "hostd", 4444)
    joining.learned_node("d", "hostd:4444")
    assert node.meta.executed == []


def test_a_learned_node_address_becomes_a_peer_but_not_this_node() -> None:
    node = FakeNode("a", "a", {"a"})
    joining = Joining(node, 4000)
    joining.learned_node("d", "10.0.0.4:25672")
    joining.learned_node("a", "10.0.0.1:25672")
    assert node.cluster.added == [("d", "10.0.0.4", 25672)]  # type: ignore[union-attr]
