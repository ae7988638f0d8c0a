"""Cluster plumbing: peers, the transport, and node-to-node requests.

Where it sits: the node owns one `Cluster`. Raft groups send their messages
through `send_raft`; queue processes on a node that does not hold the queue's
leader forward commands with `request` and get the machine's reply back;
leaders send deliveries for consumers on other nodes with `send_deliveries`.

Peers come from `cluster.seeds`: entries `NODE_NAME:PORT` where the node name
is RabbitMQ-style `prefix@host` (`rabbit@qq-0.qq-headless:25672`,
`rabbit-2@localhost:25673`). Every node is configured with the same list; the
list (plus this node) is the initial membership of the metadata group.

Peer messages: tagged dataclasses with one codec, `runtime/peer_wire.py`.
"""
from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any, Protocol

import broker.queue as qm
import broker.runtime.peer_wire as pw
import broker.runtime.raft_wire as raft_wire
from broker.raft import Message as RaftMessage

from .errors import Refused
from .raft_group import ProposalReplaced, ProposalUnknown
from .transport import PeerTransport

log = logging.getLogger("broker.cluster")



def parse_seed(seed: str) -> tuple[str, str, int]:
    """'rabbit@host:25672' -> (node name, host, port)."""
    name, sep, port = seed.rpartition(":")
    if not sep or not port.isdigit() or not name:
        raise ValueError(f"cluster.seeds: {seed!r} is not NODE_NAME:PORT")
    host = name.rpartition("@")[2] or name
    return name, host, int(port)


# ---------------------------------------------------------------- reply codec
_REPLY_TYPES: dict[str, type] = {
    t.__name__: t for t in (qm.Dequeued, qm.DequeueEmpty, qm.DequeueRefused, qm.CheckoutOk,
                            qm.CreditReply, qm.Purged, qm.NotFound, qm.OutOfOrder, Refused)
}


def encode_reply(r: object) -> object:
    if isinstance(r, Enum):
        return ["e", type(r).__name__, r.value]
    if is_dataclass(r):
        vals = [getattr(r, f.name) for f in fields(r)]
        vals = [[v.channel, v.tag] if hasattr(v, "tag") and hasattr(v, "channel") else v for v in vals]
        return ["d", type(r).__name__, vals]
    return r


def decode_reply(raw: Any) -> Any:  # msgpack-decoded in, the machine reply it encodes out
    if isinstance(raw, list) and raw and raw[0] == "e":
        if raw[1] == "EnqueueResult":
            return qm.EnqueueResult(raw[2])
        return qm.OK
    if isinstance(raw, list) and raw and raw[0] == "d":
        cls = _REPLY_TYPES[raw[1]]
        names = [f.name for f in fields(cls)]
        vals = list(raw[2])
        kw = dict(zip(names, vals, strict=True))
        if "consumer" in kw and isinstance(kw["consumer"], list):
            kw["consumer"] = qm.ConsumerId(kw["consumer"][0], kw["consumer"][1])
        return cls(**kw)
    return raw


class NotLeaderHere(Exception):
    """The addressed node does not hold the queue's leader (any more)."""


class _Request:
    __slots__ = ("req_id", "vhost", "queue", "payload", "future", "target", "sent_at", "gen")

    # payload: a queue payload (runtime/wire.py); the future gets the decoded reply
    def __init__(self, req_id: int, vhost: str, queue: str, payload: Any,
                 future: asyncio.Future[Any], target: str) -> None:
        self.req_id = req_id
        self.vhost = vhost
        self.queue = queue
        self.payload = payload
        self.future = future
        self.target = target
        self.sent_at = time.monotonic()
        self.gen = -1  # connection generation it was last sent on (-1: not sent)


