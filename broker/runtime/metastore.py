"""The metadata store: the cluster metadata machine replicated by its Raft group.

Where it sits: AMQP channels, the management API and the node itself call
`execute(command)`; the command is proposed to the metadata Raft group and,
once committed, applied on every node by `broker.metadata.apply`. Effects
(queue declared/deleted, members changed, policy changed, ...) are handed to
the node (`on_effects`) on every node, so each node starts and stops its own
queue members to match the metadata. Reads (routing, permissions) use the
local replica.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from broker import metadata as md
from broker import storage as st
from broker.raft import Membership, NodeId, RaftConfig, Role

from . import wire
from .raft_group import RaftGroup, encode_membership

log = logging.getLogger("broker.metastore")

META_GROUP = "__metadata__"
#: runtime-parameter component recording joined nodes' peer addresses ("host:port")
CLUSTER_NODES = "cluster_nodes"


class MetadataStore:
    def __init__(
        self,
        node_name: str,
        glog: st.GroupLog,
        members: list[str],
        send: Callable[[str, Any], None],
        raft_config: RaftConfig,
        on_effects: Callable[[list[Any]], None],
        forward: Callable[[str, bytes], Awaitable[int]] | None = None,
        learner: bool = False,
        on_cluster_node: Callable[[str, str], None] | None = None,
        default_user: str = "guest",
        default_pass: str = "guest",
        default_vhost: str = "/",
    ) -> None:
        self.glog = glog
        self._on_effects = on_effects
        self._forward = forward
        self._on_cluster_node = on_cluster_node
        # Replies by log index (every node computes the same reply for an
        # entry): a command forwarded to the leader gets its reply from the
        # local replica once that applied the entry. Bounded.
        self.replies: OrderedDict[int, Any] = OrderedDict()
        self._index_waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._default = (default_user, default_pass, default_vhost)
        self.state = md.new_state()
        applied = 0
        snap = glog.latest_snapshot()
        if snap is not None:
            self.state = md.from_bytes(snap.data)
            applied = snap.meta.index
        self.group = RaftGroup(
            META_GROUP, node_name, glog,
            # A joining node starts knowing no configuration: it cannot campaign
            # and takes the configuration from the leader's log.
            Membership(frozenset() if learner else frozenset(NodeId(m) for m in members)),
            self._apply, send, raft_config=raft_config, on_role_change=self._role_changed,
            on_snapshot=self._install_snapshot, applied=applied,
        )
        self._since_snapshot = 0
        self.snapshot_every = 10_000
        self.bootstrapped = bool(self.state.vhosts)

    # ------------------------------------------------------------- commands
    async def execute(self, cmd: Any) -> Any:
        """Propose (on the leader, or forwarded to it), wait until applied
        here, return the machine's reply (errors come back as
        `MetadataError` values, not exceptions)."""
        payload = wire.pack(wire.encode_meta_command(cmd))
        if self.group.is_leader or self._forward is None:
            return await self.group.propose(payload)
        index = await self._forward(self.group.leader or "", payload)
        await self.wait_applied(index)
        return self.replies.get(index)

    async def wait_applied(self, index: int) -> None:
        if self.group.applied_index >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._index_waiters.setdefault(index, []).append(fut)
        await fut

    def _apply(self, index: int, term: int, ts: int, payload: bytes) -> Any:
        cmd = wire.decode_meta_command(wire.unpack(payload))
        self.state, reply, effects = md.apply(md.CommandMeta(index, ts), cmd, self.state)
        if isinstance(cmd, md.Bootstrap) or self.state.vhosts:
            self.bootstrapped = True
        if effects:
            self._on_effects(list(effects))
        if isinstance(cmd, md.SetParameter) and cmd.component == CLUSTER_NODES:
            self._announce_nodes()
        self.replies[index] = reply
        if len(self.replies) > 10_000:
            self.replies.popitem(last=False)
        if self._index_waiters:
            for i in [i for i in self._index_waiters if i <= index]:
                for w in self._index_waiters.pop(i):
                    if not w.done():
                        w.set_result(None)
        self._since_snapshot += 1
        if self._since_snapshot >= self.snapshot_every:
            self._snapshot()
        return reply

    def _snapshot(self) -> None:
        node = self.group.node
        index = self.group.applied_index
        if index > node.max_snapshot_index():
            return
        meta = node.snapshot_meta(index)
        self.glog.save_snapshot(meta.index, meta.term, encode_membership(meta.config),
                                md.to_bytes(self.state))
        node.compacted()
        self.glog.release(index + 1)
        self._since_snapshot = 0

    def _install_snapshot(self, data: bytes) -> None:
        self.state = md.from_bytes(data)
        self.bootstrapped = bool(self.state.vhosts)
        self._announce_nodes()

    def _announce_nodes(self) -> None:
        """Tell the node every cluster node's address recorded in the metadata."""
        if self._on_cluster_node is None:
            return
        for (_vhost, component, name), p in list(self.state.parameters.items()):
            if component == CLUSTER_NODES and isinstance(p.value, str):
                self._on_cluster_node(name, p.value)

    def _role_changed(self, role: Role, leader: NodeId | None) -> None:
        # Only a brand-new log is bootstrapped: a restarted node replays its
        # Bootstrap entry instead (the callback runs before this term's first
        # entry is appended, so a fresh group's log is still empty here).
        if role is Role.LEADER and not self.bootstrapped and self.glog.last_index() == 0:
            user, password, vhost = self._default
            cmd = md.Bootstrap(md.hash_password(password, os.urandom(4)), md.UserName(user),
                               md.VhostName(vhost))
            fut = self.group.propose(wire.pack(wire.encode_meta_command(cmd)))
            fut.add_done_callback(lambda f: f.exception() and log.error("bootstrap failed: %s", f.exception()))
