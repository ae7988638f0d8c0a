"""Codec tests: the fast path must produce/consume exactly pamqp's bytes, and
properties must survive publish -> deliver byte for byte."""

from __future__ import annotations

import datetime
import decimal
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pbody
from pamqp import commands as C
from pamqp import decode as pamqp_decode
from pamqp import frame as pframe
from pamqp import header as pheader

from broker.amqp import (
    FrameDecodeError,
    PropertiesCache,
    decode_content_header,
    decode_method,
    decode_properties,
    decode_publish,
    encode_ack,
    encode_deliver,
    encode_get_ok,
    encode_method,
    encode_nack,
    encode_properties,
    encode_return,
    get_header_raw,
    long_long_value,
    set_header_raw,
    validate_properties,
)
from broker.amqp.codec import decode_ack
from broker.amqp.tables import table_entries

shortstr = st.text(max_size=60).filter(lambda s: len(s.encode()) <= 255)
exchange_name = st.from_regex(r"[a-zA-Z0-9_.:-]{0,40}", fullmatch=True)
u64 = st.integers(0, 2**63 - 1)  # pamqp encodes longlong as signed


def payload_of(frame_bytes: bytes) -> bytes:
    size = struct.unpack_from(">I", frame_bytes, 3)[0]
    assert frame_bytes[7 + size] == 0xCE
    return frame_bytes[7 : 7 + size]


def pamqp_content(channel: int, props: bytes, body: bytes, frame_max: int) -> bytes:
    hdr = pheader.ContentHeader(0, len(body), decode_properties(props))
    out = [pframe.marshal(hdr, channel)]
    step = frame_max - 8
    for i in range(0, len(body), step):
        out.append(pframe.marshal(pbody.ContentBody(body[i : i + step]), channel))
    return b"".join(out)


@given(exchange_name, shortstr, st.booleans(), st.booleans())
def test_publish_decode_matches_pamqp(exchange: str, routing_key: str, mandatory: bool, immediate: bool) -> None:
    m = C.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory, immediate=immediate)
    payload = payload_of(pframe.marshal(m, 1))
    assert decode_publish(payload) == (exchange, routing_key, mandatory, immediate)
    # and byte-by-byte truncation is always detected
    for cut in range(len(payload)):
        with pytest.raises(FrameDecodeError):
            decode_publish(payload[:cut])
    with pytest.raises(FrameDecodeError):
        decode_publish(payload + b"\x00")


@given(shortstr, u64, st.booleans(), exchange_name, shortstr, st.binary(max_size=9000), st.sampled_from([4096, 5000, 131072]))
def test_deliver_encode_matches_pamqp(
    tag: str, dtag: int, redelivered: bool, exchange: str, rk: str, body: bytes, frame_max: int
) -> None:
    props = C.Basic.Properties(content_type="text/plain", headers={"a": 1}, delivery_mode=2).marshal()
    ours = encode_deliver(3, tag, dtag, redelivered, exchange, rk, props, body, frame_max)
    theirs = pframe.marshal(
        C.Basic.Deliver(consumer_tag=tag, delivery_tag=dtag, redelivered=redelivered, exchange=exchange, routing_key=rk), 3
    ) + pamqp_content(3, props, body, frame_max)
    assert ours == theirs


@given(u64, st.booleans(), exchange_name, shortstr, st.integers(0, 2**32 - 1), st.binary(max_size=300))
def test_get_ok_encode_matches_pamqp(dtag: int, red: bool, exchange: str, rk: str, count: int, body: bytes) -> None:
    props = b"\x00\x00"
    ours = encode_get_ok(2, dtag, red, exchange, rk, count, props, body, 4096)
    theirs = pframe.marshal(
        C.Basic.GetOk(delivery_tag=dtag, redelivered=red, exchange=exchange, routing_key=rk, message_count=count), 2
    ) + pamqp_content(2, props, body, 4096)
    assert ours == theirs


