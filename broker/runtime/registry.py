"""The queue registry: which queue processes run on this node, and the
interpreter of the metadata group's effects that starts and stops them.

Where it sits: a collaborator of the node (`Node.registry`). The metadata
group hands its effects to `meta_effects` as it applies them: a declared
queue gets a process here (`QuorumQueue` for a member on this node,
`DurableClassicQueue` or `ClassicQueue` for a classic queue homed here, a
`RemoteQueue` proxy otherwise), a deleted one is stopped and its data
deleted, a policy change is pushed to the queues this node leads, and a
membership change starts a joining member here (a learner) or replaces the
leaving one by a proxy, carrying consumers and blocked publishers over (the
queue's identity, `uid`, stays). At start the node asks it to reopen every
member the metadata lists (`start_queue`), to delete the logs of durable
classic queues deleted while it was down and the definitions of transient
queues that did not outlive the last run.

It owns the node's table of queue processes (`queues`, by (vhost, name)),
of Raft groups by storage group id (`groups`: the node's ticker, quiescence
and storage callbacks find them there), of durable classic logs
(`classic_logs`) and of members that could not start (`failed_members`).

It sees the node through `RegistryHost` (the queues' own `Host`, plus the
storage, the metadata and the reliable-command path), so it is unit-tested
with real storage and no process (tests/runtime/test_registry.py).
May import: the pure cores, storage, and the queue process modules
(`queues`, `classic`, `raft_group`), `declarations.qq_args`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, Protocol

import msgpack

import broker.metadata as md
import broker.queue as qm
import broker.storage as st
from broker.raft import InvariantViolation, RaftConfig

from .background import spawn
from .backoff import RestartGate
from .classic import DurableClassicQueue
from .classic import group_id as classic_group_id
from .declarations import qq_args
from .queues import ClassicQueue, Host, QueueProcess, QueueTable, QueueUid, QuorumQueue, RemoteQueue
from .raft_group import SNAPSHOT_BYTES, RaftGroup

log = logging.getLogger("broker.registry")


class MemberSync(Protocol):
    """The part of membership (runtime/membership.py) the registry uses."""

    def sync_members(self, vhost: str, name: str) -> Awaitable[Any]: ...


class RegistryHost(Host, Protocol):
    """What the registry needs from its node: to be the queues' `Host`, and
    the storage, the metadata and the reliable command path."""

    raft_config: RaftConfig
    storage: st.LogManager | None

    @property
    def membership(self) -> MemberSync: ...

    @property
    def meta_state(self) -> md.MetadataState: ...

    async def meta_execute(self, cmd: Any) -> Any: ...

    def queue_command_reliable(self, uid: QueueUid, cmd: qm.Command,
                               on_applied: Any = None) -> None: ...


class Registry(QueueTable):
    """The queue processes (`queues`, and the lookups every publish makes,
    from the compiled `QueueTable`), Raft groups and durable classic logs of
    this node, and the interpreter of metadata effects."""

    def __init__(self, host: RegistryHost, snapshot_interval: int,
                 snapshot_bytes: int = SNAPSHOT_BYTES) -> None:
        super().__init__()
        self.host = host
        self.snapshot_interval = snapshot_interval
        self.snapshot_bytes = snapshot_bytes
        #: every Raft group on this node (the metadata group included), by storage group id
        self.groups: dict[str, RaftGroup] = {}
        #: durable classic queues on this node, by storage group id (runtime/classic.py)
        self.classic_logs: dict[str, DurableClassicQueue] = {}
        #: members that could not start (their storage is unusable): queue key ->
        #: reason. Reported by status and health checks.
        self.failed_members: dict[tuple[str, str], str] = {}
        #: of those, the ones whose storage could not be written (a full disk):
        #: `restart_stopped` tries them again once there is room
        self._start_again: set[tuple[str, str]] = set()
        #: when each queue's member may be restarted or created again (a disk
        #: that fills again at once must not make it restart every 2 s)
        self._restarts: dict[tuple[str, str], RestartGate] = {}

    # ------------------------------------------------------------ lookups
    def queue_record(self, vhost: str, name: str) -> md.QueueRecord | None:
        return self.host.meta_state.queues.get((md.VhostName(vhost), md.QueueName(name)))

    def storage_group(self, group_id: str) -> RaftGroup | DurableClassicQueue | None:
        """Whom a storage callback (durable, error) for this group id is for."""
        return self.groups.get(group_id) or self.classic_logs.get(group_id)

    @staticmethod
    def group_id(record: md.QueueRecord) -> str:
        """A quorum queue member's storage group id (one per declaration)."""
        return f"{record.vhost}/{record.name}/{record.created_at}"

    def config_for(self, record: md.QueueRecord) -> qm.QueueConfig:
        state = self.host.meta_state
        args = md.thaw_table(record.arguments)
        if record.type == "quorum":
            args = qq_args(args)
            pol = md.queue_policy(state, record)
            opol = md.queue_operator_policy(state, record)
            return qm.parse_queue_arguments(
                args, record.name, record.vhost,
                md.thaw_table(pol.definition) if pol else None,
                md.thaw_table(opol.definition) if opol else None)
        return classic_config(record.name, record.vhost, args)

    # ------------------------------------------------------------ metadata effects
    def meta_effects(self, effects: list[Any]) -> None:
        for eff in effects:
            t = type(eff)
            if t is md.QueueDeclared:
                self.start_queue(eff.record)
            elif t is md.QueueDeleted:
                self._stop_queue(eff.record)
            elif t is md.PolicyChanged:
                for vhost, name in eff.queues:
                    self._push_policy(vhost, name)
            elif t is md.MembersChanged:
                self._members_changed(eff)

    def start_queue(self, record: md.QueueRecord, joining: bool = False) -> None:
        key = (record.vhost, record.name)
        if key in self.queues:
            return
        uid: QueueUid = (record.vhost, record.name, record.created_at)
        if self.host.node_name not in record.members:
            # No member here: a proxy so local channels can use the queue.
            self.queues[key] = self._proxy(record)
            return
        try:
            config = self.config_for(record)
        except Exception as exc:  # noqa: BLE001 - QueueArgumentError, or a bug: never the metadata group's
            # Reported like a member that cannot start; a proxy keeps the
            # queue reachable from this node (its leader may run elsewhere).
            # This runs inside the metadata group's apply and at start-up:
            # an error escaping would stop that group, or the node's start.
            log.error("queue %s/%s: invalid configuration: %s", record.vhost, record.name, exc)
            self.failed_members[key] = f"{type(exc).__name__}: {exc}"
            self.queues[key] = self._proxy(record)
            return
        q: QueueProcess
        storage = self.host.storage
        if record.type == "quorum":
            assert storage is not None
            gid = self.group_id(record)
            glog = None
            try:
                glog = storage.open_group(gid)
                voters = bootstrap_voters(record, glog, joining)
                qq = QuorumQueue(self.host, record.vhost, record.name, config, glog,
                                 voters, self.host.raft_config, learner=not voters)
            except (st.StorageError, InvariantViolation) as exc:
                # This member's data is unusable (corrupt file, unreadable
                # snapshot) or cannot be created (a full disk): it stays stopped, the node and the queue's other
                # members go on; local clients reach the leader elsewhere.
                log.error("queue %s/%s: member on this node stopped: %s", record.vhost, record.name, exc)
                self.failed_members[key] = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, st.StorageIOError):
                    self._start_again.add(key)
                if glog is not None:
                    glog.close()  # (its bootstrap record could not be written)
                self.queues[key] = self._proxy(record)
                return
            qq.snapshot_every = self.snapshot_interval
            qq.group.snapshot_bytes = self.snapshot_bytes
            assert isinstance(qq.group, RaftGroup)  # QuorumQueue makes a real one
            self.groups[gid] = qq.group
            if voters and (len(record.members) == 1 or (record.leader == self.host.node_name
                                                        and qq.group.glog.last_index() == 0)):
                self._campaign_until_led(qq, time.monotonic() + 5.0)
            q = qq
        elif durable_classic(record):
            assert storage is not None
            gid = classic_group_id(record.vhost, record.name, record.created_at)
            glog = None
            try:
                glog = storage.open_group(gid)
                dq = DurableClassicQueue(self.host, record.vhost, record.name, config, glog,
                                         self.snapshot_interval)
            except Exception as exc:  # noqa: BLE001 - unusable data (corrupt file, bad entry)
                # Node-local: there is no other copy to serve it. The queue
                # stays down (reported like a stopped member); the node goes on.
                log.error("classic queue %s/%s: could not recover its log: %s", record.vhost,
                          record.name, exc)
                self.failed_members[key] = f"{type(exc).__name__}: {exc}"
                if glog is not None:
                    glog.close()
                return
            self.classic_logs[gid] = dq
            q = dq
        else:
            q = ClassicQueue(self.host, record.vhost, record.name, config)
        q.uid = uid
        self.queues[key] = q

    def restart_stopped(self) -> list[str]:
        """Members stopped by a failed write (`StorageIOError`: ENOSPC, EIO)
        start again, as Ra's supervisor restarts a crashed server: called by
        the node while its disk is not in alarm. The log handle already holds
        only what is durable (`GroupLog.wal_failed` dropped the rest), so the
        new member starts from exactly what a process restart would read;
        it waits while a write of the old one is still in flight. Members
        that could not be created on a full disk are created again. Corrupt
        data and broken invariants stay stopped (an operator's call).
        Returns the queues restarted."""
        me = self.host.node_name
        done: list[str] = []
        for key, q in list(self.queues.items()):
            if not isinstance(q, QuorumQueue) or q.deleted \
                    or not isinstance(q.group.stopped, st.StorageIOError):
                continue
            gate = self._restarts.setdefault(key, RestartGate())
            if not gate.due():
                continue
            glog = q.glog
            if not glog.settled():
                continue  # unusable, or the old member's write still in flight
            record = self.queue_record(*key)
            if record is None or me not in record.members:
                continue
            log.warning("queue %s/%s: restarting the member stopped by %s", key[0], key[1],
                        q.group.stopped)
            gate.attempt()
            q.close()
            self.groups.pop(glog.group_id, None)
            glog.close()
            if isinstance(self._start_in_place_of(q, record), QuorumQueue):
                done.append(f"{key[0]}/{key[1]}")
        for key in list(self._start_again):
            gate = self._restarts.setdefault(key, RestartGate())
            if not gate.due():
                continue
            record = self.queue_record(*key)
            self._start_again.discard(key)
            if record is None or me not in record.members or key not in self.failed_members:
                continue
            gate.attempt()
            del self.failed_members[key]
            log.warning("queue %s/%s: starting the member that could not be created again",
                        key[0], key[1])
            # (in place of its proxy; joining=False as a process restart would)
            if isinstance(self._start_in_place_of(self.queues.get(key), record), QuorumQueue):
                done.append(f"{key[0]}/{key[1]}")
        return done

    def _start_in_place_of(self, old: QueueProcess | None, record: md.QueueRecord,
                           joining: bool = False) -> QueueProcess | None:
        """Replace the queue's process (closed by the caller, or a proxy) by
        the one `start_queue` makes for `record` now (a member, or a proxy if
        it cannot start), carrying the queue's identity, consumers and blocked
        publishers over."""
        self.queues.pop((record.vhost, record.name), None)
        self.start_queue(record, joining)
        new = self.queues.get((record.vhost, record.name))
        if old is not None and new is not None:
            carry_over(old, new)
        return new

    def _proxy(self, record: md.QueueRecord) -> RemoteQueue:
        proxy = RemoteQueue(self.host, record.vhost, record.name,
                            classic_config(record.name, record.vhost, {}))
        proxy.uid = (record.vhost, record.name, record.created_at)
        return proxy

    def _members_changed(self, eff: md.MembersChanged) -> None:
        """A member joined or left: start a joining member here (as a learner
        that waits for the leader's log), or stop the one leaving. The queue's
        process is replaced, not the queue: its identity (uid), consumers and
        blocked publishers carry over, and channels find the new process by
        the identity (their publish numbering, unacked messages and pending
        settles continue); pending proposals of the old process fail as
        ProposalUnknown and are re-sent through the new one."""
        record = self.queue_record(eff.vhost, eff.name)
        if record is None:
            return
        me = self.host.node_name
        key = (record.vhost, record.name)
        q = self.queues.get(key)
        if me in eff.new and me not in eff.old:
            if isinstance(q, QuorumQueue):
                return  # the replica kept below, listed again: it runs on
            if q is not None:
                q.close()
            self._start_in_place_of(q, record, joining=True)
        elif me in eff.old and me not in eff.new and isinstance(q, QuorumQueue):
            raft = q.group.node
            if me in raft.config.members and raft.config_index >= record.members_index:
                # The record's list is not from a configuration after the one
                # this replica knows, which still has it (an unindexed list):
                # deleting the replica could cost the group its quorum for
                # good. Kept; a later report settles it. (A removed member
                # never applied its removal, so its configuration is older.)
                log.warning("queue %s/%s: the metadata no longer lists this node but its Raft "
                            "configuration at %d (the record's is from %d) does: member kept",
                            record.vhost, record.name, raft.config_index, record.members_index)
                spawn(self.host.membership.sync_members(record.vhost, record.name),
                      f"writing the members of {record.vhost}/{record.name} back")
                return
            q.close()
            self._drop_group(q)
            del self.queues[key]
            proxy = self._proxy(record)
            carry_over(q, proxy)
            self.queues[key] = proxy

    def _drop_group(self, q: QuorumQueue) -> None:
        """The queue (or this member) is gone: delete its log for good."""
        gid = q.glog.group_id
        self.groups.pop(gid, None)
        q.glog.close()
        self._delete_data(gid)

    def _campaign_until_led(self, q: QuorumQueue, deadline: float) -> None:
        """The designated leader of a new group campaigns until a leader is
        known: its first (pre-)votes may reach peers that have not applied
        the declaration yet and drop them."""
        if q.deleted or q.group.leader is not None or time.monotonic() > deadline:
            return
        q.group.campaign()
        asyncio.get_running_loop().call_later(0.1, self._campaign_until_led, q, deadline)

    def _stop_queue(self, record: md.QueueRecord) -> None:
        running = self.queues.get((record.vhost, record.name))
        if running is not None and running.uid[2] not in (0, record.created_at):
            # the deletion of an earlier incarnation (an effect handed over
            # again): the queue declared since is another one
            log.warning("queue %s/%s: not deleted, it was declared again at %d (the deletion "
                        "is of the one declared at %d)", record.vhost, record.name,
                        running.uid[2], record.created_at)
            return
        self._restarts.pop((record.vhost, record.name), None)
        self._start_again.discard((record.vhost, record.name))
        q = self.queues.pop((record.vhost, record.name), None)
        if q is None:
            if self.failed_members.pop((record.vhost, record.name), None) is not None and \
                    durable_classic(record) and self.host.node_name in record.members:
                self._drop_classic_log(classic_group_id(record.vhost, record.name, record.created_at))
            return
        for consumer in list(q.consumers.values()):
            consumer.cancelled_by_server()
        q.consumers.clear()
        q.close()
        if isinstance(q, QuorumQueue):
            self._drop_group(q)
        elif isinstance(q, DurableClassicQueue):
            q.glog.close()
            self._drop_classic_log(q.group_id)

    def _drop_classic_log(self, gid: str) -> None:
        """A durable classic queue is deleted: its log goes too."""
        self.classic_logs.pop(gid, None)
        self._delete_data(gid)

    def _delete_data(self, gid: str) -> None:
        try:
            assert self.host.storage is not None
            self.host.storage.delete_group(gid)
        except st.StorageError as exc:
            log.error("could not delete the data of %s: %s", gid, exc)

    def _push_policy(self, vhost: str, name: str) -> None:
        q = self.queues.get((vhost, name))
        record = self.queue_record(vhost, name)
        if q is None or record is None or not q.is_leader:
            return
        try:
            config = self.config_for(record)
        except Exception as exc:  # noqa: BLE001 - QueueArgumentError, or a bug: never the metadata group's
            log.error("queue %s/%s: policy not applied: %s", vhost, name, exc)
            return
        # through the same re-send-until-applied path as settles: a policy
        # change lost with a leader change would otherwise never apply
        self.host.queue_command_reliable(q.uid, qm.UpdateConfig(config))

    # ------------------------------------------------------------ start-up
    async def delete_stale_temporaries(self) -> None:
        """Classic queues that do not outlive their node (non-durable or
        exclusive) and are homed here were lost
        with the last run: delete their definitions before clients can
        connect, as RabbitMQ deletes transient queues on a restart (and an
        exclusive queue's owner connection is gone for good; a new connection
        must never inherit it)."""
        me = md.NodeName(self.host.node_name)
        stale = [r for r in self.host.meta_state.queues.values()
                 if r.type != "quorum" and r.members[:1] == (me,) and not durable_classic(r)]
        for r in stale:
            try:
                reply = await asyncio.wait_for(self.host.meta_execute(md.DeleteQueue(
                    r.vhost, r.name, owner=r.exclusive_owner)), 30)
            except Exception as exc:  # noqa: BLE001 - a timeout or a lost leader: logged, retried next start
                log.warning("could not delete the transient queue %s/%s: %s", r.vhost, r.name, exc)
                continue
            if isinstance(reply, md.MetadataError):
                log.warning("could not delete the transient queue %s/%s: %s", r.vhost, r.name, reply)
            else:
                log.info("deleted the transient queue %s/%s (its node restarted)", r.vhost, r.name)

    def drop_orphan_classic_logs(self) -> None:
        """Logs of durable classic queues deleted while this node was down
        (a metadata snapshot carries no deletion): the group id holds the
        declaration's creation time, so a log whose record is gone is garbage."""
        assert self.host.storage is not None
        want = {classic_group_id(r.vhost, r.name, r.created_at)
                for r in self.host.meta_state.queues.values() if durable_classic(r)}
        for gid in self.host.storage.group_ids():
            if gid.startswith("classic:") and gid not in want:
                log.info("deleting the log of a deleted classic queue: %s", gid)
                self._drop_classic_log(gid)