class ClusterHost(Protocol):
    """What the cluster plumbing asks of the node: where a queue's leader is,
    and the handlers of what peers send."""

    @property
    def node_name(self) -> str: ...
    @property
    def incarnation(self) -> str: ...
    def queue(self, vhost: str, name: str) -> object | None: ...
    def queue_leader(self, vhost: str, name: str) -> str | None: ...
    def flush_forwarded(self, vhost: str, name: str) -> None: ...
    # payload: a queue payload (runtime/wire.py); the future's result, the machine's reply
    def submit_as_leader(self, vhost: str, name: str, payload: Any) -> asyncio.Future[Any]: ...
    def remember_dequeued(self, vhost: str, name: str, index: int,
                          msg: tuple[bytes, bytes, str, str]) -> None: ...
    def dequeued_message(self, vhost: str, name: str, index: int
                         ) -> tuple[bytes, bytes, str, str] | None: ...
    def serve_call(self, op: str, args: Any) -> object: ...  # args: msgpack-decoded
    def step_group(self, group_id: str, msg: RaftMessage) -> None: ...
    def remote_deliveries(self, vhost: str, name: str, channel: str, tag: str,
                          deliveries: list[Any], bodies: dict[int, Any]) -> None: ...
    def handle_join(self, name: str, host: str, port: int) -> None: ...
    def quiet_notice(self, peer: str, msg: pw.Quiesce) -> None: ...
    def quiet_keepalive(self, peer: str, msg: pw.StillQuiet) -> None: ...
    def remote_alarms(self, peer: str, resources: list[str]) -> None: ...


