"""Forwarding: where a queue's commands go, and the node's side of the
ordered publish path.

Where it sits: a collaborator of the node (`Node.forwarding`). A queue
process on a node that does not lead its queue forwards its commands to the
leader (`forward`, over the cluster's ordered requests, runtime/cluster.py);
the leader's node serves them (`submit_as_leader`); leaders send deliveries
for consumers on other nodes (`send_deliveries`) and the consumer's node
hands them to its queue process (`remote_deliveries`); a member that becomes
leader records itself in the metadata (`leader_elected`).

**Draining forwarded commands.** Per queue, the cluster keeps this node's
forwarded requests pending, in order, until the leader answers. When this
node becomes the leader itself, those requests must be proposed here before
anything newer (a publisher's numbers are accepted strictly in order):
`flush_forwarded` is the one place that does it. It takes the queue's
pending requests from the cluster and proposes each one directly on the
local leader (`QuorumQueue.propose`), in order, chaining its outcome to the
waiting future. It is called by a local leader's `QuorumQueue._submit`
before each proposal, and by the cluster's resync and retry loop when it
finds this node leading a queue with pending requests. It never goes back
through `QuorumQueue._submit`, so a publish does not re-enter the drain (it
used to: `_submit` -> `flush_forwarded` -> `submit_local` ->
`submit_as_leader` -> `_submit` -> `flush_forwarded`, a no-op by then).

It sees the node through `ForwardingHost`, so it is unit-tested against
fakes (tests/runtime/test_forwarding.py).
May import: the pure cores, `cluster.NotLeaderHere`, `membership.control`,
the queue process types.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable
from typing import Any, Protocol

from mypy_extensions import mypyc_attr

import broker.metadata as md
from broker.raft import NodeId

from .background import spawn
from .cluster import NotLeaderHere
from .membership import control as membership_control
from .metastore import META_GROUP
from .queues import QueueProcess, QuorumQueue, RemoteQueue

log = logging.getLogger("broker.forwarding")


class Pending(Protocol):
    """One forwarded request still waiting for its leader (cluster `_Request`)."""

    @property
    def payload(self) -> Any: ...

    @property
    def future(self) -> asyncio.Future[Any]: ...


class Requests(Protocol):
    """The cluster's ordered requests and deliveries (runtime/cluster.py `Cluster`)."""

    def request(self, target: str, vhost: str, queue: str, payload: Any) -> asyncio.Future[Any]: ...

    def has_pending(self, vhost: str, queue: str) -> bool: ...

    def take_pending(self, vhost: str, queue: str) -> Iterable[Pending]: ...

    def send_deliveries(self, node: str, vhost: str, queue: str, channel: str, tag: str,
                        deliveries: list[Any], bodies: dict[int, Any]) -> None: ...


class Queues(Protocol):
    """The node's queue processes and records (runtime/registry.py `Registry`)."""

    def queue(self, vhost: str, name: str) -> QueueProcess | None: ...

    def queue_record(self, vhost: str, name: str) -> md.QueueRecord | None: ...


class MetaGroup(Protocol):
    """What forwarding uses of the metadata's Raft group (a RaftGroup)."""

    leader: NodeId | None

    @property
    def is_leader(self) -> bool: ...

    def propose_indexed(self, payload: Any) -> tuple[int, asyncio.Future[Any]]: ...


class ForwardingHost(Protocol):
    node_name: str

    @property
    def cluster(self) -> Requests | None: ...

    @property
    def registry(self) -> Queues: ...

    @property
    def meta_group(self) -> MetaGroup: ...

    @property
    def unreachable(self) -> Collection[str]: ...

    async def meta_execute(self, cmd: Any) -> Any: ...