@given(st.integers(0, 65535), shortstr, exchange_name, shortstr, st.binary(max_size=300))
def test_return_encode_matches_pamqp(code: int, text: str, exchange: str, rk: str, body: bytes) -> None:
    props = C.Basic.Properties(message_id="m1").marshal()
    ours = encode_return(7, code, text, exchange, rk, props, body, 4096)
    theirs = pframe.marshal(
        C.Basic.Return(reply_code=code, reply_text=text, exchange=exchange, routing_key=rk), 7
    ) + pamqp_content(7, props, body, 4096)
    assert ours == theirs


@given(st.integers(1, 65535), u64, st.booleans(), st.booleans())
def test_ack_nack_encode_and_decode_match_pamqp(ch: int, dtag: int, multiple: bool, requeue: bool) -> None:
    assert encode_ack(ch, dtag, multiple) == pframe.marshal(C.Basic.Ack(delivery_tag=dtag, multiple=multiple), ch)
    nack = pframe.marshal(C.Basic.Nack(delivery_tag=dtag, multiple=multiple, requeue=requeue), ch)
    assert encode_nack(ch, dtag, multiple, requeue) == nack
    assert decode_ack(payload_of(nack)) == (dtag, int(multiple) | (2 if requeue else 0))
    rej = pframe.marshal(C.Basic.Reject(delivery_tag=dtag, requeue=requeue), ch)
    assert decode_ack(payload_of(rej)) == (dtag, int(requeue))


def test_content_header_decode_keeps_raw_properties() -> None:
    props = C.Basic.Properties(
        content_type="application/json",
        headers={"x": [1, "two", {"three": 3}]},
        priority=5,
        timestamp=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        app_id="app",
    )
    frame = pframe.marshal(pheader.ContentHeader(0, 1234, props), 1)
    class_id, weight, size, raw = decode_content_header(payload_of(frame))
    assert (class_id, weight, size) == (60, 0, 1234)
    assert raw == props.marshal()
    validate_properties(raw)
    assert decode_properties(raw) == props
    assert encode_properties(decode_properties(raw)) == raw


# Every method the broker receives or sends through the generic path, with
# non-default arguments so each field is exercised.
GENERIC_METHODS = [
    C.Connection.Start(server_properties={"product": "x", "capabilities": {"a": True}}, mechanisms="PLAIN", locales="en_US"),
    C.Connection.StartOk(client_properties={"p": "q"}, mechanism="PLAIN", response="\x00u\x00p", locale="en_US"),
    C.Connection.Tune(channel_max=2047, frame_max=131072, heartbeat=60),
    C.Connection.TuneOk(channel_max=10, frame_max=4096, heartbeat=5),
    C.Connection.Open(virtual_host="/vh"),
    C.Connection.OpenOk(),
    C.Connection.Close(reply_code=320, reply_text="CONNECTION_FORCED - x", class_id=10, method_id=40),
    C.Connection.CloseOk(),
    C.Connection.Blocked(reason="low on memory"),
    C.Connection.Unblocked(),
    C.Channel.Open(),
    C.Channel.OpenOk(),
    C.Channel.Flow(active=True),
    C.Channel.FlowOk(active=True),
    C.Channel.Close(reply_code=404, reply_text="NOT_FOUND - q", class_id=50, method_id=10),
    C.Channel.CloseOk(),
    C.Exchange.Declare(exchange="ex", exchange_type="topic", durable=True, auto_delete=True, arguments={"alternate-exchange": "ae"}),
    C.Exchange.DeclareOk(),
    C.Exchange.Delete(exchange="ex", if_unused=True),
    C.Exchange.DeleteOk(),
    C.Exchange.Bind(destination="d", source="s", routing_key="k", arguments={"x": 1}),
    C.Exchange.BindOk(),
    C.Exchange.Unbind(destination="d", source="s", routing_key="k"),
    C.Exchange.UnbindOk(),
    C.Queue.Declare(queue="q", durable=True, exclusive=False, arguments={"x-queue-type": "quorum", "x-delivery-limit": 5}),
    C.Queue.DeclareOk(queue="q", message_count=3, consumer_count=1),
    C.Queue.Bind(queue="q", exchange="ex", routing_key="a.b", arguments={}),
    C.Queue.BindOk(),
    C.Queue.Unbind(queue="q", exchange="ex", routing_key="a.b"),
    C.Queue.UnbindOk(),
    C.Queue.Purge(queue="q"),
    C.Queue.PurgeOk(message_count=7),
    C.Queue.Delete(queue="q", if_unused=True, if_empty=True),
    C.Queue.DeleteOk(message_count=2),
    C.Basic.Qos(prefetch_size=0, prefetch_count=10, global_=True),
    C.Basic.QosOk(),
    C.Basic.Consume(queue="q", consumer_tag="ctag", no_ack=True, exclusive=True, arguments={"x-priority": 3}),
    C.Basic.ConsumeOk(consumer_tag="ctag"),
    C.Basic.Cancel(consumer_tag="ctag", nowait=True),
    C.Basic.CancelOk(consumer_tag="ctag"),
    C.Basic.Get(queue="q", no_ack=True),
    C.Basic.GetEmpty(),
    C.Basic.Recover(requeue=True),
    C.Basic.RecoverOk(),
    C.Basic.Reject(delivery_tag=5, requeue=False),
    C.Basic.Nack(delivery_tag=9, multiple=True, requeue=True),
    C.Basic.Ack(delivery_tag=9, multiple=True),
    C.Tx.Select(),
    C.Tx.SelectOk(),
    C.Tx.Commit(),
    C.Tx.CommitOk(),
    C.Tx.Rollback(),
    C.Tx.RollbackOk(),
    C.Confirm.Select(nowait=False),
    C.Confirm.SelectOk(),
]


