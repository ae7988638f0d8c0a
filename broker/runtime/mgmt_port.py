"""The management port over a running `Node` (`broker.mgmt.port.ManagementPort`).

Where it sits: the one place that knows how the management API's questions
map onto the node's object graph (queue processes, Raft groups, the
metadata store, the cluster, membership, alarms, storage). The process
(runtime/app.py `start_management`) hands a `NodePort` over the started node
to `broker.mgmt.start_servers`; the management package
sees only the port's typed views and errors, never the node. Runtime errors
become the port's typed errors here (`MembershipError` -> `MembershipRefused`,
`ChannelError` -> `QueueCommandFailed`, a failed peer call -> `PeerUnreachable`).
"""
from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import broker.metadata as md
import broker.queue as qm
from broker.common.config import Config
from broker.common.histogram import Histogram
from broker.mgmt.port import (
    AlarmStatus,
    JsonObject,
    LiveAccounting,
    MemberSample,
    MembershipRefused,
    MemberStatus,
    NodeResources,
    NodeStatus,
    NodeTotals,
    PeerUnreachable,
    Progress,
    QueueCommandFailed,
    QueueCounts,
    QueueStatsPart,
    RaftMemberStatus,
    SegmentUsage,
    StoredMessage,
)

from .errors import ChannelError
from .membership import MembershipError
from .queues import QueueProcess, QuorumQueue

if TYPE_CHECKING:
    from .node import Node

T = TypeVar("T")


async def _membership(aw: Awaitable[T]) -> T:
    try:
        return await aw
    except MembershipError as exc:
        raise MembershipRefused(exc.status, exc.reason) from None


