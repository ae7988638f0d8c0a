"""An AMQP channel's method handlers: declarations, consuming, publishing with
confirms, deliveries, acknowledgements, transactions.

Over 600 lines on purpose: it is one class, `Channel`, whose handlers share
the channel's ordering rule (below) and its state (unacked deliveries,
outstanding confirms, publisher sessions, touched queues); the hot publish,
deliver and ack paths are plain methods on it, with no indirection added for
the sake of file size. The rules with no I/O in them live in
runtime/confirms.py (pure, transcript-tested); message counters in
runtime/msg_stats.py; the socket, login, heartbeats and output buffering in
runtime/amqp_server.py, which this module never imports: a channel reaches
its connection through the `ChannelHost` protocol, and its node through
`ChannelNode` (runtime/node.py is never imported, not even for typing).

Where it sits: the connection dispatches each channel's events (`feed`).
Channels authorise (permissions in the metadata replica), call the metadata
store for declarations, route publishes with `broker.metadata.route`, hand
messages to queue processes and turn queue deliveries into basic.deliver
frames.

Ordering: a channel handles its methods strictly in order. A method that must
wait (a declaration goes through the metadata Raft group; basic.get through
the queue's) marks the channel busy; later events on that channel wait in its
backlog until the reply is sent. Publishes do not wait: they are proposed at
once and confirmed when every target queue has committed them.

Flow control: a publish counts towards the connection's `inflight` until its
queue has committed it, with its weight (`inflight_weight`: one, plus one per
INFLIGHT_UNIT bytes of body); over HIGH_WATER the connection stops reading
("inflight" hold) until less than LOW_WATER remains (runtime/amqp_server.py).
So a connection has at most ~4,000 small messages or ~16 MiB of big bodies
waiting for their queues: big bodies would otherwise fill the Raft pipeline,
and the acks of consumers (settles, in the same pipeline) would wait behind
them while the queue grows. It is read again once a quarter of that is
committed (LOW_WATER 3,000): with 1,000 a connection of big bodies left the
WAL idle while three quarters drained (bench/PERF_NOTES.md: 3-node 64 KiB
~1,150 -> ~1,300 msg/s).
"""
from __future__ import annotations

import asyncio
import logging
import re
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, Literal, NoReturn, Protocol

from pamqp import commands as C
from pamqp.base import Frame

import broker.amqp.codec as acodec
import broker.amqp.events as ev
import broker.metadata as md
import broker.queue as qm
from broker.amqp.connection import ServerConnection
from broker.common.config import Config
from broker.metadata.errors import MetadataError
from broker.metadata.routing import route
from broker.metadata.types import PermissionKind
from broker.queue.config import amqp_type_name, consumer_timeout_ms
from broker.queue.types import DEQUEUE_TAG, ChannelRef, ConsumerId, MsgId

from .confirms import (
    ACK,
    Confirm,
    ack_timeout_text,
    claim_acked,
    first_timed_out,
    group_by_consumer,
    settled_confirms,
    take_acked,
    take_tags,
    unconfirmed,
    unknown_tag_text,
)
from .declarations import reply_detail
from .errors import ChannelError
from .msg_stats import MsgCounters, NodeStats
from .pamqp_ext import declare_ok as _declare_ok
from .publish import PublisherSession
from .queues import Message, QueueProcess, QueueUid

log = logging.getLogger("broker.amqp")

HIGH_WATER = 4000
LOW_WATER = 3000
INFLIGHT_UNIT = 4096


def inflight_weight(size: int) -> int:
    """A publish's weight in the connection's `inflight` (see the module doc)."""
    return 1 + size // INFLIGHT_UNIT

NOACK_CREDIT = 256
_U16 = struct.Struct(">H")
# content-header property flags (AMQP 0-9-1 basic class)
_F_HEADERS = 0x2000
_F_PRIORITY = 0x0800
_F_EXPIRATION = 0x0100
_F_USER_ID = 0x0010


class ConnectionError_(ChannelError):
    """A hard error: closes the whole connection."""


def _raise_md(err: md.MetadataError, method: Frame) -> NoReturn:
    cls = ConnectionError_ if err.hard else ChannelError
    raise cls(err.code, err.text, method)


class Consumer:
    __slots__ = ("cid", "tag", "channel", "queue", "no_ack", "exclusive", "prefetch", "priority",
                 "outstanding", "timeout_ms", "arguments", "qstats")

    def __init__(self, channel: Channel, queue: QueueProcess, tag: str, no_ack: bool,
                 exclusive: bool, prefetch: int, priority: int, timeout_ms: int = 0,
                 arguments: dict[str, Any] | None = None) -> None:
        self.channel = channel
        self.queue = queue
        self.tag = tag
        self.cid = ConsumerId(channel.ref, tag)
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.priority = priority
        # msg ids delivered and not yet settled: a new leader re-sends the
        # deliveries of everything checked out, and these are skipped.
        self.outstanding: set[MsgId] = set()
        # delivery acknowledgement timeout of this consumer's deliveries, ms
        self.timeout_ms = timeout_ms
        self.arguments = arguments or {}
        self.qstats = channel.nstats.queue(queue.uid)

    def deliver(self, queue: QueueProcess, msg_id: MsgId, msg: Message, count: int,
                redelivered: bool) -> None:
        self.channel.deliver(self, msg_id, msg, count, redelivered)

    def cancelled_by_server(self) -> None:
        self.channel.server_cancel(self)


class _Metadata(Protocol):
    """The node's metadata replica (runtime/metastore.py `MetadataStore`)."""

    @property
    def state(self) -> md.MetadataState: ...


class ChannelQueues(Protocol):
    """The node's queue records and processes (runtime/registry.py `Registry`)."""

    def queue_record(self, vhost: str, name: str) -> md.QueueRecord | None: ...

    def queue(self, vhost: str, name: str) -> QueueProcess | None: ...

    def live_queue(self, uid: QueueUid) -> QueueProcess | None: ...


