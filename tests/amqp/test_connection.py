"""ServerConnection: handshake, negotiation, channels, content assembly, output
helpers and heartbeats. Input is fed one byte at a time unless a test says otherwise."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands as C
from pamqp import frame as pframe

from broker.amqp import (
    CLOSED,
    HEARTBEAT_FRAME,
    NEED_DATA,
    PAUSED,
    RABBITMQ_CAPABILITIES,
    Ack,
    ChannelClose,
    ChannelFlow,
    ChannelOpen,
    ChannelState,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionLost,
    ConnectionOpen,
    ConnectionStartOk,
    ConnectionState,
    ConnectionTerminated,
    ConnectionTuneOk,
    Heartbeat,
    MethodReceived,
    Nack,
    ProtocolHeaderReceived,
    ProtocolStateError,
    Publish,
    Reject,
    ServerConfig,
    ServerConnection,
    decode_properties,
    long_long_value,
    set_header_raw,
)

from .helpers import (
    HEADER,
    Client,
    body_frame,
    content_header,
    feed,
    method,
    one,
    parse_frames,
    publish,
    raw_frame,
)
from .test_codec import ALL_TYPES_TABLE, raw_props_with_headers


def test_handshake_plain_byte_by_byte() -> None:
    c = Client()
    events = c.send(HEADER)
    assert events == [ProtocolHeaderReceived((0, 9, 1))]
    [(ch, start)] = c.take()
    assert ch == 0 and isinstance(start, C.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == "AMQPLAIN PLAIN" and start.locales == "en_US"
    props = start.server_properties
    assert props["capabilities"] == dict(RABBITMQ_CAPABILITIES)
    for key in ("product", "version", "platform", "cluster_name", "copyright", "information"):
        assert isinstance(props[key], str) and props[key]

    caps = {"authentication_failure_close": True}
    [ev] = c.send(method(C.Connection.StartOk(client_properties={"capabilities": caps, "product": "t"},
                                              mechanism="PLAIN", response="\x00alice\x00s3cr\u00e9t")))
    assert isinstance(ev, ConnectionStartOk)
    assert (ev.mechanism, ev.username, ev.password) == ("PLAIN", "alice", "s3cr\u00e9t")
    assert ev.client_properties["product"] == "t"
    assert c.conn.state is ConnectionState.AUTHENTICATING
    [(_, tune)] = parse_frames(c.conn.accept_login())
    assert isinstance(tune, C.Connection.Tune)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)

    [ev] = c.send(method(C.Connection.TuneOk(channel_max=100, frame_max=8192, heartbeat=10)))
    assert ev == ConnectionTuneOk(100, 8192, 10)
    assert (c.conn.channel_max, c.conn.frame_max, c.conn.heartbeat) == (100, 8192, 10)
    [ev] = c.send(method(C.Connection.Open(virtual_host="/prod")))
    assert ev == ConnectionOpen("/prod")
    assert c.conn.state is ConnectionState.OPENING
    [(_, ok)] = parse_frames(c.conn.accept_open())
    assert isinstance(ok, C.Connection.OpenOk)
    assert c.conn.state is ConnectionState.OPEN
    [ev] = c.send(method(C.Channel.Open(), 1))
    assert ev == ChannelOpen(1)
    ok = one(c.take(), 1)
    assert isinstance(ok, C.Channel.OpenOk)
    assert c.conn.open_channels == frozenset({1})


def test_amqplain_credentials_are_parsed() -> None:
    c = Client()
    c.send(HEADER)
    table = b"\x05LOGINS\x00\x00\x00\x03bob\x08PASSWORDS\x00\x00\x00\x02pw"
    [ev] = c.send(method(C.Connection.StartOk(client_properties={}, mechanism="AMQPLAIN", response=table.decode())))
    assert (ev.username, ev.password) == ("bob", "pw")


def test_amqplain_response_that_is_not_utf8_is_parsed() -> None:
    """A password of 200 bytes: the table's length prefix 00 00 00 c8 is not
    UTF-8, so the response arrives as bytes, not str (the compiled build
    once refused it with a TypeError that dropped the connection)."""
    c = Client()
    c.send(HEADER)
    password = "p" * 200
    table = (b"\x05LOGINS\x00\x00\x00\x03bob\x08PASSWORDS" + len(password).to_bytes(4, "big")
             + password.encode())
    # connection.start-ok (10, 11): no client properties, mechanism, response, locale
    # (by hand: pamqp only marshals a str response)
    payload = (struct.pack(">HHI", 10, 11, 0) + b"\x08AMQPLAIN" + struct.pack(">I", len(table)) + table
               + b"\x05en_US")
    [ev] = c.send(raw_frame(1, 0, payload))
    assert isinstance(ev.response, bytes)
    assert (ev.username, ev.password) == ("bob", password)


@pytest.mark.parametrize("response", ["nonul", "\x00only-user", "a\x00b\x00c\x00d"])
def test_malformed_plain_response_gives_no_credentials(response: str) -> None:
    c = Client()
    c.send(HEADER)
    [ev] = c.send(method(C.Connection.StartOk(client_properties={}, mechanism="PLAIN", response=response)))
    assert (ev.username, ev.password) == (None, None)


def test_reject_login_sends_403_when_client_supports_it() -> None:
    c = Client()
    c.send(HEADER)
    c.take()
    c.send(method(C.Connection.StartOk(client_properties={"capabilities": {"authentication_failure_close": True}},
                                       mechanism="PLAIN", response="\x00u\x00bad")))
    close = one(parse_frames(c.conn.reject_login()), 0)
    assert close.reply_code == 403
    assert close.reply_text == (
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
        "For details see the broker logfile."
    )
    assert c.conn.state is ConnectionState.CLOSING
    term = c.conn.next_event()
    assert isinstance(term, ConnectionTerminated) and term.close_sent
    assert c.send(method(C.Connection.CloseOk())) == [ConnectionCloseOk()]
    assert c.conn.state is ConnectionState.CLOSED


def test_reject_login_is_silent_for_old_clients() -> None:
    c = Client()
    c.send(HEADER)
    c.take()
    c.send(method(C.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\x00u\x00bad")))
    assert c.conn.reject_login() == b""
    assert c.conn.state is ConnectionState.CLOSED
    assert isinstance(c.conn.next_event(), ConnectionTerminated)
    assert c.conn.next_event() is CLOSED


def test_decisions_in_wrong_state_are_our_bug() -> None:
    conn = ServerConnection()
    for call in (conn.accept_login, conn.reject_login, conn.accept_open):
        with pytest.raises(ProtocolStateError):
            call()


@pytest.mark.parametrize(
    ("tune", "text"),
    [
        ((0, 200000, 0), "negotiated frame_max = 200000 is higher than the maximum allowed value (131072)"),
        ((0, 0, 0), "negotiated frame_max = 0 is higher than the maximum allowed value (131072)"),
        ((10, 1000, 0), "negotiated frame_max = 1000 is lower than the minimum allowed value (4096)"),
        ((5000, 4096, 0), "negotiated channel_max = 5000 is higher than the maximum allowed value (2047)"),
        ((0, 4096, 0), "negotiated channel_max = 0 (no limit) is higher than the maximum allowed value (2047)"),
    ],
)
def test_tune_ok_violations_close_silently(tune: tuple[int, int, int], text: str) -> None:
    c = Client()
    c.send(HEADER)
    c.send(method(C.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\x00u\x00p")))
    c.conn.accept_login()
    c.take()
    cm, fm, hb = tune
    [ev] = c.send(method(C.Connection.TuneOk(channel_max=cm, frame_max=fm, heartbeat=hb)))
    assert isinstance(ev, ConnectionTerminated) and not ev.close_sent
    assert ev.reply_code == 530 and ev.reply_text == "NOT_ALLOWED - " + text
    assert c.conn.state is ConnectionState.CLOSED and c.out == b""


def test_unlimited_server_channel_max_accepts_zero() -> None:
    c = Client(ServerConfig(channel_max=0))
    c.open(channel_max=0)
    assert c.conn.channel_max == 0
    for ch in range(2, 40):
        c.send(method(C.Channel.Open(), ch))
    assert len(c.conn.open_channels) == 39


def test_channel_max_counts_open_channels() -> None:
    c = Client()
    c.open(channel_max=2, channels=(7, 9))
    [ev] = c.send(method(C.Channel.Open(), 3))
    assert isinstance(ev, ConnectionTerminated) and ev.reply_code == 530
    assert ev.reply_text == "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)"


def test_channel_close_flow_and_reopen() -> None:
    c = Client()
    c.open()
    [ev] = c.send(method(C.Channel.Flow(active=True), 1))
    assert ev == ChannelFlow(1, True)
    flow_ok = one(c.take(), 1)
    assert isinstance(flow_ok, C.Channel.FlowOk) and flow_ok.active
    [ev] = c.send(method(C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 1))
    assert ev == ChannelClose(1, 200, "bye", 0, 0)
    close_ok = one(c.take(), 1)
    assert isinstance(close_ok, C.Channel.CloseOk)
    assert c.conn.channel_state(1) is None
    assert c.send(method(C.Channel.Open(), 1)) == [ChannelOpen(1)]


def test_generic_and_fast_methods_become_events() -> None:
    c = Client()
    c.open()
    decl = C.Queue.Declare(queue="q", durable=True, arguments={"x-queue-type": "quorum"})
    [ev] = c.send(method(decl, 1))
    assert isinstance(ev, MethodReceived) and ev.channel == 1
    assert isinstance(ev.method, C.Queue.Declare) and ev.method.arguments == {"x-queue-type": "quorum"}
    assert c.send(method(C.Basic.Ack(delivery_tag=7, multiple=True), 1)) == [Ack(1, 7, True)]
    assert c.send(method(C.Basic.Nack(delivery_tag=8, multiple=False, requeue=True), 1)) == [Nack(1, 8, False, True)]
    assert c.send(method(C.Basic.Reject(delivery_tag=9, requeue=False), 1)) == [Reject(1, 9, False)]
    assert c.send(pframe.marshal(C.Basic.Qos(prefetch_count=5), 1))[0].method.prefetch_count == 5


def test_publish_is_reassembled_byte_by_byte() -> None:
    c = Client()
    c.open()
    raw = raw_props_with_headers(ALL_TYPES_TABLE)
    payload = bytes(range(256)) * 3
    frames = (
        method(C.Basic.Publish(exchange="ex", routing_key="rk", mandatory=True), 1)
        + pframe_header(1, len(payload), raw)
        + body_frame(payload[:100])
        + body_frame(payload[100:101])
        + body_frame(payload[101:])
    )
    [ev] = c.send(frames)
    assert isinstance(ev, Publish)
    assert (ev.channel, ev.exchange, ev.routing_key, ev.mandatory, ev.immediate) == (1, "ex", "rk", True, False)
    assert ev.properties_raw == raw
    assert ev.body == payload
    assert ev.properties.headers["i64"] == -7  # type: ignore[index]


def pframe_header(channel: int, size: int, raw_props: bytes) -> bytes:
    payload = struct.pack(">HHQ", 60, 0, size) + raw_props
    return struct.pack(">BHI", 2, channel, len(payload)) + payload + b"\xce"


def test_empty_body_publish_needs_no_body_frame() -> None:
    c = Client()
    c.open()
    [ev] = c.send(method(C.Basic.Publish(routing_key="q"), 1) + content_header(0))
    assert isinstance(ev, Publish) and ev.body == b"" and ev.properties_raw == b"\x00\x00"
    # the channel is ready for the next method straight away
    assert c.send(method(C.Basic.Ack(delivery_tag=1), 1)) == [Ack(1, 1, False)]


def test_interleaved_publishes_on_two_channels() -> None:
    c = Client()
    c.open(channels=(1, 2))
    a = publish(b"a" * 10, channel=1, routing_key="a")
    b = publish(b"b" * 10, channel=2, routing_key="b")
    # split each publish into its frames and interleave them
    fa, fb = split_frames(a), split_frames(b)
    mixed = b"".join(x + y for x, y in zip(fa, fb, strict=True))
    events = c.send(mixed)
    assert [(e.channel, e.routing_key, e.body) for e in events] == [(1, "a", b"a" * 10), (2, "b", b"b" * 10)]


def split_frames(data: bytes) -> list[bytes]:
    out = []
    while data:
        size = struct.unpack_from(">I", data, 3)[0]
        out.append(data[: 8 + size])
        data = data[8 + size :]
    return out


def test_large_body_round_trip_20_mib() -> None:
    c = Client(chunk=65536)
    c.open()
    body = bytes(range(251)) * (20 * 1024 * 1024 // 251)
    [ev] = c.send(publish(body))
    assert ev.body == body
    out = c.conn.send_deliver(1, "ctag", 1, False, "", "q", ev.properties_raw, body)
    frames = parse_frames(out)
    assert isinstance(frames[0][1], C.Basic.Deliver)
    assert frames[1][1].body_size == len(body)
    assert b"".join(f.value for _, f in frames[2:]) == body
    assert all(len(f.value) <= 131072 - 8 for _, f in frames[2:])


@pytest.mark.parametrize("frame_max", [4096, 4097, 10000])
def test_deliver_splits_by_negotiated_frame_max(frame_max: int) -> None:
    c = Client()
    c.open(frame_max=frame_max)
    body = bytes(i % 256 for i in range(3 * frame_max + 5))
    props = C.Basic.Properties(message_id="x").marshal()
    frames = parse_frames(c.conn.send_deliver(1, "t", 42, True, "ex", "rk", props, body))
    deliver = frames[0][1]
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered) == ("t", 42, True)
    sizes = [len(f.value) for _, f in frames[2:]]
    assert sizes == [frame_max - 8] * 3 + [len(body) - 3 * (frame_max - 8)]
    # and the client side of our own parser reassembles what we produce
    d = Client()
    d.open(frame_max=frame_max)
    raw_publish = method(C.Basic.Publish(routing_key="rk"), 1) + b"".join(split_frames(
        c.conn.send_deliver(1, "t", 43, False, "ex", "rk", props, body))[1:])
    [ev] = d.send(raw_publish)
    assert ev.body == body and ev.properties_raw == props


def test_properties_survive_publish_to_deliver_byte_exact() -> None:
    c = Client(chunk=7)
    c.open()
    raw = raw_props_with_headers(ALL_TYPES_TABLE)
    [ev] = c.send(method(C.Basic.Publish(routing_key="q"), 1) + pframe_header(1, 3, raw) + body_frame(b"abc"))
    out = c.conn.send_deliver(1, "c", 1, False, "", "q", ev.properties_raw, ev.body)
    header_frame = split_frames(out)[1]
    assert header_frame[7 + 12 : -1] == raw
    # with a delivery count added, everything else is still the publisher's bytes
    counted = set_header_raw(ev.properties_raw, "x-delivery-count", long_long_value(2))
    out2 = c.conn.send_get_ok(1, 5, True, "", "q", 0, counted, ev.body)
    frames = parse_frames(out2)
    assert frames[1][1].properties.headers["x-delivery-count"] == 2
    assert decode_properties(counted).headers["str"] == "héll"  # type: ignore[index]


def test_send_helpers_match_pamqp_and_drop_on_closed_channels() -> None:
    c = Client()
    c.open()
    assert parse_frames(c.conn.send_ack(1, 5, True))[0][1].delivery_tag == 5
    nack = parse_frames(c.conn.send_nack(1, 6))[0][1]
    assert isinstance(nack, C.Basic.Nack) and not nack.requeue
    ret = parse_frames(c.conn.send_return(1, 312, "NO_ROUTE", "ex", "rk", b"\x00\x00", b"body"))
    assert isinstance(ret[0][1], C.Basic.Return) and ret[0][1].reply_text == "NO_ROUTE"
    assert ret[2][1].value == b"body"
    ok = parse_frames(c.conn.send_method(1, C.Basic.ConsumeOk(consumer_tag="x")))
    assert isinstance(ok[0][1], C.Basic.ConsumeOk)
    # channel 2 was never opened: sends are dropped and counted
    assert c.conn.send_deliver(2, "c", 1, False, "", "q", b"\x00\x00", b"x") == b""
    assert c.conn.send_ack(2, 1) == b""
    assert c.conn.dropped_sends == 2
    with pytest.raises(ProtocolStateError):
        c.conn.send_method(0, C.Connection.CloseOk())
    with pytest.raises(ProtocolStateError):
        c.conn.send_method(1, C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))


def test_queued_replies_are_prepended_to_helper_output() -> None:
    c = Client()
    c.open(channels=())
    feed(c.conn, method(C.Channel.Open(), 1))  # open-ok is queued, not yet drained
    out = c.conn.send_method(1, C.Basic.QosOk())
    kinds = [type(f) for _, f in parse_frames(out)]
    assert kinds == [C.Channel.OpenOk, C.Basic.QosOk]
    assert c.conn.data_to_send() == b""


def test_blocked_only_for_capable_clients_and_once() -> None:
    c = Client()
    c.open()
    blocked = one(parse_frames(c.conn.send_blocked("low on disk")), 0)
    assert isinstance(blocked, C.Connection.Blocked) and blocked.reason == "low on disk"
    assert c.conn.send_blocked() == b""
    unblocked = one(parse_frames(c.conn.send_unblocked()), 0)
    assert isinstance(unblocked, C.Connection.Unblocked)
    assert c.conn.send_unblocked() == b""
    assert c.conn.client_has("connection.blocked") and not c.conn.client_has("consumer_cancel_notify")
    old = Client()
    old.open(capabilities={})
    assert old.conn.send_blocked() == b""


def test_client_connection_close() -> None:
    c = Client()
    c.open()
    [ev] = c.send(method(C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)))
    assert ev == ConnectionClose(200, "bye", 0, 0)
    ok = one(c.take(), 0)
    assert isinstance(ok, C.Connection.CloseOk)
    assert c.conn.state is ConnectionState.CLOSED
    assert c.conn.next_event() is CLOSED
    c.conn.receive_data(b"more garbage")
    assert c.conn.next_event() is CLOSED


def test_server_close_waits_for_close_ok_discarding_other_frames() -> None:
    c = Client()
    c.open()
    close = one(parse_frames(c.conn.close()), 0)
    assert close.reply_code == 320
    assert close.reply_text == "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
    events = c.send(publish(b"ignored") + method(C.Basic.Qos(), 1))
    assert [type(e) for e in events] == [ConnectionTerminated]
    assert c.conn.state is ConnectionState.CLOSING
    assert c.send(method(C.Connection.CloseOk())) == [ConnectionCloseOk()]
    assert c.conn.state is ConnectionState.CLOSED


def test_peer_eof_is_reported() -> None:
    c = Client()
    c.open()
    c.conn.receive_data(b"")
    assert c.conn.next_event() == ConnectionLost()
    assert c.conn.next_event() is CLOSED


def test_heartbeats_both_ways() -> None:
    c = Client()
    c.open(heartbeat=10)
    conn = c.conn
    assert conn.tick(100.0).data == b""  # baseline
    r = conn.tick(104.9)
    assert r.data == b"" and not r.peer_dead
    r = conn.tick(105.0)  # nothing sent for heartbeat/2
    assert r.data == HEARTBEAT_FRAME and not r.peer_dead
    assert c.send(HEARTBEAT_FRAME) == [Heartbeat()]
    assert not conn.tick(106.0).peer_dead  # data arrived: receive clock reset to 106
    conn.send_ack(1, 1)  # outgoing data postpones our heartbeat
    assert conn.tick(110.5).data == b""
    assert conn.tick(115.5).data == HEARTBEAT_FRAME
    r = conn.tick(126.0)  # 20 s (two intervals) of silence from the client
    assert r.peer_dead
    term = conn.next_event()
    assert isinstance(term, ConnectionTerminated) and "missed heartbeats from client, timeout: 10s" in term.reply_text
    assert conn.state is ConnectionState.CLOSED


def test_heartbeat_zero_disables_liveness_checks() -> None:
    c = Client()
    c.open(heartbeat=0)
    c.conn.tick(0.0)
    r = c.conn.tick(10_000.0)
    assert r == type(r)(b"", False)


def test_handshake_timeout() -> None:
    conn = ServerConnection(ServerConfig(handshake_timeout=10))
    feed(conn, HEADER)
    conn.tick(0.0)
    assert not conn.tick(9.9).peer_dead
    assert conn.tick(10.0).peer_dead
    assert conn.state is ConnectionState.CLOSED


def test_close_timeout() -> None:
    c = Client(ServerConfig(close_timeout=3))
    c.open()
    c.conn.connection_error(541, "boom")
    c.conn.tick(50.0)
    assert not c.conn.tick(52.0).peer_dead
    assert c.conn.tick(53.0).peer_dead


def test_max_message_size_is_a_channel_error() -> None:
    c = Client(ServerConfig(max_message_size=1000))
    c.open()
    events = c.send(method(C.Basic.Publish(routing_key="q"), 1) + content_header(1001) + body_frame(b"x" * 1001))
    assert events == []
    close = one(c.take(), 1)
    assert close.reply_code == 406
    assert close.reply_text == "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000"
    assert (close.class_id, close.method_id) == (60, 40)
    assert c.conn.channel_state(1) is ChannelState.CLOSING


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="frame_max"):
        ServerConfig(frame_max=100)
    with pytest.raises(ValueError, match="mechanism"):
        ServerConfig(mechanisms=("EXTERNAL",))
    caps = ServerConfig(advertise_direct_reply_to=True).server_properties()["capabilities"]
    assert caps["direct_reply_to"] is True


def test_need_data_until_frame_complete() -> None:
    c = Client()
    c.open()
    frame = method(C.Basic.Qos(prefetch_count=1), 1)
    c.conn.receive_data(frame[:-1])
    assert c.conn.next_event() is NEED_DATA
    c.conn.receive_data(frame[-1:])
    assert isinstance(c.conn.next_event(), MethodReceived)


def test_reused_buffers_are_copied() -> None:
    c = Client()
    c.open()
    frame = bytearray(method(C.Basic.Qos(prefetch_count=3), 1))
    c.conn.receive_data(memoryview(frame)[:5])
    frame[:5] = b"\x00" * 5  # the caller reuses its buffer
    c.conn.receive_data(bytes(method(C.Basic.Qos(prefetch_count=3), 1))[5:])
    ev = c.conn.next_event()
    assert isinstance(ev, MethodReceived) and ev.method.prefetch_count == 3


def test_pipelined_frames_wait_for_the_servers_decisions() -> None:
    conn = ServerConnection()
    startok = method(C.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\x00u\x00p"))
    tuneok = method(C.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0))
    pipelined = method(C.Connection.Open(virtual_host="/")) + method(C.Channel.Open(), 1) + method(C.Basic.Qos(), 1)
    conn.receive_data(HEADER + startok)
    assert isinstance(conn.next_event(), ProtocolHeaderReceived)
    assert isinstance(conn.next_event(), ConnectionStartOk)
    assert conn.next_event() is PAUSED
    conn.receive_data(tuneok)  # arrives before our decision: stays buffered
    assert conn.next_event() is PAUSED
    conn.accept_login()
    assert isinstance(conn.next_event(), ConnectionTuneOk)
    conn.receive_data(pipelined)
    assert conn.next_event() == ConnectionOpen("/")
    assert conn.next_event() is PAUSED  # channel.open must not be parsed before open-ok
    conn.accept_open()
    assert conn.next_event() == ChannelOpen(1)
    assert isinstance(conn.next_event(), MethodReceived)
    assert conn.next_event() is NEED_DATA
