"""aio-pika and kombu, unchanged, against a real broker process; the same
scenario runs against RabbitMQ 3.10 and the two results must be equal.

Each scenario declares a quorum queue, publishes with publisher confirms,
consumes with acks, and provokes error replies (passive declare of a missing
queue -> 404, a permission refusal -> 403, a wrong password), recording what
the library surfaces: its exception class and the reply code and text.
"""
from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import aiormq
import amqp
import kombu
import pytest
from kombu import Exchange, Producer, Queue

from .broker_proc import BrokerProcess

QQ = {"x-queue-type": "quorum"}
N = 50


# ---------------------------------------------------------------- aio-pika
async def _aio_pika_scenario(port: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=10)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue("aio-qq", durable=True, arguments=QQ)
        await q.purge()
        for i in range(N):
            confirmation = await ch.default_exchange.publish(
                aio_pika.Message(b"m%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                 headers={"i": i}),
                routing_key="aio-qq")
            assert isinstance(confirmation, aiormq.abc.ConfirmationFrameType)
            out.setdefault("confirms", set()).add(type(confirmation).__name__)
        out["declared_count"] = (await ch.declare_queue("aio-qq", passive=True)).declaration_result.message_count
        await ch.set_qos(prefetch_count=10)
        got: list[tuple[bytes, Any, bool]] = []
        async with q.iterator() as it:
            async for message in it:
                async with message.process():
                    got.append((message.body, message.headers["i"], message.redelivered))
                if len(got) == N:
                    break
        out["got"] = got
        out["left"] = (await ch.declare_queue("aio-qq", passive=True)).declaration_result.message_count
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as info:
            await ch.declare_queue("aio-missing", passive=True)
        out["missing"] = info.value.args[0]  # aiormq maps 404 to the class, keeps the text
        ch2 = await conn.channel()
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info2:
            await ch2.declare_queue("aio-qq", durable=True, arguments={"x-queue-type": "classic"})
        out["mismatch"] = info2.value.args[0].split(" - ")[0]
        await (await conn.channel()).queue_delete("aio-qq")
    alice = await aio_pika.connect(f"amqp://alice:alicepw@127.0.0.1:{port}/", timeout=10)
    async with alice:
        ch = await alice.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as info3:
            await ch.declare_queue("not-alice", arguments=QQ)
        out["refused"] = info3.value.args[0]
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError) as info4:
        await aio_pika.connect(f"amqp://guest:wrong@127.0.0.1:{port}/", timeout=10)
    out["bad_login"] = str(info4.value)
    return out


def test_aio_pika(defs_broker: BrokerProcess, rabbitmq_defs: int) -> None:
    ours = asyncio.run(_aio_pika_scenario(defs_broker.port))
    theirs = asyncio.run(_aio_pika_scenario(rabbitmq_defs))
    assert ours == theirs
    assert ours["confirms"] == {"Ack"}
    assert ours["declared_count"] == N and ours["left"] == 0
    assert ours["got"] == [(b"m%d" % i, i, False) for i in range(N)]
    assert ours["missing"] == "NOT_FOUND - no queue 'aio-missing' in vhost '/'"
    assert ours["mismatch"] == "PRECONDITION_FAILED"
    assert ours["refused"] == "ACCESS_REFUSED - access to queue 'not-alice' in vhost '/' refused for user 'alice'"
    assert "ACCESS_REFUSED" in ours["bad_login"]


