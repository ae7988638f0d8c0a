"""Node calls (runtime/node_calls.py) against a fake node: the node-local
views a peer may ask for, and asking every connected node (an unreachable
or failing peer is left out). No process, no sockets."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.runtime.limits import Counts
from broker.runtime.msg_stats import MsgCounters, NodeStats
from broker.runtime.node_calls import NodeCalls
from broker.runtime.queues import QuorumQueue


class FakeChannel:
    def __init__(self, n: int, consumers: int = 0) -> None:
        self.n = n
        self.consumers = consumers

    def info(self) -> dict[str, Any]:
        return {"number": self.n}

    def consumer_infos(self) -> list[dict[str, Any]]:
        return [{"channel": self.n, "tag": f"ctag{i}"} for i in range(self.consumers)]


class FakeConnection:
    def __init__(self, name: str, vhost: str, channels: dict[int, FakeChannel] | None = None) -> None:
        self.name = name
        self.vhost = vhost
        self.channels = channels or {}
        self.closed_with: list[str] = []

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "vhost": self.vhost}

    def force_close(self, text: str) -> None:
        self.closed_with.append(text)


class FakeTransport:
    def __init__(self, up: set[str]) -> None:
        self.up = up

    def is_connected(self, peer: str) -> bool:
        return peer in self.up


class FakeCluster:
    """Peers b (answers), c (raises), d (not connected)."""

    def __init__(self) -> None:
        self.peers = {"c": ("h", 1), "b": ("h", 2), "d": ("h", 3)}
        self.transport = FakeTransport({"b", "c"})
        self.asked: list[tuple[str, str, Any, float]] = []

    async def call(self, peer: str, op: str, args: object, timeout: float) -> Any:
        self.asked.append((peer, op, args, timeout))
        if peer == "c":
            raise TimeoutError("no answer")
        return [f"{op} from {peer}"]


class FakeLimits:
    def local_counts(self) -> Counts:
        return Counts({"/": 2}, {"guest": 2}, {"guest": 3})


class FakeQuorumQueue(QuorumQueue):
    def __init__(self, path: Path) -> None:  # no storage, no Raft
        self.glog = SimpleNamespace(path=path)  # type: ignore[assignment]


@dataclass
class FakeNode:
    node_name: str = "a"
    connections: set[Any] = field(default_factory=set)
    cluster: FakeCluster | None = None
    msg_stats: NodeStats | None = None
    alarms: Any = field(default_factory=lambda: SimpleNamespace(
        disk_free=10_000, disk_limit=1_000, mem_used=500, mem_limit=2_000,
        local=frozenset({"memory"})))
    storage_usage: dict[str, int] = field(default_factory=lambda: {"wal_bytes": 7})
    limits: FakeLimits = field(default_factory=FakeLimits)
    queues: dict[tuple[str, str], Any] = field(default_factory=dict)

    def queue(self, vhost: str, name: str) -> Any:
        return self.queues.get((vhost, name))


def node_with_connections() -> tuple[FakeNode, FakeConnection, FakeConnection]:
    node = FakeNode()
    c1 = FakeConnection("c1", "/", {1: FakeChannel(1, consumers=2), 2: FakeChannel(2)})
    login = FakeConnection("c2", "")  # not past the login yet: no vhost
    login.channels = {}
    node.connections = {c1, login}
    return node, c1, login


def test_local_views_show_logged_in_connections_their_channels_and_consumers() -> None:
    node, c1, _ = node_with_connections()
    calls = NodeCalls(node)
    assert calls.local_connections() == [{"name": "c1", "vhost": "/"}]
    assert sorted(ch["number"] for ch in calls.local_channels()) == [1, 2]
    assert calls.local_consumers() == [{"channel": 1, "tag": "ctag0"}, {"channel": 1, "tag": "ctag1"}]
    assert calls.serve_call("connections", None) == calls.local_connections()
    assert calls.serve_call("channels", None) == calls.local_channels()
    assert calls.serve_call("consumers", None) == calls.local_consumers()


def test_close_a_local_connection_by_name() -> None:
    node, c1, login = node_with_connections()
    calls = NodeCalls(node)
    assert calls.close_local_connection("c1", "Closed via management plugin")
    assert c1.closed_with == ["Closed via management plugin"] and login.closed_with == []
    assert not calls.close_local_connection("nope", "x")
    assert calls.serve_call("close_connection", ["c1", "again"]) is True
    assert c1.closed_with[-1] == "again"


def test_totals_and_queue_stats_with_and_without_message_counters() -> None:
    node, _, _ = node_with_connections()
    calls = NodeCalls(node)
    assert calls.serve_call("totals", None) == {"connections": 1, "channels": 2, "message_stats": None}
    assert calls.serve_call("queue_stats", None) == []
    stats = NodeStats(node)  # type: ignore[arg-type]
    stats.totals.publish = 5
    stats.queues[("/", "q1", 11)] = MsgCounters()  # type: ignore[index]
    stats.queues[("/", "q2", 12)] = MsgCounters()  # type: ignore[index]
    node.msg_stats = stats
    totals = calls.serve_call("totals", None)
    assert totals["message_stats"] == stats.totals.message_stats()
    assert [r[:3] for r in calls.serve_call("queue_stats", None)] == [["/", "q1", 11], ["/", "q2", 12]]
    assert [r[:3] for r in calls.serve_call("queue_stats", ["/", "q2"])] == [["/", "q2", 12]]


def test_resources_limit_counts_and_queue_storage(tmp_path: Path) -> None:
    node = FakeNode()
    calls = NodeCalls(node)
    assert calls.serve_call("resources", None) == {
        "node": "a", "disk_free": 10_000, "disk_free_limit": 1_000, "mem_used": 500,
        "mem_limit": 2_000, "alarms": ["memory"], "wal_bytes": 7}
    assert calls.serve_call("limit_counts", None) == [{"/": 2}, {"guest": 2}, {"guest": 3}]
    assert calls.serve_call("queue_storage", ["/", "missing"]) is None
    node.queues[("/", "classic")] = object()  # not a quorum queue: no replica files
    assert calls.serve_call("queue_storage", ["/", "classic"]) is None
    node.queues[("/", "qq")] = FakeQuorumQueue(tmp_path / "qq")
    answer = calls.serve_call("queue_storage", ["/", "qq"])
    assert answer["node"] == "a" and "segment_files" in answer
    with pytest.raises(ValueError, match="unknown call 'bogus'"):
        calls.serve_call("bogus", None)


def test_cluster_call_asks_every_connected_peer_in_node_order_and_leaves_out_failures() -> None:
    async def body() -> None:
        node, _, _ = node_with_connections()
        calls = NodeCalls(node)
        assert await calls.cluster_call("connections") == [[{"name": "c1", "vhost": "/"}]]
        cluster = node.cluster = FakeCluster()
        answers = await calls.cluster_call("connections", None, timeout=1.5)
        assert answers == [[{"name": "c1", "vhost": "/"}], ["connections from b"]]
        # b and c are connected (asked in name order), d is not; c did not answer
        assert cluster.asked == [("b", "connections", None, 1.5), ("c", "connections", None, 1.5)]
    asyncio.run(body())
