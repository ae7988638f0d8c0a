"""Peer events (runtime/peer_events.py) against a fake node: what a broken
connection to a peer and a new one set off. No process, no loop: the
campaign timer is a list of (delay, callback) pairs run by hand."""
from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.raft import Role
from broker.runtime import peer_wire as pw
from broker.runtime.peer_events import CAMPAIGN_DELAY_S, PeerEvents
from broker.runtime.queues import QuorumQueue


@dataclass
class FakeConfig:
    voters: frozenset[str]


class FakeRaftNode:
    def __init__(self, voters: set[str], me: str) -> None:
        self.config = FakeConfig(frozenset(voters))
        self.me = me
        self.lease_given_up = 0

    @property
    def promotable(self) -> bool:
        return self.me in self.config.voters

    def leader_unreachable(self) -> None:
        self.lease_given_up += 1


class FakeGroup:
    def __init__(self, group_id: str, leader: str | None, voters: set[str], me: str = "a") -> None:
        self.group_id = group_id
        self.leader = leader
        self.me = me
        self.node = FakeRaftNode(voters, me)
        self.stopped: BaseException | None = None
        self.campaigns = 0

    @property
    def role(self) -> Role:
        return Role.LEADER if self.leader == self.me else Role.FOLLOWER

    @property
    def is_leader(self) -> bool:
        return self.leader == self.me

    def campaign(self) -> None:
        self.campaigns += 1


class FakeQuorumQueue(QuorumQueue):
    """The real `is_leader` over a fake group; redeliveries recorded."""

    def __init__(self, name: str, leader: str | None) -> None:  # no storage, no Raft
        self.vhost, self.name = "/", name
        self.group = FakeGroup(name, leader, {"a", "b", "c"})  # type: ignore[assignment]
        self.deleted = False
        self.redelivered: list[str | None] = []

    def redeliver_checked_out(self, node: str | None = None) -> None:
        self.redelivered.append(node)


class FakeTransport:
    def __init__(self) -> None:
        self.up: set[str] = set()

    def is_connected(self, peer: str) -> bool:
        return peer in self.up


class FakeCluster:
    def __init__(self) -> None:
        self.transport = FakeTransport()
        self.sent: list[tuple[str, Any]] = []

    def send_to(self, peer: str, msg: Any) -> None:
        self.sent.append((peer, msg))


@dataclass
class FakeRegistry:
    groups: dict[str, Any] = field(default_factory=dict)
    queues: dict[tuple[str, str], Any] = field(default_factory=dict)


class FakeQuiescence:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def leader_lost(self, peer: str) -> None:
        self.calls.append(("leader_lost", peer))

    def peer_back(self, peer: str) -> None:
        self.calls.append(("peer_back", peer))


@dataclass
class FakeAlarms:
    local: frozenset[str] = frozenset()


class FakeNode:
    def __init__(self, name: str = "a", cluster: FakeCluster | None = None) -> None:
        self.node_name = name
        self.cluster = cluster if cluster is not None else FakeCluster()
        self.registry = FakeRegistry()
        self.quiescence = FakeQuiescence()
        self.alarms = FakeAlarms()
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def call_later(self, delay: float, fn: Callable[[], None]) -> object:
        self.timers.append((delay, fn))
        return None

    def run_timers(self) -> None:
        timers, self.timers = self.timers, []
        for _, fn in timers:
            fn()


def chosen(group_id: str, voters: list[str]) -> str:
    """The follower that campaigns at once: the same hash as the module's."""
    vs = sorted(voters)
    return vs[zlib.crc32(group_id.encode()) % len(vs)]


def group_chosen_for(me: str, others: list[str], prefix: str = "q") -> str:
    """A group id whose chosen follower among `me` and `others` (the voters
    left once the leader is taken out) is `me`."""
    for i in range(1000):
        gid = f"{prefix}{i}"
        if chosen(gid, [me, *others]) == me:
            return gid
    raise AssertionError("no group id found")


