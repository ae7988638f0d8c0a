"""The metadata store: the cluster metadata machine replicated by its Raft group.

Where it sits: AMQP channels, the management API and the node itself call
`execute(command)`; the command is proposed to the metadata Raft group and,
once committed, applied on every node by `broker.metadata.apply`. Effects
(queue declared/deleted, members changed, policy changed, ...) are handed to
the node (`on_effects`) on every node, so each node starts and stops its own
queue members to match the metadata. Reads (routing, permissions) use the
local replica.

It is its group's `Machine` (runtime/machine.py): every applied entry is a
release cursor (the metadata needs no log entry once applied), so the group
snapshots every `SNAPSHOT_EVERY` entries and releases the log up to the
snapshot.
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
from .machine import Cursor, MachineSnapshot
from .raft_group import RaftGroup

log = logging.getLogger("broker.metastore")

META_GROUP = "__metadata__"
#: runtime-parameter component recording joined nodes' peer addresses ("host:port")
CLUSTER_NODES = "cluster_nodes"
#: Applied entries between two snapshots of the metadata.
SNAPSHOT_EVERY = 10_000


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
        # The group restores the state from the log's snapshot (restore).
        self.group = RaftGroup(
            META_GROUP, node_name, glog,
            # A joining node starts knowing no configuration: it cannot campaign
            # and takes the configuration from the leader's log.
            Membership(frozenset() if learner else frozenset(NodeId(m) for m in members)),
            self, send, raft_config=raft_config, on_role_change=self._role_changed,
            snapshot_interval=SNAPSHOT_EVERY,
        )
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

    # ------------------------------------------------------------- Machine
    def apply(self, index: int, term: int, timestamp_ms: int, command: Any) -> Any:
        cmd = wire.decode_meta_command(wire.unpack(command))
        self.state, reply, effects = md.apply(md.CommandMeta(index, timestamp_ms), cmd, self.state)
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
        return reply

    def release_cursor(self) -> Cursor:
        return Cursor.RELEASE

    def snapshot(self, index: int) -> MachineSnapshot:
        return MachineSnapshot(md.to_bytes(self.state), index + 1)

    def restore(self, data: bytes, installed: bool) -> None:
        self.state = md.from_bytes(data)
        if installed:  # the leader's, over this replica's state
            self.bootstrapped = bool(self.state.vhosts)
            self._announce_nodes()

    def snapshot_for_follower(self, data: bytes, index: int) -> bytes:
        return data

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