@pytest.mark.parametrize("m", GENERIC_METHODS, ids=lambda m: m.name)
def test_generic_method_round_trip(m: object) -> None:
    ours = encode_method(5, m)  # type: ignore[arg-type]
    assert ours == pframe.marshal(m, 5)  # type: ignore[arg-type]
    payload = payload_of(ours)
    decoded = decode_method(payload)
    assert type(decoded) is type(m)
    assert dict(decoded) == dict(m)  # type: ignore[call-overload]
    assert encode_method(5, decoded) == ours
    # every strict prefix of the arguments is truncated; an extra byte is trailing
    for cut in range(4, len(payload)):
        with pytest.raises(FrameDecodeError):
            decode_method(payload[:cut])
    with pytest.raises(FrameDecodeError):
        decode_method(payload + b"\x01")


@pytest.mark.parametrize("bits", range(32))
def test_packed_bits_decode(bits: int) -> None:
    flags = [bool(bits >> i & 1) for i in range(5)]
    m = C.Queue.Declare(queue="q", passive=flags[0], durable=flags[1], exclusive=flags[2],
                        auto_delete=flags[3], nowait=flags[4], arguments={"k": 1})
    d = decode_method(payload_of(pframe.marshal(m, 1)))
    assert [d.passive, d.durable, d.exclusive, d.auto_delete, d.nowait] == flags
    assert d.arguments == {"k": 1}


def test_table_decoding_is_linear_in_entries() -> None:
    """A 128 KiB table of 43k tiny entries (duplicate keys, last one wins as in
    pamqp) decodes to the right value. pamqp's decoder re-slices the rest of
    the table per entry (~0.25 s for this frame); the speed is measured in
    docs/amqp.md, not asserted here."""
    n = 43000
    entries = b"".join(b"\x01" + bytes([97 + i % 26]) + b"V" for i in range(n))
    table = struct.pack(">I", len(entries)) + entries
    payload = b"\x00\x32\x00\x0a" + b"\x00\x00" + b"\x01q" + b"\x00" + table
    d = decode_method(payload)
    assert d.arguments == {chr(97 + i): None for i in range(26)}


