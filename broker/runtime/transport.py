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

Receiving: an accepted connection is an asyncio.BufferedProtocol
(`_InboundProtocol`) whose `FrameReader` has the socket read straight into
its buffer and decodes each frame where it landed; a frame bigger than the
buffer gets a buffer of its own size, so a big body is copied once between
the kernel and msgpack. The server's side of the handshake is the first
frame it accepts (at most 4 KiB, within HANDSHAKE_TIMEOUT_S).

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
from typing import Any, cast

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

    #: a frame to send the peer before closing (the server's refusal), if any
    reply: bytes | None = None


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
    # Set by close()/remove_peer() besides cancelling the task: Python 3.11's
    # asyncio.wait_for drops a cancellation that arrives as its inner awaitable
    # finishes (it returns or raises the inner result instead), and a sender
    # that lost its cancellation would reconnect forever and hang close().
    stopped: bool = False

    def stop(self) -> None:
        """End the sender: mark it stopped and cancel its task."""
        self.stopped = True
        if self.task is not None:
            self.task.cancel()


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
    return _decode_frame(await reader.readexactly(length))


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
        self._inbound: set[_InboundProtocol] = set()
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
        self._server = await asyncio.get_running_loop().create_server(
            self._inbound_protocol, self._host, self._port, ssl=self._server_ssl
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
            out.stop()
        tasks = [o.task for o in self._peers.values() if o.task]
        await asyncio.gather(*tasks, self._abort_inbound(), return_exceptions=True)
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
        if out is not None:
            out.stop()

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
        while not out.stopped:
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
            if out.stopped:  # stopped as the connection came up (see _Outbound.stopped)
                writer.close()
                return
            try:
                await asyncio.wait_for(self._client_handshake(reader, writer, out.peer), HANDSHAKE_TIMEOUT_S)
                if out.stopped:
                    return  # the finally closes the connection
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
    async def _abort_inbound(self) -> None:
        """Abort every inbound connection (nothing on them is worth flushing
        at shutdown; a TLS close would wait for a gone peer's close_notify)
        and wait until each has run its connection_lost. A connection
        accepted meanwhile aborts itself (connection_made sees _closed)."""
        while self._inbound:
            inbound = list(self._inbound)
            for p in inbound:
                p.abort()
            await asyncio.gather(*(p.closed for p in inbound), return_exceptions=True)

    def _inbound_protocol(self) -> _InboundProtocol:
        return _InboundProtocol(self)

    def _server_handshake(self, msg: object, ns: bytes) -> tuple[str, bytes]:
        """Check the client's handshake message (`ns`: our challenge); return
        the peer's name and our reply. Refuses with AuthenticationFailed, the
        reply to send before closing (if any) in its `reply` attribute."""
        _check_version(msg)
        if not isinstance(msg, dict) or msg.get("v") != PROTOCOL_VERSION:
            raise AuthenticationFailed("malformed handshake")
        node, nc, proof = msg.get("node"), msg.get("challenge"), msg.get("proof")
        if not (isinstance(node, str) and isinstance(nc, bytes) and isinstance(proof, bytes)):
            raise AuthenticationFailed("malformed handshake")
        if not hmac.compare_digest(proof, _proof(self._secret, b"client", ns, nc, node)):
            exc = AuthenticationFailed(f"node {node!r} does not know the cluster secret")
            exc.reply = _encode({"v": PROTOCOL_VERSION, "error": "authentication failed"})
            raise exc
        return node, _encode({"v": PROTOCOL_VERSION, "node": self.node,
                              "proof": _proof(self._secret, b"server", nc, ns, self.node)})


#: The frame reader's buffer: frames that fit are read many to a recv; a
#: bigger one gets a buffer of its own size (kept for the next one, up to
#: _KEEP_BUFFER), so its bytes land where they are decoded.
_SMALL_BUFFER = 256 * 1024
_KEEP_BUFFER = 32 * 1024 * 1024
#: The rest of a frame at least this big is read alone: a recv never takes
#: the start of the next frame with it, which would then have to be moved.
_READ_ALONE = 64 * 1024


class FrameReader:
    """Length-prefixed frames cut from a byte stream that is read straight
    into this reader's buffer (asyncio.BufferedProtocol's get_buffer and
    buffer_updated): no copy between the socket and the frame's decoding,
    where asyncio's StreamReader made three (its buffer, the frame's bytes,
    the buffer's growth) and woke a task for every 256 KiB of a big frame.

    `on_frame(view)` is called for each complete frame's payload; the view is
    valid only during the call. `max_frame` (read at every frame, so a
    handshake can raise it) bounds a payload: a longer one raises
    TransportError before any of it is buffered. Exceptions from
    `on_frame` propagate (the connection is then dropped).
    """

    __slots__ = ("max_frame", "on_frame", "buffer_size", "_buf", "_view", "_start", "_end", "_frame_end")

    def __init__(self, max_frame: int, on_frame: Callable[[memoryview], None],
                 buffer_size: int = _SMALL_BUFFER) -> None:
        self.max_frame = max_frame
        self.on_frame = on_frame
        #: the buffer's size between big frames (may be raised at any time: it
        #: takes effect at the next read)
        self.buffer_size = buffer_size
        self._buf = bytearray(buffer_size)
        self._view = memoryview(self._buf)
        self._start = 0  # first unconsumed byte
        self._end = 0  # end of the bytes read
        self._frame_end = 0  # end of the frame being read, once its header is in (else 0)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next read goes (never empty)."""
        if self._frame_end - self._end >= _READ_ALONE:
            return self._view[self._end:self._frame_end]
        return self._view[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        """`nbytes` more were read into the last get_buffer(): hand on every
        complete frame, then make room for the rest of the next one."""
        self._end += nbytes
        end = self._end
        start = self._start
        view = self._view
        frame_end = 0
        while end - start >= 4:
            (length,) = _LEN.unpack_from(view, start)
            if length > self.max_frame:
                raise TransportError(f"frame of {length} bytes exceeds the {self.max_frame}-byte limit")
            frame_end = start + 4 + length
            if frame_end > end:
                break
            payload = view[start + 4:frame_end]
            self._start = start = frame_end
            frame_end = 0
            try:
                self.on_frame(payload)
            finally:
                payload.release()
        size = len(self._buf)
        if start == end:
            self._start = self._end = self._frame_end = 0
            if size > max(_KEEP_BUFFER, self.buffer_size) or size < self.buffer_size:
                self._resize(self.buffer_size)
            return
        need = (frame_end - start) if frame_end else 4  # the whole frame being read
        if start + need > size or size < self.buffer_size:
            if need > size or size < self.buffer_size:
                self._resize(max(need, self.buffer_size, min(2 * size, _KEEP_BUFFER)))
            else:  # move the frame's start to the buffer's start
                have = end - start
                view[:have] = view[start:end]
                self._start, self._end = 0, have
        self._frame_end = self._start + need if frame_end else 0

    def pending(self) -> int:
        """Bytes read of a frame not yet complete."""
        return self._end - self._start

    def _resize(self, size: int) -> None:
        have = self._end - self._start
        buf = bytearray(size)
        buf[:have] = self._view[self._start:self._end]
        self._view.release()
        self._buf, self._view = buf, memoryview(buf)
        self._start, self._end = 0, have


def _decode_frame(payload: bytes | memoryview) -> Any:  # msgpack-decoded
    """A frame's payload decoded; TransportError if it does not decode."""
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        # TypeError: a map key msgpack cannot hash (an array or a map), found by
        # fuzzing; it escaped every handler, the unauthenticated handshake's too
        raise TransportError(f"undecodable frame: {type(exc).__name__}: {exc}") from None


class _InboundProtocol(asyncio.BufferedProtocol):
    """One accepted peer connection: the server's side of the handshake, then
    batches of messages handed to `on_message` as their frames complete."""

    def __init__(self, owner: PeerTransport) -> None:
        self._owner = owner
        self._transport: asyncio.Transport | None = None
        # 8 KiB until the peer is authenticated: an unauthenticated connection
        # costs little (its frame is at most 4 KiB)
        self._reader = FrameReader(4096, self._on_handshake, buffer_size=8192)
        self._ns = os.urandom(16)
        self._peer: str | None = None
        self._addr: object = None
        self._timer: asyncio.TimerHandle | None = None
        self._failed = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._addr = transport.get_extra_info("peername")
        if self._owner._closed:  # accepted as the transport closed: no new connection
            self.abort()
            return
        self._owner._inbound.add(self)
        self._transport.write(_encode({"v": PROTOCOL_VERSION, "challenge": self._ns}))
        self._timer = asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT_S, self._handshake_timeout)

    def _handshake_timeout(self) -> None:
        log.info("%s: inbound connection from %s ended: no handshake within %ss",
                 self._owner.node, self._addr, HANDSHAKE_TIMEOUT_S)
        self._fail()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        if self._failed:
            return  # closing: what still arrives is not delivered
        owner = self._owner
        try:
            self._reader.buffer_updated(nbytes)
        except AuthenticationFailed as exc:
            owner.stats.auth_failures += 1
            log.warning("%s: refused unauthenticated peer %s: %s", owner.node, self._addr, exc)
            if exc.reply is not None and self._transport is not None:
                self._transport.write(exc.reply)
            self._fail()
        except TransportError as exc:
            if self._peer is None:  # e.g. an oversized first frame: still the handshake
                owner.stats.auth_failures += 1
                log.warning("%s: refused unauthenticated peer %s: malformed handshake: %s",
                            owner.node, self._addr, exc)
            else:
                log.warning("%s: dropping connection from %s (%s): %s", owner.node, self._peer, self._addr, exc)
            self._fail()
        except Exception:  # a handler's bug: drop the connection (the peer re-sends), keep the node
            log.exception("%s: dropping connection from %s (%s): a message's handler failed",
                          owner.node, self._peer, self._addr)
            self._fail()

    def _on_handshake(self, payload: memoryview) -> None:
        try:
            msg = _decode_frame(payload)
        except TransportError as exc:
            raise AuthenticationFailed(f"malformed handshake: {exc}") from None
        peer, reply = self._owner._server_handshake(msg, self._ns)
        assert self._transport is not None
        self._transport.write(reply)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._peer = peer
        owner = self._owner
        owner.inbound_peers[peer] = owner.inbound_peers.get(peer, 0) + 1
        self._reader.max_frame = owner._max_frame
        self._reader.buffer_size = _SMALL_BUFFER
        self._reader.on_frame = self._on_batch

    def _on_batch(self, payload: memoryview) -> None:
        if self._failed:
            return  # a message's handler closed the connection: the rest is not delivered
        batch = _decode_frame(payload)
        if not isinstance(batch, list):
            raise TransportError("frame payload is not a batch")
        owner = self._owner
        peer = self._peer
        assert peer is not None
        owner.stats.frames_received += 1
        owner.stats.messages_received += len(batch)
        owner.last_heard[peer] = time.monotonic()
        on_message = owner._on_message
        for message in batch:
            if self._failed:
                return  # a message's handler closed the transport (shutdown)
            on_message(peer, message)

    def _fail(self) -> None:
        self._failed = True
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """End the connection now, without flushing (shutdown)."""
        self._failed = True
        if self._transport is not None:
            self._transport.abort()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        owner = self._owner
        if self._peer is not None:
            owner.inbound_peers[self._peer] -= 1
            if not owner.inbound_peers[self._peer]:
                del owner.inbound_peers[self._peer]
            self._peer = None
        if exc is not None and not self._failed:
            log.info("%s: inbound connection from %s ended: %s", owner.node, self._addr, exc)
        elif not self._failed and self._reader.pending():
            log.info("%s: inbound connection from %s ended in the middle of a frame",
                     owner.node, self._addr)
        self._failed = True
        owner._inbound.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)
