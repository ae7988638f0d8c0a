"""Server side of one AMQP 0-9-1 connection: a sans-I/O state machine.

Pipeline position: the runtime shell owns the socket and feeds every byte it
reads to `receive_data()`; it then drains `next_event()` (events.py) until
NEED_DATA, routes the events to the broker logic, answers through the
`send_*` helpers (which return bytes to write), and writes
`data_to_send()` (automatic replies such as channel.open-ok). Time is passed
in: the shell calls `tick(now_monotonic)` every second or so and obeys the
returned `TickResult` (write a heartbeat / drop a dead peer). Nothing here
touches sockets, clocks or tasks.

Connection states (one handler per state, chosen from `_HANDLERS`):

    AWAIT_HEADER -> START_SENT -> AUTHENTICATING -> TUNE_SENT -> AWAIT_OPEN
        -> OPENING -> OPEN -> CLOSING -> CLOSED

AUTHENTICATING and OPENING wait for the server's decision
(`accept_login()`, `accept_open()`). Errors before OPENING close the socket
silently (as RabbitMQ does during the handshake); from AWAIT_OPEN on they
send connection.close with RabbitMQ's reply code and text and wait in
CLOSING for close-ok.

Channels: absent (closed), OPEN, or CLOSING (we sent channel.close: every
frame on it except channel.close / channel.close-ok is discarded, as the
spec requires). An open channel assembles content: IDLE -> HEADER (after
basic.publish) -> BODY (after a header with body-size > 0) -> IDLE.

Output ordering invariant: bytes are produced in the order the protocol
requires as long as the shell writes every byte string returned by a
`send_*` helper and by `data_to_send()` in the order it got them; helpers
prepend any queued automatic replies to what they return.

Why one file of this size: it is the whole server side of an AMQP 0-9-1
connection as one sans-I/O state machine (handshake, channel states, content
assembly, flow, heartbeats, limits); the frame codec lives apart (`codec.py`).
Every method handler checks the same connection and channel state, which is
what keeps protocol errors exact.
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pamqp import base as pamqp_base
from pamqp import commands as C

import broker.amqp.codec as codec

from .codec import (
    ACK_ID,
    FRAME_BODY,
    FRAME_END,
    FRAME_HDR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    FRAME_OVERHEAD,
    HEARTBEAT_FRAME,
    NACK_ID,
    PROTOCOL_HEADER,
    PUBLISH_ID,
    REJECT_ID,
)
from .errors import (
    CHANNEL_LEVEL_CODES,
    AMQPChannelError,
    AMQPConnectionError,
    AMQPProtocolError,
    FrameDecodeError,
    ProtocolStateError,
    ReplyCode,
    erlang_binary,
    reply_text,
)
from .events import (
    CLOSED,
    NEED_DATA,
    PAUSED,
    Ack,
    ChannelClose,
    ChannelCloseOk,
    ChannelFlow,
    ChannelOpen,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionLost,
    ConnectionOpen,
    ConnectionStartOk,
    ConnectionTerminated,
    ConnectionTuneOk,
    Event,
    Heartbeat,
    MethodReceived,
    Nack,
    ProtocolHeaderReceived,
    Publish,
    Reject,
    _Sentinel,
)
from .tables import validate_properties

_U32 = struct.Struct(">I")
_VALID_PROPS_CACHE: Final = 64

CHANNEL_OPEN_ID: Final = 0x0014000A
CHANNEL_FLOW_ID: Final = 0x00140014
CHANNEL_CLOSE_ID: Final = 0x00140028
CHANNEL_CLOSE_OK_ID: Final = 0x00140029
CONNECTION_CLOSE_ID: Final = 0x000A0032
CONNECTION_CLOSE_OK_ID: Final = 0x000A0033
CONNECTION_CLASS: Final = 10

# Capabilities RabbitMQ 3.10.8 advertises in connection.start (verified against
# a live node); direct_reply_to is only advertised when the server opts in.
RABBITMQ_CAPABILITIES: Final[Mapping[str, bool]] = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
}


class ConnectionState(enum.Enum):
    AWAIT_HEADER = "await_header"
    START_SENT = "start_sent"
    AUTHENTICATING = "authenticating"
    TUNE_SENT = "tune_sent"
    AWAIT_OPEN = "await_open"
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


# RabbitMQ's names for our states in "unexpected method in connection state X".
_RABBIT_STATE_NAME: Final = {
    ConnectionState.START_SENT: "starting",
    ConnectionState.AUTHENTICATING: "securing",
    ConnectionState.TUNE_SENT: "tuning",
    ConnectionState.AWAIT_OPEN: "opening",
    ConnectionState.OPENING: "opening",
    ConnectionState.OPEN: "running",
}
# Errors in these states close the socket silently (RabbitMQ's handshake_error).
_SILENT_STATES: Final = frozenset(
    {ConnectionState.START_SENT, ConnectionState.AUTHENTICATING, ConnectionState.TUNE_SENT}
)


class ChannelState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"  # we sent channel.close, awaiting close-ok


# Content-assembly phase of a channel (plain ints: compared on every frame).
_IDLE: Final = 0
_HEADER: Final = 1  # after basic.publish, expecting the content header
_BODY: Final = 2  # after the header, expecting `remaining` more body bytes


_CH_OPEN: Final = ChannelState.OPEN
_CH_CLOSING: Final = ChannelState.CLOSING
_AWAIT_HEADER: Final = ConnectionState.AWAIT_HEADER
_OPEN: Final = ConnectionState.OPEN
_FRAME_HDR_UNPACK: Final = FRAME_HDR.unpack_from


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What the server proposes in connection.start / connection.tune."""

    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat: int = 60
    max_message_size: int = 128 * 1024 * 1024  # RabbitMQ's default max_message_size
    product: str = "quorumq"
    version: str = "0.1.0"
    platform: str = "Python"
    cluster_name: str = "quorumq"
    copyright: str = "Copyright (c) the quorumq authors."
    information: str = "Licensed under the Apache License 2.0"
    mechanisms: tuple[str, ...] = ("AMQPLAIN", "PLAIN")
    locales: tuple[str, ...] = ("en_US",)
    advertise_direct_reply_to: bool = False
    handshake_timeout: float = 10.0  # seconds from the first tick to connection.open-ok
    close_timeout: float = 3.0  # seconds to wait for connection.close-ok

    def __post_init__(self) -> None:
        if not FRAME_MIN_SIZE <= self.frame_max <= 0xFFFFFFFF:
            raise ValueError(f"frame_max must be in [{FRAME_MIN_SIZE}, 2^32-1], got {self.frame_max}")
        if not 0 <= self.channel_max <= 0xFFFF:
            raise ValueError(f"channel_max must be in [0, 65535], got {self.channel_max}")
        if not 0 <= self.heartbeat <= 0xFFFF:
            raise ValueError(f"heartbeat must be in [0, 65535], got {self.heartbeat}")
        if self.max_message_size <= 0:
            raise ValueError("max_message_size must be positive")
        for mech in self.mechanisms:
            if mech not in ("PLAIN", "AMQPLAIN"):
                raise ValueError(f"unsupported mechanism {mech!r}")

    def server_properties(self) -> dict[str, Any]:
        caps: dict[str, Any] = dict(RABBITMQ_CAPABILITIES)
        if self.advertise_direct_reply_to:
            caps["direct_reply_to"] = True
        return {
            "capabilities": caps,
            "cluster_name": self.cluster_name,
            "copyright": self.copyright,
            "information": self.information,
            "platform": self.platform,
            "product": self.product,
            "version": self.version,
        }


