"""Peer transport: authenticated, batched, length-prefixed msgpack frames between nodes.

Where it sits: the node driver hands Raft messages (and forwarded publishes) for
other nodes to `PeerTransport.send(peer, message)`; messages from peers arrive
through the `on_message(peer, message)` callback. Above it, Raft tolerates loss,
duplication and reordering across reconnects; below it is TCP (optionally TLS).

Wire format (all integers big-endian):

    frame   = length:u32  payload[length]
    payload = msgpack array of messages        (one frame carries a batch)

Connection model: every node keeps ONE outbound connection per peer for sending
and accepts inbound connections for receiving. Two connections per pair avoid
the simultaneous-connect race and keep each direction a simple ordered stream.

Handshake (mutual authentication with the shared cluster secret, the Erlang
cookie analogue; the secret itself never crosses the wire):

    server -> client  {"v": 1, "challenge": Ns}
    client -> server  {"v": 1, "node": C, "challenge": Nc,
                       "proof": HMAC(secret, "client|" + Ns + Nc + C)}
    server -> client  {"v": 1, "node": S, "proof": HMAC(secret, "server|" + Nc + Ns + S)}

Each handshake message is one frame whose payload is a msgpack map. A peer that
fails the handshake is disconnected and logged; nothing it sent is delivered.

Delivery guarantee: at most once, in order per connection, and **every loss
is visible** as a new connection: messages queued while a peer is
unreachable are kept up to `max_queued` (oldest dropped first, counted in
`stats`) and sent once the connection is back; messages queued while a
connection was up are dropped when it breaks (they may have been partly
written to it); and when a live connection's queue overflows (the peer reads
too slowly), the connection is closed rather than a message silently
dropped from the middle of its stream. So a message can only be lost with
the connection it was meant for: `generation(peer)` changes on our side, and
the peer sees a new inbound connection, which starts with the message
`on_connect(peer)` returns (the node's hello). Callers that need reliability
(forwarded requests and their replies) re-send on either signal.

Frames are bounded by bytes on the sending side too: a batch is cut before
it passes `max_batch_bytes` (one message alone may be larger, up to the
receiver's `max_frame`), so a burst of large messages never makes a frame
the receiver refuses.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import random
import socket
import ssl
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from broker.common.packing import array_header, packb

log = logging.getLogger("broker.transport")

_LEN = struct.Struct(">I")
#: Nodes of different protocol versions refuse each other (no mixed-version
#: clusters). 2: quorum-queue batch entries and message keys (runtime/wire.py,
#: queue snapshot version 2): a node of version 1 would read a key as a raft
#: index, i.e. another message's body.
PROTOCOL_VERSION = 2


def _check_version(msg: object) -> None:
    """Refuse, saying why, a handshake message of another protocol version."""
    if isinstance(msg, dict) and "v" in msg and msg["v"] != PROTOCOL_VERSION:
        raise AuthenticationFailed(
            f"peer speaks cluster protocol version {msg['v']!r}, this node {PROTOCOL_VERSION}: "
            "mixed-version clusters are not supported, upgrade every node")
DEFAULT_MAX_FRAME = 512 * 1024 * 1024
DEFAULT_MAX_BATCH_BYTES = 8 * 1024 * 1024
HANDSHAKE_TIMEOUT_S = 5.0
#: A connect that has not completed by then is abandoned and tried again.
#: The kernel's own SYN retries back off (1, 2, 4, 8... s): a connect begun
#: during a partition would otherwise send its next SYN many seconds after
#: the partition healed.
CONNECT_TIMEOUT_S = 2.0
#: TCP_USER_TIMEOUT of a peer connection: data left unacknowledged this
#: long (a partition, a peer host gone) aborts the connection, and the
#: sender reconnects (CONNECT_TIMEOUT_S a try). Without it the connection
#: stays up through the partition while TCP's retransmissions back off, and
#: after the heal nothing flows until the next one, seconds later (chaos:
#: a two-member group stalled 6 s after each heal, both members
#: pre-candidates that never heard each other). Nodes ping each other every
#: pass, so a live connection always has its data acknowledged.
USER_TIMEOUT_MS = 5000


class TransportError(Exception):
    """A peer connection failed in a way the other side must be told about."""


class AuthenticationFailed(TransportError):
    """The peer does not know the cluster secret (or speaks another protocol)."""


def _proof(secret: bytes, role: bytes, a: bytes, b: bytes, node: str) -> bytes:
    return hmac.new(secret, role + b"|" + a + b + node.encode(), hashlib.sha256).digest()


@dataclass(slots=True)
class TransportStats:
    frames_sent: int = 0
    messages_sent: int = 0
    frames_received: int = 0
    messages_received: int = 0
    dropped_queue_full: int = 0
    overflow_disconnects: int = 0
    oversized_dropped: int = 0
    auth_failures: int = 0
    connects: int = 0


@dataclass(slots=True)
class _Outbound:
    """One peer's send side: a queue, a writer task, and reconnect state."""

    peer: str
    host: str
    port: int
    queue: deque[Any] = field(default_factory=deque)  # messages: anything msgpack packs
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    connected: bool = False
    generation: int = 0  # incremented at every successful (re)connection
    overflowed: bool = False  # a message was dropped from a live connection's queue


