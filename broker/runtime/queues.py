"""Queue processes: the runtime side of one queue on this node.

Where it sits: AMQP channels call `enqueue` / `checkout` / `settle` / ... on a
`QueueProcess`; it turns them into `broker.queue` commands, gets them applied
(through the queue's Raft group for a quorum queue, or directly for a
node-local classic queue), and interprets the machine's effects: deliveries
to local consumers (bodies read from this node's copy of the log), timers,
dead-letter publishes, queue expiry, log release.

Log entry payloads: see `runtime/wire.py` (their one owner). The enqueue
entry *is* the message: deliveries read it back by message key (the entry's
raft index and the enqueue's position in it: a leader proposes the enqueues
submitted in one pass of the event loop as one batch entry, see
`QuorumQueue.propose`).

Why one file of this size: the queue processes share one base (`QueueProcess`:
consumers, effect interpretation, deliveries, body cache); the quorum, remote
and node-local classic variants are thin subclasses of it, kept beside it so
the effect handling is read once.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar, Protocol

from mypy_extensions import mypyc_attr

import broker.queue as qm
import broker.queue.effects as qe
import broker.runtime.wire as wire
import broker.storage as st

# the per-message calls import from the defining (compiled) modules: native
# calls, where `qm.x` is a lookup on the package and a Python-level call
from broker.queue.commands import Settle
from broker.queue.effects import Dequeued
from broker.queue.machine import apply as machine_apply
from broker.queue.machine import rec_key
from broker.queue.snapshot import is_version_1
from broker.queue.types import (
    BATCH_MAX,
    DEQUEUE_TAG,
    KEY_POS_BITS,
    ChannelRef,
    ConsumerId,
    Meta,
    MsgId,
    key_index,
    key_pos,
    msg_key,
)
from broker.raft import Membership, NodeId, NotLeader, ProposalDropped, RaftConfig, RaftNode, Role

from .dead_letter import DlxHost, DlxWorker
from .machine import Cursor, MachineSnapshot
from .raft_group import ProposalReplaced, RaftGroup

log = logging.getLogger("broker.queues")

Message = tuple[bytes, bytes, str, str]  # properties_raw, body, exchange, routing_key
#: Body bytes per deliveries message sent to a consumer's node.
DELIVERY_BATCH_BYTES = 16 * 1024 * 1024
#: Body bytes a leader gathers into one batch entry before proposing it
#: (bigger bodies gain nothing from sharing an entry).
PROPOSE_BATCH_BYTES = 256 * 1024
#: A queue's identity: vhost, name and its declaration's creation time (a
#: queue deleted and declared again is another queue). Channels key their
#: publish numbering and settles by it, never by the Python object: a
#: membership change replaces the process but not the queue.
QueueUid = tuple[str, str, int]


class PublishDrain(Protocol):
    """The node's forwarding (runtime/forwarding.py `Forwarding`), reached
    directly: a leader's every publish asks it first."""

    def flush_forwarded(self, vhost: str, name: str) -> None: ...


class Host(DlxHost, Protocol):
    """What a queue needs from its node (and hands on to its dead-letter
    worker, runtime/dead_letter.py `DlxHost`)."""

    node_name: str
    incarnation: str

    def dead_letter(self, vhost: str, exchange: str, routing_key: str | None,
                    messages: list[tuple[Message, dict[str, Any]]]) -> None: ...

    def queue_expired(self, vhost: str, name: str) -> None: ...

    def send_raft(self, dst: str, msg: Any) -> None: ...

    def forward(self, leader: str, vhost: str, name: str, payload: Any) -> asyncio.Future[Any]: ...

    def recorded_leader(self, vhost: str, name: str) -> str | None: ...

    def send_deliveries(self, node: str, vhost: str, name: str, channel: str, tag: str,
                        deliveries: list[Any], bodies: dict[int, Any]) -> None: ...

    def leader_elected(self, vhost: str, name: str, term: int) -> None: ...

    @property
    def forwarding(self) -> PublishDrain: ...

    def queue_leader(self, vhost: str, name: str) -> str | None: ...

    def channel_dead(self, channel: str) -> bool: ...

    def channel_gone(self, channel: str) -> bool: ...

    def remember_dequeued(self, vhost: str, name: str, index: int, msg: Message) -> None: ...


class QueueConsumer(Protocol):
    """What a queue process needs of a consumer of it (channel.Consumer is
    the AMQP one)."""

    cid: ConsumerId
    exclusive: bool
    queue: QueueProcess  # a membership change carries consumers over to the new process

    def deliver(self, queue: QueueProcess, msg_id: MsgId, msg: Message, count: int,
                redelivered: bool) -> None: ...

    def cancelled_by_server(self) -> None: ...