@dataclass(frozen=True, slots=True)
class TickResult:
    """What `tick()` asks of the shell: write `data` (a heartbeat, may be empty);
    if `peer_dead`, close the socket (the machine is already CLOSED)."""

    data: bytes
    peer_dead: bool


@dataclass(slots=True)
class _Channel:
    state: ChannelState = ChannelState.OPEN
    content: int = _IDLE
    # Pending publish (valid while content != IDLE).
    exchange: str = ""
    routing_key: str = ""
    mandatory: bool = False
    immediate: bool = False
    properties_raw: bytes = b""
    remaining: int = 0  # Invariant: body bytes still expected, >= 0
    parts: list[bytes] = field(default_factory=list)

    def reset_content(self) -> None:
        self.content = _IDLE
        if self.parts:
            self.parts = []
        self.properties_raw = b""
        self.remaining = 0


_Handler = Callable[["ServerConnection", int, int, bytes], None]


def _frame_error(ftype: int, payload: bytes, reason: str) -> AMQPConnectionError:
    return AMQPConnectionError(
        ReplyCode.FRAME_ERROR, f"type {ftype}, all octets = {erlang_binary(payload)}: {reason}"
    )


def _cannot_decode(mid: int, payload: bytes) -> AMQPConnectionError:
    return AMQPConnectionError(
        ReplyCode.FRAME_ERROR, f"cannot decode {erlang_binary(payload[4:])}", mid >> 16, mid & 0xFFFF
    )


