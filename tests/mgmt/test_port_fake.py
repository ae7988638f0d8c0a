"""The management API over an in-memory fake of its port: no broker process.

The port (`broker.mgmt.port.ManagementPort`) is everything mgmt asks of a
node; here it is a real metadata state (the metadata machine applied in
memory), fixed counts and scripted membership refusals.
"""
from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Literal

import pytest
from aiohttp.test_utils import TestClient, TestServer

from broker import metadata as md
from broker import queue as qm
from broker.common.config import Config, load_config
from broker.common.histogram import Histogram
from broker.mgmt import make_app
from broker.mgmt.port import (
    AlarmStatus,
    JsonObject,
    LiveAccounting,
    ManagementPort,
    MemberSample,
    MembershipRefused,
    MemberStatus,
    NodeResources,
    NodeStatus,
    NodeTotals,
    Progress,
    QueueCommandFailed,
    QueueCounts,
    QueueHandle,
    QueueStatsPart,
    RaftMemberStatus,
    SegmentUsage,
    StoredMessage,
)

ME = "rabbit@fake1"
NODES = [ME, "rabbit@fake2", "rabbit@fake3"]


class FakeQueue:
    def __init__(self, vhost: str, name: str, fail: QueueCommandFailed | None = None) -> None:
        self.vhost, self.name = vhost, name
        self.fail = fail
        self.commands: list[qm.Command] = []

    async def command(self, cmd: qm.Command) -> object:
        if self.fail is not None:
            raise self.fail
        self.commands.append(cmd)
        return None

    def command_reliable(self, cmd: qm.Command, on_applied: Callable[[], None] | None = None) -> None:
        self.commands.append(cmd)
        if on_applied is not None:
            on_applied()

    def message(self, raft_index: int) -> StoredMessage:
        raise KeyError(raft_index)

    def enqueue(self, properties: bytes, body: bytes, exchange: str, routing_key: str,
                priority: int | None, expiration_ms: int | None) -> Awaitable[object]:
        async def done() -> object:
            return None
        return done()