class ChannelCommands(Protocol):
    """Queue commands (runtime/commands.py `Commands`)."""

    # the reply: the queue machine's, which depends on the command
    async def queue_command(self, q: QueueProcess, cmd: qm.Command) -> Any: ...

    def queue_command_reliable(self, uid: QueueUid, cmd: qm.Command,
                               on_applied: Callable[[], None] | None = None) -> None: ...

    async def commands_settled(self, uid: QueueUid, timeout: float = 5.0) -> None: ...

    def dequeued_message(self, q: QueueProcess, index: int) -> Message | None: ...

    # payload: a queue entry (runtime/wire.py); the future's result, the machine's reply
    def submit_enqueue(self, uid: QueueUid, payload: list[Any]) -> asyncio.Future[Any]: ...


class ChannelDeclarations(Protocol):
    """queue.declare/delete and auto-delete (runtime/declarations.py `Declarations`)."""

    def server_queue_name(self) -> str: ...

    async def declare_queue(self, vhost: str, name: str, *, durable: bool,
                            exclusive_owner: str | None, auto_delete: bool,
                            arguments: dict[str, Any], passive: bool,
                            server_named: bool) -> md.Reply | None: ...

    async def delete_queue(self, vhost: str, name: str, if_unused: bool, if_empty: bool,
                           owner: str | None) -> tuple[md.Reply | None, int]: ...

    async def maybe_auto_delete(self, q: QueueProcess) -> None: ...

    def schedule_auto_delete_check(self, q: QueueProcess) -> None: ...


class QueueCounts(Protocol):
    """A queue's counts as its leader has them (runtime/membership.py `Membership`)."""

    async def queue_overview(self, vhost: str, queue: str) -> dict[str, Any]: ...


class ChannelNode(Protocol):
    """What a channel needs from its node (runtime/node.py `Node`, which this
    module never imports): identity, configuration, the metadata replica,
    queue lookups and commands, declarations, and the event loop's timer.
    Read-only, so the node may hold narrower types."""

    @property
    def node_name(self) -> str: ...
    @property
    def incarnation(self) -> str: ...
    @property
    def config(self) -> Config: ...
    @property
    def meta(self) -> _Metadata: ...
    @property
    def registry(self) -> ChannelQueues: ...
    @property
    def commands(self) -> ChannelCommands: ...
    @property
    def declarations(self) -> ChannelDeclarations: ...
    @property
    def membership(self) -> QueueCounts: ...

    def queue(self, vhost: str, name: str) -> QueueProcess | None: ...

    async def meta_execute(self, cmd: md.Command) -> md.Reply | None: ...

    def call_later(self, delay: float, fn: Callable[[], None]) -> object: ...


class ChannelHost(Protocol):
    """What a channel needs from its connection (runtime/amqp_server.py's
    `AmqpConnection`): identity, login, output, flow control and the sets
    of channels whose confirms or settles wait for the next flush."""

    @property
    def node(self) -> ChannelNode: ...

    id: str
    amqp: ServerConnection
    user: str
    vhost: str
    peer: str
    peer_port: int
    channel_opens: int
    last_queue: str | None
    nstats: NodeStats
    props_cache: acodec.PropertiesCache
    #: exchanges the user may write to (checked once per connection)
    write_ok: set[str]
    inflight: int
    holds: set[str]
    confirms_dirty: set[Channel]
    settles_dirty: set[Channel]

    @property
    def name(self) -> str: ...
    def details(self) -> dict[str, Any]: ...
    def write(self, data: bytes) -> None: ...
    def write_parts(self, parts: list[bytes | memoryview]) -> None: ...
    def flush(self) -> None: ...
    def schedule_flush(self) -> None: ...
    def hold(self, why: str) -> None: ...
    def release(self, why: str) -> None: ...
    def channel_failed(self, ch: Channel, err: ChannelError) -> None: ...


