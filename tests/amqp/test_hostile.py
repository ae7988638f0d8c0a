"""Hostile input: random and mutated byte streams never crash the machine.
They end in a clean close (CLOSING/CLOSED with a well-formed connection.close
or a silent close) or in a wait for more data; output always parses."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands as C

from broker.amqp import (
    CLOSED,
    NEED_DATA,
    PAUSED,
    ConnectionState,
    ConnectionTerminated,
    ServerConfig,
    ServerConnection,
)

from .helpers import HEADER, Client, method, parse_frames, publish

VALID_SESSION = (
    method(C.Channel.Open(), 2)
    + method(C.Queue.Declare(queue="q", arguments={"x-queue-type": "quorum"}), 2)
    + publish(b"hello world" * 50, channel=2, props=C.Basic.Properties(headers={"a": [1, {"b": 2.5}]}), frame_max=4096)
    + method(C.Basic.Ack(delivery_tag=1), 2)
    + method(C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0), 2)
    + method(C.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
)


def drive(conn: ServerConnection, data: bytes, cuts: list[int]) -> tuple[list[object], bytes]:
    events: list[object] = []
    out = b""
    pos = 0
    for cut in [*sorted(cuts), len(data)]:
        piece = data[pos:cut]
        pos = max(pos, cut)
        if not piece:
            continue
        conn.receive_data(piece)
        while True:
            ev = conn.next_event()
            if ev is NEED_DATA or ev is CLOSED or ev is PAUSED:
                break
            events.append(ev)
        out += conn.data_to_send()
    return events, out


def check_outcome(conn: ServerConnection, events: list[object], out: bytes) -> None:
    parsed = parse_frames(out)  # everything we wrote is well-formed AMQP
    terminated = [e for e in events if isinstance(e, ConnectionTerminated)]
    if terminated:
        assert conn.state in (ConnectionState.CLOSING, ConnectionState.CLOSED)
        assert len(terminated) == 1
        if terminated[0].close_sent:
            closes = [f for _, f in parsed if isinstance(f, C.Connection.Close)]
            assert closes and closes[-1].reply_code == terminated[0].reply_code
    if conn.state is ConnectionState.CLOSING:
        assert isinstance(parsed[-1][1], C.Connection.Close)


@settings(max_examples=200)
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=6))
def test_random_bytes_from_scratch(data: bytes, cuts: list[int]) -> None:
    conn = ServerConnection()
    events, out = drive(conn, data, cuts)
    check_outcome(conn, events, out)


@settings(max_examples=200)
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=6))
def test_random_bytes_after_header(data: bytes, cuts: list[int]) -> None:
    conn = ServerConnection()
    _, out = drive(conn, HEADER, [])
    events, more = drive(conn, data, cuts)
    check_outcome(conn, events, out + more)


@settings(max_examples=200)
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=6))
def test_random_bytes_on_an_open_connection(data: bytes, cuts: list[int]) -> None:
    c = Client(ServerConfig(frame_max=4096))
    c.open(frame_max=4096)
    events, out = drive(c.conn, data, cuts)
    check_outcome(c.conn, events, out)


@settings(max_examples=250)
@given(
    st.lists(st.tuples(st.integers(0, len(VALID_SESSION) - 1), st.integers(0, 255)), min_size=1, max_size=4),
    st.lists(st.integers(0, len(VALID_SESSION)), max_size=8),
    st.integers(0, len(VALID_SESSION)),
)
def test_mutated_valid_session(flips: list[tuple[int, int]], cuts: list[int], truncate: int) -> None:
    data = bytearray(VALID_SESSION)
    for pos, value in flips:
        data[pos] = value
    c = Client(ServerConfig(frame_max=4096))
    c.open(frame_max=4096)
    events, out = drive(c.conn, bytes(data[:truncate] if truncate else data), cuts)
    check_outcome(c.conn, events, out)


def test_unmutated_session_is_clean() -> None:
    """The base of the mutation test must itself be valid (else mutations prove nothing)."""
    c = Client(ServerConfig(frame_max=4096))
    c.open(frame_max=4096)
    events, out = drive(c.conn, VALID_SESSION, list(range(0, len(VALID_SESSION), 3)))
    assert not any(isinstance(e, ConnectionTerminated) for e in events)
    assert c.conn.state is ConnectionState.CLOSED
    assert [type(f).__name__ for _, f in parse_frames(out)] == [
        "OpenOk", "CloseOk", "CloseOk"]