@settings(max_examples=60)
@given(st.dictionaries(
    st.text(min_size=1, max_size=8),
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20)
        | st.binary(max_size=10).map(bytearray)
        | st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=-1000, max_value=1000),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(min_size=1, max_size=5), inner, max_size=4),
        max_leaves=12,
    ),
    max_size=6,
))
def test_table_decoder_agrees_with_pamqp(table: dict[str, object]) -> None:
    props = C.Basic.Properties(headers=table)
    raw = props.marshal()
    _n, theirs = pamqp_decode.field_table(raw[2:])
    assert decode_properties(raw).headers == theirs
    validate_properties(raw)


def test_decode_method_rejects_unknown_and_bad_utf8() -> None:
    with pytest.raises(FrameDecodeError, match="unknown method"):
        decode_method(b"\x00\x3c\x00\x99")
    with pytest.raises(FrameDecodeError):
        decode_method(b"\x00\x3c")
    bad = b"\x00\x32\x00\x0a" + b"\x00\x00" + b"\x02\xff\xfe" + b"\x00" + b"\x00\x00\x00\x00"
    with pytest.raises(FrameDecodeError):
        decode_method(bad)


# A headers table exercising every field type, hand-encoded so that types
# pamqp would normalise ('l' vs 'L', 'i' vs 'I', 'B' vs 'b', 'u', 'f', 'x')
# are present: decoding + re-encoding would change these bytes.
def _entry(key: str, typed: bytes) -> bytes:
    k = key.encode()
    return bytes([len(k)]) + k + typed


