"""The memory alarm on a single node (issue 15): a connection that publishes
gets connection.blocked with RabbitMQ's reason and is no longer read; what it
had already sent is accepted and confirmed; a connection that only consumes
keeps working. (The disk alarm across a cluster, with unblocking, is
tests/cluster/test_alarms.py.) And the message size limit."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from .broker_proc import BrokerProcess


@pytest.fixture
def low_memory_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    # a watermark far below any Python process: the alarm is on from the start
    b = BrokerProcess(tmp_path / "node", config=(
        "vm_memory_high_watermark.absolute = 1MB\nalarms.check_interval_ms = 100\n")).start()
    yield b
    b.kill()


def test_publishers_are_blocked_consumers_are_not(low_memory_broker: BrokerProcess) -> None:
    port = low_memory_broker.port
    consumer = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    cch = consumer.channel()
    cch.queue_declare("mem-q", durable=True, arguments={"x-queue-type": "quorum"})

    # heartbeat 1 s: a blocked connection is not read, yet it must not be closed
    # for "missed heartbeats" (its heartbeats wait unread in the socket)
    publisher = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=1))
    reasons: list[str] = []
    publisher.add_on_connection_blocked_callback(lambda _c, m: reasons.append(m.method.reason))
    pch = publisher.channel()
    pch.confirm_delivery()
    pch.basic_publish("", "mem-q", b"accepted", pika.BasicProperties(delivery_mode=2))  # confirmed
    publisher.process_data_events(1)
    assert reasons == ["low on memory"]
    publisher.process_data_events(4)  # > 2 heartbeat intervals while blocked
    assert publisher.is_open

    # the consumer's connection was never blocked: it gets the message and acks it
    method, _props, body = cch.basic_get("mem-q")
    assert body == b"accepted"
    cch.basic_ack(method.delivery_tag)
    assert cch.queue_declare("mem-q", passive=True).method.message_count == 0
    consumer.close()


def test_max_message_size_refuses_a_larger_publish_with_rabbitmqs_text(tmp_path: Path) -> None:
    """`max_message_size` (RabbitMQ's key): a bigger body closes the channel
    with 406 and RabbitMQ's text; the connection and smaller messages go on."""
    b = BrokerProcess(tmp_path / "node", config="max_message_size = 1024\n").start()
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
        ch = conn.channel()
        ch.queue_declare("size-q", durable=True, arguments={"x-queue-type": "quorum"})
        ch.confirm_delivery()
        ch.basic_publish("", "size-q", b"x" * 1024)  # at the limit: accepted, confirmed
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_publish("", "size-q", b"x" * 2000)
        assert err.value.reply_code == 406
        assert err.value.reply_text == (
            "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1024")
        ch = conn.channel()
        assert ch.queue_declare("size-q", passive=True).method.message_count == 1
        conn.close()
    finally:
        b.kill()
