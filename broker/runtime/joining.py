"""Joining: a node with an empty data directory enters a running cluster.

Where it sits: a collaborator of the node (`Node.joining`). A node that is
not one of `cluster.initial_members` and has no metadata yet starts as a
metadata learner with no members and runs `join()`: it asks the seeds
(`Join` with the address peers reach it at) every half second until the
metadata leader has added it and it is a voter (a learner is promoted once
caught up). A node that receives `Join` (`handle_join`, through
`Node.handle_join`, the name `ClusterHost` gives it) passes it on to the
metadata leader, unless it is the leader: then it records the joiner's
address as a `cluster_nodes` parameter in the metadata (every node then
connects to it: `learned_node`, the metadata store's `on_cluster_node`) and
adds it to the metadata group as a learner. One admission runs per joiner
at a time; a failed one is retried by the joiner's next request.

It sees the node through `JoiningHost`, so it is unit-tested against fakes
(tests/runtime/test_joining.py).
May import: the pure cores, `peer_wire`, `metastore.CLUSTER_NODES`, `raft_group`.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import broker.metadata as md
import broker.runtime.peer_wire as pw
from broker.raft import ConfChange, ConfChangeKind, NodeId

from .background import spawn
from .metastore import CLUSTER_NODES
from .raft_group import RaftGroup

log = logging.getLogger("broker.joining")

#: how often a joining node asks the seeds again
JOIN_RETRY_S = 0.5


class JoinPeers(Protocol):
    """What joining does with the cluster (runtime/cluster.py `Cluster`)."""

    def send_join(self, host: str, port: int) -> None: ...

    def send_to(self, peer: str, msg: pw.PeerMessage) -> None: ...

    def add_peer(self, name: str, host: str, port: int) -> None: ...


class Metadata(Protocol):
    """This node's metadata replica (runtime/metastore.py `MetadataStore`)."""

    @property
    def bootstrapped(self) -> bool: ...

    @property
    def group(self) -> RaftGroup: ...

    @property
    def state(self) -> md.MetadataState: ...

    async def execute(self, cmd: Any) -> Any: ...  # a metadata command; its reply


class JoiningHost(Protocol):
    @property
    def node_name(self) -> str: ...

    @property
    def cluster(self) -> JoinPeers | None: ...

    @property
    def meta(self) -> Metadata: ...


class Joining:
    def __init__(self, host: JoiningHost, peer_port: int, retry_s: float = JOIN_RETRY_S) -> None:
        """`peer_port`: `cluster.port`, where peers reach this node."""
        self.host = host
        self.peer_port = peer_port
        self.retry_s = retry_s
        #: joiners whose admission is running here (this node leads the metadata)
        self._in_progress: set[str] = set()  # joiners being admitted

    def advertised(self) -> tuple[str, int]:
        """Where peers reach this node: the host part of its name and the
        peer port (cluster.bind may be a wildcard)."""
        return self.host.node_name.rpartition("@")[2], self.peer_port

    def joined(self) -> bool:
        """The metadata has a leader and this node is one of its voters."""
        meta = self.host.meta
        return (meta.bootstrapped and meta.group.leader is not None
                and self.host.node_name in meta.group.node.config.voters)

    async def join(self) -> None:
        """Ask the seeds until the metadata leader has added this node (it then
        receives the metadata log as a learner and is promoted once caught up)."""
        cluster = self.host.cluster
        assert cluster is not None
        host, port = self.advertised()
        while not self.joined():
            cluster.send_join(host, port)
            await asyncio.sleep(self.retry_s)
        log.info("node %s: joined the cluster", self.host.node_name)

    def handle_join(self, name: str, host: str, port: int) -> None:
        """A node asks to join: the metadata leader records its address (every
        node then connects to it) and adds it to the metadata group as a
        learner; others pass the request on to the leader."""
        cluster = self.host.cluster
        if cluster is None:
            return
        g = self.host.meta.group
        if not g.is_leader:
            if g.leader and g.leader != self.host.node_name:
                cluster.send_to(g.leader, pw.Join(name, host, port))
            return
        cluster.add_peer(name, host, port)
        if name in self._in_progress:
            return
        self._in_progress.add(name)
        spawn(self._admit(g, name, host, port), f"admitting {name}")

    async def _admit(self, g: RaftGroup, name: str, host: str, port: int) -> None:
        meta = self.host.meta
        try:
            addr = f"{host}:{port}"
            rec = meta.state.parameters.get((md.VhostName("/"), CLUSTER_NODES, name))
            if rec is None or rec.value != addr:
                await meta.execute(md.SetParameter(md.VhostName("/"), CLUSTER_NODES, name, addr))
                g = meta.group  # (restarted in place meanwhile: the new one)
                if not g.is_leader:
                    return  # the joiner asks again, and reaches the leader
            if name not in g.node.config.members:
                await g.propose_conf(ConfChange(ConfChangeKind.ADD_LEARNER, NodeId(name)))
                log.info("node %s: admitted %s to the cluster", self.host.node_name, name)
        except Exception as exc:  # retried by the joiner's next request
            log.info("join of %s not done yet: %s", name, exc)
        finally:
            self._in_progress.discard(name)

    def learned_node(self, name: str, addr: str) -> None:
        """The metadata records a node's peer address (`cluster_nodes`): connect to it."""
        cluster = self.host.cluster
        if cluster is not None and name != self.host.node_name:
            host, _, port = addr.rpartition(":")
            cluster.add_peer(name, host, int(port))


__all__ = ["JOIN_RETRY_S", "Joining", "JoiningHost"]
