"""Node calls: the node-local views a peer may ask for, and asking every node.

Where it sits: a collaborator of the node (`Node.calls`). The management API
of any node shows the whole cluster's connections, channels, consumers,
totals, resources, per-queue message stats and queue storage, as
RabbitMQ's does: `NodePort` (runtime/mgmt_port.py) asks `cluster_call(op,
args)`, which answers `serve_call(op, args)` here and asks every connected
peer the same over the cluster (`Cluster.call`, peer message `Call`); a peer
serves it with its own `serve_call` (through `Node.serve_call`, the name
`ClusterHost` gives it). A peer that does not answer within the timeout is
left out. `close_local_connection` force-closes one of this node's AMQP
connections (the management API's DELETE, carried out on the connection's
node).

It sees the node through `NodeCallsHost`, so it is unit-tested against fakes
(tests/runtime/test_node_calls.py).
May import: the pure cores, storage's manifest, `alarms`, `limits.Counts`,
`msg_stats`, the queue types (a queue's storage is its `QuorumQueue`'s log).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping
from typing import Any, Protocol

import broker.storage.manifest as st_manifest

from .alarms import Alarms
from .limits import Counts
from .msg_stats import NodeStats
from .queues import QueueProcess, QuorumQueue

log = logging.getLogger("broker.node_calls")

#: how long `cluster_call` waits for each peer's answer, by default
CALL_TIMEOUT_S = 3.0


class LocalChannel(Protocol):
    """One AMQP channel of this node (runtime/channel.py `Channel`)."""

    def info(self) -> dict[str, Any]: ...

    def consumer_infos(self) -> list[dict[str, Any]]: ...


class LocalConnection(Protocol):
    """One AMQP connection of this node (runtime/amqp_server.py `AmqpConnection`)."""

    @property
    def name(self) -> str: ...

    @property
    def vhost(self) -> str: ...  # "" until past the login

    @property
    def channels(self) -> Mapping[int, LocalChannel]: ...

    def info(self) -> dict[str, Any]: ...

    def force_close(self, text: str) -> None: ...


class Transport(Protocol):
    def is_connected(self, peer: str) -> bool: ...


class Peers(Protocol):
    """The cluster's peers and its calls (runtime/cluster.py `Cluster`)."""

    @property
    def peers(self) -> Mapping[str, object]: ...

    @property
    def transport(self) -> Transport: ...

    async def call(self, peer: str, op: str, args: object, timeout: float) -> Any: ...  # msgpack-decoded


class LocalLimits(Protocol):
    def local_counts(self) -> Counts: ...


class NodeCallsHost(Protocol):
    @property
    def node_name(self) -> str: ...

    @property
    def connections(self) -> Collection[LocalConnection]: ...

    @property
    def cluster(self) -> Peers | None: ...

    @property
    def msg_stats(self) -> NodeStats | None: ...  # None until the first AMQP connection

    @property
    def alarms(self) -> Alarms: ...

    @property
    def storage_usage(self) -> Mapping[str, int]: ...

    @property
    def limits(self) -> LocalLimits: ...

    def queue(self, vhost: str, name: str) -> QueueProcess | None: ...


class NodeCalls:
    def __init__(self, host: NodeCallsHost) -> None:
        self.host = host

    # ------------------------------------------------------------ node-local views
    def local_connections(self) -> list[dict[str, Any]]:
        """This node's AMQP connections (past the login), as the management
        API shows them."""
        return [c.info() for c in list(self.host.connections) if c.vhost]

    def local_channels(self) -> list[dict[str, Any]]:
        return [ch.info() for c in list(self.host.connections) for ch in list(c.channels.values())]

    def local_consumers(self) -> list[dict[str, Any]]:
        return [info for c in list(self.host.connections) for ch in list(c.channels.values())
                for info in ch.consumer_infos()]

    def close_local_connection(self, name: str, reason: str) -> bool:
        """Force-close this node's connection `name` (320 CONNECTION_FORCED)."""
        found = False
        for conn in list(self.host.connections):
            if conn.name == name:
                conn.force_close(reason)
                found = True
        return found

    # ------------------------------------------------------------ calls
    def serve_call(self, op: str, args: Any) -> Any:  # args and answer: msgpack-encodable
        """A peer's node-local question (Cluster.call): the management API of
        any node shows the whole cluster's connections, channels and consumers."""
        host = self.host
        if op == "connections":
            return self.local_connections()
        if op == "channels":
            return self.local_channels()
        if op == "consumers":
            return self.local_consumers()
        if op == "totals":
            stats = host.msg_stats
            return {"connections": sum(1 for c in list(host.connections) if c.vhost),
                    "channels": sum(len(c.channels) for c in list(host.connections)),
                    "message_stats": stats.totals.message_stats() if stats is not None else None}
        if op == "queue_stats":
            # [[vhost, name, created_at, message_stats]] of this node's channels
            stats = host.msg_stats
            want = tuple(args) if args else None
            return [] if stats is None else [
                [uid[0], uid[1], uid[2], c.message_stats()] for uid, c in list(stats.queues.items())
                if want is None or (uid[0], uid[1]) == want]
        if op == "resources":
            a = host.alarms
            return {"node": host.node_name, "disk_free": a.disk_free, "disk_free_limit": a.disk_limit,
                    "mem_used": a.mem_used, "mem_limit": a.mem_limit,
                    "alarms": sorted(a.local), **host.storage_usage}
        if op == "queue_storage":
            # this node's replica of one queue: its segment and snapshot files
            q = host.queue(str(args[0]), str(args[1]))
            if not isinstance(q, QuorumQueue):
                return None
            return {"node": host.node_name, **st_manifest.group_usage(q.glog.path)}
        if op == "limit_counts":
            return host.limits.local_counts().to_wire()
        if op == "close_connection":
            return self.close_local_connection(str(args[0]), str(args[1]))
        raise ValueError(f"unknown call {op!r}")

    async def cluster_call(self, op: str, args: Any = None,
                           timeout: float = CALL_TIMEOUT_S) -> list[Any]:
        """`serve_call(op, args)` here and on every connected peer; the
        answers in node order. A peer that does not answer in time is left
        out (RabbitMQ's lists leave out unreachable nodes too)."""
        answers: list[Any] = [self.serve_call(op, args)]
        cluster = self.host.cluster
        if cluster is None:
            return answers
        peers = [p for p in sorted(cluster.peers) if cluster.transport.is_connected(p)]
        results = await asyncio.gather(*(cluster.call(p, op, args, timeout) for p in peers),
                                       return_exceptions=True)
        for peer, r in zip(peers, results, strict=True):
            if isinstance(r, BaseException):
                log.warning("%s from %s: no answer: %s", op, peer, r)
            else:
                answers.append(r)
        return answers


__all__ = ["CALL_TIMEOUT_S", "NodeCalls", "NodeCallsHost"]