# Compiled (broker/compiled.py); the unit tests subclass it to count drains.
@mypyc_attr(allow_interpreted_subclasses=True)
class Forwarding:
    def __init__(self, host: ForwardingHost) -> None:
        self.host = host

    # ------------------------------------------------------------ where commands go
    def queue_leader(self, vhost: str, name: str) -> str | None:
        """Where to send commands for a queue: this node only if its member is
        the leader right now; else the leader its member knows, else the one
        the metadata records (never this node: that would be a stale record).
        None while no leader is known."""
        me = self.host.node_name
        if vhost == "" and name == META_GROUP:
            g = self.host.meta_group
            return me if g.is_leader else (g.leader if g.leader != me else None)
        q = self.host.registry.queue(vhost, name)
        if q is not None and not isinstance(q, RemoteQueue):
            if q.is_leader:
                return me
            lead = q.group.leader if isinstance(q, QuorumQueue) else None
            if lead and lead != me:
                return lead
        rec = self.recorded_leader(vhost, name)
        return rec if rec != me else None

    def recorded_leader(self, vhost: str, name: str) -> str | None:
        if vhost == "" and name == META_GROUP:
            return self.host.meta_group.leader
        r = self.host.registry.queue_record(vhost, name)
        return r.leader if r is not None else None

    def forward(self, leader: str, vhost: str, name: str, payload: Any) -> asyncio.Future[Any]:
        """Send a command to the queue's leader on another node. With no leader
        known (""), it waits in order until one is."""
        cluster = self.host.cluster
        if cluster is None:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            fut.set_exception(RuntimeError(f"queue '{name}' has no leader"))
            return fut
        if leader == self.host.node_name:
            leader = ""
        return cluster.request(leader, vhost, name, payload)

    async def forward_meta(self, leader: str, payload: bytes) -> tuple[int, bytes | None]:
        """A metadata command to the metadata group's leader (MetadataStore):
        the index of its entry and the leader's reply (`md.reply_to_bytes`;
        None from a leader of an earlier version, which sent the index only)."""
        result = await self.forward(leader, "", META_GROUP, payload)
        if isinstance(result, int):
            return result, None
        index, reply = result
        return int(index), None if reply is None else bytes(reply)

    # ------------------------------------------------------------ serving as leader
    def submit_as_leader(self, vhost: str, name: str, payload: Any) -> asyncio.Future[Any]:
        """Serve a forwarded command: only if this node leads that queue
        (NotLeaderHere otherwise). A queue command goes through the queue's
        `_submit`, which drains this node's own forwarded commands first."""
        return self._lead(vhost, name, payload, drained=False)

    def _lead(self, vhost: str, name: str, payload: Any, drained: bool) -> asyncio.Future[Any]:
        if vhost == "" and name == META_GROUP:
            g = self.host.meta_group
            if not g.is_leader:
                raise NotLeaderHere()
            index, fut = g.propose_indexed(payload)
            out: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

            def done(f: asyncio.Future[Any]) -> None:
                if f.cancelled() or f.exception() is not None:
                    out.set_exception(f.exception() or RuntimeError("cancelled"))
                else:  # the reply too: the forwarder's replica may not compute it
                    reply = f.result()
                    out.set_result([index, None if reply is None else md.reply_to_bytes(reply)])
            fut.add_done_callback(done)
            return out
        q = self.host.registry.queue(vhost, name)
        if q is None or isinstance(q, RemoteQueue) or not q.is_leader:
            raise NotLeaderHere()
        if payload and payload[0] == "M":  # membership control, see membership.control
            if not isinstance(q, QuorumQueue):  # membership checks the queue's type first
                raise RuntimeError(f"queue '{name}' in vhost '{vhost}' is not a quorum queue")
            result = membership_control(q, payload, self.host.unreachable)
            if isinstance(result, asyncio.Future):
                return result
            done_fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            done_fut.set_result(result)
            return done_fut
        if drained and isinstance(q, QuorumQueue):
            return q.propose(payload)  # the drain itself: not through _submit again
        return q._submit(payload)

    def flush_forwarded(self, vhost: str, name: str) -> None:
        """This node now leads the queue: propose the commands still pending
        with the old leader, in their order, before anything newer (see the
        module docstring: the one drain, never re-entered)."""
        cluster = self.host.cluster
        if cluster is None or not cluster.has_pending(vhost, name):
            return
        if self.queue_leader(vhost, name) != self.host.node_name:
            return
        for r in cluster.take_pending(vhost, name):
            self._propose_taken(vhost, name, r.payload, r.future)

    def _propose_taken(self, vhost: str, name: str, payload: Any,
                       future: asyncio.Future[Any]) -> None:
        try:
            inner = self._lead(vhost, name, payload, drained=True)
        except NotLeaderHere:
            # (not reached while draining: the drain checked the leadership and
            # nothing in it gives it up) pending again, in order, for the leader
            inner = self.forward(self.queue_leader(vhost, name) or "", vhost, name, payload)
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
            return

        def done(f: asyncio.Future[Any]) -> None:
            if future.done():
                return
            if f.cancelled() or f.exception() is not None:
                future.set_exception(f.exception() or RuntimeError("cancelled"))
            else:
                future.set_result(f.result())
        inner.add_done_callback(done)

    # ------------------------------------------------------------ deliveries, leadership
    def send_deliveries(self, node: str, vhost: str, name: str, channel: str, tag: str,
                        deliveries: list[Any], bodies: dict[int, Any]) -> None:
        cluster = self.host.cluster
        if cluster is not None:
            cluster.send_deliveries(node, vhost, name, channel, tag, deliveries, bodies)

    def remote_deliveries(self, vhost: str, name: str, channel: str, tag: str,
                          deliveries: list[Any], bodies: dict[int, Any]) -> None:
        q = self.host.registry.queue(vhost, name)
        if q is not None:
            q.remote_deliveries(channel, tag, deliveries, bodies)

    def leader_elected(self, vhost: str, name: str, term: int) -> None:
        """Record this node as the queue's leader, elected in `term` (the
        metadata keeps the latest term's leader whatever order reports land in)."""
        me = self.host.node_name
        r = self.host.registry.queue_record(vhost, name)
        if r is not None and (r.leader != me or r.leader_term < term):
            spawn(self.host.meta_execute(md.SetQueueLeader(
                md.VhostName(vhost), md.QueueName(name), md.NodeName(me), term)),
                f"recording this node as leader of {vhost}/{name}")
