"""The AMQP 0-9-1 server shell: sockets in, broker actions out.

Where it sits: one `AmqpConnection` (an asyncio Protocol) per client socket
feeds bytes to the sans-I/O `broker.amqp.ServerConnection`, drains its
events, handles the connection's own (login, vhost access, channel open and
close, heartbeats) and dispatches the rest to its `Channel`s
(runtime/channel.py: method handlers, publishing, deliveries, acks). It owns
the output: channels append frames with `write`, and `flush` sends them in
one transport write, after the settles and confirms of the channels marked
dirty since the last flush.

Flow control: the socket stops being read (TCP back-pressure reaches the
client) while any of four holds is on (`AmqpConnection.hold`/`release`):
"inflight" while the connection's enqueues waiting to be committed weigh
more than `HIGH_WATER`, until less than `LOW_WATER` remains (one per message
plus one per 4 KiB of body, counted by the channels: runtime/channel.py);
"write" while its own output buffer is over the transport's high-water mark
(a slow reader); "alarm" while a resource alarm blocks it
(runtime/alarms.py); and "drain" for one pass of the event loop after it
handled `DRAIN_BUDGET` channel events in one go (the rest of what it read
waits for the next pass, after everything else that is ready).

Why the budget: a connection's read can hold a thousand publishes, and
handling them all at once kept the whole node busy for tens of milliseconds
in which no other socket was read and no write completion was applied. A
consumer's acks then renewed its credit only a pass or two later: with a
prefetch of 1,000 at 27k msg/s the consumer went without credit for part of
every round and the queue grew (p99 publish->deliver 180-470 ms, 16 B, one
node, compiled build; 60 ms with the budget).

Why the budget adapts: a pass that ends early brings each queue fewer
publishes, and an entry's Raft, replication and apply work is paid per entry,
so publishes spread over many queues need the long pass (a publisher rotating
over 100 queues brings 2-3 to each in 256 events), while publishes to one or
two queues fill their entries well before it. So a pass also ends after 64
publishes when they averaged 32 or more a routing key: on the 1-node 16 B and
1 KiB rows this took p99 from 75-113 ms to 59-73 at the same throughput;
asking only 8 a key (a publisher rotating over 10 queues then stops at 80)
cut the 3-node row of 10 publishers over 100 queues by a quarter
(bench/PERF_NOTES.md).

The node is a `ServerNode` (below): what this module and its channels use of
it, never runtime/node.py itself (runtime/host_checks.py proves `Node` fits).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Mapping, MutableSet
from typing import Any, Protocol, cast

import broker.amqp.codec as acodec
import broker.amqp.events as ev
import broker.metadata as md
from broker.amqp.connection import ServerConfig, ServerConnection

from .alarms import blocked_reason
from .channel import Channel, ChannelDeclarations, ChannelNode, ConnectionError_
from .errors import ChannelError
from .msg_stats import node_stats

log = logging.getLogger("broker.amqp")

#: channel events (publishes, acks, methods) one connection handles in one
#: pass of the event loop before it lets the others run (see the module doc)
DRAIN_BUDGET = 256
#: ... and a pass ends sooner, from `PASS_FULL` publishes on, once they went
#: to few enough routing keys (`PER_KEY_FULL` publishes a key or more on
#: average): their queues' entries are well filled already, and a longer pass
#: would only delay the other connections (see the module doc)
PASS_FULL = 64
PER_KEY_FULL = 32


class ConnectionLimits(Protocol):
    """The node's connection and channel limits (runtime/limits.py `ConnectionLimits`)."""

    def node_refused(self) -> md.MetadataError | None: ...

    def connection_refused(self, user: str, vhost: str) -> md.MetadataError | None: ...

    def channel_refused(self, user: str) -> md.MetadataError | None: ...


class ServerDeclarations(ChannelDeclarations, Protocol):
    """A channel's declarations, and a closed connection's exclusive queues."""

    def connection_closed(self, conn_id: str) -> None: ...


class ServerNode(ChannelNode, Protocol):
    """What a connection needs from its node (runtime/node.py `Node`, which
    this module never imports): what its channels need, and the AMQP
    settings, limits, resource alarms, the set of open connections and the
    queues (the message counters, runtime/msg_stats.py `StatsHost`)."""

    @property
    def amqp_config(self) -> ServerConfig: ...
    @property
    def limits(self) -> ConnectionLimits: ...
    @property
    def declarations(self) -> ServerDeclarations: ...
    #: resources with an alarm anywhere in the cluster (runtime/alarms.py)
    @property
    def alarm_resources(self) -> frozenset[str]: ...
    @property
    def connections(self) -> MutableSet[AmqpConnection]: ...
    @property
    def queues(self) -> Mapping[tuple[str, str], object]: ...


