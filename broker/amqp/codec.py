"""AMQP 0-9-1 frame codec: a struct-based fast path plus pamqp for everything else.

Pipeline position: bytes <-> frames. `connection.ServerConnection` splits the
byte stream into frames and calls these functions; nothing here keeps state
except a bounded cache of re-encoded properties.

Fast path (hand-written, precompiled `struct.Struct`s, no per-message objects
beyond the result): incoming basic.publish, content header, basic.ack /
basic.nack / basic.reject; outgoing basic.deliver, basic.get-ok,
basic.return, basic.ack, basic.nack, content header + body frames. Every
other method is a pamqp object: encoded by pamqp (`encode_method`), decoded
by a linear walk over the pamqp class's argument types (`decode_method`),
which also rejects truncated arguments and stray trailing bytes (pamqp's own
decoder accepts both and is quadratic in the number of table entries).

Message properties travel as the publisher's raw bytes ("properties_raw":
property flags + values, exactly as they appeared in the content header) and
are written back unchanged on delivery; see `tables` for byte-exact splicing.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from pamqp import base as pamqp_base
from pamqp import commands as pamqp_commands
from pamqp import decode as pamqp_decode

from .errors import FrameDecodeError
from .tables import (
    EMPTY_PROPERTIES,
    PROPERTY_LAYOUT,
    decode_table,
    long_long_value,
    set_header_raw,
)

FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE
FRAME_END_BYTE: Final = b"\xce"
FRAME_OVERHEAD: Final = 8  # 7-byte frame header + frame-end octet
FRAME_MIN_SIZE: Final = 4096
PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"

BASIC_CLASS: Final = 60
# (class_id << 16) | method_id of the fast-path methods
PUBLISH_ID: Final = 0x003C0028
DELIVER_ID: Final = 0x003C003C
GET_OK_ID: Final = 0x003C0047
RETURN_ID: Final = 0x003C0032
ACK_ID: Final = 0x003C0050
NACK_ID: Final = 0x003C0078
REJECT_ID: Final = 0x003C005A

FRAME_HDR: Final = struct.Struct(">BHI")
_U32: Final = struct.Struct(">I")
_U16: Final = struct.Struct(">H")
_HDR_FIXED: Final = struct.Struct(">HHQ")  # class-id, weight, body-size
_ACK_ARGS: Final = struct.Struct(">QB")  # delivery-tag + bits
_DELIVER_MID: Final = struct.Struct(">QB")  # delivery-tag + redelivered bit
_GET_OK_TAIL: Final = struct.Struct(">I")  # message-count

HEARTBEAT_FRAME: Final = b"\x08\x00\x00\x00\x00\x00\x00\xce"



def _shortstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 255:
        raise ValueError(f"shortstr longer than 255 bytes: {value[:40]!r}...")
    return bytes((len(raw),)) + raw


# ---------------------------------------------------------------------------
# Incoming fast path


def decode_publish(payload: bytes | memoryview) -> tuple[str, str, bool, bool]:
    """Decode basic.publish arguments (payload includes the 4-byte method id).

    Returns (exchange, routing_key, mandatory, immediate).
    """
    n = len(payload)
    pos = 6  # method id + ticket
    if n < 9:
        raise FrameDecodeError("basic.publish truncated")
    elen = payload[pos]
    pos += 1
    exchange_b = bytes(payload[pos : pos + elen])
    pos += elen
    if pos >= n:
        raise FrameDecodeError("basic.publish truncated")
    rlen = payload[pos]
    pos += 1
    routing_b = bytes(payload[pos : pos + rlen])
    pos += rlen
    if pos + 1 != n:
        raise FrameDecodeError("basic.publish truncated" if pos >= n else "trailing bytes")
    bits = payload[pos]
    try:
        return exchange_b.decode("utf-8"), routing_b.decode("utf-8"), bool(bits & 1), bool(bits & 2)
    except UnicodeDecodeError as exc:
        raise FrameDecodeError("shortstr is not valid UTF-8") from exc


def decode_ack(payload: bytes | memoryview) -> tuple[int, int]:
    """Decode basic.ack / basic.nack / basic.reject args: (delivery_tag, bits)."""
    if len(payload) != 13:
        raise FrameDecodeError("basic.ack/nack/reject has the wrong length")
    tag, bits = _ACK_ARGS.unpack_from(payload, 4)
    return int(tag), int(bits)


def decode_content_header(payload: bytes | memoryview) -> tuple[int, int, int, bytes]:
    """Split a content-header payload: (class_id, weight, body_size, properties_raw).

    The properties are NOT validated here (see `tables.validate_properties`).
    """
    if len(payload) < 14:
        raise FrameDecodeError("content header truncated")
    class_id, weight, body_size = _HDR_FIXED.unpack_from(payload, 0)
    return class_id, weight, body_size, bytes(payload[12:])


# ---------------------------------------------------------------------------
# Outgoing fast path


# Method frame end + content header frame start + class/weight/body-size, in one pack.
_END_HEADER_START: Final = struct.Struct(">BBHIHHQ")
# Frame end + body frame header, in one pack.
_END_BODY_START: Final = struct.Struct(">BBHI")
_DELIVER_HEAD: Final = struct.Struct(">BHII")  # method frame header + method id

_SHORTSTR_CACHE: dict[str, bytes] = {}
_SHORTSTR_CACHE_MAX: Final = 4096


def _ss(value: str) -> bytes:
    """Encoded shortstr, memoised: consumer tags, exchanges and routing keys repeat."""
    hit = _SHORTSTR_CACHE.get(value)
    if hit is None:
        hit = _shortstr(value)
        if len(_SHORTSTR_CACHE) >= _SHORTSTR_CACHE_MAX:
            _SHORTSTR_CACHE.clear()
        _SHORTSTR_CACHE[value] = hit
    return hit


def _content_tail(channel: int, properties_raw: bytes, body: bytes, frame_max: int) -> list[bytes | memoryview]:
    """Frame end of the preceding method frame, then content header + body frames."""
    size = len(body)
    out: list[bytes | memoryview] = [
        _END_HEADER_START.pack(FRAME_END, FRAME_HEADER, channel, 12 + len(properties_raw), BASIC_CLASS, 0, size),
        properties_raw,
    ]
    if not size:
        out.append(FRAME_END_BYTE)
        return out
    chunk = frame_max - FRAME_OVERHEAD if frame_max else size
    if size <= chunk:
        out += (_END_BODY_START.pack(FRAME_END, FRAME_BODY, channel, size), body, FRAME_END_BYTE)
        return out
    view = memoryview(body)
    for start in range(0, size, chunk):
        piece = view[start : start + chunk]
        out += (_END_BODY_START.pack(FRAME_END, FRAME_BODY, channel, len(piece)), piece)
    out.append(FRAME_END_BYTE)
    return out


#: bodies this big are delivered from their own buffer (`deliver_parts`),
#: not copied into the frame and again into the connection's write
VECTORED_BODY = 16 * 1024


def encode_content(channel: int, properties_raw: bytes, body: bytes, frame_max: int) -> bytes:
    """Content header frame + body frames (split so no frame exceeds frame_max;
    frame_max 0 means unlimited)."""
    return b"".join(_content_tail(channel, properties_raw, body, frame_max))[1:]


def encode_deliver(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    properties_raw: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.deliver + content header + body frames, byte-identical to pamqp's."""
    return b"".join(deliver_parts(channel, consumer_tag, delivery_tag, redelivered, exchange,
                                  routing_key, properties_raw, body, frame_max))


