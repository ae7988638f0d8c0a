"""Real AMQP clients (pika, aio-pika) against ServerConnection.

A tiny in-test broker (one thread, one socket per connection, in-memory
queues) drives the state machine exactly as the runtime shell will: feed
bytes, drain events, answer with the send_* helpers, write data_to_send().
This proves interoperability of the handshake, content framing, properties
and error closes with unmodified client libraries.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import decimal
import socket
import threading
from collections.abc import Iterator
from typing import Any

import aio_pika
import pika
import pika.exceptions
import pytest
from pamqp import commands as C

from broker.amqp import (
    CLOSED,
    NEED_DATA,
    PAUSED,
    Ack,
    ConnectionOpen,
    ConnectionStartOk,
    MethodReceived,
    Publish,
    ServerConfig,
    ServerConnection,
)


class MiniBroker:
    """Just enough broker for client interop tests (default exchange only)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.queues: dict[str, collections.deque[tuple[bytes, bytes, str]]] = collections.defaultdict(collections.deque)
        self.published: list[Publish] = []
        self.acks: list[int] = []
        self.stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop:
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s: socket.socket) -> None:
        conn = ServerConnection(ServerConfig(heartbeat=0))
        consumers: dict[str, tuple[int, str]] = {}
        confirms: dict[int, int] = {}
        tags = [0]
        try:
            while True:
                data = s.recv(65536)
                conn.receive_data(data)
                out = []
                while True:
                    ev = conn.next_event()
                    if ev is NEED_DATA or ev is CLOSED or ev is PAUSED:
                        break
                    out.append(self._handle(conn, ev, consumers, confirms, tags))
                out.append(conn.data_to_send())
                s.sendall(b"".join(out))
                if ev is CLOSED or not data:
                    return
        except OSError:
            return
        finally:
            s.close()

    def _deliver(self, conn: ServerConnection, consumers: dict[str, tuple[int, str]], tags: list[int]) -> bytes:
        out = []
        for ctag, (ch, queue) in consumers.items():
            q = self.queues[queue]
            while q:
                props, body, rk = q.popleft()
                tags[0] += 1
                out.append(conn.send_deliver(ch, ctag, tags[0], False, "", rk, props, body))
        return b"".join(out)

    def _handle(self, conn: ServerConnection, ev: Any, consumers: dict[str, tuple[int, str]],
                confirms: dict[int, int], tags: list[int]) -> bytes:
        if isinstance(ev, ConnectionStartOk):
            return conn.accept_login() if (ev.username, ev.password) == ("guest", "guest") else conn.reject_login()
        if isinstance(ev, ConnectionOpen):
            if ev.virtual_host != "/":
                return conn.connection_error(530, f"vhost {ev.virtual_host} not found", 10, 40)
            return conn.accept_open()
        if isinstance(ev, Publish):
            self.published.append(ev)
            out = b""
            if ev.exchange:
                return conn.channel_error(ev.channel, 404, f"no exchange '{ev.exchange}' in vhost '/'", 60, 40)
            if ev.routing_key.startswith("missing") and ev.mandatory:
                out += conn.send_return(ev.channel, 312, "NO_ROUTE", ev.exchange, ev.routing_key,
                                        ev.properties_raw, ev.body)
            else:
                self.queues[ev.routing_key].append((ev.properties_raw, ev.body, ev.routing_key))
            if ev.channel in confirms:
                confirms[ev.channel] += 1
                out += conn.send_ack(ev.channel, confirms[ev.channel])
            return out + self._deliver(conn, consumers, tags)
        if isinstance(ev, Ack):
            self.acks.append(ev.delivery_tag)
            return b""
        if isinstance(ev, MethodReceived):
            m, ch = ev.method, ev.channel
            if isinstance(m, C.Queue.Declare):
                return conn.send_method(ch, C.Queue.DeclareOk(queue=m.queue, message_count=len(self.queues[m.queue]), consumer_count=0))
            if isinstance(m, C.Basic.Qos):
                return conn.send_method(ch, C.Basic.QosOk())
            if isinstance(m, C.Confirm.Select):
                confirms[ch] = 0
                return conn.send_method(ch, C.Confirm.SelectOk())
            if isinstance(m, C.Basic.Consume):
                consumers[m.consumer_tag or "ctag"] = (ch, m.queue)
                return conn.send_method(ch, C.Basic.ConsumeOk(consumer_tag=m.consumer_tag or "ctag")) + \
                    self._deliver(conn, consumers, tags)
            if isinstance(m, C.Basic.Cancel):
                consumers.pop(m.consumer_tag, None)
                return conn.send_method(ch, C.Basic.CancelOk(consumer_tag=m.consumer_tag))
            if isinstance(m, C.Basic.Get):
                q = self.queues[m.queue]
                if not q:
                    return conn.send_method(ch, C.Basic.GetEmpty())
                props, body, rk = q.popleft()
                tags[0] += 1
                return conn.send_get_ok(ch, tags[0], False, "", rk, len(q), props, body)
        return b""


@pytest.fixture
def broker() -> Iterator[MiniBroker]:
    b = MiniBroker()
    yield b
    b.stop = True
    b.sock.close()