class FakePort:
    """A ManagementPort with no node behind it."""

    def __init__(self) -> None:
        self.state = md.initial_state(md.hash_password("guest", b"salt"))
        self.index = 0
        self.counts: dict[tuple[str, str], QueueCounts] = {}
        self.queues: dict[tuple[str, str], FakeQueue] = {}
        self.refusal: MembershipRefused | None = None
        self.members_added: list[tuple[str, str, str]] = []
        self._config = load_config("")

    # -- node
    @property
    def node_name(self) -> str:
        return ME

    @property
    def incarnation(self) -> str:
        return ME + "|0"

    @property
    def config(self) -> Config:
        return self._config

    def node_status(self) -> NodeStatus:
        return NodeStatus(ME, 5672, True, ME, True, True, self.index)

    def cluster_nodes(self) -> list[str]:
        return list(NODES)

    def is_running(self, node: str) -> bool:
        return node != "rabbit@fake3"

    def alarm_status(self) -> AlarmStatus:
        return AlarmStatus(frozenset(), {}, (), 10 << 30, 50 << 20, 1 << 20, 1 << 30)

    def stopped_members(self) -> dict[str, str]:
        return {}

    def wal_stats(self) -> Mapping[str, int]:
        return {}

    def wal_sync_histogram(self) -> Histogram | None:
        return None

    # -- cluster
    async def cluster_totals(self) -> list[NodeTotals]:
        return [NodeTotals(1, 2, None), NodeTotals(3, 4, None)]

    async def cluster_resources(self) -> list[NodeResources]:
        return [NodeResources(ME, disk_free=1)]

    async def cluster_queue_stats(self, only: tuple[str, str] | None = None
                                  ) -> list[QueueStatsPart]:
        return []

    async def cluster_list(self, what: Literal["connections", "channels", "consumers"]
                           ) -> list[JsonObject]:
        return []

    async def queue_storage(self, vhost: str, name: str) -> list[JsonObject]:
        return []

    async def close_connection(self, node: str | None, name: str, reason: str) -> None:
        return None

    # -- metadata
    def metadata(self) -> md.MetadataState:
        return self.state

    async def meta_execute(self, cmd: md.Command) -> md.Reply | None:
        self.index += 1
        self.state, reply, _effects = md.apply(md.CommandMeta(self.index, 1000), cmd, self.state)
        return reply

    async def declare_queue(self, vhost: str, name: str, *, durable: bool, auto_delete: bool,
                            arguments: dict[str, Any]) -> md.Reply | None:
        arguments = {"x-queue-type": "quorum", **arguments}  # quorum by default here
        reply = await self.meta_execute(md.DeclareQueue(
            md.VhostName(vhost), md.QueueName(name), durable, None, auto_delete,
            md.freeze_table(arguments), members=tuple(md.NodeName(n) for n in NODES),
            leader=md.NodeName(ME)))
        if isinstance(reply, md.QueueDeclareOk):
            self.queues[(vhost, name)] = FakeQueue(vhost, name)
        return reply

    async def delete_queue(self, vhost: str, name: str, if_unused: bool,
                           if_empty: bool) -> md.Reply | None:
        return await self.meta_execute(md.DeleteQueue(md.VhostName(vhost), md.QueueName(name)))

    # -- queues
    def queue_leader(self, record: md.QueueRecord) -> str | None:
        return record.leader

    def local_counts(self, vhost: str, name: str) -> QueueCounts | None:
        return self.counts.get((vhost, name))

    def leader_counts(self, vhost: str, name: str) -> QueueCounts | None:
        return self.counts.get((vhost, name))

    def local_queue(self, vhost: str, name: str) -> QueueHandle | None:
        return self.queues.get((vhost, name))

    def borrow_channel(self, ref: str) -> None:
        pass

    def give_back_channel(self, ref: str) -> None:
        pass

    def member_samples(self, include_quiet: bool = True) -> list[MemberSample]:
        return []

    def raft_members(self) -> list[RaftMemberStatus]:
        return []

    def segment_usage(self, vhost: str, name: str) -> SegmentUsage:
        return SegmentUsage(0, 0)

    def group_id(self, record: md.QueueRecord) -> str:
        return f"{record.vhost}/{record.name}/{record.created_at}"

    def data_dir(self) -> str:
        return "/nonexistent"

    def live_accounting(self) -> dict[str, LiveAccounting]:
        return {}

    # -- membership
    def _maybe_refuse(self) -> None:
        if self.refusal is not None:
            raise self.refusal

    async def quorum_status(self, vhost: str, name: str) -> list[MemberStatus]:
        self._maybe_refuse()
        return [MemberStatus(ME, True, "leader", 3, 10, 10, None, True)]

    async def remote_counts(self, vhost: str, name: str) -> QueueCounts:
        raise MembershipRefused(503, "no leader")

    def quorum_critical(self, node: str) -> list[tuple[str, str]]:
        return []

    async def add_member(self, vhost: str, name: str, node: str) -> None:
        self._maybe_refuse()
        self.members_added.append((vhost, name, node))

    async def delete_member(self, vhost: str, name: str, node: str, force: bool = False) -> None:
        self._maybe_refuse()

    async def transfer_leader(self, vhost: str, name: str, node: str) -> None:
        self._maybe_refuse()

    async def grow(self, node: str, strategy: str, vhost_pattern: str, queue_pattern: str,
                   progress: Progress = None) -> list[JsonObject]:
        self._maybe_refuse()
        return []

    async def shrink(self, node: str, errors_only: bool,
                     progress: Progress = None) -> list[JsonObject]:
        self._maybe_refuse()
        return []

    async def rebalance(self, vhost_pattern: str, queue_pattern: str,
                        progress: Progress = None) -> list[JsonObject]:
        self._maybe_refuse()
        items: list[JsonObject] = [{"vhost": "/", "name": "q", "result": "ok", "done": 1,
                                    "total": 1}]
        if progress is not None:
            progress(items[0])
        return items

    async def drain(self, node: str, exclude: set[str],
                    progress: Progress = None) -> list[JsonObject]:
        self._maybe_refuse()
        return []

    async def hand_off_leaders(self, node: str, progress: Progress = None) -> list[JsonObject]:
        self._maybe_refuse()
        return []

    async def forget_node(self, node: str) -> None:
        self._maybe_refuse()


AUTH = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}


@pytest.fixture
async def api() -> AsyncIterator[tuple[TestClient[Any, Any], FakePort]]:
    port = FakePort()
    typed: ManagementPort = port  # the fake is a whole port (checked by mypy)
    client: TestClient[Any, Any] = TestClient(TestServer(make_app(typed)))
    await client.start_server()
    try:
        yield client, port
    finally:
        await client.close()


async def test_queue_list_shows_the_ports_counts(api: tuple[TestClient[Any, Any], FakePort]) -> None:
    client, port = api
    resp = await client.put("/api/queues/%2F/q1", json={"durable": True}, headers=AUTH)
    assert resp.status == 201, await resp.text()
    resp = await client.put("/api/queues/%2F/q2", json={"durable": True}, headers=AUTH)
    assert resp.status == 201
    port.counts[("/", "q1")] = QueueCounts(messages=5, messages_ready=3,
                                           messages_unacknowledged=2, consumers=1,
                                           delivery_limit=20)
    resp = await client.get("/api/queues", headers=AUTH)
    assert resp.status == 200
    body = await resp.json()
    by_name = {q["name"]: q for q in body}
    assert set(by_name) == {"q1", "q2"}
    q1, q2 = by_name["q1"], by_name["q2"]
    assert (q1["messages"], q1["messages_ready"], q1["messages_unacknowledged"],
            q1["consumers"], q1["counts_known"]) == (5, 3, 2, 1, True)
    assert q1["type"] == "quorum" and q1["delivery_limit"] == 20
    assert q1["members"] == NODES and q1["online"] == NODES[:2] and q1["leader"] == ME
    # no local replica, and the leader cannot be asked: unknown, shown as 0
    assert q2["counts_known"] is False and q2["messages"] == 0
    resp = await client.get("/api/overview", headers=AUTH)
    overview = await resp.json()
    assert overview["queue_totals"] == {"messages": 5, "messages_ready": 3,
                                        "messages_unacknowledged": 2}
    assert overview["object_totals"]["connections"] == 4
    assert overview["listeners"] == [{"node": ME, "protocol": "amqp", "port": 5672}]