def deliver_parts(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    properties_raw: bytes,
    body: bytes,
    frame_max: int,
) -> list[bytes | memoryview]:
    """encode_deliver's bytes as the buffers to write back to back. A body of
    `VECTORED_BODY` bytes or more is one of them (or views into it, one per
    body frame), not copied; a smaller one is joined with the frames into a
    single buffer (one copy costs less than writing many small buffers)."""
    ct, ex, rk = _ss(consumer_tag), _ss(exchange), _ss(routing_key)
    head = _DELIVER_HEAD.pack(FRAME_METHOD, channel, 13 + len(ct) + len(ex) + len(rk), DELIVER_ID)
    mid = _DELIVER_MID.pack(delivery_tag, 1 if redelivered else 0)
    parts = [head, ct, mid, ex, rk, *_content_tail(channel, properties_raw, body, frame_max)]
    return parts if len(body) >= VECTORED_BODY else [b"".join(parts)]


def encode_get_ok(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    message_count: int,
    properties_raw: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.get-ok + content header + body frames."""
    ex, rk = _ss(exchange), _ss(routing_key)
    head = _DELIVER_HEAD.pack(FRAME_METHOD, channel, 17 + len(ex) + len(rk), GET_OK_ID)
    mid = _DELIVER_MID.pack(delivery_tag, 1 if redelivered else 0)
    return b"".join(
        [head, mid, ex, rk, _GET_OK_TAIL.pack(message_count), *_content_tail(channel, properties_raw, body, frame_max)]
    )


def encode_return(
    channel: int,
    reply_code: int,
    reply_text: str,
    exchange: str,
    routing_key: str,
    properties_raw: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.return + content header + body frames (mandatory publish that was not routed)."""
    text, ex, rk = _ss(reply_text), _ss(exchange), _ss(routing_key)
    head = _DELIVER_HEAD.pack(FRAME_METHOD, channel, 6 + len(text) + len(ex) + len(rk), RETURN_ID)
    return b"".join(
        [head, _U16.pack(reply_code), text, ex, rk, *_content_tail(channel, properties_raw, body, frame_max)]
    )


_ACK_FRAME: Final = struct.Struct(">BHIIQBB")  # whole basic.ack/nack frame


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """basic.ack frame (publisher confirm)."""
    return _ACK_FRAME.pack(FRAME_METHOD, channel, 13, ACK_ID, delivery_tag, 1 if multiple else 0, FRAME_END)


def encode_nack(channel: int, delivery_tag: int, multiple: bool, requeue: bool = False) -> bytes:
    """basic.nack frame (negative publisher confirm)."""
    bits = (1 if multiple else 0) | (2 if requeue else 0)
    return _ACK_FRAME.pack(FRAME_METHOD, channel, 13, NACK_ID, delivery_tag, bits, FRAME_END)


# ---------------------------------------------------------------------------
# Generic path (pamqp)


def encode_method(channel: int, method: pamqp_base.Frame) -> bytes:
    """Any pamqp method as one method frame."""
    payload = _U32.pack(method.index) + method.marshal()
    return b"".join((FRAME_HDR.pack(FRAME_METHOD, channel, len(payload)), payload, FRAME_END_BYTE))


def method_class(method_id: int) -> type[pamqp_base.Frame] | None:
    """The pamqp class for a (class_id << 16 | method_id), or None if unknown."""
    cls: type[pamqp_base.Frame] | None = pamqp_commands.INDEX_MAPPING.get(method_id)
    return cls


_ARG_STRUCTS: Final = {
    "octet": struct.Struct(">B"),
    "short": struct.Struct(">H"),
    "long": struct.Struct(">L"),
    "longlong": struct.Struct(">q"),
}
_PLANS: dict[int, tuple[tuple[str, str], ...]] = {}


def _plan(cls: type[pamqp_base.Frame]) -> tuple[tuple[str, str], ...]:
    """(attribute, AMQP type) pairs of a pamqp method class, memoised."""
    plan = _PLANS.get(cls.index)
    if plan is None:
        plan = tuple((a, cls.amqp_type(a)) for a in cls.__slots__)
        _PLANS[cls.index] = plan
    return plan


def _shortstr_at(data: bytes, pos: int, end: int) -> tuple[str, int]:
    if pos >= end:
        raise FrameDecodeError("shortstr truncated")
    stop = pos + 1 + data[pos]
    if stop > end:
        raise FrameDecodeError("shortstr truncated")
    try:
        return data[pos + 1 : stop].decode("utf-8"), stop
    except UnicodeDecodeError as exc:
        raise FrameDecodeError("shortstr is not valid UTF-8") from exc


def _timestamp_at(data: bytes, pos: int, end: int) -> tuple[Any, int]:
    if pos + 8 > end:
        raise FrameDecodeError("timestamp truncated")
    return pamqp_decode.timestamp(data[pos : pos + 8])[1], pos + 8


def decode_method(payload: bytes) -> pamqp_base.Frame:
    """Decode a method frame payload (4-byte method id + arguments) into the
    pamqp method object, in one linear pass (pamqp's own decoder is quadratic
    in the number of table entries and accepts truncated strings).

    Raises FrameDecodeError for unknown methods, truncated arguments, trailing
    bytes, or a shortstr that is not UTF-8.
    """
    n = len(payload)
    if n < 4:
        raise FrameDecodeError("method frame shorter than its method id")
    mid = _U32.unpack_from(payload, 0)[0]
    cls = method_class(mid)
    if cls is None:
        raise FrameDecodeError(f"unknown method {mid >> 16}.{mid & 0xFFFF}")
    method: pamqp_base.Frame = cls.__new__(cls)
    pos = 4
    bits = 0
    bit_index = 8  # Invariant: 8 means the next bit starts a new octet
    for name, kind in _plan(cls):
        value: Any
        if kind == "bit":
            if bit_index == 8:
                if pos >= n:
                    raise FrameDecodeError("bit field truncated")
                bits = payload[pos]
                pos += 1
                bit_index = 0
            value = bool(bits >> bit_index & 1)
            bit_index += 1
        else:
            bit_index = 8
            fixed = _ARG_STRUCTS.get(kind)
            if fixed is not None:
                if pos + fixed.size > n:
                    raise FrameDecodeError(f"{kind} truncated")
                value = fixed.unpack_from(payload, pos)[0]
                pos += fixed.size
            elif kind == "shortstr":
                value, pos = _shortstr_at(payload, pos, n)
            elif kind == "longstr":
                value, pos = _longstr_at(payload, pos, n)
            elif kind == "table":
                value, pos = decode_table(payload, pos, n)
            elif kind == "timestamp":
                value, pos = _timestamp_at(payload, pos, n)
            else:  # pragma: no cover - every AMQP 0-9-1 argument type is listed above
                raise FrameDecodeError(f"unsupported argument type {kind}")
        setattr(method, name, value)
    if pos != n:
        raise FrameDecodeError("trailing bytes after method arguments")
    return method


def _longstr_at(data: bytes, pos: int, end: int) -> tuple[str | bytes, int]:
    if pos + 4 > end:
        raise FrameDecodeError("longstr truncated")
    stop = pos + 4 + int(_U32.unpack_from(data, pos)[0])
    if stop > end:
        raise FrameDecodeError("longstr truncated")
    raw = data[pos + 4 : stop]
    try:
        return raw.decode("utf-8"), stop  # pamqp's convention: str if UTF-8, else bytes
    except UnicodeDecodeError:
        return raw, stop


# ---------------------------------------------------------------------------
# Properties

_PAMQP_NAME: Final = {"type": "message_type"}
# flags -> ((pamqp attribute, kind), ...) for the properties present, memoised
# (publishers use few distinct flag combinations; at most 2^14 entries).
_PROP_PLANS: dict[int, tuple[tuple[str, str], ...]] = {}
_Properties = pamqp_commands.Basic.Properties


def _prop_plan(flags: int) -> tuple[tuple[str, str], ...]:
    plan = _PROP_PLANS.get(flags)
    if plan is None:
        plan = tuple((_PAMQP_NAME.get(name, name), kind) for name, bit, kind in PROPERTY_LAYOUT if flags & bit)
        _PROP_PLANS[flags] = plan
    return plan


def decode_properties(properties_raw: bytes) -> pamqp_commands.Basic.Properties:
    """Decode raw properties (flags + values) into pamqp's Basic.Properties."""
    props = _Properties.__new__(_Properties)
    props.content_type = props.content_encoding = props.headers = None
    props.delivery_mode = props.priority = props.correlation_id = props.reply_to = None
    props.expiration = props.message_id = props.timestamp = props.message_type = None
    props.user_id = props.app_id = None
    props.cluster_id = ""
    n = len(properties_raw)
    if n < 2:
        raise FrameDecodeError("content header property flags truncated")
    flags = _U16.unpack_from(properties_raw, 0)[0]
    pos = 2
    word = flags
    while word & 1:  # continuation flag words (none are defined for Basic)
        if pos + 2 > n:
            raise FrameDecodeError("content header property flags truncated")
        word = _U16.unpack_from(properties_raw, pos)[0]
        pos += 2
    for attr, kind in _prop_plan(flags & 0xFFFE):
        value: Any
        if kind == "s":
            value, pos = _shortstr_at(properties_raw, pos, n)
        elif kind == "t":
            value, pos = decode_table(properties_raw, pos, n)
        elif kind == "o":
            if pos >= n:
                raise FrameDecodeError("content property truncated")
            value = properties_raw[pos]
            pos += 1
        else:
            value, pos = _timestamp_at(properties_raw, pos, n)
        setattr(props, attr, value)
    if pos != n:
        raise FrameDecodeError("trailing bytes after content properties")
    return props


def encode_properties(props: pamqp_commands.Basic.Properties | None) -> bytes:
    """Encode pamqp Basic.Properties (None -> no properties) to raw bytes."""
    if props is None:
        return EMPTY_PROPERTIES
    raw: bytes = props.marshal()
    return raw


class PropertiesCache:
    """Bounded memo of properties re-encoded with an ``x-delivery-count`` header.

    Redeliveries of messages published with identical properties (the common
    case: one publisher, fixed properties) reuse the same re-encoded bytes.
    Invariant: at most `capacity` entries; the oldest entry is evicted first.
    """

    __slots__ = ("capacity", "_entries")

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._entries: dict[tuple[bytes, int], bytes] = {}

    def with_delivery_count(self, properties_raw: bytes, count: int) -> bytes:
        key = (properties_raw, count)
        hit = self._entries.get(key)
        if hit is not None:
            return hit
        out = set_header_raw(properties_raw, "x-delivery-count", long_long_value(count))
        if len(self._entries) >= self.capacity:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = out
        return out

    def __len__(self) -> int:
        return len(self._entries)


def decode_field_table(raw: bytes) -> dict[str, Any]:
    """Decode a whole length-prefixed field table (e.g. an AMQPLAIN response)."""
    value, end = decode_table(raw, 0, len(raw))
    if end != len(raw):
        raise FrameDecodeError("trailing bytes after field table")
    return value