class Cluster:
    def __init__(self, node: ClusterHost, seeds: tuple[str, ...], bind: str, port: int,
                 secret: bytes, server_ssl: ssl.SSLContext | None = None,
                 client_ssl: ssl.SSLContext | None = None) -> None:
        self.node = node
        self.name: str = node.node_name
        self.peers: dict[str, tuple[str, int]] = {}
        for s in seeds:
            name, host, p = parse_seed(s)
            if name != self.name:
                self.peers[name] = (host, p)
        self.members = sorted({self.name, *self.peers})
        self.transport = PeerTransport(self.name, secret, self._on_message, host=bind, port=port,
                                       server_ssl=server_ssl, client_ssl=client_ssl)
        self.incarnations: dict[str, str] = {}
        self._req_seq = 0
        self._requests: dict[int, _Request] = {}
        self._pending: dict[tuple[str, str], dict[int, _Request]] = {}
        self._retry_task: asyncio.Task[None] | None = None
        self.on_peer_hello: Callable[[str, str], None] | None = None
        #: called with a peer's name at every new connection to it (what we
        #: sent it on the previous one, deliveries included, may be lost)
        self.on_reconnect: Callable[[str], None] | None = None
        # queue -> (leader named by a refusal, when): preferred over a possibly
        # stale metadata record for a few seconds
        self._hints: dict[tuple[str, str], tuple[str, float]] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self.transport.on_peer_down = self._peer_down
        # Every (re)connection starts with our hello: the peer learns that
        # whatever we sent it on the previous connection (replies included)
        # may be lost, and re-sends its requests to us (see _on_message "h").
        self.transport.on_connect = self._connected
        self.on_peer_down: Callable[[str], None] | None = None

    async def start(self) -> int:
        port = await self.transport.start()
        for name, (host, p) in self.peers.items():
            self.transport.add_peer(name, host, p)
        self._retry_task = asyncio.get_running_loop().create_task(self._retry_loop())
        return port

    async def close(self) -> None:
        if self._retry_task is not None:
            self._retry_task.cancel()
        for r in self._requests.values():
            if not r.future.done():
                r.future.set_exception(ConnectionError("node shutting down"))
        for f in self._calls.values():
            if not f.done():
                f.set_exception(ConnectionError("node shutting down"))
        await self.transport.close()

    def _peer_down(self, peer: str) -> None:
        log.info("%s: lost connection to %s", self.name, peer)
        if self.on_peer_down is not None:
            self.on_peer_down(peer)

    def add_peer(self, name: str, host: str, port: int) -> None:
        """A node joined the cluster (or we learned its address from the metadata)."""
        if name == self.name or self.peers.get(name) == (host, port):
            return
        self.peers[name] = (host, port)
        self.members = sorted({self.name, *self.peers})
        self.transport.add_peer(name, host, port)

    def remove_peer(self, name: str) -> None:
        """A node left the cluster for good (Node._forget_departed_peers)."""
        if self.peers.pop(name, None) is None:
            return
        self.members = sorted({self.name, *self.peers})
        self.transport.remove_peer(name)
        self.incarnations.pop(name, None)
        self._hints = {k: h for k, h in self._hints.items() if h[0] != name}

    def send_to(self, peer: str, msg: pw.PeerMessage) -> None:
        self.transport.send(peer, pw.encode(msg))

    def send_join(self, host: str, port: int) -> None:
        """Ask every seed to let this node into the cluster (see Joining.handle_join)."""
        for peer in self.peers:
            self.transport.send(peer, pw.encode(pw.Join(self.name, host, port)))

    def transport_up(self, peer: str) -> bool:
        """Our connection to `peer` is up (what liveness tracks)."""
        return self.transport.is_connected(peer)

    def last_heard(self, peer: str) -> float | None:
        """When `peer` last sent us a frame (monotonic), None if never."""
        return self.transport.last_heard.get(peer)

    def connected(self, peer: str) -> bool:
        return peer == self.name or (self.transport.is_connected(peer) and peer in self.transport.inbound_peers)

    # ------------------------------------------------------------ sending
    def send_raft(self, dst: str, msg: RaftMessage) -> None:
        if dst in self.peers:
            self.transport.send(dst, pw.encode(pw.RaftMessage(raft_wire.encode_message(msg))))

    def request(self, target: str, vhost: str, queue: str, payload: Any) -> asyncio.Future[Any]:
        """Send a queue command to `target` (the queue's leader); the future gets
        the decoded reply.

        Invariant: a queue's requests reach a leader in the order they were
        made, and none is skipped. The machine drops an enqueue whose
        publisher sequence number is not above the last one it accepted, so a
        later publish overtaking a lost earlier one would turn the earlier one
        into a "duplicate" (confirmed, never enqueued). Hence a request is
        only sent while every earlier pending request of its queue was sent on
        the same live connection to the same leader; otherwise it waits, and
        whenever the leader changes or the connection is re-established, all
        the queue's pending requests are re-sent in order (re-sent ones the
        leader already applied come back as duplicates, which is harmless).
        Nothing is re-sent on a timer: a slow leader gets no duplicates."""
        self._req_seq += 1
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        req = _Request(self._req_seq, vhost, queue, payload, fut, target)
        key = (vhost, queue)
        pending = self._pending.setdefault(key, {})
        pending[req.req_id] = req
        self._requests[req.req_id] = req
        gen = self.transport.generation(target) if target in self.peers else -1
        if not target:
            req.target = ""
        if gen >= 0 and all(r.target == target and r.gen == gen for r in pending.values() if r is not req):
            self._send_request(req, gen)
        else:
            self._resync(key)
        return fut

    def _send_request(self, req: _Request, gen: int) -> None:
        req.sent_at = time.monotonic()
        req.gen = gen
        self.transport.send(req.target, pw.encode(pw.QueueRequest(req.req_id, req.vhost, req.queue,
                                                                   req.payload)))

    def _resync(self, key: tuple[str, str]) -> None:
        """(Re)send every pending request of a queue, in order, to its current
        leader, if that leader is reachable; else leave them for later."""
        pending = self._pending.get(key)
        if not pending:
            return
        leader = self._leader_for(key)
        if leader == self.name:
            self.node.flush_forwarded(*key)
            return
        if leader is None or leader not in self.peers:
            return
        gen = self.transport.generation(leader)
        if gen < 0:
            return
        for r in list(pending.values()):
            if r.future.done():  # cancelled by its channel, or answered: never re-sent
                self._finish(r)
                continue
            r.target = leader
            self._send_request(r, gen)

    def _connected(self, peer: str) -> list[Any]:
        """A new connection to `peer`: it starts with our hello; then whatever
        the node must send again (deliveries lost with the old one)."""
        if self.on_reconnect is not None:
            asyncio.get_running_loop().call_soon(self.on_reconnect, peer)
        return pw.encode(pw.Hello(self.node.incarnation))

    def _leader_for(self, key: tuple[str, str]) -> str | None:
        """Where a queue's requests go: this node's view (its member's leader,
        else the metadata record), unless a recent refusal named another
        leader (the metadata record can lag behind an election)."""
        hint = self._hints.get(key)
        if hint is not None:
            if time.monotonic() - hint[1] < 5.0 and hint[0] in self.peers:
                own = self.node.queue_leader(*key)
                q = self.node.queue(*key)
                if own == self.name or (q is not None and getattr(q, "group", None) is not None):
                    return own  # a local member knows better than any hint
                return hint[0]
            del self._hints[key]
        return self.node.queue_leader(*key)

    def _resync_target(self, peer: str) -> None:
        for key, pending in list(self._pending.items()):
            if any(r.target == peer for r in pending.values()):
                for r in pending.values():
                    r.gen = -1
                self._resync(key)

    def _finish(self, req: _Request) -> None:
        self._requests.pop(req.req_id, None)
        pending = self._pending.get((req.vhost, req.queue))
        if pending is not None:
            pending.pop(req.req_id, None)
            if not pending:
                del self._pending[(req.vhost, req.queue)]

    def take_pending(self, vhost: str, queue: str) -> list[_Request]:
        """Hand a queue's pending requests (in order) to a local leader."""
        pending = self._pending.pop((vhost, queue), {})
        for r in pending.values():
            self._requests.pop(r.req_id, None)
        return [r for r in pending.values() if not r.future.done()]

    def has_pending(self, vhost: str, queue: str) -> bool:
        return (vhost, queue) in self._pending

    async def _retry_loop(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            for key, pending in list(self._pending.items()):
                for r in [r for r in pending.values() if r.future.done()]:
                    self._finish(r)
                if not pending:
                    continue
                leader = self._leader_for(key)
                if leader == self.name:
                    self.node.flush_forwarded(*key)
                    continue
                if leader is None or leader not in self.peers:
                    continue
                gen = self.transport.generation(leader)
                if gen >= 0 and any(r.target != leader or r.gen != gen for r in pending.values()):
                    self._resync(key)

    async def call(self, peer: str, op: str, args: object, timeout: float) -> Any:  # msgpack-decoded
        """Ask `peer` a node-local question (`NodeCalls.serve_call(op, args)`,
        e.g. its AMQP connections for the management API) and wait for the
        answer. Not re-sent: a lost connection or a slow peer raises
        TimeoutError after `timeout`; an error on the peer raises RuntimeError."""
        self._req_seq += 1
        call_id = self._req_seq
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        try:
            if peer not in self.peers or not self.transport.is_connected(peer):
                raise ConnectionError(f"node {peer} is not connected")
            self.transport.send(peer, pw.encode(pw.Call(call_id, op, args)))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._calls.pop(call_id, None)

    def _serve_call(self, peer: str, call: pw.Call) -> None:
        call_id = call.call_id
        try:
            value, ok = self.node.serve_call(call.op, call.args), True
        except Exception as exc:  # noqa: BLE001 - the asker gets the text
            value, ok = f"{type(exc).__name__}: {exc}", False
        self.transport.send(peer, pw.encode(pw.CallReply(call_id, ok, value)))

    def send_deliveries(self, node: str, vhost: str, queue: str, channel: str, tag: str,
                        deliveries: list[Any], bodies: dict[int, Any]) -> None:
        if node in self.peers:
            self.transport.send(node, pw.encode(pw.Deliveries(vhost, queue, channel, tag, deliveries,
                                                              bodies)))

    # ------------------------------------------------------------ receiving
    def _on_message(self, peer: str, raw: Any) -> None:
        try:
            m = pw.decode(raw)
            if isinstance(m, pw.RaftMessage):
                msg = raft_wire.decode_message(m.message)
                self.node.step_group(msg.group, msg)
            elif isinstance(m, pw.Deliveries):
                self.node.remote_deliveries(m.vhost, m.queue, m.channel, m.tag, m.deliveries, m.bodies)
            elif isinstance(m, pw.QueueRequest):
                self._serve_request(peer, m)
            elif isinstance(m, pw.QueueReply):
                self._on_reply(m.req_id, m.status, m.value)
            elif isinstance(m, pw.Join):
                self.node.handle_join(m.node_name, m.host, m.port)
            elif isinstance(m, pw.Call):
                self._serve_call(peer, m)
            elif isinstance(m, pw.CallReply):
                fut = self._calls.get(m.call_id)
                if fut is not None and not fut.done():
                    if m.ok:
                        fut.set_result(m.value)
                    else:
                        fut.set_exception(RuntimeError(m.value))
            elif isinstance(m, pw.Quiesce):
                self.node.quiet_notice(peer, m)
            elif isinstance(m, pw.StillQuiet):
                self.node.quiet_keepalive(peer, m)
            elif isinstance(m, pw.Ping):
                pass  # the transport noted when it arrived (last_heard)
            elif isinstance(m, pw.AlarmState):
                self.node.remote_alarms(peer, m.resources)
            elif isinstance(m, pw.Hello):
                # A new connection from `peer`: replies it sent us on the old
                # one may be lost. Re-send our pending requests to it, in order
                # (enqueues are de-duplicated, the rest is idempotent).
                incarnation = m.incarnation
                self._resync_target(peer)
                old = self.incarnations.get(peer)
                self.incarnations[peer] = incarnation
                if old != incarnation and peer in self.peers:
                    # answer so the peer learns ours even if it started first
                    # (a joining node not admitted yet gets ours once it is)
                    self.transport.send(peer, pw.encode(pw.Hello(self.node.incarnation)))
                    if self.on_peer_hello is not None:
                        self.on_peer_hello(peer, incarnation)
        except pw.PeerMessageError as exc:
            log.warning("dropped a message from %s: %s", peer, exc)
        except Exception:
            log.exception("bad message from %s", peer)

    def _serve_request(self, peer: str, req: pw.QueueRequest) -> None:
        req_id, vhost, queue, payload = req.req_id, req.vhost, req.queue, req.payload

        def reply(status: str, value: Any) -> None:
            self.transport.send(peer, pw.encode(pw.QueueReply(req_id, status, value)))

        try:
            fut = self.node.submit_as_leader(vhost, queue, payload)
        except NotLeaderHere:
            reply("not_leader", self.node.queue_leader(vhost, queue))
            return
        except Exception as exc:
            reply("error", str(exc))
            return

        def done(f: asyncio.Future[Any]) -> None:
            if f.cancelled() or f.exception() is not None:
                if isinstance(f.exception(), (ProposalReplaced, ProposalUnknown)):
                    # Proposed here while leader, then overwritten by a new
                    # leader's entry (never applied), or its fate unknown here
                    # (member closed, snapshot installed over it): the
                    # requester re-sends it, in order, to the leader (enqueues
                    # are de-duplicated, the others are idempotent).
                    reply("not_leader", self.node.queue_leader(vhost, queue))
                else:
                    reply("error", str(f.exception()))
                return
            result = f.result()
            if isinstance(result, qm.Dequeued):
                # basic.get from a node that may hold no replica: send the body along
                msg = self.node.dequeued_message(vhost, queue, result.key)
                reply("ok", ["dqb", encode_reply(result), list(msg) if msg is not None else None])
            else:
                reply("ok", encode_reply(result))
        fut.add_done_callback(done)

    def _on_reply(self, req_id: int, status: str, value: Any) -> None:
        req = self._requests.get(req_id)
        if req is None or req.future.done():
            return
        if status == "ok":
            self._finish(req)
            if isinstance(value, list) and value and value[0] == "dqb":
                result = decode_reply(value[1])
                if value[2] is not None:
                    # kept by the node, not by a queue process that a
                    # membership change may replace before the get reads it
                    self.node.remember_dequeued(req.vhost, req.queue, result.key,
                                                tuple(value[2]))
                req.future.set_result(result)
                return
            req.future.set_result(decode_reply(value))
        elif status == "not_leader":
            # Refused unapplied (the target is not, or not yet, the leader): the
            # retry loop re-sends the queue's requests, in order, to whoever is
            # the leader by then (possibly the same node once it is elected),
            # preferring the leader the refusal names.
            key = (req.vhost, req.queue)
            if isinstance(value, str) and value and value != req.target and value in self.peers:
                self._hints[key] = (value, time.monotonic())
            for r in self._pending.get(key, {}).values():
                r.gen = -1
        else:
            # the leader could not apply it (group stopped, queue gone): fail
            self._finish(req)
            req.future.set_exception(RuntimeError(str(value)))