def _encode(payload: object) -> bytes:
    body = packb(payload)
    return _LEN.pack(len(body)) + body


def _user_timeout(writer: asyncio.StreamWriter) -> None:
    """USER_TIMEOUT_MS on the connection's socket (Linux; elsewhere a no-op)."""
    sock = writer.get_extra_info("socket")
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if sock is not None and option is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, USER_TIMEOUT_MS)
        except OSError as exc:  # pragma: no cover - a kernel without the option
            log.debug("TCP_USER_TIMEOUT not set: %s", exc)


async def _read_frame(reader: asyncio.StreamReader, max_frame: int) -> Any:  # msgpack-decoded
    """The next frame's decoded payload. Refuses an oversized or undecodable
    frame with TransportError (the connection is then dropped); a stream that
    ends mid-frame raises asyncio.IncompleteReadError. Nothing else."""
    header = await reader.readexactly(4)
    (length,) = _LEN.unpack(header)
    if length > max_frame:
        raise TransportError(f"frame of {length} bytes exceeds the {max_frame}-byte limit")
    body = await reader.readexactly(length)
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        # TypeError: a map key msgpack cannot hash (an array or a map), found by
        # fuzzing; it escaped every handler, the unauthenticated handshake's too
        raise TransportError(f"undecodable frame: {type(exc).__name__}: {exc}") from None