def bootstrap_voters(record: md.QueueRecord, glog: st.GroupLog, joining: bool) -> list[str]:
    """The voters this member's Raft group starts from until its log (or
    snapshot) says otherwise; decided once, when the group is created
    here, and kept beside its log so a restart decides the same.

    The queue's declared members start from that list. Any member created
    later (added by a membership change, or first started here after one:
    the record's `members_index` is set) starts with no voters, as a
    learner that cannot campaign and takes its configuration from the
    leader. Never today's member list: with an empty or short log, a node
    that took it for the configuration could win an election among other
    such nodes and overwrite committed entries."""
    raw = glog.read_bootstrap()
    if raw is not None:
        return [str(m) for m in msgpack.unpackb(raw)]
    if glog.last_index() != 0 or glog.snapshot_meta() is not None or glog.hard_state().term:
        return list(record.members)  # a group created before bootstrap records existed
    voters: list[str] = [] if joining or record.members_index else list(record.members)
    glog.write_bootstrap(msgpack.packb(voters))
    return voters


def carry_over(old: QueueProcess, new: QueueProcess) -> None:
    """A membership change replaced a queue's process: the new one takes
    the old one's consumers and blocked publishers."""
    new.consumers.update(old.consumers)
    for consumer in old.consumers.values():
        consumer.queue = new
    new.blocked_publishers |= old.blocked_publishers
    new.had_consumer = new.had_consumer or old.had_consumer