PROPS = pika.BasicProperties(
    content_type="application/json",
    content_encoding="utf-8",
    headers={
        "str": "v",
        "int": 7,
        "big": 2**40,
        "neg": -3,
        "bool": True,
        "dec": decimal.Decimal("3.14"),
        "ts": datetime.datetime(2024, 5, 6, 7, 8, 9),
        "nested": {"a": [1, "two", {"three": None}]},
        "bytes": b"\x00\xff",
    },
    delivery_mode=2,
    priority=3,
    correlation_id="cid",
    reply_to="rq",
    expiration="60000",
    message_id="mid",
    timestamp=1_700_000_000,
    type="t",
    user_id="guest",
    app_id="app",
)


def params(port: int, **kw: Any) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1, socket_timeout=5, **kw)


def test_pika_publish_get_consume_byte_exact(broker: MiniBroker) -> None:
    conn = pika.BlockingConnection(params(broker.port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q")
    body = bytes(range(256)) * 20000  # 5 MB: many body frames both ways
    ch.basic_publish("", "q", body, PROPS)
    ch.basic_publish("", "q", b"second", PROPS)
    method, props, got = ch.basic_get("q")
    assert got == body and method.routing_key == "q"
    expected = dict(PROPS.headers)
    expected["ts"] = expected["ts"].replace(tzinfo=datetime.UTC)  # pika decodes timestamps as UTC-aware
    assert props.headers == expected
    for name in ("content_type", "delivery_mode", "priority", "correlation_id", "reply_to", "expiration",
                 "message_id", "timestamp", "type", "user_id", "app_id", "content_encoding"):
        assert getattr(props, name) == getattr(PROPS, name), name
    # the server kept the publisher's raw bytes: both messages carry identical properties bytes
    assert broker.published[0].properties_raw == broker.published[1].properties_raw
    seen: list[bytes] = []

    def on_message(chan: Any, m: Any, p: Any, b: bytes) -> None:
        seen.append(b)
        chan.basic_ack(m.delivery_tag)
        chan.stop_consuming()

    ch.basic_consume("q", on_message)
    ch.start_consuming()
    assert seen == [b"second"]
    conn.close()
    assert broker.acks


def test_pika_mandatory_return_and_channel_error(broker: MiniBroker) -> None:
    conn = pika.BlockingConnection(params(broker.port))
    ch = conn.channel()
    returned: list[bytes] = []
    ch.add_on_return_callback(lambda _c, _m, _p, b: returned.append(b))
    ch.basic_publish("", "missing-q", b"lost", mandatory=True)
    for _ in range(50):  # wait for the condition (at most ~5 s), not for a fixed time
        if returned:
            break
        conn.process_data_events(time_limit=0.1)
    assert returned == [b"lost"]
    ch.basic_publish("nope", "rk", b"x")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("q")
    assert info.value.reply_code == 404
    assert info.value.reply_text == "NOT_FOUND - no exchange 'nope' in vhost '/'"
    ch2 = conn.channel()  # the connection survives a channel error
    ch2.queue_declare("q")
    conn.close()


def test_pika_bad_credentials_and_vhost(broker: MiniBroker) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(params(broker.port, credentials=pika.PlainCredentials("guest", "wrong")))
    assert "ACCESS_REFUSED" in str(info.value)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info2:
        pika.BlockingConnection(params(broker.port, virtual_host="nope"))
    assert "(530) 'NOT_ALLOWED - vhost nope not found'" in str(info2.value)


async def test_aio_pika_round_trip(broker: MiniBroker) -> None:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/", timeout=5)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue("aq")
        msg = aio_pika.Message(b"hello", headers={"x": 1, "y": [True, "z"]}, message_id="m1", priority=2)
        await ch.default_exchange.publish(msg, routing_key="aq")
        got = await q.get(timeout=5)
        assert got.body == b"hello" and got.headers == {"x": 1, "y": [True, "z"]}
        assert got.message_id == "m1" and got.priority == 2
        await got.ack()
        await asyncio.sleep(0)


def test_kombu_py_amqp_round_trip(broker: MiniBroker) -> None:
    """kombu over py-amqp: a third, independent client implementation
    with its own login and field-table codec)."""
    import kombu

    with kombu.Connection(f"amqp://guest:guest@127.0.0.1:{broker.port}//", connect_timeout=5) as conn:
        conn.connect()
        assert conn.connection.server_properties["capabilities"]["publisher_confirms"] is True
        ch = conn.channel()
        ch.queue_declare(queue="kq")
        msg = ch.prepare_message(b"payload", content_type="text/plain",
                                 headers={"n": 1, "nested": {"l": [1, 2]}}, priority=4)
        ch.basic_publish(msg, exchange="", routing_key="kq")
        got = None
        for _ in range(50):  # basic.get until the publish has been routed
            got = ch.basic_get(queue="kq", no_ack=True)
            if got is not None:
                break
        assert got is not None
        assert got.body == b"payload"
        assert got.headers == {"n": 1, "nested": {"l": [1, 2]}}
        assert got.properties["priority"] == 4 and got.content_type == "text/plain"
