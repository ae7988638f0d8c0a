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
snapshot. A replica that installs the leader's snapshot jumps over entries:
it hands the node the effects between its state and the snapshot's
(`metadata.effects_between`) instead of theirs.

A failed write (a full disk) stops the group; `restart_stopped` starts it
again in place over the same log once the node's disk is out of alarm, as
Ra's supervisor restarts a server (the queue members' equivalent is
`Registry.restart_stopped`). The new group replays the log from the
snapshot; the effects of the entries the stopped one had already applied
are not handed to the node again (it acted on them once).
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import broker.metadata as md
import broker.runtime.wire as wire
import broker.storage as st
from broker.raft import Membership, NodeId, RaftConfig, Role

from .backoff import RestartGate
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
        forward: Callable[[str, bytes], Awaitable[tuple[int, bytes | None]]] | None = None,
        learner: bool = False,
        on_cluster_node: Callable[[str, str], None] | None = None,
        default_user: str = "guest",
        default_pass: str = "guest",
        default_vhost: str = "/",
    ) -> None:
        self.glog = glog
        self._node_name = node_name
        self._send = send
        self._raft_config = raft_config
        self._on_effects = on_effects
        self._forward = forward
        self._on_cluster_node = on_cluster_node
        # Replies by log index (every node computes the same reply for an
        # entry): a command forwarded to the leader gets its reply from the
        # local replica once that applied the entry. Bounded.
        self.replies: OrderedDict[int, Any] = OrderedDict()
        self._index_waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._default = (default_user, default_pass, default_vhost)
        self._state = md.new_state()  # the machine's
        #: what readers see (routing, permissions, the registry, the API):
        #: the machine's state; while a group restarted in place replays up
        #: to what the node had applied (`_acted`), that state, never an
        #: older one (`_show` keeps it so)
        self.state = self._state
        #: entries up to this index were applied (and their effects handed to
        #: the node) by a group this one replaced (`restart_stopped`)
        self._effects_done_upto = 0
        #: the state the node acted on, while a restarted group replays up to it
        self._acted: md.MetadataState | None = None
        self.restart_gate = RestartGate()
        # The group restores the state from the log's snapshot (restore).
        # A joining node starts knowing no configuration: it cannot campaign
        # and takes the configuration from the leader's log.
        self.group = self._new_group(
            Membership(frozenset() if learner else frozenset(NodeId(m) for m in members)))
        self.bootstrapped = bool(self._state.vhosts)

    def _show(self) -> None:
        acted = self._acted
        self.state = self._state if acted is None else acted

    def _new_group(self, bootstrap: Membership) -> RaftGroup:
        return RaftGroup(
            META_GROUP, self._node_name, self.glog, bootstrap, self, self._send,
            raft_config=self._raft_config, on_role_change=self._role_changed,
            snapshot_interval=SNAPSHOT_EVERY,
        )

    # ------------------------------------------------------------- restart
    def restart_stopped(self, storage: st.LogManager) -> RaftGroup | None:
        """The group stopped on a failed write (`StorageIOError`: ENOSPC,
        EIO): start a new one over the same log, which already holds only
        what is durable (`GroupLog.wal_failed`), as a process restart would
        read it; the caller (the node, while its disk is not in alarm) puts
        it where the old one was. Waits while a write of the old group is
        still in flight; backs off 2..60 s between attempts. Corrupt data
        and broken invariants stay stopped. Returns the new group."""
        g, glog = self.group, self.glog
        if not isinstance(g.stopped, st.StorageIOError) or not self.restart_gate.due():
            return None
        if not glog.settled():
            return None  # unusable, or the old group's write still in flight
        log.warning("metadata: restarting the group stopped by %s (applied %d)", g.stopped,
                    g.applied_index)
        self.restart_gate.attempt()
        saved = (self._state, self._acted, self._effects_done_upto)
        acted = self.state
        old_applied = max(g.applied_index, self._effects_done_upto)
        bootstrap = g.storage.bootstrap
        g.close("the metadata group is restarting")
        glog.close()
        try:
            self.glog = storage.open_group(META_GROUP)
            self._effects_done_upto, self._acted = old_applied, acted
            # From the log alone, as a process restart: the log's snapshot
            # (if any) is restored by the new group (`restore`), its entries
            # replayed over it, at once.
            self._state = md.new_state()
            self._show()
            group = self._new_group(bootstrap)
        except Exception:
            # the old group stays, stopped, and readers keep what they saw;
            # tried again after the back-off
            self._state, self._acted, self._effects_done_upto = saved
            self._show()
            self.glog = glog
            raise
        self.group = group
        group.process_now()
        return group

    # ------------------------------------------------------------- commands
    async def execute(self, cmd: Any) -> Any:
        """Propose (on the leader, or forwarded to it), wait until applied
        here, return the machine's reply (errors come back as
        `MetadataError` values, not exceptions)."""
        payload = wire.pack(wire.encode_meta_command(cmd))
        if self.group.is_leader or self._forward is None:
            return await self.group.propose(payload)
        index, leader_reply = await self._forward(self.group.leader or "", payload)
        await self.wait_applied(index)
        reply = self.replies.get(index)
        if reply is None and leader_reply is not None:
            # Its entry reached this replica inside the leader's snapshot (or
            # is no longer among the replies kept): the leader's reply.
            reply = md.reply_from_bytes(leader_reply)
        return reply

    async def wait_applied(self, index: int) -> None:
        if self.group.applied_index >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._index_waiters.setdefault(index, []).append(fut)
        await fut

    # ------------------------------------------------------------- Machine
    def apply(self, index: int, term: int, timestamp_ms: int, command: Any) -> Any:
        cmd = wire.decode_meta_command(wire.unpack(command))
        self._state, reply, effects = md.apply(md.CommandMeta(index, timestamp_ms), cmd, self._state)
        if isinstance(cmd, md.Bootstrap) or self._state.vhosts:
            self.bootstrapped = True
        acted = self._acted
        if acted is not None and index >= self._effects_done_upto:
            self._acted = acted = None  # replayed up to what the node acted on
        if acted is None:
            self.state = self._state  # (the node reads it acting on the effects)
            if effects and index > self._effects_done_upto:
                self._on_effects(list(effects))
        if isinstance(cmd, md.SetParameter) and cmd.component == CLUSTER_NODES:
            self._announce_nodes()
        self.replies[index] = reply
        if len(self.replies) > 10_000:
            self.replies.popitem(last=False)
        self._applied_upto(index)
        return reply

    def _applied_upto(self, index: int) -> None:
        if self._index_waiters:
            for i in [i for i in self._index_waiters if i <= index]:
                for w in self._index_waiters.pop(i):
                    if not w.done():
                        w.set_result(None)

    def release_cursor(self) -> Cursor:
        return Cursor.RELEASE

    def snapshot(self, index: int) -> MachineSnapshot:
        return MachineSnapshot(md.to_bytes(self._state), index + 1)

    def restore(self, data: bytes, installed: bool) -> None:
        old, self._state = self._state, md.from_bytes(data)
        effects: list[md.Effect] = []
        # Effects: for the leader's snapshot installed over this replica
        # (it jumped over entries), and for a log's own snapshot newer than
        # what the node acted on (one installed and saved just before the
        # group stopped, restored by the group restarted in place). Only
        # beyond what the node acted on, from the state it acted on.
        if installed or self._acted is not None:
            self.bootstrapped = bool(self._state.vhosts)
            if self._state.last_applied > self._effects_done_upto:
                base = old if self._acted is None else self._acted
                self._acted = None
                effects = md.effects_between(base, self._state)
        self._show()
        if effects:
            self._on_effects(effects)
        if installed:
            self._announce_nodes()
            self._applied_upto(self._state.last_applied)

    def snapshot_for_follower(self, data: bytes, index: int) -> bytes:
        return data

    def _announce_nodes(self) -> None:
        """Tell the node every cluster node's address recorded in the metadata."""
        if self._on_cluster_node is None:
            return
        for (_vhost, component, name), p in list(self._state.parameters.items()):
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
            fut.add_done_callback(_log_bootstrap_failure)


def _log_bootstrap_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("bootstrap failed: %s", fut.exception())