def _opt_int(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class QueueRef:
    """A `QueueHandle` over one queue process of the node."""

    def __init__(self, node: Node, q: QueueProcess) -> None:
        self._node = node
        self._q = q

    @property
    def vhost(self) -> str:
        return self._q.vhost

    @property
    def name(self) -> str:
        return self._q.name

    async def command(self, cmd: qm.Command) -> object:
        try:
            return await self._node.commands.queue_command(self._q, cmd)
        except ChannelError as exc:
            raise QueueCommandFailed(exc.code, exc.text) from None

    def command_reliable(self, cmd: qm.Command, on_applied: Callable[[], None] | None = None) -> None:
        self._node.commands.queue_command_reliable(self._q.uid, cmd, on_applied)

    def message(self, key: int) -> StoredMessage:
        """A message the handle's basic.get dequeued (commands.dequeued_message)."""
        msg = self._node.commands.dequeued_message(self._q, key)
        if msg is None:
            raise KeyError(f"message {key} of queue '{self._q.name}' is not readable on this node")
        props, body, exchange, routing_key = msg[:4]
        return StoredMessage(bytes(props), bytes(body), exchange, routing_key)

    def enqueue(self, properties: bytes, body: bytes, exchange: str, routing_key: str,
                priority: int | None, expiration_ms: int | None) -> Awaitable[object]:
        try:
            fut = self._q.enqueue(None, 0, properties, body, exchange, routing_key, priority,
                                  expiration_ms)
        except Exception as exc:  # a stopped group
            raise QueueCommandFailed(503, str(exc)) from None

        async def wait() -> object:
            try:
                return await fut
            except Exception as exc:
                raise QueueCommandFailed(503, str(exc)) from None
        return wait()


class NodePort:
    """`ManagementPort` over `node` (see broker/mgmt/port.py for each operation)."""

    def __init__(self, node: Node) -> None:
        self._node = node

    # ------------------------------------------------------------ the node
    @property
    def node_name(self) -> str:
        return self._node.node_name

    @property
    def incarnation(self) -> str:
        return self._node.incarnation

    @property
    def config(self) -> Config:
        return self._node.config

    def node_status(self) -> NodeStatus:
        n = self._node
        g = n.meta.group
        return NodeStatus(
            name=n.node_name, amqp_port=n.port, clustered=n.cluster is not None,
            metadata_leader=None if g.leader is None else str(g.leader),
            metadata_is_leader=bool(g.is_leader),
            metadata_voter=n.node_name in g.node.config.voters,
            metadata_commit_index=g.node.status().commit)

    def cluster_nodes(self) -> list[str]:
        return self._node.cluster_nodes()

    def is_running(self, node: str) -> bool:
        return node == self._node.node_name or self._node.peer_connected(node)

    def alarm_status(self) -> AlarmStatus:
        a = self._node.alarms
        return AlarmStatus(
            local=frozenset(a.local),
            remote={peer: frozenset(held) for peer, held in a.remote.items()},
            in_effect=tuple(a.cluster_alarms()), disk_free=a.disk_free,
            disk_limit=a.disk_limit, mem_used=a.mem_used, mem_limit=a.mem_limit)

    def stopped_members(self) -> dict[str, str]:
        return self._node.stopped_members()

    def wal_stats(self) -> Mapping[str, int]:
        storage = self._node.storage
        return dict(storage.stats) if storage is not None else {}

    def wal_sync_histogram(self) -> Histogram | None:
        storage = self._node.storage
        return storage.sync_hist if storage is not None else None

    # ------------------------------------------------------------ the cluster
    async def cluster_totals(self) -> list[NodeTotals]:
        return [NodeTotals(int(t["connections"]), int(t["channels"]), t.get("message_stats"))
                for t in await self._node.calls.cluster_call("totals")]

    async def cluster_resources(self) -> list[NodeResources]:
        out = []
        for r in await self._node.calls.cluster_call("resources"):
            out.append(NodeResources(
                node=str(r["node"]), disk_free=_opt_int(r.get("disk_free")),
                disk_free_limit=_opt_int(r.get("disk_free_limit")),
                mem_used=_opt_int(r.get("mem_used")), mem_limit=_opt_int(r.get("mem_limit")),
                alarms=tuple(r.get("alarms") or ()), wal_bytes=_opt_int(r.get("wal_bytes")),
                segment_files=_opt_int(r.get("segment_files")),
                segment_bytes=_opt_int(r.get("segment_bytes")),
                snapshot_bytes=_opt_int(r.get("snapshot_bytes"))))
        return out

    async def cluster_queue_stats(self, only: tuple[str, str] | None = None
                                  ) -> list[QueueStatsPart]:
        return [QueueStatsPart(vhost, name, created_at, stats)
                for answer in await self._node.calls.cluster_call("queue_stats",
                                                                  list(only) if only else None)
                for vhost, name, created_at, stats in answer]

    async def cluster_list(self, what: Literal["connections", "channels", "consumers"]
                           ) -> list[JsonObject]:
        return [item for answer in await self._node.calls.cluster_call(what) for item in answer]

    async def queue_storage(self, vhost: str, name: str) -> list[JsonObject]:
        return [a for a in await self._node.calls.cluster_call("queue_storage", [vhost, name]) if a]

    async def close_connection(self, node: str | None, name: str, reason: str) -> None:
        n = self._node
        if node in (None, n.node_name) or n.cluster is None:
            n.calls.close_local_connection(name, reason)
            return
        try:
            await n.cluster.call(node, "close_connection", [name, reason], 5.0)
        except (TimeoutError, ConnectionError, RuntimeError) as exc:
            raise PeerUnreachable(503, str(exc)) from None

    # ------------------------------------------------------------ metadata
    def metadata(self) -> md.MetadataState:
        return self._node.meta.state

    async def meta_execute(self, cmd: md.Command) -> md.Reply | None:
        reply: md.Reply | None = await self._node.meta_execute(cmd)
        return reply

    async def declare_queue(self, vhost: str, name: str, *, durable: bool, auto_delete: bool,
                            arguments: dict[str, Any]) -> md.Reply | None:
        reply: md.Reply | None = await self._node.declarations.declare_queue(
            vhost, name, durable=durable, exclusive_owner=None, auto_delete=auto_delete,
            arguments=arguments, passive=False, server_named=False)
        return reply

    async def delete_queue(self, vhost: str, name: str, if_unused: bool,
                           if_empty: bool) -> md.Reply | None:
        reply: md.Reply | None
        reply, _count = await self._node.declarations.delete_queue(
            vhost, name, if_unused, if_empty, None)
        return reply

    # ------------------------------------------------------------ queues here
    def _member(self, vhost: str, name: str) -> QuorumQueue | None:
        q = self._node.queues.get((vhost, name))
        return q if isinstance(q, QuorumQueue) else None

    def queue_leader(self, record: md.QueueRecord) -> str | None:
        q = self._member(record.vhost, record.name)
        if q is not None and q.group.leader is not None:
            return str(q.group.leader)
        return record.leader

    def local_counts(self, vhost: str, name: str) -> QueueCounts | None:
        q = self._node.queues.get((vhost, name))
        if q is None or q.kind == "quorum" and not isinstance(q, QuorumQueue):
            return None  # no replica here (a RemoteQueue proxy)
        return QueueCounts.of(q.overview())

    def leader_counts(self, vhost: str, name: str) -> QueueCounts | None:
        q = self._node.queues.get((vhost, name))
        if q is None:
            return None
        if isinstance(q, QuorumQueue) and q.is_leader or q.kind == "classic":
            return QueueCounts.of(q.overview())
        return None

    def local_queue(self, vhost: str, name: str) -> QueueRef | None:
        q = self._node.queue(vhost, name)
        return QueueRef(self._node, q) if q is not None else None

    def borrow_channel(self, ref: str) -> None:
        self._node.borrow_channel(ref)

    def give_back_channel(self, ref: str) -> None:
        self._node.give_back_channel(ref)

    def _members(self) -> list[QuorumQueue]:
        return [q for q in list(self._node.queues.values()) if isinstance(q, QuorumQueue)]

    def member_samples(self, include_quiet: bool = True) -> list[MemberSample]:
        return [MemberSample(q.vhost, q.name, q.group.applied_index, q.group.last_applied_ms,
                             None if q.group.leader is None else str(q.group.leader))
                for q in self._members() if include_quiet or not q.group.quiesced]

    def raft_members(self) -> list[RaftMemberStatus]:
        out = []
        for q in self._members():
            g = q.group
            st = g.node.status()
            smeta = q.glog.snapshot_meta()
            out.append(RaftMemberStatus(
                q.vhost, q.name, bool(g.is_leader), st.term, st.commit, g.applied_index,
                st.last_index, smeta.index if smeta is not None else 0, bool(g.quiesced)))
        return out

    def segment_usage(self, vhost: str, name: str) -> SegmentUsage:
        q = self._member(vhost, name)
        if q is None:
            return SegmentUsage(0, 0)
        files = q.glog.segment_files()
        size = 0
        for f in files:
            try:
                size += os.stat(f).st_size
            except OSError:
                pass
        return SegmentUsage(len(files), size)

    def group_id(self, record: md.QueueRecord) -> str:
        return self._node.registry.group_id(record)

    def data_dir(self) -> str:
        storage = self._node.storage
        assert storage is not None, "the node's storage is not open"
        return str(storage.data_dir)

    def live_accounting(self) -> dict[str, LiveAccounting]:
        out = {}
        for q in self._members():
            acc = q.storage_accounting()
            out[acc["group_id"]] = LiveAccounting(
                q.vhost, q.name, acc["live_indexes"], acc["oldest_live_timestamp_ms"],
                acc["oldest_live_holder"], acc["live_messages"])
        return out

    # ------------------------------------------------------------ membership
    async def quorum_status(self, vhost: str, name: str) -> list[MemberStatus]:
        rows = await _membership(self._node.membership.quorum_status(vhost, name))
        return [MemberStatus(
            node=str(r["node"]), voter=bool(r["voter"]), raft_state=str(r["raft_state"]),
            term=int(r["term"]), commit_index=int(r["commit_index"]),
            last_applied=_opt_int(r.get("last_applied")), match_index=_opt_int(r.get("match_index")),
            online=bool(r["online"])) for r in rows]

    async def remote_counts(self, vhost: str, name: str) -> QueueCounts:
        return QueueCounts.of(await _membership(self._node.membership.queue_overview(vhost, name)))

    def quorum_critical(self, node: str) -> list[tuple[str, str]]:
        return sorted((str(a), str(b)) for a, b in self._node.membership.quorum_critical(node))

    async def add_member(self, vhost: str, name: str, node: str) -> None:
        await _membership(self._node.membership.add_member(vhost, name, node))

    async def delete_member(self, vhost: str, name: str, node: str, force: bool = False) -> None:
        await _membership(self._node.membership.delete_member(vhost, name, node, force=force))

    async def transfer_leader(self, vhost: str, name: str, node: str) -> None:
        await _membership(self._node.membership.transfer_leader(vhost, name, node))

    async def grow(self, node: str, strategy: str, vhost_pattern: str, queue_pattern: str,
                   progress: Progress = None) -> list[JsonObject]:
        return await _membership(self._node.membership.grow(
            node, strategy, vhost_pattern=vhost_pattern, queue_pattern=queue_pattern,
            progress=progress))

    async def shrink(self, node: str, errors_only: bool,
                     progress: Progress = None) -> list[JsonObject]:
        return await _membership(self._node.membership.shrink(
            node, errors_only=errors_only, progress=progress))

    async def rebalance(self, vhost_pattern: str, queue_pattern: str,
                        progress: Progress = None) -> list[JsonObject]:
        return await _membership(self._node.membership.rebalance(
            vhost_pattern=vhost_pattern, queue_pattern=queue_pattern, progress=progress))

    async def drain(self, node: str, exclude: set[str],
                    progress: Progress = None) -> list[JsonObject]:
        return await _membership(self._node.membership.drain(
            node, progress=progress, exclude=exclude))

    async def hand_off_leaders(self, node: str, progress: Progress = None) -> list[JsonObject]:
        return await _membership(self._node.membership.hand_off_leaders(node, progress=progress))

    async def forget_node(self, node: str) -> None:
        await _membership(self._node.membership.forget_node(node))


__all__ = ["NodePort", "QueueRef"]
