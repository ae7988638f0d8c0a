"""Raw (byte-level) handling of AMQP field tables and Basic content properties.

Pipeline position: used by the codec fast path (`codec`) to validate the
properties of an incoming content header without decoding them, and by the
delivery path to add or override a single header (``x-delivery-count``)
while keeping every other byte the publisher sent exactly as it was.

Decoding a table into Python values and re-encoding it is lossy (pamqp picks
integer widths itself, sorts keys, turns ``l``/``L`` into the same int), so
properties are carried as the publisher's raw bytes ("properties_raw": the
content-header payload after class-id, weight and body-size, i.e. the
property flags followed by the property values) and only spliced here.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import decode as pamqp_decode

from .errors import FrameDecodeError

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")

# Fixed sizes of field values by type tag (RabbitMQ's errata set plus pamqp's 'L').
_FIXED: dict[int, int] = {
    ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2,
    ord("I"): 4, ord("i"): 4, ord("l"): 8, ord("L"): 8, ord("f"): 4,
    ord("d"): 8, ord("D"): 5, ord("T"): 8, ord("V"): 0,
    0: 0,  # NUL as void: not in the spec but seen in the wild (pamqp accepts it too)
}
_LONG_STR = frozenset({ord("S"), ord("x")})
_TABLE = ord("F")
_ARRAY = ord("A")

MAX_DEPTH = 64  # nesting limit: deeper input is rejected, not recursed into

# Basic property flags, in wire order (bit 15 first). Value kinds:
# s = shortstr, t = table, o = octet, q = 64-bit timestamp.
PROPERTY_LAYOUT: tuple[tuple[str, int, str], ...] = (
    ("content_type", 0x8000, "s"),
    ("content_encoding", 0x4000, "s"),
    ("headers", 0x2000, "t"),
    ("delivery_mode", 0x1000, "o"),
    ("priority", 0x0800, "o"),
    ("correlation_id", 0x0400, "s"),
    ("reply_to", 0x0200, "s"),
    ("expiration", 0x0100, "s"),
    ("message_id", 0x0080, "s"),
    ("timestamp", 0x0040, "q"),
    ("type", 0x0020, "s"),
    ("user_id", 0x0010, "s"),
    ("app_id", 0x0008, "s"),
    ("cluster_id", 0x0004, "s"),
)
HEADERS_FLAG = 0x2000

EMPTY_PROPERTIES = b"\x00\x00"  # no flags set


def skip_value(data: bytes | memoryview, pos: int, end: int, depth: int = 0) -> int:
    """Return the offset just past the field value (type tag at `pos`).

    Raises FrameDecodeError if the value is unknown, truncated or nested too deep.
    """
    if pos >= end:
        raise FrameDecodeError("field value truncated")
    tag = data[pos]
    pos += 1
    size = _FIXED.get(tag)
    if size is not None:
        pos += size
    elif tag in _LONG_STR:
        if pos + 4 > end:
            raise FrameDecodeError("long string length truncated")
        pos += 4 + int(_U32.unpack_from(data, pos)[0])
    elif tag == _TABLE:
        pos = skip_table(data, pos, end, depth + 1)
    elif tag == _ARRAY:
        pos = skip_array(data, pos, end, depth + 1)
    else:
        raise FrameDecodeError(f"unknown field type {chr(tag)!r}")
    if pos > end:
        raise FrameDecodeError("field value truncated")
    return pos


def skip_table(data: bytes | memoryview, pos: int, end: int, depth: int = 0) -> int:
    """Validate a length-prefixed field table at `pos`; return the offset past it."""
    if depth > MAX_DEPTH:
        raise FrameDecodeError("field table nested too deeply")
    if pos + 4 > end:
        raise FrameDecodeError("field table length truncated")
    stop: int = pos + 4 + int(_U32.unpack_from(data, pos)[0])
    if stop > end:
        raise FrameDecodeError("field table length exceeds available data")
    pos += 4
    while pos < stop:
        pos += 1 + data[pos]  # key: shortstr
        pos = skip_value(data, pos, stop, depth)
    if pos != stop:
        raise FrameDecodeError("field table entries overrun the table length")
    return stop


def skip_array(data: bytes | memoryview, pos: int, end: int, depth: int = 0) -> int:
    """Validate a length-prefixed field array at `pos`; return the offset past it."""
    if depth > MAX_DEPTH:
        raise FrameDecodeError("field array nested too deeply")
    if pos + 4 > end:
        raise FrameDecodeError("field array length truncated")
    stop: int = pos + 4 + int(_U32.unpack_from(data, pos)[0])
    if stop > end:
        raise FrameDecodeError("field array length exceeds available data")
    pos += 4
    while pos < stop:
        pos = skip_value(data, pos, stop, depth)
    return stop


def table_entries(table: bytes) -> list[tuple[bytes, bytes]]:
    """Split an encoded table (with its length prefix) into (key, raw typed value) pairs."""
    end = skip_table(table, 0, len(table))
    out: list[tuple[bytes, bytes]] = []
    pos = 4
    while pos < end:
        klen = table[pos]
        key = table[pos + 1 : pos + 1 + klen]
        vstart = pos + 1 + klen
        pos = skip_value(table, vstart, end)
        out.append((key, table[vstart:pos]))
    return out


def _property_flags(raw: bytes) -> tuple[int, int]:
    """(first flag word, offset of the first property value)."""
    if len(raw) < 2:
        raise FrameDecodeError("content header property flags truncated")
    flags = _U16.unpack_from(raw, 0)[0]
    pos = 2
    word = flags
    while word & 1:  # continuation bit: more flag words follow (none defined for Basic)
        if pos + 2 > len(raw):
            raise FrameDecodeError("content header property flags truncated")
        word = _U16.unpack_from(raw, pos)[0]
        pos += 2
    return flags, pos


def validate_properties(raw: bytes | memoryview, start: int = 0, end: int | None = None) -> None:
    """Check that `raw[start:end]` is a well-formed Basic property list.

    Cheap: walks the flags and skips values without building Python objects.
    """
    if end is None:
        end = len(raw)
    if end - start < 2:
        raise FrameDecodeError("content header property flags truncated")
    flags = (raw[start] << 8) | raw[start + 1]
    pos = start + 2
    word = flags
    while word & 1:
        if pos + 2 > end:
            raise FrameDecodeError("content header property flags truncated")
        word = (raw[pos] << 8) | raw[pos + 1]
        pos += 2
    if not flags & 0xFFFE:
        if pos != end:
            raise FrameDecodeError("trailing bytes after content properties")
        return
    for _name, bit, kind in PROPERTY_LAYOUT:
        if not flags & bit:
            continue
        if kind == "s":
            if pos >= end:
                raise FrameDecodeError("content property truncated")
            pos += 1 + raw[pos]
        elif kind == "t":
            pos = skip_table(raw, pos, end)
        elif kind == "o":
            pos += 1
        else:
            pos += 8
        if pos > end:
            raise FrameDecodeError("content property truncated")
    if pos != end:
        raise FrameDecodeError("trailing bytes after content properties")


def _headers_span(raw: bytes) -> tuple[int, int, int, int]:
    """(flags, flags_end, headers_start, headers_end); start == end when absent."""
    flags, pos = _property_flags(raw)
    n = len(raw)
    for bit in (0x8000, 0x4000):  # content_type, content_encoding precede headers
        if flags & bit:
            if pos >= n:
                raise FrameDecodeError("content property truncated")
            pos += 1 + raw[pos]
    if pos > n:
        raise FrameDecodeError("content property truncated")
    if flags & HEADERS_FLAG:
        return flags, 2, pos, skip_table(raw, pos, n)
    return flags, 2, pos, pos


def get_header_raw(properties_raw: bytes, key: str) -> bytes | None:
    """The raw typed value (tag + bytes) of header `key`, or None if absent."""
    _flags, _fe, start, stop = _headers_span(properties_raw)
    if start == stop:
        return None
    k = key.encode("utf-8")
    for ekey, value in table_entries(properties_raw[start:stop]):
        if ekey == k:
            return value
    return None


def set_header_raw(properties_raw: bytes, key: str, typed_value: bytes) -> bytes:
    """Return properties with header `key` set to `typed_value` (type tag + value
    bytes, e.g. ``b"l" + pack(">q", 3)``). Every other byte is kept as it was:
    the entry is replaced in place if present, appended otherwise; the headers
    table (and its flag) is created if the message had none.
    """
    flags, _fe, start, stop = _headers_span(properties_raw)
    kb = key.encode("utf-8")
    if len(kb) > 255:
        raise ValueError("header name longer than 255 bytes")
    entry = _U8.pack(len(kb)) + kb + typed_value
    if start == stop:
        table = _U32.pack(len(entry)) + entry
        new_flags = flags | HEADERS_FLAG
        return _U16.pack(new_flags) + properties_raw[2:start] + table + properties_raw[start:]
    parts: list[bytes] = []
    replaced = False
    for ekey, value in table_entries(properties_raw[start:stop]):
        if ekey == kb:
            if not replaced:
                parts.append(entry)
                replaced = True
            continue  # drop duplicates of the key
        parts.append(_U8.pack(len(ekey)) + ekey + value)
    if not replaced:
        parts.append(entry)
    body = b"".join(parts)
    return properties_raw[:start] + _U32.pack(len(body)) + body + properties_raw[stop:]


def long_long_value(value: int) -> bytes:
    """Typed table value 'l' (signed 64-bit), as RabbitMQ encodes x-delivery-count."""
    return b"l" + _I64.pack(value)


# ---------------------------------------------------------------------------
# Linear decoding to Python values (same values as pamqp.decode produces).
# pamqp slices the remaining table for every entry, which is quadratic in the
# number of entries (a 128 KiB table of tiny entries costs ~0.25 s); this walks
# offsets instead. Timestamps and decimals are delegated to pamqp so the value
# types are identical.

_SCALARS: dict[int, struct.Struct] = {
    ord("b"): struct.Struct(">b"), ord("B"): struct.Struct(">B"),
    ord("s"): struct.Struct(">h"), ord("u"): struct.Struct(">H"),
    ord("I"): struct.Struct(">l"), ord("i"): struct.Struct(">L"),
    ord("l"): struct.Struct(">q"), ord("L"): struct.Struct(">q"),
    ord("f"): struct.Struct(">f"), ord("d"): struct.Struct(">d"),
}


def decode_value(data: bytes, pos: int, end: int, depth: int = 0) -> tuple[Any, int]:
    """Decode the typed field value at `pos`: (value, offset past it)."""
    if pos >= end:
        raise FrameDecodeError("field value truncated")
    tag = data[pos]
    pos += 1
    scalar = _SCALARS.get(tag)
    if scalar is not None:
        stop = pos + scalar.size
        if stop > end:
            raise FrameDecodeError("field value truncated")
        return scalar.unpack_from(data, pos)[0], stop
    if tag == 0x74:  # 't'
        if pos >= end:
            raise FrameDecodeError("field value truncated")
        return bool(data[pos]), pos + 1
    if tag == 0x53 or tag == 0x78:  # 'S' long string, 'x' byte array
        if pos + 4 > end:
            raise FrameDecodeError("long string length truncated")
        stop = pos + 4 + int(_U32.unpack_from(data, pos)[0])
        if stop > end:
            raise FrameDecodeError("long string truncated")
        raw = data[pos + 4 : stop]
        if tag == 0x78:
            return bytearray(raw), stop
        try:
            return raw.decode("utf-8"), stop
        except UnicodeDecodeError:
            return raw, stop
    if tag == 0x46:  # 'F'
        return decode_table(data, pos, end, depth + 1)
    if tag == 0x41:  # 'A'
        return decode_array(data, pos, end, depth + 1)
    if tag == 0x56 or tag == 0:  # 'V' / NUL
        return None, pos
    if tag == 0x54:  # 'T'
        if pos + 8 > end:
            raise FrameDecodeError("timestamp truncated")
        return pamqp_decode.timestamp(data[pos : pos + 8])[1], pos + 8
    if tag == 0x44:  # 'D'
        if pos + 5 > end:
            raise FrameDecodeError("decimal truncated")
        return pamqp_decode.decimal(data[pos : pos + 5])[1], pos + 5
    raise FrameDecodeError(f"unknown field type {chr(tag)!r}")


def decode_table(data: bytes, pos: int, end: int, depth: int = 0) -> tuple[dict[str, Any], int]:
    """Decode the length-prefixed field table at `pos`: (dict, offset past it)."""
    if depth > MAX_DEPTH:
        raise FrameDecodeError("field table nested too deeply")
    if pos + 4 > end:
        raise FrameDecodeError("field table length truncated")
    stop = pos + 4 + int(_U32.unpack_from(data, pos)[0])
    if stop > end:
        raise FrameDecodeError("field table length exceeds available data")
    pos += 4
    out: dict[str, Any] = {}
    while pos < stop:
        klen = data[pos]
        kend = pos + 1 + klen
        if kend > stop:
            raise FrameDecodeError("field table key length exceeds data")
        try:
            key = data[pos + 1 : kend].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FrameDecodeError("field table key is not UTF-8") from exc
        out[key], pos = decode_value(data, kend, stop, depth)
    return out, stop


def decode_array(data: bytes, pos: int, end: int, depth: int = 0) -> tuple[list[Any], int]:
    """Decode the length-prefixed field array at `pos`: (list, offset past it)."""
    if depth > MAX_DEPTH:
        raise FrameDecodeError("field array nested too deeply")
    if pos + 4 > end:
        raise FrameDecodeError("field array length truncated")
    stop = pos + 4 + int(_U32.unpack_from(data, pos)[0])
    if stop > end:
        raise FrameDecodeError("field array length exceeds available data")
    pos += 4
    out: list[Any] = []
    while pos < stop:
        value, pos = decode_value(data, pos, stop, depth)
        out.append(value)
    return out, stop