#: connection ids, unique within the process ("c1", "c2", ...)
_conn_ids = itertools.count(1)


class AmqpConnection(asyncio.Protocol):
    def __init__(self, node: ServerNode) -> None:
        self.id = f"c{next(_conn_ids)}"
        self.node = node
        self.amqp = ServerConnection(node.amqp_config)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.user = ""
        self.vhost = ""
        self.channels: dict[int, Channel] = {}
        self.channel_opens = 0  # channels opened so far (see Channel.ref)
        self.out: list[bytes | memoryview] = []
        #: `out` holds a big body's buffers: written as they are (writelines)
        self.out_vectored = False
        self.flush_scheduled = False
        self.confirms_dirty: set[Channel] = set()
        self.settles_dirty: set[Channel] = set()
        self.inflight = 0
        #: why reading is paused ("inflight", "write", "alarm"; see the module doc)
        self.holds: set[str] = set()
        self.tls = False  # came in on the TLS listener
        self.last_queue: str | None = None
        self.global_prefetch = 0
        self.write_ok: set[str] = set()
        self.props_cache = acodec.PropertiesCache()
        self._ticker: asyncio.TimerHandle | None = None
        self.closed = False
        self.nstats = node_stats(node)
        self.peer_port = 0
        self.host = ""
        self.port = 0
        self.connected_at = int(time.time() * 1000)
        self.client_properties: dict[str, Any] = {}
        self.auth_mechanism = ""
        self.amqp.channel_open_check = self._channel_allowed

    # ------------------------------------------------------------ asyncio hooks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream server's: reads and writes
        self.tls = transport.get_extra_info("ssl_object") is not None
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if peer else ""
        self.peer_port = int(peer[1]) if peer else 0
        sock = transport.get_extra_info("sockname")
        self.host, self.port = (sock[0], int(sock[1])) if sock else ("", 0)
        self.nstats.start()
        self.node.connections.add(self)
        self._schedule_tick()

    def data_received(self, data: bytes) -> None:
        amqp = self.amqp
        amqp.receive_data(data)
        self._drain()

    def eof_received(self) -> bool | None:
        self.amqp.receive_data(b"")
        self._drain()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if "drain" in self.holds:
            # what was read before the loss is handled, as it would have been
            # without the budget (acks settle, publishes are enqueued)
            self._drain(unlimited=True)
        self._teardown()

    def pause_writing(self) -> None:
        # A slow reader: stop reading its input too so its deliveries do not pile up,
        # and hold the settles of its no-ack deliveries: their queues then stop
        # after NOACK_CREDIT messages instead of filling the write buffer.
        self.hold("write")

    def resume_writing(self) -> None:
        self.release("write")
        if not self.closed:
            self.flush()

    # ------------------------------------------------------------ events
    def _drain(self, unlimited: bool = False) -> None:
        amqp = self.amqp
        channels = self.channels
        budget = -1 if unlimited else DRAIN_BUDGET  # counting down from -1 never reaches 0
        published = 0  # publishes handled in this pass, and their routing keys
        keys: set[str] = set()
        while True:
            event = amqp.next_event()
            if event is ev.NEED_DATA or event is ev.CLOSED or event is ev.PAUSED:
                break
            t = type(event)
            if t in (ev.Publish, ev.Ack, ev.Nack, ev.Reject, ev.MethodReceived):
                if t is ev.Publish:
                    if self.node.alarm_resources and not self.alarm_blocked:
                        self._alarm_block()
                    keys.add(cast(ev.Publish, event).routing_key)
                    published += 1
                # each of these has `channel` (mypy does not narrow `t in (...)`:
                # getattr, not a cast per frame)
                ch = channels.get(getattr(event, "channel", 0))
                if ch is not None:
                    ch.feed(event)
                budget -= 1
                if budget == 0 or (published >= PASS_FULL and budget > 0
                                   and len(keys) * PER_KEY_FULL <= published):
                    # the rest (still in `amqp`) after the others' turn
                    self.hold("drain")
                    asyncio.get_running_loop().call_soon(self._drain_more)
                    break
                continue
            self._connection_event(event)
        self.flush()

    def _drain_more(self) -> None:
        if self.closed:
            return
        self.release("drain")
        self._drain()

    def _connection_event(self, event: object) -> None:
        """An event of the connection's own (not a channel's; never a sentinel).
        Rare (login, open, channel open/close, heartbeats): isinstance narrows."""
        amqp = self.amqp
        if isinstance(event, ev.ConnectionStartOk):
            self._login(event)
        elif isinstance(event, ev.ConnectionTuneOk):
            if event.heartbeat and self._ticker is not None:
                self._ticker.cancel()  # re-pace ticks for the negotiated heartbeat
                self._schedule_tick()
        elif isinstance(event, ev.ConnectionOpen):
            state = self.node.meta.state
            # RabbitMQ checks the node's, the vhost's and the user's connection
            # limits before access.
            err = self.node.limits.node_refused() \
                or self.node.limits.connection_refused(self.user, event.virtual_host) \
                or md.check_vhost_access(state, self.user, event.virtual_host)
            if err is not None:
                self.write(amqp.connection_error(530, err.text, 10, 40))
            else:
                self.vhost = event.virtual_host
                self.write(amqp.accept_open())
        elif isinstance(event, ev.ChannelOpen):
            self.channels[event.channel] = Channel(self, event.channel)
        elif isinstance(event, (ev.ChannelClose, ev.ChannelCloseOk)):
            ch = self.channels.pop(event.channel, None)
            if ch is not None:
                ch.close()
        elif isinstance(event, (ev.ConnectionClose, ev.ConnectionCloseOk, ev.ConnectionTerminated,
                                ev.ConnectionLost)):
            if isinstance(event, ev.ConnectionTerminated) and event.reply_code not in (200, 320):
                log.info("connection %s (%s) closed: %s %s", self.id, self.peer, event.reply_code,
                         event.reply_text)
            self.write(amqp.data_to_send())
            self._close_channels()
            if not isinstance(event, ev.ConnectionTerminated) or not event.close_sent:
                self.flush()
                if self.transport is not None:
                    self.transport.close()

    def _login(self, event: ev.ConnectionStartOk) -> None:
        amqp = self.amqp
        node = self.node
        if event.username is None or event.password is None:
            self.write(amqp.reject_login())
            return
        result = md.authenticate(node.meta.state, event.username, event.password, self.peer,
                                 node.config["loopback_users"], event.mechanism)
        if isinstance(result, md.MetadataError):
            log.warning("connection %s (%s): login refused for user '%s'", self.id, self.peer, event.username)
            self.write(amqp.reject_login())
            return
        self.user = event.username
        self.client_properties = event.client_properties or {}
        self.auth_mechanism = event.mechanism
        self.write(amqp.accept_login())

    def _channel_allowed(self) -> tuple[int, str] | None:
        """ServerConnection.channel_open_check: the user's max-channels (530)."""
        err = self.node.limits.channel_refused(self.user)
        return None if err is None else (err.code, err.text)

    def channel_failed(self, ch: Channel, err: ChannelError) -> None:
        amqp = self.amqp
        if isinstance(err, ConnectionError_):
            self.write(amqp.connection_error(err.code, err.text, err.class_id, err.method_id))
            self._close_channels()
        else:
            self.write(amqp.channel_error(ch.number, err.code, err.text, err.class_id, err.method_id))
            ch.close()
            ch.backlog.clear()
        self.flush()

    def _close_channels(self) -> None:
        for ch in list(self.channels.values()):
            ch.close()
        self.channels.clear()

    # ------------------------------------------------------------ output
    def write(self, data: bytes) -> None:
        if data:
            self.out.append(data)

    def write_parts(self, parts: list[bytes | memoryview]) -> None:
        """Buffers to write back to back: several (a big body's delivery, see
        codec.deliver_parts) are written as they are, not joined."""
        if len(parts) == 1:
            self.out.append(parts[0])
        elif parts:
            self.out += parts
            self.out_vectored = True

    def schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.confirms_dirty:
            dirty2, self.confirms_dirty = self.confirms_dirty, set()
            for ch in dirty2:
                ch.flush_confirms()
        extra = self.amqp.data_to_send()
        if extra:
            self.out.append(extra)
        # taken before the write: a transport that calls resume_writing (and
        # so flush) from inside write must not see these bytes again
        out, self.out = self.out, []
        vectored, self.out_vectored = self.out_vectored, False
        if out and self.transport is not None and not self.transport.is_closing():
            if vectored:  # no copy of the big bodies: uvloop writes them with writev
                self.transport.writelines(out)
            else:
                self.transport.write(b"".join(out))  # one part: itself, not a copy
        # Settles go after the write: those of no-ack deliveries renew the
        # consumer's credit, so they wait while the write just made left the
        # transport's buffer full (pause_writing holds "write"); sent before
        # it, a whole batch more than the credit could pile up for a client
        # that stopped reading.
        if self.settles_dirty and "write" not in self.holds:
            dirty, self.settles_dirty = self.settles_dirty, set()
            for ch in dirty:
                ch.flush_settles()

    def hold(self, why: str) -> None:
        """Stop reading the socket for `why` (reading resumes once every hold is released)."""
        if not self.holds and self.transport is not None:
            self.transport.pause_reading()
        self.holds.add(why)

    def release(self, why: str) -> None:
        if why not in self.holds:
            return
        self.holds.discard(why)
        if not self.holds and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    @property
    def alarm_blocked(self) -> bool:
        return "alarm" in self.holds

    # ------------------------------------------------------------ resource alarms
    def _alarm_block(self) -> None:
        """A publish while an alarm is in effect (runtime/alarms.py): tell the
        client (connection.blocked, if it asked for it) and stop reading. What
        was already read is handled as usual: accepted publishes are confirmed."""
        self.write(self.amqp.send_blocked(blocked_reason(self.node.alarm_resources)))
        self.hold("alarm")

    def alarms_changed(self, resources: frozenset[str]) -> None:
        if resources or not self.alarm_blocked or self.closed:
            return
        self.write(self.amqp.send_unblocked())
        self.flush()
        self.release("alarm")

    # ------------------------------------------------------------ heartbeats
    def _schedule_tick(self) -> None:
        # Tick often enough to send a heartbeat every heartbeat/2 seconds and to
        # notice 2 missed intervals promptly, even for short timeouts (1 s).
        hb = self.amqp.heartbeat
        interval = min(1.0, max(0.1, hb / 4)) if hb else 1.0
        self._ticker = asyncio.get_running_loop().call_later(interval, self._tick)

    def _tick(self) -> None:
        if self.closed:
            return
        if self.holds:  # not reading on purpose: its heartbeats wait in the socket
            self.amqp.keepalive()
        result = self.amqp.tick(asyncio.get_running_loop().time())
        self.write(result.data)
        now = time.monotonic()
        for ch in list(self.channels.values()):
            if ch.unacked:
                ch.check_ack_timeout(now)
        self.flush()
        if result.peer_dead:
            log.info("connection %s (%s): missed heartbeats, closing", self.id, self.peer)
            if self.transport is not None:
                self.transport.close()
            return
        self._schedule_tick()

    def _teardown(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._ticker is not None:
            self._ticker.cancel()
        self._close_channels()
        self.node.connections.discard(self)
        self.node.declarations.connection_closed(self.id)

    # ------------------------------------------------------------ management views
    @property
    def name(self) -> str:
        """RabbitMQ's connection name: 'PEER:PORT -> HOST:PORT'."""
        return f"{self.peer}:{self.peer_port} -> {self.host}:{self.port}"

    def details(self) -> dict[str, Any]:
        return {"name": self.name, "peer_host": self.peer, "peer_port": self.peer_port}

    def info(self) -> dict[str, Any]:
        """The connection as RabbitMQ's management API shows it (/api/connections)."""
        amqp = self.amqp
        props = self.client_properties
        return {
            "name": self.name, "node": self.node.node_name, "type": "network",
            # "flow": not read while its publishes wait for their queues (RabbitMQ's
            # credit-flow state); "blocked": a resource alarm
            "state": ("closed" if self.closed else "blocked" if self.alarm_blocked
                      else "flow" if "inflight" in self.holds else "running"),
            "protocol": "AMQP 0-9-1",
            "vhost": self.vhost, "user": self.user, "user_who_performed_action": self.user,
            "auth_mechanism": self.auth_mechanism, "ssl": self.tls,
            "host": self.host, "port": self.port, "peer_host": self.peer,
            "peer_port": self.peer_port, "connected_at": self.connected_at,
            "channels": len(self.channels), "channel_max": amqp.channel_max,
            "frame_max": amqp.frame_max, "timeout": amqp.heartbeat,
            "client_properties": props,
        }

    def force_close(self, text: str) -> None:
        self.write(self.amqp.close(text))
        self.flush()
