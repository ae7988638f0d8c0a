"""The README quick start, end to end with pika against a real broker process:
declare a quorum queue, publish with confirms, consume with acks; and after a
clean restart everything confirmed is still there."""
from __future__ import annotations

import pika

from .broker_proc import BrokerProcess


def _conn(b: BrokerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))


def test_quick_start_publish_confirm_consume_ack(broker: BrokerProcess) -> None:
    conn = _conn(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ok = ch.queue_declare("quickstart", durable=True, arguments={"x-queue-type": "quorum"})
    assert ok.method.queue == "quickstart"
    for i in range(100):
        ch.basic_publish("", "quickstart", f"m{i}".encode(),
                         pika.BasicProperties(delivery_mode=2, headers={"i": i}))
    assert ch.queue_declare("quickstart", passive=True).method.message_count == 100
    got = []
    for method, props, body in ch.consume("quickstart", inactivity_timeout=10):
        assert method is not None, "delivery timed out"
        got.append((body, props.headers["i"], method.redelivered))
        ch.basic_ack(method.delivery_tag)
        if len(got) == 100:
            break
    ch.cancel()
    assert got == [(f"m{i}".encode(), i, False) for i in range(100)]
    assert ch.queue_declare("quickstart", passive=True).method.message_count == 0
    conn.close()


def test_confirmed_messages_survive_a_restart(fresh_broker: BrokerProcess) -> None:
    fresh_broker.start()
    conn = _conn(fresh_broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("durable-q", durable=True, arguments={"x-queue-type": "quorum"})
    for i in range(50):
        ch.basic_publish("", "durable-q", b"x%d" % i, pika.BasicProperties(delivery_mode=2))
    conn.close()
    fresh_broker.stop()
    fresh_broker.start()
    conn = _conn(fresh_broker)
    ch = conn.channel()
    assert ch.queue_declare("durable-q", passive=True).method.message_count == 50
    bodies = []
    for _ in range(50):
        method, _props, body = ch.basic_get("durable-q", auto_ack=True)
        assert method is not None
        bodies.append(body)
    assert bodies == [b"x%d" % i for i in range(50)]
    conn.close()