class ServerConnection:
    """Sans-I/O server side of one AMQP 0-9-1 connection (see module docstring)."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self._state = ConnectionState.AWAIT_HEADER
        self._handler: _Handler = ServerConnection._in_await_header
        # Negotiated values; before tune-ok the server's proposals bound input.
        self.frame_max = self.config.frame_max
        self.channel_max = self.config.channel_max
        self.heartbeat = 0
        self.client_properties: dict[str, Any] = {}
        self.mechanism = ""
        self.username: str | None = None
        self.virtual_host: str | None = None
        self.blocked = False
        self._channels: dict[int, _Channel] = {}
        # Input: _buf[_pos:] is unconsumed, followed by the chunks in _pending.
        self._buf = b""
        self._pos = 0
        self._pending: list[bytes] = []
        self._pending_len = 0
        self._skip = 0  # bytes of a refused oversized frame still to discard
        self._valid_props: dict[bytes, None] = {}  # recently validated properties_raw
        self._max_payload = self.config.frame_max - FRAME_OVERHEAD
        self._events: deque[Event] = deque()
        self._outbox: list[bytes] = []
        # Liveness bookkeeping (times come only from tick()).
        self._received = False  # bytes arrived since the last tick
        self._sent = False  # bytes produced since the last tick
        self._last_recv: float | None = None
        self._last_sent: float | None = None
        self._started: float | None = None
        self._closing_since: float | None = None
        self.dropped_sends = 0  # deliveries dropped because their channel was gone
        #: Asked at each channel.open before channel.open-ok (the I/O shell's
        #: per-user channel limit): a (reply code, text) refusal closes the
        #: connection with it instead, as RabbitMQ does; None allows the channel.
        self.channel_open_check: Callable[[], tuple[int, str] | None] | None = None

    @property
    def state(self) -> ConnectionState:
        return self._state

    def _set_state(self, state: ConnectionState) -> None:
        # Invariant: _handler is always _HANDLERS[_state] (cached: enum hashing is slow).
        self._state = state
        self._handler = _HANDLERS[state]

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes read from the socket; b"" means the peer closed it (EOF).
        Non-bytes buffers are copied (the caller may reuse them)."""
        if not data:
            if self._state is not ConnectionState.CLOSED:
                self._set_closed()
                self._events.append(ConnectionLost())
            return
        if self._state is ConnectionState.CLOSED:
            return
        self._received = True
        if type(data) is not bytes:  # a memoryview/bytearray may be reused by the caller
            data = bytes(data)
        self._pending.append(data)
        self._pending_len += len(data)

    def _fill(self, need: int) -> bool:
        """Make `need` unconsumed bytes contiguous in _buf (from _pos = 0).

        Chunks are only joined once a whole frame (or header) is available, so a
        peer trickling a large frame byte by byte costs linear, not quadratic, time.
        """
        have = len(self._buf) - self._pos
        if have + self._pending_len < need:
            return False
        pending = self._pending
        if have == 0 and len(pending) == 1:
            self._buf = pending[0]
        else:
            self._buf = b"".join([self._buf[self._pos :], *pending])
        self._pos = 0
        pending.clear()
        self._pending_len = 0
        return True

    def next_event(self) -> Event | _Sentinel:
        """The next event, or NEED_DATA (feed more bytes), PAUSED (decide on the
        pending login/open first), or CLOSED once the connection is over."""
        events = self._events
        while True:
            if events:
                return events.popleft()
            state = self._state
            if state is _OPEN:  # hot path: no further state checks
                if not self._step():
                    return NEED_DATA
                continue
            if state is ConnectionState.CLOSED:
                return CLOSED
            if state is ConnectionState.AUTHENTICATING or state is ConnectionState.OPENING:
                return PAUSED
            if not self._step():
                return NEED_DATA

    def _step(self) -> bool:
        """Consume one frame (or the protocol header). False if more bytes are needed."""
        buf = self._buf
        pos = self._pos
        try:
            if self._skip:
                # Still inside an oversized frame we refused: drop its bytes so the
                # stream stays in sync and the client's close-ok can be read.
                if len(buf) - pos == 0 and not self._fill(1):
                    return False
                buf, pos = self._buf, self._pos
                n = min(self._skip, len(buf) - pos)
                self._skip -= n
                self._pos = pos + n
                return True
            if len(buf) - pos < 8:
                if not self._fill(8 if self._state is _AWAIT_HEADER else 7):
                    return False
                buf, pos = self._buf, 0
            if self._state is _AWAIT_HEADER:
                self._pos = pos + 8
                self._on_protocol_header(buf[pos : pos + 8])
                return True
            ftype, channel, size = _FRAME_HDR_UNPACK(buf, pos)
            if size > self._max_payload:
                self._pos = pos + 7
                self._skip = size + 1
                raise _frame_error(ftype, b"", f"{{frame_too_large,{size},{self._max_payload}}}")
            end = pos + 7 + size
            if len(buf) <= end:
                if not self._fill(8 + size):
                    return False
                buf, pos, end = self._buf, 0, 7 + size
            payload = buf[pos + 7 : end]
            self._pos = end + 1
            if buf[end] != FRAME_END:
                raise _frame_error(ftype, payload, f"{{invalid_frame_end_marker,{buf[end]}}}")
            if self._state is _OPEN:
                # the state of nearly every frame, called directly (compiled:
                # a native call; through _handler, a Python-level one)
                self._in_open(ftype, channel, payload)
            else:
                self._handler(self, ftype, channel, payload)
        except AMQPConnectionError as exc:
            if self._state is ConnectionState.CLOSING:
                self._set_closed()  # garbage while waiting for close-ok: give up
            else:
                self._terminate(exc, send_close=self._state not in _SILENT_STATES)
        return True

    # ----------------------------------------------------------- per state

    def _on_protocol_header(self, header: bytes) -> None:
        if header != PROTOCOL_HEADER:
            # RabbitMQ answers any unsupported header with the one it speaks, then closes.
            self._outbox.append(PROTOCOL_HEADER)
            self._set_closed()
            self._events.append(
                ConnectionTerminated(
                    ReplyCode.FRAME_ERROR,
                    reply_text(ReplyCode.FRAME_ERROR, f"bad protocol header {erlang_binary(header)}"),
                    0,
                    0,
                    False,
                )
            )
            return
        cfg = self.config
        start = C.Connection.Start(
            version_major=0,
            version_minor=9,
            server_properties=cfg.server_properties(),
            mechanisms=" ".join(cfg.mechanisms),
            locales=" ".join(cfg.locales),
        )
        self._emit(codec.encode_method(0, start))
        self._set_state(ConnectionState.START_SENT)
        self._events.append(ProtocolHeaderReceived((0, 9, 1)))

    def _handshake_method(self, ftype: int, channel: int, payload: bytes) -> pamqp_base.Frame | None:
        """Common checks before OPEN; returns a decoded channel-0 method or None
        if the frame was a heartbeat."""
        if ftype == FRAME_HEARTBEAT and channel == 0 and not payload:
            self._events.append(Heartbeat())
            return None
        if ftype != FRAME_METHOD or channel != 0:
            raise AMQPConnectionError(
                ReplyCode.UNEXPECTED_FRAME, f"type {ftype}, all octets = {erlang_binary(payload)}"
            )
        try:
            method = codec.decode_method(payload)
        except FrameDecodeError:
            if len(payload) < 4:
                raise _frame_error(ftype, payload, "unknown_frame") from None
            raise _cannot_decode(_U32.unpack_from(payload, 0)[0], payload) from None
        if isinstance(method, C.Connection.Close):
            self._on_client_close(method)
            return None
        return method

    def _unexpected_in_state(self, method: pamqp_base.Frame) -> AMQPConnectionError:
        name = _RABBIT_STATE_NAME.get(self._state, self._state.value)
        return AMQPConnectionError(
            ReplyCode.CHANNEL_ERROR,
            f"unexpected method in connection state {name}",
            method.index >> 16,
            method.index & 0xFFFF,
        )

    def _in_start_sent(self, ftype: int, channel: int, payload: bytes) -> None:
        method = self._handshake_method(ftype, channel, payload)
        if method is None:
            return
        if not isinstance(method, C.Connection.StartOk):
            raise self._unexpected_in_state(method)
        mechanism = method.mechanism or ""
        if mechanism not in self.config.mechanisms:
            raise AMQPConnectionError(
                ReplyCode.COMMAND_INVALID, f"unknown authentication mechanism '{mechanism}'", 10, 11
            )
        # A longstr: str when it is UTF-8, else bytes (pamqp's convention, which
        # the codec follows, though pamqp annotates it str): read untyped, so
        # that compiled code does not refuse the bytes (an AMQPLAIN response
        # is a table whose length prefix often is not UTF-8)
        response: object = getattr(method, "response", b"")
        raw = response.encode("utf-8") if isinstance(response, str) else \
            bytes(response) if isinstance(response, (bytes, bytearray)) else b""
        username, password = _parse_credentials(mechanism, raw)
        props = method.client_properties or {}
        self.client_properties = dict(props)
        self.mechanism = mechanism
        self.username = username
        self._set_state(ConnectionState.AUTHENTICATING)
        self._events.append(
            ConnectionStartOk(mechanism, raw, self.client_properties, method.locale or "", username, password)
        )

    def _in_authenticating(self, ftype: int, channel: int, payload: bytes) -> None:
        method = self._handshake_method(ftype, channel, payload)
        if method is not None:
            raise self._unexpected_in_state(method)

    def _in_tune_sent(self, ftype: int, channel: int, payload: bytes) -> None:
        method = self._handshake_method(ftype, channel, payload)
        if method is None:
            return
        if not isinstance(method, C.Connection.TuneOk):
            raise self._unexpected_in_state(method)
        cfg = self.config
        fm, cm, hb = method.frame_max, method.channel_max, method.heartbeat
        # RabbitMQ's rules: the client may lower the server's values but not
        # raise them; 0 means "no limit", which is higher than any limit.
        if cfg.frame_max and (fm == 0 or fm > cfg.frame_max):
            raise AMQPConnectionError(
                ReplyCode.NOT_ALLOWED,
                f"negotiated frame_max = {fm} is higher than the maximum allowed value ({cfg.frame_max})",
                10,
                31,
            )
        if fm and fm < FRAME_MIN_SIZE:
            raise AMQPConnectionError(
                ReplyCode.NOT_ALLOWED,
                f"negotiated frame_max = {fm} is lower than the minimum allowed value ({FRAME_MIN_SIZE})",
                10,
                31,
            )
        if cfg.channel_max and (cm == 0 or cm > cfg.channel_max):
            shown = f"{cm} (no limit)" if cm == 0 else str(cm)
            raise AMQPConnectionError(
                ReplyCode.NOT_ALLOWED,
                f"negotiated channel_max = {shown} is higher than the maximum allowed value ({cfg.channel_max})",
                10,
                31,
            )
        self.frame_max = fm
        self.channel_max = cm
        self.heartbeat = hb
        self._max_payload = fm - FRAME_OVERHEAD
        self._set_state(ConnectionState.AWAIT_OPEN)
        self._events.append(ConnectionTuneOk(cm, fm, hb))

    def _in_await_open(self, ftype: int, channel: int, payload: bytes) -> None:
        method = self._handshake_method(ftype, channel, payload)
        if method is None:
            return
        if self._state is ConnectionState.AWAIT_OPEN and isinstance(method, C.Connection.Open):
            self.virtual_host = method.virtual_host
            self._set_state(ConnectionState.OPENING)
            self._events.append(ConnectionOpen(method.virtual_host))
            return
        raise self._unexpected_in_state(method)

    def _in_open(self, ftype: int, channel: int, payload: bytes) -> None:
        if ftype == FRAME_BODY:
            chan = self._channels.get(channel)
            # Fast path: the whole body in one frame (the common case below frame_max).
            if chan is not None and chan.content == _BODY and not chan.parts and len(payload) == chan.remaining:
                self._events.append(
                    Publish(channel, chan.exchange, chan.routing_key, chan.mandatory, False, chan.properties_raw, payload)
                )
                chan.content = _IDLE
                chan.remaining = 0
                chan.properties_raw = b""
                return
        if ftype == FRAME_METHOD:
            if len(payload) < 4:
                raise _frame_error(ftype, payload, "unknown_frame")
            mid = _U32.unpack_from(payload, 0)[0]
            if channel == 0:
                self._method_on_channel0(mid, payload)
                return
            chan = self._channels.get(channel)
            if chan is None:
                if mid == CHANNEL_OPEN_ID:
                    self._open_channel(channel, payload)
                    return
                raise AMQPConnectionError(
                    ReplyCode.CHANNEL_ERROR, "expected 'channel.open'", mid >> 16, mid & 0xFFFF
                )
            if chan.state is _CH_CLOSING:
                self._method_on_closing_channel(channel, mid, payload)
                return
            if chan.content != _IDLE:
                raise self._unexpected_content(chan)
            if mid == PUBLISH_ID:
                try:
                    exchange, routing_key, mandatory, immediate = codec.decode_publish(payload)
                except FrameDecodeError:
                    raise _cannot_decode(mid, payload) from None
                if immediate:  # RabbitMQ 3.x never implemented immediate delivery
                    raise AMQPConnectionError(ReplyCode.NOT_IMPLEMENTED, "immediate=true", 60, 40)
                chan.exchange = exchange
                chan.routing_key = routing_key
                chan.mandatory = mandatory
                chan.immediate = immediate
                chan.content = _HEADER
                return
            if mid == ACK_ID or mid == NACK_ID or mid == REJECT_ID:
                try:
                    tag, bits = codec.decode_ack(payload)
                except FrameDecodeError:
                    raise _cannot_decode(mid, payload) from None
                if mid == ACK_ID:
                    self._events.append(Ack(channel, tag, bool(bits & 1)))
                elif mid == NACK_ID:
                    self._events.append(Nack(channel, tag, bool(bits & 1), bool(bits & 2)))
                else:
                    self._events.append(Reject(channel, tag, bool(bits & 1)))
                return
            self._generic_channel_method(channel, chan, mid, payload)
            return
        if ftype == FRAME_HEADER or ftype == FRAME_BODY:
            chan = self._channels.get(channel) if channel else None
            if chan is not None and chan.state is _CH_CLOSING:
                return  # discarded: the channel is closing
            if chan is None or chan.content == _IDLE:
                raise AMQPConnectionError(
                    ReplyCode.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
                )
            if ftype == FRAME_HEADER:
                self._content_header(channel, chan, payload)
            else:
                self._content_body(channel, chan, payload)
            return
        if ftype == FRAME_HEARTBEAT:
            if payload:
                raise _frame_error(ftype, payload, "unknown_frame")
            if channel != 0:
                raise AMQPConnectionError(
                    ReplyCode.UNEXPECTED_FRAME, f"type {ftype}, all octets = {erlang_binary(payload)}"
                )
            self._events.append(Heartbeat())
            return
        raise _frame_error(ftype, payload, "unknown_frame")

    def _in_closing(self, ftype: int, channel: int, payload: bytes) -> None:
        # After sending connection.close only close / close-ok matter (spec 2.2.4).
        if ftype != FRAME_METHOD or channel != 0 or len(payload) < 4:
            return
        mid = _U32.unpack_from(payload, 0)[0]
        if mid == CONNECTION_CLOSE_OK_ID:
            self._set_closed()
            self._events.append(ConnectionCloseOk())
        elif mid == CONNECTION_CLOSE_ID:
            self._emit(codec.encode_method(0, C.Connection.CloseOk()))
            self._set_closed()
            self._events.append(ConnectionCloseOk())

    def _in_closed(self, ftype: int, channel: int, payload: bytes) -> None:  # pragma: no cover
        return

    def _in_await_header(self, ftype: int, channel: int, payload: bytes) -> None:  # pragma: no cover
        raise ProtocolStateError("frames are not parsed before the protocol header")

    # ------------------------------------------------------- open-state parts

    def _method_on_channel0(self, mid: int, payload: bytes) -> None:
        cls = codec.method_class(mid)
        if cls is None:
            raise AMQPConnectionError(
                ReplyCode.NOT_IMPLEMENTED, f"unknown method {{{mid >> 16},{mid & 0xFFFF}}}", mid >> 16, mid & 0xFFFF
            )
        if mid == CONNECTION_CLOSE_ID:
            method = self._decode(mid, payload)
            assert isinstance(method, C.Connection.Close)
            self._on_client_close(method)
            return
        raise AMQPConnectionError(
            ReplyCode.CHANNEL_ERROR, "unexpected method in connection state running", mid >> 16, mid & 0xFFFF
        )

    def _decode(self, mid: int, payload: bytes) -> pamqp_base.Frame:
        try:
            return codec.decode_method(payload)
        except FrameDecodeError:
            raise _cannot_decode(mid, payload) from None

    def _open_channel(self, channel: int, payload: bytes) -> None:
        self._decode(CHANNEL_OPEN_ID, payload)
        if self.channel_max and len(self._channels) >= self.channel_max:
            raise AMQPConnectionError(
                ReplyCode.NOT_ALLOWED,
                f"number of channels opened ({len(self._channels)}) has reached the negotiated "
                f"channel_max ({self.channel_max})",
                20,
                10,
            )
        if self.channel_open_check is not None:
            refusal = self.channel_open_check()
            if refusal is not None:
                # RabbitMQ raises it with no failed method: class and method 0.
                raise AMQPConnectionError(refusal[0], refusal[1], 0, 0)
        self._channels[channel] = _Channel()
        self._emit(codec.encode_method(channel, C.Channel.OpenOk()))
        self._events.append(ChannelOpen(channel))

    def _method_on_closing_channel(self, channel: int, mid: int, payload: bytes) -> None:
        if mid == CHANNEL_CLOSE_OK_ID:
            self._decode(mid, payload)
            del self._channels[channel]
            self._events.append(ChannelCloseOk(channel))
        elif mid == CHANNEL_CLOSE_ID:
            # Both sides closed at once: answer, keep waiting for our close-ok.
            self._decode(mid, payload)
            self._emit(codec.encode_method(channel, C.Channel.CloseOk()))
        # anything else is discarded (spec: after channel.close, ignore all but close/close-ok)

    def _generic_channel_method(self, channel: int, chan: _Channel, mid: int, payload: bytes) -> None:
        cls = codec.method_class(mid)
        class_id, method_id = mid >> 16, mid & 0xFFFF
        if cls is None:
            raise AMQPConnectionError(
                ReplyCode.NOT_IMPLEMENTED, f"unknown method {{{class_id},{method_id}}}", class_id, method_id
            )
        if class_id == CONNECTION_CLASS:
            raise AMQPConnectionError(ReplyCode.COMMAND_INVALID, "unimplemented method", class_id, method_id)
        method = self._decode(mid, payload)
        if mid == CHANNEL_CLOSE_ID:
            assert isinstance(method, C.Channel.Close)
            del self._channels[channel]
            self._emit(codec.encode_method(channel, C.Channel.CloseOk()))
            self._events.append(
                ChannelClose(
                    channel, method.reply_code or 0, method.reply_text or "", method.class_id or 0, method.method_id or 0
                )
            )
        elif mid == CHANNEL_OPEN_ID:
            raise AMQPConnectionError(ReplyCode.CHANNEL_ERROR, "second 'channel.open' seen", class_id, method_id)
        elif mid == CHANNEL_FLOW_ID:
            assert isinstance(method, C.Channel.Flow)
            if not method.active:
                raise AMQPConnectionError(ReplyCode.NOT_IMPLEMENTED, "active=false", class_id, method_id)
            self._emit(codec.encode_method(channel, C.Channel.FlowOk(active=True)))
            self._events.append(ChannelFlow(channel, True))
        elif mid == CHANNEL_CLOSE_OK_ID:
            raise AMQPConnectionError(ReplyCode.COMMAND_INVALID, "unimplemented method", class_id, method_id)
        else:
            self._events.append(MethodReceived(channel, method))

    def _unexpected_content(self, chan: _Channel) -> AMQPConnectionError:
        if chan.content == _HEADER:
            detail = "expected content header for class 60, got non content header frame instead"
        else:
            detail = "expected content body, got non content body frame instead"
        return AMQPConnectionError(ReplyCode.UNEXPECTED_FRAME, detail, 60, 40)

    def _content_header(self, channel: int, chan: _Channel, payload: bytes) -> None:
        if chan.content != _HEADER:
            raise self._unexpected_content(chan)
        try:
            class_id, weight, body_size, props = codec.decode_content_header(payload)
            if class_id == 60 and weight == 0 and props not in self._valid_props:
                validate_properties(props)
                # Publishers usually repeat identical properties: remember the
                # last few validated encodings (bounded, oldest evicted first).
                if len(self._valid_props) >= _VALID_PROPS_CACHE:
                    del self._valid_props[next(iter(self._valid_props))]
                self._valid_props[props] = None
        except FrameDecodeError:
            raise _frame_error(FRAME_HEADER, payload, "unknown_frame") from None
        if class_id != 60:
            raise AMQPConnectionError(
                ReplyCode.UNEXPECTED_FRAME,
                f"expected content header for class 60, got one for class {class_id} instead",
                60,
                40,
            )
        if weight != 0:
            raise self._unexpected_content(chan)
        if body_size > self.config.max_message_size:
            chan.reset_content()
            self.channel_error(
                channel,
                ReplyCode.PRECONDITION_FAILED,
                f"message size {body_size} is larger than configured max size {self.config.max_message_size}",
                60,
                40,
                _queue=True,
            )
            return
        if body_size == 0:
            self._events.append(
                Publish(channel, chan.exchange, chan.routing_key, chan.mandatory, chan.immediate, props, b"")
            )
            chan.reset_content()
            return
        chan.properties_raw = props
        chan.remaining = body_size
        chan.content = _BODY

    def _content_body(self, channel: int, chan: _Channel, payload: bytes) -> None:
        if chan.content != _BODY:
            raise self._unexpected_content(chan)
        n = len(payload)
        if n > chan.remaining:
            raise AMQPConnectionError(
                ReplyCode.UNEXPECTED_FRAME,
                f"content body larger than declared: got {n} bytes, {chan.remaining} remaining",
                60,
                40,
            )
        chan.remaining -= n
        if chan.remaining:
            chan.parts.append(payload)
            return
        parts = chan.parts
        if parts:
            parts.append(payload)
            body = b"".join(parts)
        else:
            body = payload
        self._events.append(
            Publish(channel, chan.exchange, chan.routing_key, chan.mandatory, chan.immediate, chan.properties_raw, body)
        )
        chan.reset_content()

    # ------------------------------------------------------ closing helpers

    def _on_client_close(self, method: C.Connection.Close) -> None:
        self._emit(codec.encode_method(0, C.Connection.CloseOk()))
        self._set_closed()
        self._events.append(
            ConnectionClose(
                method.reply_code or 0, method.reply_text or "", method.class_id or 0, method.method_id or 0
            )
        )

    def _set_closed(self) -> None:
        self._set_state(ConnectionState.CLOSED)
        self._buf = b""
        self._pos = 0
        self._pending.clear()
        self._pending_len = 0
        for chan in self._channels.values():
            chan.reset_content()

    def _terminate(self, exc: AMQPProtocolError, send_close: bool) -> None:
        if self._state in (ConnectionState.CLOSED, ConnectionState.CLOSING):
            return
        if send_close:
            close = C.Connection.Close(
                reply_code=exc.code, reply_text=exc.text, class_id=exc.class_id, method_id=exc.method_id
            )
            self._emit(codec.encode_method(0, close))
            self._set_state(ConnectionState.CLOSING)
            self._closing_since = None
            for chan in self._channels.values():
                chan.reset_content()
        else:
            self._set_closed()
        self._events.append(ConnectionTerminated(exc.code, exc.text, exc.class_id, exc.method_id, send_close))

    def _channel_close(self, channel: int, exc: AMQPProtocolError) -> bytes:
        chan = self._channels[channel]
        chan.state = _CH_CLOSING
        chan.reset_content()
        close = C.Channel.Close(
            reply_code=exc.code, reply_text=exc.text, class_id=exc.class_id, method_id=exc.method_id
        )
        return codec.encode_method(channel, close)

    # ------------------------------------------------------------ output

    def _emit(self, data: bytes) -> None:
        self._outbox.append(data)
        self._sent = True

    def _out(self, data: bytes) -> bytes:
        self._sent = True
        if self._outbox:
            self._outbox.append(data)
            data = b"".join(self._outbox)
            self._outbox.clear()
        return data

    def data_to_send(self) -> bytes:
        """Drain automatic replies queued while processing input (may be b"")."""
        if not self._outbox:
            return b""
        data = b"".join(self._outbox)
        self._outbox.clear()
        return data

    def _can_send(self, channel: int) -> bool:
        if self._state is not ConnectionState.OPEN:
            self.dropped_sends += 1
            return False
        chan = self._channels.get(channel)
        if chan is None or chan.state is not _CH_OPEN:
            self.dropped_sends += 1
            return False
        return True

    @property
    def open_channels(self) -> frozenset[int]:
        """Channels that are open (not closing)."""
        return frozenset(n for n, c in self._channels.items() if c.state is _CH_OPEN)

    def channel_state(self, channel: int) -> ChannelState | None:
        chan = self._channels.get(channel)
        return None if chan is None else chan.state

    # handshake decisions

    def accept_login(self) -> bytes:
        """Credentials are valid: send connection.tune."""
        if self._state is not ConnectionState.AUTHENTICATING:
            raise ProtocolStateError(f"accept_login() in state {self._state.name}")
        cfg = self.config
        self._set_state(ConnectionState.TUNE_SENT)
        tune = C.Connection.Tune(channel_max=cfg.channel_max, frame_max=cfg.frame_max, heartbeat=cfg.heartbeat)
        return self._out(codec.encode_method(0, tune))

    def reject_login(self) -> bytes:
        """Credentials are wrong: 403 ACCESS_REFUSED (sent only if the client
        announced the authentication_failure_close capability, else silent)."""
        if self._state is not ConnectionState.AUTHENTICATING:
            raise ProtocolStateError(f"reject_login() in state {self._state.name}")
        exc = AMQPConnectionError(
            ReplyCode.ACCESS_REFUSED,
            f"Login was refused using authentication mechanism {self.mechanism}. "
            "For details see the broker logfile.",
        )
        caps = self.client_properties.get("capabilities")
        send_close = isinstance(caps, dict) and caps.get("authentication_failure_close") is True
        self._terminate(exc, send_close=send_close)
        return self.data_to_send()

    def accept_open(self) -> bytes:
        """The vhost exists and the user may use it: send connection.open-ok."""
        if self._state is not ConnectionState.OPENING:
            raise ProtocolStateError(f"accept_open() in state {self._state.name}")
        self._set_state(ConnectionState.OPEN)
        return self._out(codec.encode_method(0, C.Connection.OpenOk()))

    # errors

    def channel_error(
        self,
        channel: int,
        code: int,
        text: str,
        class_id: int = 0,
        method_id: int = 0,
        *,
        _queue: bool = False,
    ) -> bytes:
        """Close `channel` with channel.close(code, "NAME - text"); frames on it are
        then discarded until close-ok. A connection-level code (>= 500, 320, 402)
        closes the whole connection instead. No-op if the channel is not open."""
        if int(code) not in CHANNEL_LEVEL_CODES:
            return self.connection_error(code, text, class_id, method_id)
        chan = self._channels.get(channel)
        if self._state is not ConnectionState.OPEN or chan is None or chan.state is not _CH_OPEN:
            return b""
        data = self._channel_close(channel, AMQPChannelError(code, text, class_id, method_id))
        if _queue:
            self._emit(data)
            return b""
        return self._out(data)

    def connection_error(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> bytes:
        """Close the connection with connection.close(code, "NAME - text") and wait
        for close-ok (state CLOSING). Also queues a ConnectionTerminated event."""
        if self._state in (ConnectionState.CLOSED, ConnectionState.CLOSING):
            return self.data_to_send()
        self._terminate(AMQPConnectionError(code, text, class_id, method_id), send_close=True)
        return self.data_to_send()

    def close(self, text: str = "broker forced connection closure with reason 'shutdown'") -> bytes:
        """Server-initiated close (320 CONNECTION_FORCED), e.g. on node shutdown."""
        return self.connection_error(ReplyCode.CONNECTION_FORCED, text)

    def fail(self, exc: AMQPProtocolError, channel: int = 0) -> bytes:
        """Turn an exception raised by broker logic into the right close."""
        if isinstance(exc, AMQPChannelError) and channel:
            chan = self._channels.get(channel)
            if chan is None or chan.state is not _CH_OPEN or self._state is not ConnectionState.OPEN:
                return b""
            return self._out(self._channel_close(channel, exc))
        if self._state in (ConnectionState.CLOSED, ConnectionState.CLOSING):
            return b""
        self._terminate(exc, send_close=self._state not in _SILENT_STATES)
        return self.data_to_send()

    # generic and fast sends

    def send_method(self, channel: int, method: pamqp_base.Frame) -> bytes:
        """Any pamqp method on an open channel (queue.declare-ok, basic.consume-ok,
        basic.cancel (server cancel), confirm.select-ok, ...). Returns b"" and counts
        a drop if the channel is not open."""
        if channel == 0 or method.index >> 16 == CONNECTION_CLASS:
            raise ProtocolStateError("connection-class methods are sent by the state machine itself")
        if isinstance(method, C.Channel.Close | C.Channel.Open | C.Channel.OpenOk):
            raise ProtocolStateError("use channel_error() to close a channel; opening is automatic")
        if not self._can_send(channel):
            return b""
        return self._out(codec.encode_method(channel, method))

    def send_deliver(
        self,
        channel: int,
        consumer_tag: str,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
    ) -> bytes:
        """basic.deliver + header + body frames split by the negotiated frame_max."""
        return b"".join(self.send_deliver_parts(channel, consumer_tag, delivery_tag, redelivered,
                                                exchange, routing_key, properties_raw, body))

    def send_deliver_parts(
        self,
        channel: int,
        consumer_tag: str,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
    ) -> list[bytes | memoryview]:
        """send_deliver's bytes as buffers to write back to back, the body not
        copied into them (for big bodies: see codec.deliver_parts)."""
        if not self._can_send(channel):
            return []
        parts = codec.deliver_parts(
            channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
            properties_raw, body, self.frame_max,
        )
        self._sent = True
        pending = self.data_to_send()
        if pending:
            parts.insert(0, pending)
        return parts

    def send_get_ok(
        self,
        channel: int,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        message_count: int,
        properties_raw: bytes,
        body: bytes,
    ) -> bytes:
        """basic.get-ok + header + body frames (basic.get-empty goes via send_method)."""
        if not self._can_send(channel):
            return b""
        return self._out(
            codec.encode_get_ok(
                channel, delivery_tag, redelivered, exchange, routing_key, message_count,
                properties_raw, body, self.frame_max,
            )
        )

    def send_return(
        self,
        channel: int,
        reply_code: int,
        reply_text: str,
        exchange: str,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
    ) -> bytes:
        """basic.return (e.g. 312, "NO_ROUTE") + header + body frames."""
        if not self._can_send(channel):
            return b""
        return self._out(
            codec.encode_return(
                channel, reply_code, reply_text, exchange, routing_key, properties_raw, body, self.frame_max
            )
        )

    def send_ack(self, channel: int, delivery_tag: int, multiple: bool = False) -> bytes:
        """Publisher confirm."""
        if not self._can_send(channel):
            return b""
        return self._out(codec.encode_ack(channel, delivery_tag, multiple))

    def send_nack(self, channel: int, delivery_tag: int, multiple: bool = False) -> bytes:
        """Negative publisher confirm."""
        if not self._can_send(channel):
            return b""
        return self._out(codec.encode_nack(channel, delivery_tag, multiple, False))

    def client_has(self, capability: str) -> bool:
        """Whether the client announced `capability` (e.g. "consumer_cancel_notify",
        "connection.blocked") in its client_properties."""
        caps = self.client_properties.get("capabilities")
        return isinstance(caps, dict) and caps.get(capability) is True


    def send_blocked(self, reason: str = "low on memory") -> bytes:
        """connection.blocked, only to clients with the connection.blocked capability
        and only once until send_unblocked()."""
        if self._state is not ConnectionState.OPEN or self.blocked or not self.client_has("connection.blocked"):
            return b""
        self.blocked = True
        return self._out(codec.encode_method(0, C.Connection.Blocked(reason=reason)))

    def send_unblocked(self) -> bytes:
        if self._state is not ConnectionState.OPEN or not self.blocked:
            return b""
        self.blocked = False
        return self._out(codec.encode_method(0, C.Connection.Unblocked()))

    # ------------------------------------------------------------ time

    def keepalive(self) -> None:
        """The server stopped reading this connection on purpose (flow control,
        a resource alarm): the client's silence says nothing about it, so the
        missed-heartbeat check counts this tick as heard from (RabbitMQ pauses
        its heartbeat monitor while a connection is blocked, too)."""
        self._received = True

    def tick(self, now: float) -> TickResult:
        """Heartbeat bookkeeping; `now` is a monotonic time in seconds.

        Sends a heartbeat when nothing was sent for heartbeat/2 seconds; declares
        the peer dead after 2 heartbeat intervals of silence (RabbitMQ), after
        `handshake_timeout` without reaching OPEN, or after `close_timeout` in
        CLOSING without close-ok.
        """
        if self._started is None:
            self._started = now
        if self._received or self._last_recv is None:
            self._last_recv = now
            self._received = False
        if self._sent or self._last_sent is None:
            self._last_sent = now
            self._sent = False
        state = self._state
        if state is ConnectionState.CLOSED:
            return TickResult(b"", False)
        if state is ConnectionState.CLOSING:
            if self._closing_since is None:
                self._closing_since = now
            if now - self._closing_since >= self.config.close_timeout:
                self._set_closed()
                return TickResult(self.data_to_send(), True)
            return TickResult(b"", False)
        if state is not ConnectionState.OPEN and now - self._started >= self.config.handshake_timeout:
            self._die(f"handshake timeout after {self.config.handshake_timeout:g}s")
            return TickResult(self.data_to_send(), True)
        hb = self.heartbeat
        if hb and state in (ConnectionState.OPEN, ConnectionState.AWAIT_OPEN, ConnectionState.OPENING):
            if now - self._last_recv >= 2 * hb:
                self._die(f"missed heartbeats from client, timeout: {hb}s")
                return TickResult(self.data_to_send(), True)
            if now - self._last_sent >= hb / 2:
                self._last_sent = now
                return TickResult(self._out(HEARTBEAT_FRAME), False)
        return TickResult(b"", False)

    def _die(self, detail: str) -> None:
        self._set_closed()
        code = ReplyCode.CONNECTION_FORCED
        self._events.append(ConnectionTerminated(code, reply_text(code, detail), 0, 0, False))


def _parse_credentials(mechanism: str, response: bytes) -> tuple[str | None, str | None]:
    """(username, password) from a PLAIN or AMQPLAIN response; (None, None) if malformed."""
    try:
        if mechanism == "PLAIN":
            parts = response.split(b"\x00")
            if len(parts) != 3:
                return None, None
            return parts[1].decode("utf-8"), parts[2].decode("utf-8")
        if mechanism == "AMQPLAIN":
            table = codec.decode_field_table(_U32.pack(len(response)) + response)
            login, password = table.get("LOGIN"), table.get("PASSWORD")
            if isinstance(login, bytes | bytearray):
                login = bytes(login).decode("utf-8")
            if isinstance(password, bytes | bytearray):
                password = bytes(password).decode("utf-8")
            if isinstance(login, str) and isinstance(password, str):
                return login, password
    except (FrameDecodeError, UnicodeDecodeError):
        pass
    return None, None


_HANDLERS: Final[dict[ConnectionState, _Handler]] = {
    ConnectionState.AWAIT_HEADER: ServerConnection._in_await_header,
    ConnectionState.START_SENT: ServerConnection._in_start_sent,
    ConnectionState.AUTHENTICATING: ServerConnection._in_authenticating,
    ConnectionState.TUNE_SENT: ServerConnection._in_tune_sent,
    ConnectionState.AWAIT_OPEN: ServerConnection._in_await_open,
    ConnectionState.OPENING: ServerConnection._in_await_open,
    ConnectionState.OPEN: ServerConnection._in_open,
    ConnectionState.CLOSING: ServerConnection._in_closing,
    ConnectionState.CLOSED: ServerConnection._in_closed,
}