def _table(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


def _array(*values: bytes) -> bytes:
    body = b"".join(values)
    return struct.pack(">I", len(body)) + body


ALL_TYPES_TABLE = _table(
    _entry("zbool", b"t\x01"),
    _entry("i8", b"b\xfe"),
    _entry("u8", b"B\xfe"),
    _entry("i16", b"s\xff\x00"),
    _entry("u16", b"u\xff\x00"),
    _entry("i32", b"I" + struct.pack(">i", -5)),
    _entry("u32", b"i" + struct.pack(">I", 5)),
    _entry("i64", b"l" + struct.pack(">q", -7)),
    _entry("u64", b"L" + struct.pack(">q", 7)),
    _entry("float", b"f" + struct.pack(">f", 1.5)),
    _entry("double", b"d" + struct.pack(">d", 2.25)),
    _entry("decimal", b"D\x02" + struct.pack(">i", 12345)),
    _entry("str", b"S" + struct.pack(">I", 5) + "héll".encode()),
    _entry("bytes", b"x" + struct.pack(">I", 3) + b"\x00\xff\x01"),
    _entry("ts", b"T" + struct.pack(">Q", 1700000000)),
    _entry("void", b"V"),
    _entry("nested", b"F" + _table(_entry("deep", b"F" + _table(_entry("n", b"b\x01"))), _entry("s", b"S\x00\x00\x00\x00"))),
    _entry("array", b"A" + _array(b"b\x01", b"S\x00\x00\x00\x01a", b"F" + _table(), b"A" + _array(b"t\x00"), b"D\x01\x00\x00\x00\x0f")),
)


def raw_props_with_headers(table: bytes) -> bytes:
    # content_type, headers, delivery_mode, correlation_id, timestamp, app_id
    flags = 0x8000 | 0x2000 | 0x1000 | 0x0400 | 0x0040 | 0x0008
    return (
        struct.pack(">H", flags)
        + b"\x0atext/plain"
        + table
        + b"\x02"
        + b"\x03cid"
        + struct.pack(">Q", 1_700_000_000)
        + b"\x03app"
    )


def test_all_field_types_validate_and_decode() -> None:
    raw = raw_props_with_headers(ALL_TYPES_TABLE)
    validate_properties(raw)
    props = decode_properties(raw)
    h = props.headers
    assert h is not None
    assert h["i64"] == -7 and h["u64"] == 7 and h["u8"] == 254 and h["i8"] == -2
    assert h["decimal"] == decimal.Decimal("123.45")
    assert h["bytes"] == bytearray(b"\x00\xff\x01")
    assert h["nested"] == {"deep": {"n": 1}, "s": ""}
    assert h["array"][3] == [False]
    assert props.delivery_mode == 2 and props.app_id == "app" and props.correlation_id == "cid"
    # pamqp's re-encoding is NOT byte-exact for this table: that is why we keep raw bytes
    assert encode_properties(props) != raw


@pytest.mark.parametrize("cut", [1, 5, 17, 60, 200])
def test_truncated_properties_are_rejected(cut: int) -> None:
    raw = raw_props_with_headers(ALL_TYPES_TABLE)
    with pytest.raises(FrameDecodeError):
        validate_properties(raw[: len(raw) - cut])


def test_bad_properties_are_rejected() -> None:
    with pytest.raises(FrameDecodeError):
        validate_properties(b"\x00\x00\x01")  # trailing byte
    with pytest.raises(FrameDecodeError):
        validate_properties(b"\x20\x00" + _table(_entry("k", b"Z\x00")))  # unknown tag
    with pytest.raises(FrameDecodeError):
        validate_properties(b"\x20\x00" + b"\x00\x00\x00\x09" + b"\x01k")  # length overruns
    deep = b"t\x01"
    for _ in range(100):
        deep = b"A" + _array(deep)
    with pytest.raises(FrameDecodeError, match="nested"):
        validate_properties(b"\x20\x00" + _table(_entry("d", deep)))


def test_set_header_keeps_every_other_byte() -> None:
    raw = raw_props_with_headers(ALL_TYPES_TABLE)
    out = set_header_raw(raw, "x-delivery-count", long_long_value(3))
    validate_properties(out)
    before = table_entries(ALL_TYPES_TABLE)
    start = 2 + 11
    table_len = struct.unpack_from(">I", out, start)[0]
    after = table_entries(out[start : start + 4 + table_len])
    assert after[:-1] == before
    assert after[-1] == (b"x-delivery-count", b"l" + struct.pack(">q", 3))
    assert out[: start] == raw[: start]
    assert out[start + 4 + table_len :] == raw[2 + 11 + len(ALL_TYPES_TABLE) :]
    # overriding replaces in place, keeping position
    again = set_header_raw(out, "x-delivery-count", long_long_value(4))
    assert get_header_raw(again, "x-delivery-count") == b"l" + struct.pack(">q", 4)
    assert len(again) == len(out)
    assert decode_properties(again).headers["x-delivery-count"] == 4  # type: ignore[index]


@pytest.mark.parametrize(
    "props",
    [
        C.Basic.Properties(),
        C.Basic.Properties(content_type="a", content_encoding="gzip", priority=3),
        C.Basic.Properties(delivery_mode=2, message_id="m"),
        C.Basic.Properties(headers={"keep": "me"}, reply_to="r"),
    ],
)
def test_set_header_creates_headers_when_missing(props: C.Basic.Properties) -> None:
    raw = props.marshal()
    out = set_header_raw(raw, "x-delivery-count", long_long_value(1))
    decoded = decode_properties(out)
    assert decoded.headers is not None and decoded.headers["x-delivery-count"] == 1
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "message_id", "reply_to"):
        assert getattr(decoded, name) == getattr(props, name)
    if props.headers:
        assert decoded.headers["keep"] == "me"


def test_properties_cache_reuses_and_evicts() -> None:
    cache = PropertiesCache(capacity=2)
    raw = C.Basic.Properties(content_type="t").marshal()
    a = cache.with_delivery_count(raw, 1)
    assert cache.with_delivery_count(raw, 1) is a
    cache.with_delivery_count(raw, 2)
    cache.with_delivery_count(raw, 3)
    assert len(cache) == 2
    assert cache.with_delivery_count(raw, 1) == a  # recomputed, same bytes
    assert decode_properties(a).headers == {"x-delivery-count": 1}