def test_a_broken_connection_to_a_leader_gives_up_the_lease_and_one_follower_campaigns() -> None:
    node = FakeNode("a")
    events = PeerEvents(node, uniform=lambda lo, hi: lo)
    mine = group_chosen_for("a", ["c"])
    theirs = group_chosen_for("c", ["a"], prefix="t")
    for gid in (mine, theirs):
        node.registry.groups[gid] = FakeGroup(gid, "b", {"a", "b", "c"})
    node.registry.groups["led-here"] = FakeGroup("led-here", "a", {"a", "b", "c"})
    node.registry.groups["led-by-c"] = FakeGroup("led-by-c", "c", {"a", "b", "c"})
    node.registry.groups["learner"] = FakeGroup("learner", "b", {"b", "c"})  # a is not a voter

    events.down("b")

    assert node.quiescence.calls == [("leader_lost", "b")]
    g = node.registry.groups
    assert g[mine].node.lease_given_up == 1 and g[theirs].node.lease_given_up == 1
    for other in ("led-here", "led-by-c", "learner"):
        assert g[other].node.lease_given_up == 0
    # only the group this node is chosen for gets a campaign timer, with the delay drawn
    assert [d for d, _ in node.timers] == [CAMPAIGN_DELAY_S[0]]
    node.run_timers()
    assert g[mine].campaigns == 1 and g[theirs].campaigns == 0


def test_the_delayed_campaign_is_skipped_if_things_changed_meanwhile() -> None:
    for change in ("reconnected", "new leader", "stopped", "none"):
        node = FakeNode("a")
        events = PeerEvents(node, uniform=lambda lo, hi: hi)
        gid = group_chosen_for("a", ["c"])
        grp = FakeGroup(gid, "b", {"a", "b", "c"})
        node.registry.groups[gid] = grp
        events.down("b")
        assert [d for d, _ in node.timers] == [CAMPAIGN_DELAY_S[1]]
        if change == "reconnected":
            node.cluster.transport.up.add("b")
        elif change == "new leader":
            grp.leader = "c"
        elif change == "stopped":
            grp.stopped = RuntimeError("disk")
        node.run_timers()
        assert grp.campaigns == (1 if change == "none" else 0), change


def test_the_lone_remaining_voter_is_always_the_one_that_campaigns() -> None:
    node = FakeNode("a")
    events = PeerEvents(node)
    for i in range(5):
        node.registry.groups[f"pair{i}"] = FakeGroup(f"pair{i}", "b", {"a", "b"})
    events.down("b")
    assert len(node.timers) == 5
    assert all(CAMPAIGN_DELAY_S[0] <= d <= CAMPAIGN_DELAY_S[1] for d, _ in node.timers)
    node.run_timers()
    assert all(g.campaigns == 1 for g in node.registry.groups.values())


def test_a_reconnected_peer_gets_redeliveries_from_queues_led_here_and_our_alarms() -> None:
    node = FakeNode("a")
    node.alarms.local = frozenset({"memory", "disk"})
    events = PeerEvents(node)
    led = FakeQuorumQueue("led", "a")
    follower = FakeQuorumQueue("follower", "b")
    deleted = FakeQuorumQueue("deleted", "a")
    deleted.deleted = True
    node.registry.queues = {("/", q.name): q for q in (led, follower, deleted)}
    node.registry.queues[("/", "classic")] = object()  # not a quorum queue: skipped

    events.reconnected("b")

    assert node.quiescence.calls == [("peer_back", "b")]
    assert led.redelivered == ["b"]
    assert follower.redelivered == [] and deleted.redelivered == []
    assert node.cluster.sent == [("b", pw.AlarmState(["disk", "memory"]))]


def test_without_a_cluster_nothing_is_sent() -> None:
    node = FakeNode("a")
    node.cluster = None  # type: ignore[assignment]
    events = PeerEvents(node)
    events.reconnected("b")
    assert node.quiescence.calls == [("peer_back", "b")]