def durable_classic(record: md.QueueRecord) -> bool:
    """Classic queues whose persistent messages survive a restart (RabbitMQ:
    durable ones, auto-delete or not; exclusive queues go with their
    connection)."""
    return record.type != "quorum" and record.durable and record.exclusive_owner is None


def classic_config(name: str, vhost: str, args: dict[str, Any]) -> qm.QueueConfig:
    """Classic queues use the same machine with classic semantics: no delivery limit."""
    def num(key: str) -> int | None:
        v = args.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

    def text(key: str) -> str | None:
        # declarations refuse other types; a record from before that check
        # (or a longstr that is not UTF-8) must not stop the queue's start
        v = args.get(key)
        if isinstance(v, (bytes, bytearray)):
            return bytes(v).decode("utf-8", "replace")
        return v if isinstance(v, str) else None

    overflow = args.get("x-overflow", "drop-head")
    if overflow not in ("drop-head", "reject-publish"):
        overflow = "drop-head"
    return qm.QueueConfig(
        name=name, vhost=vhost, max_length=num("x-max-length"),
        max_length_bytes=num("x-max-length-bytes"), overflow=overflow,
        message_ttl_ms=num("x-message-ttl"), expires_ms=num("x-expires"),
        dead_letter_exchange=text("x-dead-letter-exchange"),
        dead_letter_routing_key=text("x-dead-letter-routing-key"),
        delivery_limit=None, requeue_in_place=True,
        single_active_consumer=bool(args.get("x-single-active-consumer", False)),
    )