async def test_unknown_queue_is_a_404(api: tuple[TestClient[Any, Any], FakePort]) -> None:
    client, _port = api
    resp = await client.get("/api/queues/%2F/nope", headers=AUTH)
    assert resp.status == 404
    assert await resp.json() == {"error": "not_found", "reason": "no queue 'nope' in vhost '/'"}
    resp = await client.get("/api/queues/nowhere/q", headers=AUTH)
    assert resp.status == 404
    assert (await resp.json())["reason"] == "no vhost 'nowhere'"


async def test_membership_refusal_keeps_its_status(api: tuple[TestClient[Any, Any], FakePort]) -> None:
    client, port = api
    await client.put("/api/queues/%2F/q1", json={}, headers=AUTH)
    resp = await client.post("/api/queues/%2F/q1/members", json={"node": "rabbit@fake2"},
                             headers=AUTH)
    assert resp.status == 204
    assert port.members_added == [("/", "q1", "rabbit@fake2")]
    port.refusal = MembershipRefused(409, "queue 'q1' already has a member on 'rabbit@fake2'")
    resp = await client.post("/api/queues/%2F/q1/members", json={"node": "rabbit@fake2"},
                             headers=AUTH)
    assert resp.status == 409
    assert await resp.json() == {"error": "conflict",
                                 "reason": "queue 'q1' already has a member on 'rabbit@fake2'"}
    # a status outside 4xx/5xx is still a client error
    port.refusal = MembershipRefused(200, "odd")
    resp = await client.get("/api/queues/%2F/q1/quorum-status", headers=AUTH)
    assert resp.status == 400
    # an unknown node is refused before the port is asked
    resp = await client.post("/api/queues/%2F/q1/members", json={"node": "rabbit@elsewhere"},
                             headers=AUTH)
    assert resp.status == 404


async def test_quorum_status_rows(api: tuple[TestClient[Any, Any], FakePort]) -> None:
    client, _port = api
    await client.put("/api/queues/%2F/q1", json={}, headers=AUTH)
    resp = await client.get("/api/queues/%2F/q1/quorum-status", headers=AUTH)
    assert resp.status == 200
    assert await resp.json() == [{"node": ME, "voter": True, "raft_state": "leader", "term": 3,
                                  "commit_index": 10, "last_applied": 10, "match_index": None,
                                  "online": True}]


async def test_long_operation_streams_progress(api: tuple[TestClient[Any, Any], FakePort]) -> None:
    client, port = api
    resp = await client.post("/api/quorum-queues/rebalance?progress=true", json={}, headers=AUTH)
    assert resp.status == 200
    lines = (await resp.text()).splitlines()
    assert lines[0].startswith('{"progress"') and lines[-1].startswith('{"result"')
    port.refusal = MembershipRefused(409, "busy")
    resp = await client.post("/api/quorum-queues/rebalance", json={}, headers=AUTH)
    assert resp.status == 409


async def test_purge_failure_maps_the_reply_code(api: tuple[TestClient[Any, Any], FakePort]) -> None:
    client, port = api
    await client.put("/api/queues/%2F/q1", json={}, headers=AUTH)
    resp = await client.delete("/api/queues/%2F/q1/contents", headers=AUTH)
    assert resp.status == 204
    assert port.queues[("/", "q1")].commands == [qm.Purge()]
    port.queues[("/", "q1")].fail = QueueCommandFailed(404, "queue 'q1' in vhost '/' is gone")
    resp = await client.delete("/api/queues/%2F/q1/contents", headers=AUTH)
    assert resp.status == 503
    assert (await resp.json())["reason"] == "queue 'q1' in vhost '/' is gone"
    port.queues[("/", "q1")].fail = QueueCommandFailed(406, "refused")
    resp = await client.delete("/api/queues/%2F/q1/contents", headers=AUTH)
    assert resp.status == 400


async def test_nodes_and_readiness(api: tuple[TestClient[Any, Any], FakePort]) -> None:
    client, _port = api
    resp = await client.get("/api/nodes", headers=AUTH)
    nodes = {n["name"]: n for n in await resp.json()}
    assert list(nodes) == NODES
    assert nodes[ME]["running"] and nodes[ME]["metadata_leader"] and nodes[ME]["disk_free"] == 1
    assert not nodes["rabbit@fake3"]["running"] and nodes["rabbit@fake3"]["disk_free"] is None
    resp = await client.get("/api/health/ready")
    assert resp.status == 200 and await resp.json() == {"status": "ok"}