class Channel:
    def __init__(self, conn: ChannelHost, number: int) -> None:
        self.conn = conn
        self.number = number
        # Unique per channel open (clients reuse channel numbers): a publisher
        # identity, with its de-duplication state in every queue, is never
        # inherited by a later channel with the same number.
        conn.channel_opens += 1
        self.ref = ChannelRef(f"{conn.node.incarnation}/{conn.id}/{number}.{conn.channel_opens}")
        self.node = conn.node
        self.busy = False
        self.stats = MsgCounters()
        self.nstats = conn.nstats
        self.totals = conn.nstats.totals
        self.backlog: deque[Any] = deque()
        self.closed = False
        # consumers and deliveries
        self.prefetch = 0
        self.global_prefetch = 0  # basic.qos global=true (per channel, as RabbitMQ)
        self.consumers: dict[str, Consumer] = {}
        self.next_tag = 1
        # delivery tag -> (queue, consumer, msg id, ack deadline (monotonic s), timeout ms)
        self.unacked: OrderedDict[int, Unacked] = OrderedDict()
        # The distinct timeouts of this channel's deliveries: with one, deadlines
        # grow with delivery tags and the oldest delivery is the first to expire.
        self.ack_timeouts: set[int] = set()
        self._settles: dict[tuple[QueueUid, ConsumerId], tuple[QueueProcess, list[MsgId]]] = {}
        self._consumer_seq = 0
        # publishing
        self.confirm = False
        self.publish_seq = 0
        self.outstanding: deque[Confirm] = deque()
        # One session per target queue, keyed by the queue's identity (never by
        # a Python object: membership changes replace queue processes).
        self.sessions: dict[QueueUid, PublisherSession] = {}
        # Queues this channel published to, consumed from or got from: they
        # are told ChannelDown when it closes.
        self.touched: dict[QueueUid, QueueProcess] = {}
        self.tx = False
        self._task: asyncio.Task[Any] | None = None  # the method being waited for
        self.tx_publishes: list[ev.Publish] = []
        # settlements of the open transaction, each with the delivery tags it
        # claimed when it arrived (checked then, applied at tx.commit)
        self.tx_acks: list[tuple[ev.Ack | ev.Nack | ev.Reject, list[int]]] = []
        self.tx_claimed: set[int] = set()

    # ------------------------------------------------------------ dispatch
    # `event` is one of the channel's events (ev.Publish, Ack, Nack, Reject,
    # MethodReceived), typed Any: the hot path dispatches on its type object
    # (`t is ev.Publish`), which mypy does not narrow, and a cast or isinstance
    # per message only for the checker is not worth it.
    def feed(self, event: Any) -> None:
        if self.busy:
            self.backlog.append(event)
            return
        self._handle(event)

    def _handle(self, event: Any) -> None:
        try:
            t = type(event)
            if t is ev.Publish:
                if self.tx:
                    self.tx_publishes.append(event)
                else:
                    self.publish(event)
            elif t is ev.Ack:
                if self.tx:
                    self._tx_settle(event, _ACK)
                else:
                    self.ack(event.delivery_tag, event.multiple)
            elif t is ev.Nack or t is ev.Reject:
                if self.tx:
                    self._tx_settle(event, _REJECT if t is ev.Reject else _NACK)
                else:
                    self.nack(event.delivery_tag, getattr(event, "multiple", False), event.requeue,
                              _REJECT if t is ev.Reject else None)
            elif t is ev.MethodReceived:
                self.method(event.method)
        except ChannelError as err:
            self.conn.channel_failed(self, err)

    def _run_async(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run an async method; the channel handles nothing else until it is done."""
        self.busy = True
        task = asyncio.ensure_future(coro)
        self._task = task
        task.add_done_callback(self._async_done)

    def _async_done(self, task: asyncio.Task[Any]) -> None:
        self.busy = False
        self._task = None
        exc = task.exception() if not task.cancelled() else None
        if isinstance(exc, ChannelError):
            self.conn.channel_failed(self, exc)
        elif exc is not None:
            log.exception("channel %s: internal error", self.ref, exc_info=exc)
            self.conn.channel_failed(self, ConnectionError_(541, f"internal error: {exc}"))
        while self.backlog and not self.busy and not self.closed:
            self._handle(self.backlog.popleft())
        self.conn.flush()

    def send(self, method: Frame) -> None:
        self.conn.write(self.conn.amqp.send_method(self.number, method))

    # ------------------------------------------------------------ methods
    def method(self, m: Frame) -> None:
        handler = _METHODS.get(type(m))
        if handler is None:
            raise ConnectionError_(540, f"method {m.name} is not implemented", m)
        handler(self, m)

    def _user(self) -> str:
        return self.conn.user

    def _vhost(self) -> str:
        return self.conn.vhost

    def _check(self, kind: PermissionKind, rtype: Literal["queue", "exchange"], name: str,
               method: Frame) -> None:
        if rtype == "exchange" and not name:
            name = "amq.default"  # RabbitMQ authorises the default exchange under this name
        err = md.check(self.node.meta.state, self._user(), self._vhost(), kind, md.Resource(rtype, name))
        if err is not None:
            _raise_md(err, method)

    def _queue_name(self, name: str, method: Frame) -> str:
        """'' means the channel's last declared queue, as RabbitMQ does."""
        if name:
            return name
        if self.conn.last_queue is None:
            raise ChannelError(404, "no previously declared queue", method)
        return self.conn.last_queue

    # exchange.*
    def exchange_declare(self, m: C.Exchange.Declare) -> None:
        if not m.passive:
            self._check("configure", "exchange", m.exchange, m)
            if m.exchange_type not in _EXCHANGE_TYPES and m.exchange and not m.exchange.startswith("amq."):
                # RabbitMQ's text (broker.metadata says 'invalid exchange type')
                raise ConnectionError_(503, f"unknown exchange type '{m.exchange_type}'", m)
        cmd = md.DeclareExchange(
            md.VhostName(self._vhost()), md.ExchangeName(m.exchange), m.exchange_type,
            bool(m.durable), bool(m.auto_delete), bool(m.internal),
            md.freeze_table(m.arguments or {}), bool(m.passive))
        self._meta_call(cmd, m, None if m.nowait else C.Exchange.DeclareOk())

    def exchange_delete(self, m: C.Exchange.Delete) -> None:
        self._check("configure", "exchange", m.exchange, m)
        cmd = md.DeleteExchange(md.VhostName(self._vhost()), md.ExchangeName(m.exchange), bool(m.if_unused))
        self._meta_call(cmd, m, None if m.nowait else C.Exchange.DeleteOk())

    def exchange_bind(self, m: C.Exchange.Bind | C.Exchange.Unbind, unbind: bool = False) -> None:
        self._check("write", "exchange", m.destination, m)
        self._check("read", "exchange", m.source, m)
        cls = md.Unbind if unbind else md.Bind
        cmd = cls(md.VhostName(self._vhost()), md.ExchangeName(m.source), m.destination, "exchange",
                  m.routing_key, md.freeze_table(m.arguments or {}))
        ok = C.Exchange.UnbindOk() if unbind else C.Exchange.BindOk()
        self._meta_call(cmd, m, None if m.nowait else ok)

    def exchange_unbind(self, m: C.Exchange.Unbind) -> None:
        self.exchange_bind(m, unbind=True)

    # queue.*
    def queue_declare(self, m: C.Queue.Declare) -> None:
        self._run_async(self._queue_declare(m))

    async def _queue_declare(self, m: C.Queue.Declare) -> None:
        node = self.node
        name = m.queue
        server_named = not name and not m.passive  # passive '' is a 404 for '' in RabbitMQ
        if server_named:
            name = node.declarations.server_queue_name()
        if name.startswith("amq.") and not server_named and not m.passive:
            raise ChannelError(403, f"queue name '{name}' contains reserved prefix 'amq.*'", m)
        if not m.passive:
            self._check("configure", "queue", name, m)
        args = dict(m.arguments or {})
        reply = await node.declarations.declare_queue(
            self._vhost(), name, durable=bool(m.durable), exclusive_owner=self.conn.id if m.exclusive else None,
            auto_delete=bool(m.auto_delete), arguments=args, passive=bool(m.passive),
            server_named=server_named)
        if isinstance(reply, md.MetadataError):
            _raise_md(reply, m)
        if not isinstance(reply, md.QueueDeclareOk):  # the machine answers a declare with these two
            raise TypeError(f"queue.declare: unexpected metadata reply {reply!r}")  # internal error (541)
        record = reply.record
        if record.exclusive_owner is not None and record.exclusive_owner != self.conn.id:
            raise ChannelError(405, f"cannot obtain exclusive access to locked queue '{name}' in vhost "
                                    f"'{self._vhost()}'. It could be originally declared on another "
                                    f"connection or the exclusive property value does not match that "
                                    f"of the original declaration.", m)
        self.conn.last_queue = name
        q = node.queue(self._vhost(), name)
        if not m.nowait:
            if q is not None:
                await node.commands.commands_settled(q.uid)  # a closed channel's returns count
            ov = q.overview() if q is not None else {"messages_ready": 0}
            if q is not None and q.kind == "quorum" and not q.is_leader:
                # counts as the leader has them (this node may hold no replica)
                try:
                    ov = await node.membership.queue_overview(self._vhost(), name) or ov
                except Exception as exc:  # no leader right now: report what we know
                    log.debug("declare-ok counts for %s: %s", name, exc)
            consumers = ov.get("consumers", len(q.consumers) if q is not None else 0)
            self.send(_declare_ok(name, ov["messages_ready"], consumers))

    def queue_bind(self, m: C.Queue.Bind | C.Queue.Unbind, unbind: bool = False) -> None:
        qname = self._queue_name(m.queue, m)
        self._check("write", "queue", qname, m)
        self._check("read", "exchange", m.exchange, m)
        cls = md.Unbind if unbind else md.Bind
        cmd = cls(md.VhostName(self._vhost()), md.ExchangeName(m.exchange), qname, "queue",
                  m.routing_key, md.freeze_table(m.arguments or {}), owner=self.conn.id)
        ok = C.Queue.UnbindOk() if unbind else C.Queue.BindOk()
        self._meta_call(cmd, m, None if getattr(m, "nowait", False) else ok)

    def queue_unbind(self, m: C.Queue.Unbind) -> None:
        self.queue_bind(m, unbind=True)

    def queue_purge(self, m: C.Queue.Purge) -> None:
        qname = self._queue_name(m.queue, m)
        self._check("read", "queue", qname, m)
        q = self._local_queue(qname, m)
        self._run_async(self._queue_purge(q, m))

    async def _queue_purge(self, q: QueueProcess, m: C.Queue.Purge) -> None:
        reply = await self.node.commands.queue_command(q, qm.Purge())
        if not m.nowait:
            self.send(C.Queue.PurgeOk(message_count=getattr(reply, "count", 0)))

    def queue_delete(self, m: C.Queue.Delete) -> None:
        qname = self._queue_name(m.queue, m)
        self._check("configure", "queue", qname, m)
        record = self.node.registry.queue_record(self._vhost(), qname)
        if record is not None and record.type == "quorum" and (m.if_unused or m.if_empty):
            # RabbitMQ refuses both flags for quorum queues with a connection error.
            flag = "if-unused" if m.if_unused else "if-empty"
            raise ConnectionError_(540, f"cannot delete queue '{qname}' in vhost '{self._vhost()}'. "
                                        f"queue.delete operations with {flag} flag set are not "
                                        f"supported by quorum queues", m)
        self._run_async(self._queue_delete(qname, m))

    async def _queue_delete(self, qname: str, m: C.Queue.Delete) -> None:
        reply, count = await self.node.declarations.delete_queue(self._vhost(), qname, bool(m.if_unused),
                                                    bool(m.if_empty), owner=self.conn.id)
        if isinstance(reply, md.MetadataError):
            _raise_md(reply, m)
        if not m.nowait:
            self.send(C.Queue.DeleteOk(message_count=count))

    def _meta_call(self, cmd: md.Command, m: Frame, ok: Frame | None) -> None:
        async def run() -> None:
            reply = await self.node.meta_execute(cmd)
            if isinstance(reply, md.MetadataError):
                _raise_md(reply, m)
            if ok is not None:
                self.send(ok)
        self._run_async(run())

    def _local_queue(self, name: str, m: Frame) -> QueueProcess:
        q = self.node.queue(self._vhost(), name)
        if q is None:
            raise ChannelError(404, f"no queue '{name}' in vhost '{self._vhost()}'", m)
        return q

    def _queue_timeout(self, q: QueueProcess, consume_args: dict[str, Any] | None) -> int:
        """The delivery acknowledgement timeout (ms) for deliveries from `q`."""
        record = self.node.registry.queue_record(q.vhost, q.name)
        queue_args = md.thaw_table(record.arguments) if record is not None else None
        pol = md.queue_policy(self.node.meta.state, record) if record is not None else None
        return consumer_timeout_ms(consume_args, queue_args,
                                   md.thaw_table(pol.definition) if pol is not None else None,
                                   self.node.config["consumer_timeout"])

    def check_ack_timeout(self, now: float) -> None:
        """Close the channel (406) when a delivery has waited for its
        acknowledgement longer than its timeout, as RabbitMQ does; the channel's
        close returns its unacknowledged messages to their queues."""
        if self.closed or not self.unacked:
            return
        expired = first_timed_out(self.unacked, now, len(self.ack_timeouts) <= 1)
        if expired is None:
            return
        tag, timeout = expired
        log.warning("consumer on channel %s (delivery tag %d) has timed out waiting for delivery "
                    "acknowledgement. Timeout used: %d ms", self.ref, tag, timeout)
        self.conn.channel_failed(self, ChannelError(406, ack_timeout_text(self.number, timeout)))

    # basic.*
    def basic_qos(self, m: C.Basic.Qos) -> None:
        if m.prefetch_size:
            raise ConnectionError_(540, f"prefetch_size!=0 ({m.prefetch_size})", m)
        if m.prefetch_count > 65535:
            raise ChannelError(406, "prefetch_count exceeds 65535", m)
        if m.global_:
            # RabbitMQ: global qos is refused for quorum queues at consume time;
            # we keep a channel-wide limit and refuse consuming from quorum queues.
            self.global_prefetch = m.prefetch_count
        else:
            self.prefetch = m.prefetch_count
        self.send(C.Basic.QosOk())

    def basic_consume(self, m: C.Basic.Consume) -> None:
        qname = self._queue_name(m.queue, m)
        self._check("read", "queue", qname, m)
        q = self._local_queue(qname, m)
        tag = m.consumer_tag
        if not tag:
            self._consumer_seq += 1
            tag = f"amq.ctag-{self.conn.id}-{self.number}-{self._consumer_seq}"
        if tag in self.consumers:
            raise ConnectionError_(530, f"attempt to reuse consumer tag '{tag}'", m)
        if q.kind == "quorum" and self.global_prefetch:
            # RabbitMQ (3.10 and 4.x) closes the connection here with 540, although
            # the docs speak of a channel error: clients see the reply, so we follow it.
            raise ConnectionError_(540, f"queue '{qname}' in vhost '{self._vhost()}' does not support "
                                        f"global qos", m)
        record = self.node.registry.queue_record(self._vhost(), qname)
        if record is not None and record.exclusive_owner not in (None, self.conn.id):
            raise ChannelError(405, f"cannot obtain exclusive access to locked queue '{qname}' in "
                                    f"vhost '{self._vhost()}'. It could be originally declared on "
                                    f"another connection or the exclusive property value does not "
                                    f"match that of the original declaration.", m)
        args = m.arguments or {}
        priority = args.get("x-priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ChannelError(406, f"invalid arg 'x-priority' for queue '{qname}' in vhost "
                                    f"'{self._vhost()}': \"expected integer, got {amqp_type_name(priority)}\"", m)
        # Exclusive consumers are enforced by classic queues only: RabbitMQ's quorum
        # queues (3.10 and 4.x, rabbit_quorum_queue:consume) accept the flag and
        # ignore it, and clients see that reply.
        if q.kind != "quorum":
            if m.exclusive and q.consumers:
                raise ChannelError(403, f"queue '{qname}' in vhost '{self._vhost()}' in exclusive use", m)
            if any(c.exclusive for c in q.consumers.values()):
                raise ChannelError(403, f"queue '{qname}' in vhost '{self._vhost()}' in exclusive use", m)
        consumer = Consumer(self, q, tag, bool(m.no_ack), bool(m.exclusive), self.prefetch, priority,
                            self._queue_timeout(q, args), dict(args))
        self.ack_timeouts.add(consumer.timeout_ms)
        self.consumers[tag] = consumer
        q.add_consumer(consumer)
        self.touched[q.uid] = q
        if not m.nowait:
            self.send(C.Basic.ConsumeOk(consumer_tag=tag))
        # no-ack consumers get a finite credit, renewed as their deliveries are
        # written out (see AmqpConnection.pause_writing): a client that stops
        # reading holds at most NOACK_CREDIT messages in the broker.
        prefetch = NOACK_CREDIT if m.no_ack else self.prefetch
        self._run_async(self._checkout(q, consumer, prefetch, priority))

    async def _checkout(self, q: QueueProcess, c: Consumer, prefetch: int, priority: int) -> None:
        await self.node.commands.queue_command(q, qm.Checkout(c.cid, prefetch, priority))

    def basic_cancel(self, m: C.Basic.Cancel) -> None:
        c = self.consumers.pop(m.consumer_tag or "", None)  # decoded frames carry a str
        if c is not None:
            c.queue.remove_consumer(c.cid)
            self._run_async(self._cancel(c, m))
        elif not m.nowait:
            self.send(C.Basic.CancelOk(consumer_tag=m.consumer_tag))

    async def _cancel(self, c: Consumer, m: C.Basic.Cancel) -> None:
        await self.node.commands.queue_command(c.queue, qm.Cancel(c.cid))
        if not m.nowait:
            self.send(C.Basic.CancelOk(consumer_tag=m.consumer_tag))
        # an auto-delete queue goes with its last consumer, no-ack ones included
        await self.node.declarations.maybe_auto_delete(c.queue)

    def server_cancel(self, c: Consumer) -> None:
        if self.consumers.pop(c.tag, None) is not None and not self.closed:
            if self.conn.amqp.client_has("consumer_cancel_notify"):
                self.send(C.Basic.Cancel(consumer_tag=c.tag, nowait=True))
            self.conn.flush()

    def basic_get(self, m: C.Basic.Get) -> None:
        qname = self._queue_name(m.queue, m)
        self._check("read", "queue", qname, m)
        q = self._local_queue(qname, m)
        self.touched[q.uid] = q
        self._run_async(self._get(q, m))

    async def _get(self, q: QueueProcess, m: C.Basic.Get) -> None:
        reply = await self.node.commands.queue_command(q, qm.Dequeue(self.ref, bool(m.no_ack)))
        if isinstance(reply, qm.Dequeued):
            found = self.node.commands.dequeued_message(q, reply.key)
            if found is None:
                # The body is not on this node any more (its member went away
                # while the get was in flight): give the message back, answer
                # empty rather than fail the connection.
                log.warning("%s: basic.get body %d not readable here; returned", q.name,
                            reply.key)
                if not m.no_ack:
                    self.node.commands.queue_command_reliable(q.uid, qm.Return(
                        ConsumerId(self.ref, DEQUEUE_TAG), (reply.msg_id,)))
                self.send(C.Basic.GetEmpty())
                return
            msg = found
            tag = self.next_tag
            self.next_tag += 1
            for st in (self.stats, self.totals, self.nstats.queue(q.uid)):
                if m.no_ack:
                    st.get_no_ack += 1
                else:
                    st.get += 1
                if reply.redelivered:
                    st.redeliver += 1
            if not m.no_ack:
                timeout = self._queue_timeout(q, None)
                self.ack_timeouts.add(timeout)
                self.unacked[tag] = (q, ConsumerId(self.ref, DEQUEUE_TAG), reply.msg_id,
                                     time.monotonic() + timeout / 1000, timeout)
            # x-delivery-count is a quorum-queue header (classic queues do not add it)
            props = msg[0] if not reply.delivery_count or q.kind != "quorum" else \
                self.conn.props_cache.with_delivery_count(msg[0], reply.delivery_count)
            self.conn.write(self.conn.amqp.send_get_ok(
                self.number, tag, reply.redelivered, msg[2], msg[3], reply.messages_ready, props, msg[1]))
        elif isinstance(reply, qm.DequeueRefused):
            raise ChannelError(reply.reply_code, reply_detail(reply.reply_text), m)
        else:
            self.send(C.Basic.GetEmpty())

    def basic_recover(self, m: C.Basic.Recover) -> None:
        # RabbitMQ supports only requeue=true (unacked messages go back to their
        # queues); requeue=false is a 540 connection error, for recover-async too.
        if not m.requeue:
            raise ConnectionError_(540, "requeue=false", m)
        self._return_all_unacked()
        self.send(C.Basic.RecoverOk())

    def basic_recover_async(self, m: C.Basic.RecoverAsync) -> None:
        if not m.requeue:
            raise ConnectionError_(540, "requeue=false", m)
        self._return_all_unacked()

    def _return_all_unacked(self) -> None:
        """basic.recover: every unacked message goes back to its queue, but
        those an open transaction acked stay, for its commit to settle (as
        RabbitMQ, which takes them out of the unacked set at the ack)."""
        claimed = self.tx_claimed
        if claimed:
            kept = {t: d for t, d in self.unacked.items() if t in claimed}
            groups = group_by_consumer(d for t, d in self.unacked.items() if t not in claimed)
            self.unacked.clear()
            self.unacked.update(kept)
        else:
            groups = group_by_consumer(self.unacked.values())
            self.unacked.clear()
        for (uid, cid), ids in groups.items():
            self.node.commands.queue_command_reliable(
                uid, qm.Return(cid, tuple(ids)), partial(self._forget_outstanding, cid, ids))

    def confirm_select(self, m: C.Confirm.Select) -> None:
        if self.tx:
            raise ChannelError(406, "cannot switch from tx to confirm mode", m)
        self.confirm = True
        if not m.nowait:
            self.send(C.Confirm.SelectOk())

    def tx_select(self, m: C.Tx.Select) -> None:
        if self.confirm:
            raise ChannelError(406, "cannot switch from confirm to tx mode", m)
        self.tx = True
        self.send(C.Tx.SelectOk())

    def tx_commit(self, m: C.Tx.Commit) -> None:
        if not self.tx:
            raise ChannelError(406, "channel is not transactional", m)
        pubs, acks = self.tx_publishes, self.tx_acks
        self.tx_publishes, self.tx_acks = [], []
        self.tx_claimed = set()
        futures: list[asyncio.Future[Any]] = []
        for p in pubs:
            futures.extend(self.publish(p, collect=True))
        for a, tags in acks:
            taken = take_tags(self.unacked, tags)
            if isinstance(a, ev.Ack):
                self._acked(taken)
            else:
                self._nacked(taken, a.requeue)

        async def run() -> None:
            if futures:
                await asyncio.gather(*futures, return_exceptions=True)
            self.send(C.Tx.CommitOk())
        self._run_async(run())

    def tx_rollback(self, m: C.Tx.Rollback) -> None:
        if not self.tx:
            raise ChannelError(406, "channel is not transactional", m)
        self.tx_publishes, self.tx_acks = [], []
        self.tx_claimed = set()
        self.send(C.Tx.RollbackOk())

    def _tx_settle(self, event: ev.Ack | ev.Nack | ev.Reject, method: Frame) -> None:
        """A basic.ack/nack/reject inside a transaction: its tags are checked
        now (an unknown one closes the channel, nothing of the transaction
        applied, as RabbitMQ does) and settled at tx.commit."""
        tags = claim_acked(self.unacked, self.tx_claimed, event.delivery_tag,
                           getattr(event, "multiple", False))
        if tags is None:
            raise ChannelError(406, unknown_tag_text(event.delivery_tag), method)
        self.tx_acks.append((event, tags))

    # ------------------------------------------------------------ publishing
    def publish(self, p: ev.Publish, collect: bool = False) -> list[asyncio.Future[Any]]:
        node = self.node
        vhost = self._vhost()
        conn = self.conn
        if p.exchange not in conn.write_ok:
            self._check("write", "exchange", p.exchange, _PUBLISH)
            conn.write_ok.add(p.exchange)
        props = p.properties_raw
        flags = _U16.unpack_from(props, 0)[0] if len(props) >= 2 else 0
        priority = expiration = None
        headers = None
        if flags & (_F_HEADERS | _F_PRIORITY | _F_EXPIRATION | _F_USER_ID):
            decoded = acodec.decode_properties(props)
            priority = decoded.priority
            headers = decoded.headers
            if decoded.expiration is not None:
                expiration = _expiration(decoded.expiration)
            if decoded.user_id is not None and decoded.user_id != conn.user:
                raise ChannelError(406, f"user_id property set to '{decoded.user_id}' but authenticated "
                                        f"user was '{conn.user}'", _PUBLISH)
        routed = route(node.meta.state, md.VhostName(vhost), p.exchange, p.routing_key, headers)
        if isinstance(routed, MetadataError):
            _raise_md(routed, _PUBLISH)
        self.stats.publish += 1
        self.totals.publish += 1
        seq = 0
        if self.confirm:
            self.publish_seq += 1
            seq = self.publish_seq
        find = node.registry.queue
        queues = [q for q in (find(vhost, n) for n in routed) if q is not None]
        if not queues:
            if p.mandatory:
                self.stats.return_unroutable += 1
                self.totals.return_unroutable += 1
                conn.write(conn.amqp.send_return(self.number, 312, "NO_ROUTE", p.exchange, p.routing_key,
                                                 props, p.body))
            if seq:
                self.outstanding.append(Confirm(seq, 0))
                conn.confirms_dirty.add(self)
            return []
        pending = Confirm(seq, len(queues)) if seq else None
        if pending is not None:
            self.outstanding.append(pending)
        size = len(p.body)
        weight = inflight_weight(size)
        futures = []
        for q in queues:
            if self.ref in q.blocked_publishers:
                # overflow reject-publish in force: nack without enqueueing
                self._refused(pending)
                continue
            uid = q.uid
            self.touched[uid] = q
            self.nstats.queue(uid).publish += 1
            conn.inflight += weight
            if pending is not None:
                session = self.sessions.get(uid)
                if session is None:
                    session = self.sessions[uid] = PublisherSession(
                        self.ref, partial(node.commands.submit_enqueue, uid),
                        node.call_later, f"{self.ref}->{q.name}")
                # `pending` and `weight` are bound once per publish, before this loop
                session.publish(size, priority, expiration, props, p.body, p.exchange,
                                p.routing_key, lambda ok: self._published(pending, ok, weight))
                continue
            # No confirms: untracked (no de-duplication), nothing to report.
            try:
                fut = q.enqueue(None, 0, props, p.body, p.exchange, p.routing_key, priority, expiration)
            except Exception as exc:  # stopped group
                log.warning("publish to %s failed: %s", q.name, exc)
                conn.inflight -= weight
                continue
            fut.add_done_callback(lambda f: self._unconfirmed_done(f, weight))
            if collect:
                futures.append(fut)
        if conn.inflight > HIGH_WATER:
            conn.hold("inflight")
        return futures

    def _refused(self, pending: Confirm | None) -> None:
        """One target queue will not take the message: it is nacked."""
        if pending is not None:
            pending.nack = True
            pending.remaining -= 1
            if pending.remaining == 0:
                self.conn.confirms_dirty.add(self)

    def _inflight_done(self, weight: int) -> None:
        conn = self.conn
        conn.inflight -= weight
        if conn.holds and conn.inflight < LOW_WATER:
            conn.release("inflight")

    def _unconfirmed_done(self, fut: asyncio.Future[Any], weight: int) -> None:
        self._inflight_done(weight)
        if not fut.cancelled():
            fut.exception()  # retrieved: nobody waits for an unconfirmed publish

    def _published(self, pending: Confirm, ok: bool, weight: int) -> None:
        """A publisher session's final outcome for one target queue."""
        self._inflight_done(weight)
        if not ok:
            pending.nack = True
        pending.remaining -= 1
        if pending.remaining == 0:
            conn = self.conn
            conn.confirms_dirty.add(self)
            conn.schedule_flush()

    def flush_confirms(self) -> None:
        """Send the confirms of the settled head of `outstanding` (in order;
        see confirms.settled_confirms)."""
        frames, acked = settled_confirms(self.outstanding)
        self.stats.confirm += acked
        self.totals.confirm += acked
        conn = self.conn
        amqp = conn.amqp
        for kind, seq, multiple in frames:
            if kind == ACK:
                conn.write(amqp.send_ack(self.number, seq, multiple))
            else:
                conn.write(amqp.send_nack(self.number, seq, multiple))

    # ------------------------------------------------------------ deliveries
    def deliver(self, c: Consumer, msg_id: MsgId, msg: Message, count: int, redelivered: bool) -> None:
        if self.closed or msg_id in c.outstanding:
            return
        tag = self.next_tag
        self.next_tag = tag + 1
        conn = self.conn
        # Invariant: a msg id stays in c.outstanding until its settle/return is
        # applied by the queue, so a re-send after an election (which re-issues
        # every checked-out message) never duplicates an in-flight ack.
        c.outstanding.add(msg_id)
        st, tot, qs = self.stats, self.totals, c.qstats
        if redelivered:
            st.redeliver += 1
            tot.redeliver += 1
            qs.redeliver += 1
        if c.no_ack:
            st.deliver_no_ack += 1
            tot.deliver_no_ack += 1
            qs.deliver_no_ack += 1
            self._settle_later(c.queue, c.cid, msg_id)
        else:
            st.deliver += 1
            tot.deliver += 1
            qs.deliver += 1
            timeout = c.timeout_ms
            self.unacked[tag] = (c.queue, c.cid, msg_id, time.monotonic() + timeout / 1000, timeout)
        # x-delivery-count is a quorum-queue header (classic queues do not add it)
        props = msg[0] if not count or c.queue.kind != "quorum" else \
            conn.props_cache.with_delivery_count(msg[0], count)
        # a big body is written from the stored buffer (codec.deliver_parts)
        conn.write_parts(conn.amqp.send_deliver_parts(self.number, c.tag, tag, redelivered, msg[2], msg[3],
                                                      props, msg[1]))
        conn.schedule_flush()

    def _settle_later(self, q: QueueProcess, cid: ConsumerId, msg_id: MsgId) -> None:
        key = (q.uid, cid)
        entry = self._settles.get(key)
        if entry is None:
            self._settles[key] = (q, [msg_id])
            self.conn.settles_dirty.add(self)
        else:
            entry[1].append(msg_id)

    def flush_settles(self) -> None:
        """Settles (acks) go to their queue until applied: a leader change or a
        lost connection re-sends them (settling twice is harmless)."""
        settles, self._settles = self._settles, {}
        for (uid, cid), (_q, ids) in settles.items():
            self.node.commands.queue_command_reliable(
                uid, qm.Settle(cid, tuple(ids)), partial(self._forget_outstanding, cid, ids))

    def _forget_outstanding(self, cid: ConsumerId, ids: list[MsgId]) -> None:
        c = self.consumers.get(cid.tag)
        if c is not None and c.cid == cid:
            c.outstanding.difference_update(ids)

    def ack(self, tag: int, multiple: bool) -> None:
        taken = take_acked(self.unacked, tag, multiple)
        if taken is None:
            raise ChannelError(406, unknown_tag_text(tag), _ACK)
        self._acked(taken)

    def _acked(self, taken: list[Unacked]) -> None:
        self.stats.ack += len(taken)
        self.totals.ack += len(taken)
        nstats = self.nstats
        for q, cid, msg_id, _, _ in taken:
            nstats.queue(q.uid).ack += 1
            self._settle_later(q, cid, msg_id)

    def nack(self, tag: int, multiple: bool, requeue: bool, method: Frame | None = None) -> None:
        """basic.nack, or basic.reject (`method` _REJECT: a refusal names the
        method the client sent, as RabbitMQ's does)."""
        taken = take_acked(self.unacked, tag, multiple)
        if taken is None:
            raise ChannelError(406, unknown_tag_text(tag), method or _NACK)
        self._nacked(taken, requeue)

    def _nacked(self, taken: list[Unacked], requeue: bool) -> None:
        for (uid, cid), ids in group_by_consumer(taken).items():
            cmd = qm.Return(cid, tuple(ids)) if requeue else qm.Discard(cid, tuple(ids))
            self.node.commands.queue_command_reliable(
                uid, cmd, partial(self._forget_outstanding, cid, ids))

    # ------------------------------------------------------------ management views
    @property
    def name(self) -> str:
        return f"{self.conn.name} ({self.number})"

    def info(self) -> dict[str, Any]:
        """The channel as RabbitMQ's management API shows it (/api/channels)."""
        conn = self.conn
        return {
            "name": self.name, "number": self.number, "node": self.node.node_name,
            "vhost": conn.vhost, "user": conn.user, "user_who_performed_action": conn.user,
            "connection_details": conn.details(), "state": "closing" if self.closed else "running",
            "consumer_count": len(self.consumers), "messages_unacknowledged": len(self.unacked),
            "messages_unconfirmed": unconfirmed(self.outstanding),
            "messages_uncommitted": len(self.tx_publishes), "acks_uncommitted": len(self.tx_acks),
            "prefetch_count": self.prefetch, "global_prefetch_count": self.global_prefetch,
            "confirm": self.confirm, "transactional": self.tx,
            "message_stats": self.stats.message_stats(),
        }

    def consumer_infos(self) -> list[dict[str, Any]]:
        """This channel's consumers as RabbitMQ shows them (/api/consumers)."""
        details = {"name": self.name, "number": self.number, "node": self.node.node_name,
                   "connection_name": self.conn.name, "peer_host": self.conn.peer,
                   "peer_port": self.conn.peer_port, "user": self.conn.user}
        return [{"consumer_tag": c.tag, "queue": {"name": c.queue.name, "vhost": c.queue.vhost},
                 "channel_details": details, "ack_required": not c.no_ack,
                 "exclusive": c.exclusive, "prefetch_count": c.prefetch, "active": True,
                 "activity_status": "up", "consumer_timeout": c.timeout_ms,
                 "arguments": {k: v for k, v in c.arguments.items()
                               if isinstance(v, (str, int, float, bool))}}
                for c in self.consumers.values()]

    # ------------------------------------------------------------ teardown
    def close(self) -> None:
        """The channel is gone: its consumers go away and its unacked messages
        return to their queues (ChannelDown)."""
        if self.closed:
            return
        self.closed = True
        if self._task is not None and not self._task.done():
            # A consume or get still waiting (e.g. the queue has no leader)
            # must not be applied after this channel is gone: its deliveries
            # would go nowhere and each ChannelDown would count them as a
            # failed delivery (towards the delivery limit).
            self._task.cancel()
        self.flush_settles()
        for session in self.sessions.values():
            # their outcomes will never be reported: give back the flow-control
            # credit they hold (the connection may live on)
            self.conn.inflight -= sum(inflight_weight(size) for size in session.pending_sizes())
            session.close()
        self.sessions.clear()
        if self.conn.holds and self.conn.inflight < LOW_WATER:
            self.conn.release("inflight")
        # What this channel really delivered, per queue and consumer: only
        # those returns count as failed deliveries (see qm.ChannelDown).
        delivered: dict[QueueUid, dict[str, set[int]]] = {}
        for c in self.consumers.values():
            delivered.setdefault(c.queue.uid, {}).setdefault(c.tag, set()).update(c.outstanding)
        for q, cid, msg_id, *_ in self.unacked.values():
            delivered.setdefault(q.uid, {}).setdefault(cid.tag, set()).add(msg_id)
        for c in self.consumers.values():
            c.queue.remove_consumer(c.cid)
        self.consumers.clear()
        for uid in list(self.touched):
            per_tag = delivered.get(uid, {})
            down = qm.ChannelDown(self.ref, delivered=tuple(
                (tag, tuple(sorted(ids))) for tag, ids in sorted(per_tag.items())))
            # Reliable: until applied, the channel's messages stay checked out.
            self.node.commands.queue_command_reliable(uid, down)
            live = self.node.registry.live_queue(uid)
            if live is not None:
                self.node.declarations.schedule_auto_delete_check(live)
        self.touched.clear()
        self.unacked.clear()


_MAX_EXPIRY_MS = 315360000000  # ten years: RabbitMQ 3.10 accepts this and refuses one more


def _expiration(text: str) -> int:
    """The expiration property as RabbitMQ checks it (rabbit_basic), with its
    error texts: Erlang terms printed with ~p, which wraps a line that would
    pass column 78 (measured against RabbitMQ: 77 stays, 79 wraps)."""
    prefix = f"invalid expiration '{text}': "
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise ChannelError(406, prefix + "no_integer", _PUBLISH)
    value = int(text)
    if value < 0:
        term = ("value_negative", value)
    elif value > _MAX_EXPIRY_MS:
        term = ("value_too_large", value)
    else:
        return value
    flat = f"{{{term[0]},{term[1]}}}"
    if len(prefix) + len(flat) > 78:
        flat = f"{{{term[0]},\n{' ' * (len(prefix) + 1)}{term[1]}}}"
    raise ChannelError(406, prefix + flat, _PUBLISH)


Unacked = tuple[QueueProcess, ConsumerId, MsgId, float, int]


_PUBLISH = C.Basic.Publish()
_EXCHANGE_TYPES = frozenset({"direct", "fanout", "topic", "headers"})
_ACK = C.Basic.Ack()
_NACK = C.Basic.Nack()
_REJECT = C.Basic.Reject()

# Each handler takes its own method class: the table is typed by what dispatch knows.
_METHODS: dict[type[Frame], Callable[[Channel, Any], None]] = {
    C.Exchange.Declare: Channel.exchange_declare,
    C.Exchange.Delete: Channel.exchange_delete,
    C.Exchange.Bind: Channel.exchange_bind,
    C.Exchange.Unbind: Channel.exchange_unbind,
    C.Queue.Declare: Channel.queue_declare,
    C.Queue.Bind: Channel.queue_bind,
    C.Queue.Unbind: Channel.queue_unbind,
    C.Queue.Purge: Channel.queue_purge,
    C.Queue.Delete: Channel.queue_delete,
    C.Basic.Qos: Channel.basic_qos,
    C.Basic.Consume: Channel.basic_consume,
    C.Basic.Cancel: Channel.basic_cancel,
    C.Basic.Get: Channel.basic_get,
    C.Basic.Recover: Channel.basic_recover,
    C.Basic.RecoverAsync: Channel.basic_recover_async,
    C.Confirm.Select: Channel.confirm_select,
    C.Tx.Select: Channel.tx_select,
    C.Tx.Commit: Channel.tx_commit,
    C.Tx.Rollback: Channel.tx_rollback,
}