# ---------------------------------------------------------------- kombu (py-amqp)
def _kombu_scenario(port: int, login_method: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    url = f"amqp://guest:guest@127.0.0.1:{port}//"
    with kombu.Connection(url, login_method=login_method,
                          transport_options={"confirm_publish": True}) as conn:
        conn.connect()
        queue = Queue("kombu-qq", Exchange("kombu-x", type="direct"), routing_key="k",
                      durable=True, queue_arguments=QQ)
        producer = Producer(conn.channel(), exchange=queue.exchange)
        for i in range(N):
            # with confirm_publish, publish() returns only once the broker confirmed
            producer.publish({"i": i}, routing_key="k", declare=[queue], serializer="json",
                             delivery_mode=2, retry=False)
        ch = conn.channel()
        out["declared_count"] = queue(ch).queue_declare(passive=True).message_count
        got: list[int] = []

        def on_message(body: Any, message: Any) -> None:
            got.append(body["i"])
            message.ack()

        with kombu.Consumer(conn.channel(), queues=[queue], callbacks=[on_message], prefetch_count=10):
            while len(got) < N:
                conn.drain_events(timeout=10)
        out["got"] = got
        out["left"] = queue(ch).queue_declare(passive=True).message_count
        with pytest.raises(amqp.exceptions.NotFound) as info:
            Queue("kombu-missing")(conn.channel()).queue_declare(passive=True)
        out["missing"] = info.value.reply_code, info.value.reply_text
        queue(conn.channel()).delete()
        Exchange("kombu-x")(conn.channel()).delete()
    with kombu.Connection(f"amqp://alice:alicepw@127.0.0.1:{port}//", login_method=login_method) as alice:
        with pytest.raises(amqp.exceptions.AccessRefused) as info2:
            Queue("kombu-not-alice")(alice.channel()).declare()
        out["refused"] = info2.value.reply_code, info2.value.reply_text
    with kombu.Connection(f"amqp://guest:wrong@127.0.0.1:{port}//", login_method=login_method,
                          connect_timeout=5) as bad:
        with pytest.raises(amqp.exceptions.AccessRefused) as info3:
            bad.connect()
        out["bad_login"] = info3.value.reply_code
    return out


@pytest.mark.parametrize("login_method", ["AMQPLAIN", "PLAIN"])
def test_kombu(defs_broker: BrokerProcess, rabbitmq_defs: int, login_method: str) -> None:
    ours = _kombu_scenario(defs_broker.port, login_method)
    theirs = _kombu_scenario(rabbitmq_defs, login_method)
    assert ours == theirs
    assert ours["declared_count"] == N and ours["left"] == 0
    assert ours["got"] == list(range(N))
    assert ours["missing"] == (404, "NOT_FOUND - no queue 'kombu-missing' in vhost '/'")
    assert ours["refused"] == (403, "ACCESS_REFUSED - access to queue 'kombu-not-alice' in vhost '/' "
                                    "refused for user 'alice'")
    assert ours["bad_login"] == 403


def _kombu_connection_error(port: int) -> tuple[Any, ...]:
    """A connection-level error (reusing a consumer tag: 530) surfaces as
    py-amqp's exception; the kombu connection is re-established and works, as
    Celery workers rely on."""
    url = f"amqp://guest:guest@127.0.0.1:{port}//"
    q = Queue("kombu-after", routing_key="kombu-after", durable=True, queue_arguments=QQ)
    with kombu.Connection(url, transport_options={"confirm_publish": True}) as conn:
        ch = conn.channel()
        q(ch).declare()
        ch.basic_consume("kombu-after", consumer_tag="dup")
        with pytest.raises(amqp.exceptions.NotAllowed) as info:
            ch.basic_consume("kombu-after", consumer_tag="dup")
            conn.drain_events(timeout=5)
        error = type(info.value).__name__, info.value.reply_code, info.value.reply_text
        conn.close()
        conn.ensure_connection(max_retries=3)
        with conn.Producer() as producer:
            producer.publish(b"again", routing_key="kombu-after", declare=[q], retry=False)
        simple = conn.SimpleQueue(q)
        msg = simple.get(timeout=10)
        body = msg.body
        msg.ack()
        simple.close()
        q(conn.channel()).delete()
    return error + (body,)


def test_kombu_connection_error_then_reconnect(defs_broker: BrokerProcess, rabbitmq_defs: int) -> None:
    ours = _kombu_connection_error(defs_broker.port)
    assert ours == _kombu_connection_error(rabbitmq_defs)
    assert ours == ("NotAllowed", 530, "NOT_ALLOWED - attempt to reuse consumer tag 'dup'", b"again")
