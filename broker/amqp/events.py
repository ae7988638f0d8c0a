"""Events produced by `ServerConnection.next_event()`.

Pipeline position: bytes from the socket -> `ServerConnection.receive_data()`
-> these events -> the runtime shell, which routes them to the queue /
exchange / metadata logic and answers through the `ServerConnection.send_*`
helpers. Events are immutable values; the machine has already done all
protocol bookkeeping (and queued any automatic reply, e.g. channel.open-ok)
by the time an event is returned.

Automatic replies (already queued, drain with `data_to_send()`):
connection.start (after ProtocolHeaderReceived), channel.open-ok
(ChannelOpen), channel.close-ok (ChannelClose), channel.flow-ok
(ChannelFlow), connection.close-ok (ConnectionClose).
Decisions left to the server: ConnectionStartOk -> `accept_login()` /
`reject_login()`; ConnectionOpen -> `accept_open()` / `connection_error()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pamqp import base as pamqp_base
from pamqp import commands as pamqp_commands

from .codec import decode_properties


class _Sentinel:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA: Final = _Sentinel("NEED_DATA")
"""next_event(): no complete event buffered; feed more bytes."""
CLOSED: Final = _Sentinel("CLOSED")
"""next_event(): the connection is closed; nothing more will come."""
PAUSED: Final = _Sentinel("PAUSED")
"""next_event(): waiting for the server's decision (accept_login/reject_login after
ConnectionStartOk, accept_open/connection_error after ConnectionOpen). Input that
the client pipelined stays buffered; call next_event() again after deciding."""


@dataclass(frozen=True, slots=True)
class ProtocolHeaderReceived:
    """The client sent a valid ``AMQP 0-9-1`` header; connection.start is queued."""

    version: tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class ConnectionStartOk:
    """Client chose a mechanism and sent credentials.

    `username`/`password` are parsed for PLAIN and AMQPLAIN (None if the
    response is malformed). The server must call `accept_login()` or
    `reject_login()`.
    """

    mechanism: str
    response: bytes
    client_properties: dict[str, Any]
    locale: str
    username: str | None
    password: str | None


@dataclass(frozen=True, slots=True)
class ConnectionTuneOk:
    """Negotiated limits (already validated and applied by the machine)."""

    channel_max: int
    frame_max: int
    heartbeat: int


@dataclass(frozen=True, slots=True)
class ConnectionOpen:
    """Client asks for a vhost; the server must `accept_open()` or refuse
    (`connection_error(530, "vhost x not found")`)."""

    virtual_host: str


@dataclass(frozen=True, slots=True)
class ConnectionClose:
    """Client closed the connection; close-ok is queued and the machine is CLOSED."""

    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


@dataclass(frozen=True, slots=True)
class ConnectionCloseOk:
    """Client confirmed a server-initiated connection.close; the machine is CLOSED."""


@dataclass(frozen=True, slots=True)
class ConnectionTerminated:
    """The machine closed the connection because of an error.

    If `close_sent`, a connection.close is queued and the machine waits (in
    CLOSING) for close-ok; otherwise (errors during the handshake, a bad
    protocol header, a dead peer) it is CLOSED at once and the shell should
    just flush `data_to_send()` and close the socket.
    """

    reply_code: int
    reply_text: str
    class_id: int
    method_id: int
    close_sent: bool


@dataclass(frozen=True, slots=True)
class ConnectionLost:
    """The peer closed the socket (receive_data(b"")) without a close handshake."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A heartbeat frame arrived (liveness is tracked by the machine)."""


@dataclass(frozen=True, slots=True)
class ChannelOpen:
    """A channel was opened; open-ok is queued."""

    channel: int


@dataclass(frozen=True, slots=True)
class ChannelClose:
    """The client closed a channel; close-ok is queued and the channel is free.
    The server must release its consumers and unacked messages."""

    channel: int
    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


@dataclass(frozen=True, slots=True)
class ChannelCloseOk:
    """The client confirmed a server-initiated channel.close; the channel is free."""

    channel: int


@dataclass(frozen=True, slots=True)
class ChannelFlow:
    """channel.flow(active=True) (flow-ok is queued). active=False is refused with
    540 NOT_IMPLEMENTED, as RabbitMQ does, so this always has active=True."""

    channel: int
    active: bool


@dataclass(frozen=True, slots=True)
class MethodReceived:
    """Any other method on an open channel, decoded by pamqp (exchange.*, queue.*,
    basic.qos/consume/cancel/get/recover, tx.*, confirm.select, ...)."""

    channel: int
    method: pamqp_base.Frame


# One per message: its __init__ is written out (init=False) because the one
# dataclasses generates runs interpreted even in the compiled build (five
# times slower there than this one; see broker/compiled.py).
@dataclass(frozen=True, slots=True, init=False)
class Publish:
    """A complete basic.publish: method, content header and the whole body.

    `properties_raw` is the publisher's property flags + values, byte for byte;
    pass it unchanged to `send_deliver`. `properties` decodes it on demand
    (each access decodes again: keep the result if you need it twice).
    `immediate` is always False: immediate=true is refused with 540, as RabbitMQ does.
    """

    channel: int
    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool
    properties_raw: bytes
    body: bytes

    def __init__(self, channel: int, exchange: str, routing_key: str, mandatory: bool,
                 immediate: bool, properties_raw: bytes, body: bytes) -> None:
        object.__setattr__(self, "channel", channel)
        object.__setattr__(self, "exchange", exchange)
        object.__setattr__(self, "routing_key", routing_key)
        object.__setattr__(self, "mandatory", mandatory)
        object.__setattr__(self, "immediate", immediate)
        object.__setattr__(self, "properties_raw", properties_raw)
        object.__setattr__(self, "body", body)

    @property
    def properties(self) -> pamqp_commands.Basic.Properties:
        return decode_properties(self.properties_raw)


@dataclass(frozen=True, slots=True, init=False)
class Ack:
    """basic.ack from a consumer (fast path; __init__ written out as Publish's)."""

    channel: int
    delivery_tag: int
    multiple: bool

    def __init__(self, channel: int, delivery_tag: int, multiple: bool) -> None:
        object.__setattr__(self, "channel", channel)
        object.__setattr__(self, "delivery_tag", delivery_tag)
        object.__setattr__(self, "multiple", multiple)


@dataclass(frozen=True, slots=True)
class Nack:
    """basic.nack from a consumer (fast path)."""

    channel: int
    delivery_tag: int
    multiple: bool
    requeue: bool


@dataclass(frozen=True, slots=True)
class Reject:
    """basic.reject from a consumer (fast path)."""

    channel: int
    delivery_tag: int
    requeue: bool


Event = (
    ProtocolHeaderReceived
    | ConnectionStartOk
    | ConnectionTuneOk
    | ConnectionOpen
    | ConnectionClose
    | ConnectionCloseOk
    | ConnectionTerminated
    | ConnectionLost
    | Heartbeat
    | ChannelOpen
    | ChannelClose
    | ChannelCloseOk
    | ChannelFlow
    | MethodReceived
    | Publish
    | Ack
    | Nack
    | Reject
)