class PeerTransport:
    """Send and receive batched messages to/from peers with mutual authentication.

    `on_message(peer_name, message)` is called on the event loop for every
    message received from an authenticated peer, in order.
    """

    def __init__(
        self,
        node: str,
        secret: bytes,
        on_message: Callable[[str, Any], None],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        server_ssl: ssl.SSLContext | None = None,
        client_ssl: ssl.SSLContext | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_batch: int = 4096,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        max_queued: int = 100_000,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        if not secret:
            raise ValueError("the cluster secret must not be empty")
        self.node = node
        self._secret = secret
        self._on_message = on_message
        self._host = host
        self._port = port
        self._server_ssl = server_ssl
        self._client_ssl = client_ssl
        self._max_frame = max_frame
        self._max_batch = max_batch
        self._max_batch_bytes = max_batch_bytes
        self._max_queued = max_queued
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._rng = rng or random.Random()
        self._server: asyncio.base_events.Server | None = None
        self._peers: dict[str, _Outbound] = {}
        self._inbound: set[asyncio.Task[None]] = set()
        self._inbound_writers: set[asyncio.StreamWriter] = set()
        self.stats = TransportStats()
        self._closed = False
        #: called with a peer's name when our connection to it breaks
        self.on_peer_down: Callable[[str], None] | None = None
        #: called with a peer's name when a connection to it is established:
        #: the message it returns goes first on the new connection
        self.on_connect: Callable[[str], object] | None = None
        #: peers currently authenticated on an inbound connection (for status pages)
        self.inbound_peers: dict[str, int] = {}
        #: monotonic time of the last frame each peer sent us (failure
        #: detection of a peer whose connection hangs without breaking)
        self.last_heard: dict[str, float] = {}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> int:
        """Listen for peers; return the bound port."""
        self._server = await asyncio.start_server(
            self._accept, self._host, self._port, ssl=self._server_ssl
        )
        sock = self._server.sockets[0]
        self._port = sock.getsockname()[1]
        return self._port

    @property
    def port(self) -> int:
        return self._port

    async def close(self) -> None:
        self._closed = True
        if self._server is not None:
            self._server.close()
        for out in self._peers.values():
            if out.task is not None:
                out.task.cancel()
        for w in list(self._inbound_writers):
            w.close()
        for t in list(self._inbound):
            t.cancel()
        tasks = [o.task for o in self._peers.values() if o.task] + list(self._inbound)
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self._peers.clear()

    # ------------------------------------------------------------------ sending
    def add_peer(self, peer: str, host: str, port: int) -> None:
        """Know where `peer` listens; start its sender (idempotent; updates the address)."""
        out = self._peers.get(peer)
        if out is None:
            out = _Outbound(peer, host, port)
            self._peers[peer] = out
            out.task = asyncio.get_running_loop().create_task(self._sender(out))
        else:
            out.host, out.port = host, port

    def remove_peer(self, peer: str) -> None:
        out = self._peers.pop(peer, None)
        if out is not None and out.task is not None:
            out.task.cancel()

    def is_connected(self, peer: str) -> bool:
        out = self._peers.get(peer)
        return bool(out and out.connected)

    def generation(self, peer: str) -> int:
        """Changes whenever the connection to `peer` is re-established: a
        message sent under an older generation may have been lost."""
        out = self._peers.get(peer)
        return out.generation if out is not None and out.connected else -1

    def send(self, peer: str, message: object) -> None:
        """Queue `message` for `peer` (batched with whatever else is queued)."""
        out = self._peers.get(peer)
        if out is None:
            if self._closed:
                return  # shutting down: nothing goes out any more
            raise KeyError(f"unknown peer {peer!r}: add_peer() it first")
        if len(out.queue) >= self._max_queued:
            out.queue.popleft()
            self.stats.dropped_queue_full += 1
            if out.connected:
                # A hole in a live stream would go unnoticed: end the
                # connection instead (see the delivery guarantee).
                out.overflowed = True
        out.queue.append(message)
        out.wakeup.set()

    async def _sender(self, out: _Outbound) -> None:
        delay = self._backoff[0]
        while True:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    out.host, out.port, ssl=self._client_ssl,
                    server_hostname=out.host if self._client_ssl else None,
                ), CONNECT_TIMEOUT_S)
                _user_timeout(writer)
            except (OSError, ssl.SSLError, TimeoutError) as exc:
                # A TLS failure is a configuration problem worth seeing; a
                # refused connection is just a peer that is not up (yet).
                level = logging.WARNING if isinstance(exc, ssl.SSLError) else logging.DEBUG
                log.log(level, "%s: connect to %s (%s:%s) failed: %s", self.node, out.peer, out.host,
                        out.port, exc)
                await asyncio.sleep(delay * (0.5 + self._rng.random()))
                delay = min(delay * 2, self._backoff[1])
                continue
            try:
                await asyncio.wait_for(self._client_handshake(reader, writer, out.peer), HANDSHAKE_TIMEOUT_S)
                if self.on_connect is not None:
                    first = self.on_connect(out.peer)
                    if first is not None:
                        out.queue.appendleft(first)
                out.overflowed = False
                out.connected = True
                out.generation += 1
                self.stats.connects += 1
                delay = self._backoff[0]
                await self._pump(out, reader, writer)
            except (AuthenticationFailed, TransportError) as exc:
                self.stats.auth_failures += isinstance(exc, AuthenticationFailed)
                log.warning("%s: connection to %s refused: %s", self.node, out.peer, exc)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
                log.info("%s: connection to %s lost: %s", self.node, out.peer, exc)
            finally:
                was_connected = out.connected
                out.connected = False
                writer.close()
                if was_connected:
                    # What was queued for the broken connection may or may not
                    # have been meant for it: drop it, callers resend (see the
                    # delivery guarantee in the module docstring).
                    out.queue.clear()
                if was_connected and self.on_peer_down is not None:
                    self.on_peer_down(out.peer)
            await asyncio.sleep(delay * (0.5 + self._rng.random()))
            delay = min(delay * 2, self._backoff[1])

    async def _pump(self, out: _Outbound, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Write queued messages as batches; detect a closed peer.

        The receive side of an outbound connection carries nothing after the
        handshake, so any read completing (EOF or stray bytes) ends it."""
        closed = asyncio.ensure_future(reader.read(1))
        try:
            while True:
                if not out.queue:
                    out.wakeup.clear()
                    waiter = asyncio.ensure_future(out.wakeup.wait())
                    done, _ = await asyncio.wait({waiter, closed}, return_when=asyncio.FIRST_COMPLETED)
                    if closed in done:
                        waiter.cancel()
                        raise TransportError("peer closed the connection")
                    continue
                if out.overflowed:
                    self.stats.overflow_disconnects += 1
                    raise TransportError(f"send queue to {out.peer} overflowed ({self._max_queued} "
                                         f"messages): reconnecting so the loss is seen")
                frame = self._next_frame(out)
                if frame is None:
                    continue
                writer.writelines(frame)  # uvloop writes the list with writev, not joined
                self.stats.frames_sent += 1
                await writer.drain()
        finally:
            closed.cancel()

    def _next_frame(self, out: _Outbound) -> list[bytes] | None:
        """Take queued messages for one frame: at most `max_batch` of them and
        `max_batch_bytes` (a single larger message goes alone). The frame is
        the buffers to write back to back: its length and array header, then
        each message as packed (a join would copy the batch twice more)."""
        queue = out.queue
        parts: list[bytes] = []
        size = 0
        while queue and len(parts) < self._max_batch:
            packed = packb(queue[0])
            if parts and size + len(packed) > self._max_batch_bytes:
                break
            queue.popleft()
            if len(packed) + 16 > self._max_frame:
                # The receiver would refuse the frame. Drop it, and end the
                # connection so the loss is seen (senders re-send or resync).
                self.stats.oversized_dropped += 1
                log.error("%s: dropping a %d-byte message to %s (over the %d-byte frame limit)",
                          self.node, len(packed), out.peer, self._max_frame)
                out.overflowed = True
                continue
            parts.append(packed)
            size += len(packed)
        if not parts:
            return None
        head = array_header(len(parts))
        self.stats.messages_sent += len(parts)
        return [_LEN.pack(len(head) + size), head, *parts]

    async def _client_handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, expected_peer: str
    ) -> None:
        hello = await _read_frame(reader, 4096)
        _check_version(hello)
        if not isinstance(hello, dict) or hello.get("v") != PROTOCOL_VERSION or not isinstance(hello.get("challenge"), bytes):
            raise AuthenticationFailed("peer did not send a valid challenge")
        ns: bytes = hello["challenge"]
        nc = os.urandom(16)
        writer.write(_encode({"v": PROTOCOL_VERSION, "node": self.node, "challenge": nc,
                              "proof": _proof(self._secret, b"client", ns, nc, self.node)}))
        await writer.drain()
        reply = await _read_frame(reader, 4096)
        if not isinstance(reply, dict) or "proof" not in reply:
            raise AuthenticationFailed(f"{expected_peer} refused our authentication: {reply!r}")
        server_node = reply.get("node")
        if not isinstance(server_node, str) or not hmac.compare_digest(
            reply["proof"], _proof(self._secret, b"server", nc, ns, server_node)
        ):
            raise AuthenticationFailed(f"{expected_peer} failed to prove it knows the cluster secret")
        if server_node != expected_peer:
            raise AuthenticationFailed(f"expected node {expected_peer!r} at that address, found {server_node!r}")

    # ------------------------------------------------------------------ receiving
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._inbound.add(task)
        self._inbound_writers.add(writer)
        peer = None
        addr = writer.get_extra_info("peername")
        try:
            peer = await asyncio.wait_for(self._server_handshake(reader, writer), HANDSHAKE_TIMEOUT_S)
            self.inbound_peers[peer] = self.inbound_peers.get(peer, 0) + 1
            while True:
                batch = await _read_frame(reader, self._max_frame)
                if not isinstance(batch, list):
                    raise TransportError("frame payload is not a batch")
                self.stats.frames_received += 1
                self.stats.messages_received += len(batch)
                self.last_heard[peer] = time.monotonic()
                for message in batch:
                    self._on_message(peer, message)
        except AuthenticationFailed as exc:
            self.stats.auth_failures += 1
            log.warning("%s: refused unauthenticated peer %s: %s", self.node, addr, exc)
        except TransportError as exc:
            log.warning("%s: dropping connection from %s (%s): %s", self.node, peer, addr, exc)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, msgpack.UnpackException, ValueError) as exc:
            log.info("%s: inbound connection from %s (%s) ended: %s", self.node, peer, addr, exc)
        finally:
            if peer is not None:
                self.inbound_peers[peer] -= 1
                if not self.inbound_peers[peer]:
                    del self.inbound_peers[peer]
            writer.close()
            self._inbound_writers.discard(writer)
            self._inbound.discard(task)

    async def _server_handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
        ns = os.urandom(16)
        writer.write(_encode({"v": PROTOCOL_VERSION, "challenge": ns}))
        await writer.drain()
        try:
            msg = await _read_frame(reader, 4096)
        except (TransportError, msgpack.UnpackException, ValueError) as exc:
            raise AuthenticationFailed(f"malformed handshake: {exc}") from None
        _check_version(msg)
        if not isinstance(msg, dict) or msg.get("v") != PROTOCOL_VERSION:
            raise AuthenticationFailed("malformed handshake")
        node, nc, proof = msg.get("node"), msg.get("challenge"), msg.get("proof")
        if not (isinstance(node, str) and isinstance(nc, bytes) and isinstance(proof, bytes)):
            raise AuthenticationFailed("malformed handshake")
        if not hmac.compare_digest(proof, _proof(self._secret, b"client", ns, nc, node)):
            writer.write(_encode({"v": PROTOCOL_VERSION, "error": "authentication failed"}))
            await writer.drain()
            raise AuthenticationFailed(f"node {node!r} does not know the cluster secret")
        writer.write(_encode({"v": PROTOCOL_VERSION, "node": self.node,
                              "proof": _proof(self._secret, b"server", nc, ns, self.node)}))
        await writer.drain()
        return node