class QueueGroup(Protocol):
    """What the runtime uses of a quorum queue member's Raft group (a
    `raft_group.RaftGroup`; the unit tests stand in their own, which compiled
    code would refuse as a RaftGroup)."""

    group_id: str
    glog: st.GroupLog
    node: RaftNode
    role: Role
    leader: NodeId | None
    stopped: BaseException | None
    closed: bool
    quiesced: bool
    applied_index: int
    applied_since_snapshot: int
    last_applied_ms: int
    snapshot_interval: int
    snapshot_bytes: int

    @property
    def is_leader(self) -> bool: ...

    def propose(self, payload: Any, plain: bool = False) -> asyncio.Future[Any]: ...

    def propose_conf(self, cc: Any) -> asyncio.Future[Any]: ...

    def campaign(self) -> None: ...

    def close(self, reason: str) -> None: ...

    def _kick(self) -> None: ...  # membership's leadership transfer wakes the group


# Compiled (broker/compiled.py), and subclassed by interpreted code: the
# unit tests' queues stand in for it (and for QuorumQueue).
@mypyc_attr(allow_interpreted_subclasses=True)
class QueueProcess:
    """Shared logic of quorum and classic queues: commands out, effects in."""

    kind = "quorum"
    _replaying = False  # applying log entries written before this start

    def __init__(self, host: Host, vhost: str, name: str, config: qm.QueueConfig) -> None:
        self.host = host
        self.vhost = vhost
        self.name = name
        self.uid: QueueUid = (vhost, name, 0)  # the node sets the real one
        self.state = qm.new_state(config)
        self.consumers: dict[ConsumerId, QueueConsumer] = {}
        self.blocked_publishers: set[ChannelRef] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        # Recently applied message bodies (message key -> message), bounded.
        self._cache: OrderedDict[int, Message] = OrderedDict()
        self._cache_bytes = 0
        self.cache_limit = 64 * 1024 * 1024
        self.deleted = False
        self.had_consumer = False  # auto-delete only applies once a consumer came
        # x-expires is checked when a Tick is applied; the machine sets no timer
        # for it, so the leader ticks periodically while the queue has no consumers.
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._arm_expiry()

    # ---------------------------------------------------------------- overridables
    def _submit(self, payload: list[Any]) -> asyncio.Future[Any]:
        raise NotImplementedError

    def _read_message(self, key: int) -> Message:
        raise NotImplementedError

    @property
    def is_leader(self) -> bool:
        return True

    @property
    def leader_node(self) -> str | None:
        return self.host.node_name

    # ---------------------------------------------------------------- commands
    def enqueue(self, publisher: ChannelRef | None, seq: int, props_raw: bytes, body: bytes,
                exchange: str, routing_key: str, priority: int | None,
                expiration_ms: int | None) -> asyncio.Future[Any]:
        return self._submit(wire.enqueue_payload(publisher, seq, props_raw, body, exchange,
                                                 routing_key, priority, expiration_ms))

    def settle(self, consumer: ConsumerId, msg_ids: list[int]) -> asyncio.Future[Any]:
        return self._submit(wire.settle_payload(consumer, msg_ids))

    def command(self, cmd: qm.Command) -> asyncio.Future[Any]:
        return self._submit(wire.payload_for(cmd))

    # ---------------------------------------------------------------- applying
    def _apply_payload(self, index: int, term: int, ts: int, payload: list[Any], pos: int = 0) -> Any:
        cmd, msg = wire.queue_command(payload)
        if msg is not None:
            self._remember((index << KEY_POS_BITS) | pos, msg)
        self.state, reply, effects = machine_apply(Meta(index, term, ts, pos), cmd, self.state)
        if effects:
            self._run_effects(effects)
        if msg is None and type(cmd) is not Settle:
            if type(reply) is Dequeued and self.is_leader:
                self._hold_dequeued(reply.key)
            self._command_applied()
        return reply

    def _hold_dequeued(self, key: int) -> None:
        """Read a basic.get's body as its Dequeue is applied, and leave it
        with the node (commands.remember_dequeued, where a body shipped by a
        remote leader waits too) for the get to take: the get reads it only
        after the reply reaches it, and a snapshot taken at this very entry
        may have released it from the log by then."""
        try:
            msg = self.message(key)
        except (KeyError, IndexError, ValueError, st.StorageError) as exc:
            log.warning("queue %s: body of dequeued message %d unreadable: %s", self.name, key, exc)
            return
        self.host.remember_dequeued(self.vhost, self.name, key, msg)

    def _command_applied(self) -> None:
        """A command other than an enqueue or a settle was applied (a policy
        push among them): what its configuration may have changed."""
        if self._expiry_timer is None:
            self._arm_expiry()  # a policy may have brought x-expires

    def _arm_expiry(self) -> None:
        exp = self.state.config.expires_ms
        if exp is None or self.deleted or self._expiry_timer is not None:
            return
        self._expiry_timer = self._loop.call_later(min(max(exp, 50), 1000) / 1000, self._expiry_fire)

    def _expiry_fire(self) -> None:
        self._expiry_timer = None
        if self.deleted:
            return
        if self.is_leader and not self.state.consumers:
            try:
                self.command(qm.Tick()).add_done_callback(_retrieve)
            except Exception as exc:  # not leader any more
                log.debug("%s: expiry tick not proposed: %s", self.name, exc)
        self._arm_expiry()

    def _remember(self, key: int, msg: Message) -> None:
        cache = self._cache
        cache[key] = msg
        self._cache_bytes += len(msg[1]) + len(msg[0])
        while self._cache_bytes > self.cache_limit and cache:
            _, old = cache.popitem(last=False)
            self._cache_bytes -= len(old[1]) + len(old[0])

    def message(self, key: int) -> Message:
        """The message with `key` (types.msg_key): cached, or read from the log."""
        msg = self._cache.get(key)
        if msg is not None:
            return msg
        return self._read_message(key)

    def _forget(self, key: int) -> None:
        msg = self._cache.pop(key, None)
        if msg is not None:
            self._cache_bytes -= len(msg[1]) + len(msg[0])

    # ---------------------------------------------------------------- effects
    def _run_effects(self, effects: list[qe.Effect]) -> None:
        leader = self.is_leader
        # Dispatch on the type object (the hot path: one type() per effect).
        # mypy does not narrow `eff` through `t is X`, hence the ignores below;
        # each branch handles exactly the effect class it tests for.
        for eff in effects:
            t = type(eff)
            if t is qe.Deliver:
                if leader:
                    self._deliver(eff)  # type: ignore[arg-type]
            elif t is qe.ReleaseCursor:
                self._release(eff)  # type: ignore[arg-type]
            elif not leader:
                continue
            elif t is qe.SetTimer:
                self._set_timer(eff.delay_ms)  # type: ignore[union-attr]
            elif t is qe.RejectPublish:
                self.blocked_publishers.add(eff.publisher)  # type: ignore[union-attr]
            elif t is qe.ResumePublish:
                self.blocked_publishers.discard(eff.publisher)  # type: ignore[union-attr]
            elif t is qe.DeadLetter:
                self._dead_letter(eff)  # type: ignore[arg-type]
            elif t is qe.DeleteQueue:
                self.host.queue_expired(self.vhost, self.name)
            elif t is qe.ConsumerCancelled:
                c = self.consumers.pop(eff.consumer, None)  # type: ignore[union-attr]
                if c is not None:
                    c.cancelled_by_server()
            elif t is qe.DeadLetterDeliver:
                self._dlx_deliver(eff)  # type: ignore[arg-type]
            # ActiveConsumerChanged: nothing to do (the channel learns from deliveries).

    def _dlx_deliver(self, eff: qe.DeadLetterDeliver) -> None:
        """At-least-once dead letters handed to this leader's worker (see
        runtime/dead_letter.py); only quorum queues run one."""

    def _deliver(self, eff: qe.Deliver) -> None:
        consumer = self.consumers.get(eff.consumer)
        if consumer is not None:
            for msg_id, index, count, redelivered in eff.deliveries:
                consumer.deliver(self, msg_id, self.message(index), count, redelivered)
            return
        # A consumer on another node: send it the deliveries; bodies go along
        # unless that node holds a replica that already has the entry.
        node = eff.consumer.channel.split("|", 1)[0]
        if node == self.host.node_name:
            return  # its channel is gone; ChannelDown returns the messages
        has = self._replica_match(node)
        # Batches bounded by body bytes: one peer message never nears the
        # transport's frame limit, whatever the prefetch.
        batch: list[list[Any]] = []
        bodies: dict[int, Any] = {}
        size = 0
        for d in eff.deliveries:
            index = d[1]
            if key_index(index) > has:
                msg = self.message(index)
                if batch and size + len(msg[1]) + len(msg[0]) > DELIVERY_BATCH_BYTES:
                    self.host.send_deliveries(node, self.vhost, self.name, eff.consumer.channel,
                                              eff.consumer.tag, batch, bodies)
                    batch, bodies, size = [], {}, 0
                bodies[index] = msg
                size += len(msg[1]) + len(msg[0])
            batch.append(list(d))
        if batch:
            self.host.send_deliveries(node, self.vhost, self.name, eff.consumer.channel,
                                      eff.consumer.tag, batch, bodies)

    def _replica_match(self, node: str) -> int:
        """Highest index `node`'s replica of this queue is known to hold (0: none)."""
        return 0

    def remote_deliveries(self, channel: str, tag: str, deliveries: list[Any],
                          bodies: dict[int, Any]) -> None:
        """Deliveries the leader (on another node) made to a consumer on this node."""
        consumer = self.consumers.get(ConsumerId(ChannelRef(channel), tag))
        if consumer is None:
            return
        for msg_id, index, count, redelivered in deliveries:
            body = bodies.get(index)
            msg = tuple(body) if body is not None else self.message(index)
            consumer.deliver(self, msg_id, msg, count, redelivered)

    def _dead_letter(self, eff: qe.DeadLetter) -> None:
        if self._replaying:
            # At-most-once: these were dead-lettered (or lost) before the restart;
            # re-running the effect while replaying the log would duplicate them.
            return
        out = []
        for index, count in eff.messages:
            try:
                msg = self.message(index)
            except st.StorageError:
                log.warning("%s: dead letter %d unreadable", self.name, index)
                continue
            out.append((msg, {"reason": eff.reason.value, "queue": self.name, "count": count}))
        if out:
            self.host.dead_letter(self.vhost, eff.exchange, eff.routing_key, out)

    def _set_timer(self, delay_ms: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(max(delay_ms, 0) / 1000, self._fire_timer)

    def _fire_timer(self) -> None:
        self._timer = None
        if not self.deleted and self.is_leader:
            try:
                fut = self.command(qm.Tick())
            except Exception as exc:  # not leader any more: the new leader owns the timer
                log.debug("%s: timer tick not proposed: %s", self.name, exc)
                return
            fut.add_done_callback(self._rearm_timer)

    def _rearm_timer(self, fut: asyncio.Future[Any]) -> None:
        """A Tick applied before the machine's deadline leaves `state.timer_at`
        set without a new SetTimer effect (the machine assumes the timer is
        still armed), e.g. after a housekeeping tick replaced it. Invariant
        kept here: while `timer_at` is set on the leader, a timer is armed."""
        if fut.cancelled() or fut.exception() is not None:
            return
        at = self.state.timer_at
        if at is not None and self._timer is None and not self.deleted and self.is_leader:
            self._set_timer(max(at - int(time.time() * 1000), 1))

    def _release(self, eff: qe.ReleaseCursor) -> None:
        """Drop cached bodies of entries below the smallest live index."""
        cache = self._cache
        while cache:
            first = next(iter(cache))
            if key_index(first) >= eff.smallest_live_index:
                break
            self._forget(first)

    # ---------------------------------------------------------------- consumers
    def add_consumer(self, consumer: QueueConsumer) -> None:
        self.consumers[consumer.cid] = consumer
        self.had_consumer = True

    def remove_consumer(self, cid: ConsumerId) -> None:
        self.consumers.pop(cid, None)

    def overview(self) -> dict[str, Any]:
        return self.state.overview()

    def close(self) -> None:
        self.deleted = True
        if self._timer is not None:
            self._timer.cancel()
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


class RemoteQueue(QueueProcess):
    """A quorum queue with no member on this node: commands go to its leader,
    deliveries come back with their bodies. Counts are not known locally."""

    kind = "quorum"

    def _submit(self, payload: list[Any]) -> asyncio.Future[Any]:
        return self.host.forward(self.host.queue_leader(self.vhost, self.name) or "", self.vhost,
                                 self.name, payload)

    @property
    def is_leader(self) -> bool:
        return False

    @property
    def leader_node(self) -> str | None:
        return self.host.recorded_leader(self.vhost, self.name)

    def _read_message(self, key: int) -> Message:
        raise KeyError(f"queue {self.name}: message {key} is not on this node")

    def overview(self) -> dict[str, Any]:
        return {"messages_ready": 0, "messages_unacknowledged": 0, "messages": 0}


class ClassicQueue(QueueProcess):
    """A node-local, non-replicated queue (exclusive/auto-delete/server-named
    temporaries such as RPC reply queues). Same machine, applied directly;
    its messages live in memory and do not survive a restart."""

    kind = "classic"

    def __init__(self, host: Host, vhost: str, name: str, config: qm.QueueConfig) -> None:
        super().__init__(host, vhost, name, config)
        self._index = 0
        self.cache_limit = 1 << 62  # the cache is the only copy

    def _submit(self, payload: list[Any]) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._index += 1
        ts = int(time.time() * 1000)
        try:
            fut.set_result(self._apply_payload(self._index, 1, ts, payload))
        except Exception as exc:  # a broken invariant stops this queue only
            fut.set_exception(exc)
        return fut

    def _read_message(self, key: int) -> Message:
        raise KeyError(f"classic queue {self.name}: message {key} is gone")


@mypyc_attr(allow_interpreted_subclasses=True)
class QueueTable:
    """The node's queue processes by (vhost, name), and the lookups every
    publish makes: here, compiled, so that they run as native code; the
    registry (runtime/registry.py, interpreted) is one."""

    def __init__(self) -> None:
        #: the queue processes on this node, by (vhost, name)
        self.queues: dict[tuple[str, str], QueueProcess] = {}

    def queue(self, vhost: str, name: str) -> QueueProcess | None:
        return self.queues.get((vhost, name))

    def live_queue(self, uid: QueueUid) -> QueueProcess | None:
        """The process of the queue with this identity on this node right now
        (membership changes replace processes), or None once it is gone."""
        q = self.queues.get((uid[0], uid[1]))
        return q if q is not None and q.uid == uid and not q.deleted else None


@mypyc_attr(allow_interpreted_subclasses=True)
class QuorumQueue(QueueProcess):
    """A replicated quorum queue member on this node (its Raft group).

    It is its group's `Machine` (runtime/machine.py): `apply` runs the queue
    machine and its effects, a `ReleaseCursor` effect becomes the group's
    release cursor (a purge asks for a snapshot at once), `snapshot` says what
    a snapshot holds and how far the log may be released and compacted; the
    group decides when, and writes."""

    kind = "quorum"
    #: Seconds with nothing applied after which a member that applied entries
    #: since its last snapshot takes one (every replica, of its own state), so
    #: an idle queue's log is released and compacted too.
    snapshot_idle_s: ClassVar[float] = 5.0

    def __init__(self, host: Host, vhost: str, name: str, config: qm.QueueConfig,
                 glog: st.GroupLog, members: list[str], raft_config: RaftConfig,
                 on_role_change: Callable[[QuorumQueue], None] | None = None,
                 learner: bool = False) -> None:
        super().__init__(host, vhost, name, config)
        self.glog = glog
        self._on_role = on_role_change
        # Entries up to here were in the log before this start: applying them
        # again replays history, whose external effects already happened.
        self._recovered_index = glog.last_index()
        # Bodies of live messages below the snapshot index that this replica's
        # log does not hold (it was installed from the leader's snapshot), by key.
        self._snap_bodies: dict[int, Message] = {}
        # Enqueues submitted on this leader, not yet proposed (one batch entry
        # at the end of this pass of the event loop; see `propose`), with
        # their futures and body bytes.
        self._batch: list[list[Any]] = []
        self._batch_futs: list[asyncio.Future[Any]] = []
        self._batch_bytes = 0
        # The last entry read back from the log: (index, its payload).
        self._read_batch: tuple[int, list[Any]] | None = None
        # The release cursor the entry being applied emitted (release_cursor).
        self._cursor: Cursor | None = None
        # The group restores this member from its log's snapshot (restore).
        self.group: QueueGroup = RaftGroup(
            glog.group_id, host.node_name, glog,
            Membership(frozenset() if learner else frozenset(NodeId(m) for m in members)),
            self, host.send_raft, raft_config=replace(raft_config, lazy_commit=True),
            on_role_change=self._role_changed, snapshot_idle_s=self.snapshot_idle_s,
        )
        # The at-least-once dead-letter worker, while this member leads and the
        # queue's strategy is at-least-once (runtime/dead_letter.py).
        self._dlx: DlxWorker | None = None

    def _submit(self, payload: list[Any]) -> asyncio.Future[Any]:
        if self.group.role is Role.LEADER:
            self.host.forwarding.flush_forwarded(self.vhost, self.name)  # keep publish order
            return self.propose(payload)
        return self.host.forward(self.host.queue_leader(self.vhost, self.name) or "", self.vhost,
                                 self.name, payload)

    def propose(self, payload: list[Any]) -> asyncio.Future[Any]:
        """Propose on this member, the leader, without draining the node's
        forwarded commands first (runtime/forwarding.py: the drain itself).

        Enqueues are gathered and proposed as one batch entry at the end of
        this pass of the event loop (or once `BATCH_MAX` or
        `PROPOSE_BATCH_BYTES` are reached): one Raft entry, one WAL record
        and one replication item for many publishes. Invariant: entries are
        proposed in submission order, so any other command flushes the
        gathered enqueues first. Each enqueue's future gets its own reply;
        a batch that fails fails every future in it (the publisher
        re-sends; de-duplication makes that safe)."""
        if payload[0] == wire.ENQUEUE:
            size = len(payload[7])
            if self._batch and self._batch_bytes + size > PROPOSE_BATCH_BYTES:
                self._flush_batch()  # an entry holds one big body, or bodies up to the limit
            batch = self._batch
            fut: asyncio.Future[Any] = self._loop.create_future()
            if not batch:
                self._loop.call_soon(self._flush_batch)
            batch.append(payload)
            self._batch_futs.append(fut)
            self._batch_bytes += size
            if len(batch) >= BATCH_MAX:
                self._flush_batch()
            return fut
        if self._batch:
            self._flush_batch()
        return self.group.propose(payload, wire.is_plain(payload))

    def _flush_batch(self) -> None:
        """Propose the gathered enqueues: one entry (a batch of two or more)."""
        batch, futs = self._batch, self._batch_futs
        if not batch:
            return
        self._batch, self._batch_futs, self._batch_bytes = [], [], 0
        try:
            if self.group.closed:
                raise ProposalReplaced(f"queue '{self.name}' in vhost '{self.vhost}': member closed "
                                       "before its gathered publishes were proposed")
            single = len(batch) == 1
            entry = self.group.propose(batch[0] if single else wire.batch_payload(batch), True)
        except (NotLeader, ProposalDropped) as refused:
            # Never proposed: like an entry a new leader replaced, the
            # requester re-sends it, in order, to the leader (cluster.py).
            _fail(futs, ProposalReplaced(f"not proposed: {refused}"))
            return
        except Exception as exc:  # noqa: BLE001 - stopped, closed: each publisher re-sends
            _fail(futs, exc)
            return
        entry.add_done_callback(lambda e: _scatter(e, futs, single))

    @property
    def is_leader(self) -> bool:
        return self.group.role is Role.LEADER

    def _remember(self, key: int, msg: Message) -> None:
        """Bodies are cached where they are read soon: on the leader, and on
        a follower with consumers of its own (the leader tells it which
        messages to deliver). Any other follower reads none until it leads
        or gets a consumer, and then reads them from its log (the recent
        ones still in the memory table: `_read_message`)."""
        if self.consumers or self.group.role is Role.LEADER:
            QueueProcess._remember(self, key, msg)

    @property
    def leader_node(self) -> str | None:
        return self.group.leader or self.host.recorded_leader(self.vhost, self.name)

    def _replica_match(self, node: str) -> int:
        pr = self.group.node.progress.get(NodeId(node))
        return pr.match if pr is not None else 0

    def redeliver_checked_out(self, node: str | None = None) -> None:
        """After an election, or a new connection from `node` (what was sent to
        it before may be lost): re-issue deliveries of every checked-out
        message (of consumers on `node` only, when given). Channels ignore
        ones they already hold (same consumer and msg id), so only lost
        deliveries reach the clients."""
        st_ = self.state
        for cid, c in list(st_.consumers.items()):
            if not c.checked or cid.tag == DEQUEUE_TAG:
                continue
            if node is not None and cid.channel.split("|", 1)[0] != node:
                continue
            deliveries: list[qe.Delivery] = []
            for msg_id, record in c.checked.items():
                index = rec_key(record)
                count = st_.extra.get(index, (0, 0))[0]
                deliveries.append((MsgId(msg_id), index, count, True))
            self._deliver(qe.Deliver(cid, tuple(deliveries)))

    def _read_message(self, key: int) -> Message:
        held = self._snap_bodies.get(key)
        if held is not None:
            return held
        index = key_index(key)
        rb = self._read_batch
        if rb is None or rb[0] != index:  # consumers read a batch entry's messages in turn
            rb = self._read_batch = (index, wire.entry_payload(self.glog.entries(index, index + 1)[0].data))
        return wire.payload_message(rb[1], key_pos(key))


    @property
    def snapshot_every(self) -> int:
        """Applied entries between two snapshots (`raft.snapshot_interval`,
        set by the node): the group's cadence."""
        return self.group.snapshot_interval

    @snapshot_every.setter
    def snapshot_every(self, n: int) -> None:
        self.group.snapshot_interval = n

    def _release(self, eff: qe.ReleaseCursor) -> None:
        """Drop cached bodies below the smallest live index, and offer the
        group a snapshot of the state as of `eff.index` (the entry being
        applied: the state once it is applied is exactly that)."""
        super()._release(eff)
        if self._cursor is None:
            self._cursor = Cursor.RELEASE

    # ---------------------------------------------------------------- Machine
    def apply(self, index: int, term: int, timestamp_ms: int, command: Any) -> Any:
        self._replaying = index <= self._recovered_index
        if command[0] == wire.BATCH:
            items = wire.batch_items(command)
            assert items is not None
            # The group's snapshot cadence counts applied entries: a batch
            # counts as its publishes, so the log between two snapshots (and
            # a restart's replay) stays as long as before batching.
            self.group.applied_since_snapshot += len(items) - 1
            apply_payload = QueueProcess._apply_payload
            return [apply_payload(self, index, term, timestamp_ms, p, pos) for pos, p in enumerate(items)]
        reply = QueueProcess._apply_payload(self, index, term, timestamp_ms, command)
        if type(reply) is qm.Purged:
            # a purge frees most of the log at once: snapshot (release, compact) now
            self._cursor = Cursor.NOW
        return reply

    def release_cursor(self) -> Cursor | None:
        cursor = self._cursor
        if cursor is not None:
            self._cursor = None
        return cursor

    def snapshot(self, index: int) -> MachineSnapshot:
        """The state as of `index`; segments may go below the smallest live
        index (every index up to `index` when none is live). Bodies this
        replica holds from an installed snapshot are kept only while live."""
        sli = self.state.smallest_live_index()
        live = index + 1 if sli is None else sli
        self._snap_bodies = {k: m for k, m in self._snap_bodies.items() if key_index(k) >= live}
        data = self._encode_snapshot(self._snap_bodies)
        # The live indexes for compaction, taken with the snapshot's state (so
        # a snapshot sent to a follower finds every body it names). Only when
        # few messages are live compared to the entries below the snapshot:
        # computing them is linear in the number of live messages.
        keep: list[int] | None = None
        try:
            if _live_count(self.state) * 2 < index - self.glog.first_index():
                keep = live_indexes(self.state)  # raft indexes
        except st.StorageError:
            keep = None
        return MachineSnapshot(data, live, keep)

    # Snapshot format: msgpack {"state": queue machine snapshot, "bodies":
    # {message key: [properties, body, exchange, routing key]}} (bodies keyed
    # by raft index when the state is of version 1: `_decode_snapshot`). Locally taken
    # snapshots carry only bodies this replica got from a snapshot itself (its
    # own log keeps the rest: release() never deletes a segment holding a live
    # message); snapshots sent to a follower carry every live body below the
    # snapshot index (see snapshot_for_follower).
    def _encode_snapshot(self, bodies: dict[int, Message]) -> bytes:
        return wire.pack({"state": qm.snapshot(self.state), "bodies": {i: list(m) for i, m in bodies.items()}})

    @staticmethod
    def _decode_snapshot(data: bytes) -> tuple[qm.QueueState, dict[int, Any]]:
        """The state and the bodies (by message key) of snapshot bytes."""
        doc = wire.unpack(data)
        shift = KEY_POS_BITS if is_version_1(doc["state"]) else 0
        return qm.restore(doc["state"]), {int(i) << shift: m for i, m in doc["bodies"].items()}

    def restore(self, data: bytes, installed: bool) -> None:
        self.state, bodies = self._decode_snapshot(data)
        self._snap_bodies = {k: tuple(m) for k, m in bodies.items()}
        self._read_batch = None

    def snapshot_for_follower(self, data: bytes, snap_index: int) -> bytes:
        """Every live body below the snapshot index goes along: the follower's
        log will not hold them."""
        state, bodies = self._decode_snapshot(data)
        for key in live_keys(state):
            if key_index(key) <= snap_index and key not in bodies:
                try:
                    bodies[key] = list(self.message(key))
                except (st.StorageError, KeyError, IndexError, ValueError):
                    log.error("%s: live message %d missing from the log", self.name, key)
        return wire.pack({"state": qm.snapshot(state), "bodies": bodies})

    def _dlx_deliver(self, eff: qe.DeadLetterDeliver) -> None:
        if self._dlx is not None and not self._replaying:
            self._dlx.deliver(eff)

    def _sync_dlx_worker(self) -> None:
        """Run the dead-letter worker exactly while leading an at-least-once queue."""
        cfg = self.state.config
        want = (self.is_leader and not self.deleted and cfg.at_least_once
                and cfg.dead_letter_exchange is not None)
        if want and self._dlx is None:
            self._dlx = DlxWorker(self.host, self, self.command)
            self._dlx.attach()
        elif not want and self._dlx is not None:
            self._dlx.stop()
            self._dlx = None

    def _command_applied(self) -> None:
        super()._command_applied()
        if self._dlx is not None or self.state.config.at_least_once:
            self._sync_dlx_worker()  # a policy may have changed the strategy

    def _role_changed(self, role: Role, leader: NodeId | None) -> None:
        if role is not Role.LEADER and self._dlx is not None:
            self._dlx.stop()
            self._dlx = None
        if role is Role.LEADER:
            self._loop.call_soon(self._when_caught_up)
        if self._on_role is not None:
            self._on_role(self)

    def _when_caught_up(self) -> None:
        """Wait until this term's first entry is committed and applied, so the
        state reflects everything the previous leader committed."""
        node = self.group.node
        if not self.is_leader or self.deleted:
            return
        committed = node.log.committed
        if committed and node.log.term(committed) == node.term and self.group.applied_index >= committed:
            self._leader_housekeeping()
        else:
            self._loop.call_later(0.02, self._when_caught_up)

    def _leader_housekeeping(self) -> None:
        """On election: return the messages of consumers whose channels are
        gone (their node restarted or left), re-send deliveries that may have
        been lost with the old leader, restart the TTL timer, and record this
        node as the queue's leader in the metadata."""
        if not self.is_leader:
            return
        self.reap_dead_channels()
        self.redeliver_checked_out()
        self._sync_dlx_worker()
        if self.state.timer_at is not None:
            self._set_timer(0)
        self.host.leader_elected(self.vhost, self.name, self.group.node.term)

    def gone_channels(self) -> list[ChannelRef]:
        """Channels of consumers or tracked publishers that are gone for good."""
        channels = {cid.channel for cid in self.state.consumers} | set(self.state.publishers)
        return sorted(ch for ch in channels if self.host.channel_gone(ch))

    def reap_dead_channels(self) -> None:
        """Channels gone for good (their node restarted, or closed here) stop
        being consumers and publishers; channels only suspected gone (their
        node unreachable for a while) lose their consumers (the messages go
        back to the queue) but keep their de-duplication entry, since they
        may still re-send publishes."""
        host = self.host
        consumers = {cid.channel for cid in self.state.consumers}
        gone = set(self.gone_channels())
        suspect = {ch for ch in consumers - gone if host.channel_dead(ch)}
        for ch, keep in [*((c, False) for c in sorted(gone)), *((c, True) for c in sorted(suspect))]:
            try:
                self.command(qm.ChannelDown(ch, keep_publisher=keep)).add_done_callback(_retrieve)
            except Exception as exc:
                log.debug("%s: ChannelDown(%s) not proposed: %s", self.name, ch, exc)

    def close(self) -> None:
        super().close()
        if self._dlx is not None:
            self._dlx.stop()
            self._dlx = None
        self.group.close(f"queue '{self.name}' in vhost '{self.vhost}' is gone")
        # gathered enqueues are never proposed on a closed member: they fail as
        # replaced, and their publishers (or forwarding nodes) re-send them
        self._flush_batch()

    def storage_accounting(self) -> dict[str, Any]:
        """Read-only, for the management API's storage manifest: the raft
        indexes of the entries holding every live message (sorted), and for
        the oldest one its enqueue time (leader's clock, from its log entry)
        and what holds it."""
        st_ = self.state
        keys = live_keys(st_)
        live = _entry_indexes(keys)
        out: dict[str, Any] = {"group_id": self.glog.group_id, "live_indexes": live,
                               "live_messages": len(keys),
                               "oldest_live_timestamp_ms": None, "oldest_live_holder": None}
        if not live:
            return out
        oldest = live[0]
        holder = "ready"
        def held(recs: Any) -> bool:
            return any(key_index(rec_key(r)) == oldest for r in recs)

        for cid, c in st_.consumers.items():
            if held(c.checked.values()):
                holder = f"consumer '{cid.tag}' on channel {cid.channel} (unacknowledged)"
        if held(st_.returns):
            holder = "returned, awaiting redelivery"
        if held(rec[0] for rec in [*st_.dlx_pending, *st_.dlx_checked.values()]):
            holder = "dead-lettered (at-least-once), awaiting the target's confirm"
        out["oldest_live_holder"] = holder
        if not any(key_index(k) == oldest for k in self._snap_bodies):
            try:
                out["oldest_live_timestamp_ms"] = wire.unpack(
                    self.glog.entries(oldest, oldest + 1)[0].data)[0]
            except (st.StorageError, LookupError, ValueError, TypeError):
                pass
        return out


def _live_count(state: Any) -> int:
    """Number of live messages of a queue state (cheap: no iteration over them)."""
    return (len(state.lo) + len(state.hi) + len(state.returns) + len(state.dlx_pending)
            + len(state.dlx_checked) + sum(len(c.checked) for c in state.consumers.values()))


def live_keys(state: Any) -> list[int]:
    """Keys of every live message of a queue state (ready, returned,
    checked out, dead-lettered awaiting confirmation), sorted."""
    out = [rec_key(r) for r in state.lo] + [rec_key(r) for r in state.hi]
    out += [rec_key(r) for r in state.returns]
    for c in state.consumers.values():
        out += [rec_key(r) for r in c.checked.values()]
    out += [rec_key(rec[0]) for rec in state.dlx_pending]
    out += [rec_key(rec[0]) for rec in state.dlx_checked.values()]
    return sorted(set(out))


def live_indexes(state: Any) -> list[int]:
    """Raft indexes of the entries holding a live message of a queue state, sorted."""
    return _entry_indexes(live_keys(state))


def _entry_indexes(keys: list[int]) -> list[int]:
    return sorted({k >> KEY_POS_BITS for k in keys})


def _fail(futs: list[asyncio.Future[Any]], exc: BaseException) -> None:
    for f in futs:
        if not f.done():
            f.set_exception(exc)


def _scatter(entry: asyncio.Future[Any], futs: list[asyncio.Future[Any]], single: bool) -> None:
    """An entry of gathered enqueues ended: each enqueue's future gets its own
    reply (a batch entry's reply is their list, in order; a `single`
    enqueue's is its own), or the entry's failure."""
    if entry.cancelled():
        for f in futs:
            if not f.done():
                f.cancel()
        return
    exc = entry.exception()
    if exc is not None:
        _fail(futs, exc)
        return
    replies = [entry.result()] if single else entry.result()
    for f, r in zip(futs, replies, strict=True):
        if not f.done():
            f.set_result(r)


__all__ = ["ClassicQueue", "DEQUEUE_TAG", "Host", "Message", "QueueProcess", "QueueUid", "QuorumQueue",
           "RemoteQueue", "live_indexes", "live_keys", "msg_key"]
