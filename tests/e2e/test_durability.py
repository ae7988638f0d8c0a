"""Durability across kill -9: a publisher with confirms is running when the
broker process is killed; after a restart every confirmed message is there,
messages that were delivered but not acknowledged come back with the
redelivered flag, and the queue/exchange/binding definitions are intact.

A confirm is sent only after the enqueue is committed, and on a single node
commit means the WAL write was fsynced: so nothing confirmed can be missing.
"""
from __future__ import annotations

import threading
import time

import pika
from pika.spec import BasicProperties

from .broker_proc import BrokerProcess
from .test_compat import QQ, connect


def _publisher(port: int, confirmed: list[int], stop: threading.Event, errors: list[BaseException]) -> None:
    """Publish 'p<i>' one at a time with confirms; record i once confirmed.
    Ends when the broker goes away (the expected end) or `stop` is set."""
    try:
        conn = connect(port)
        ch = conn.channel()
        ch.confirm_delivery()
        i = 0
        while not stop.is_set():
            ch.basic_publish("dur-x", "k", b"p%d" % i, BasicProperties(delivery_mode=2))
            confirmed.append(i)
            i += 1
    except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError, ConnectionError):
        return
    except BaseException as exc:  # anything else is a test failure
        errors.append(exc)


def _wait(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_kill_9_keeps_confirmed_and_redelivers_unacked(fresh_broker: BrokerProcess) -> None:
    b = fresh_broker.start()
    conn = connect(b.port)
    ch = conn.channel()
    ch.exchange_declare("dur-x", "direct", durable=True)
    ch.queue_declare("dur-q", durable=True, arguments={**QQ, "x-max-length": 100000})
    ch.queue_bind("dur-q", "dur-x", "k")
    # an exchange-to-exchange binding and a durable classic queue (its definition
    # survives; its messages live in memory, see ClassicQueue)
    ch.exchange_declare("dur-fan", "fanout", durable=True)
    ch.exchange_bind("dur-x", "dur-fan")
    ch.queue_declare("dur-classic", durable=True)
    ch.queue_bind("dur-classic", "dur-fan")
    # a message whose TTL runs out around the restart: the new leader must still
    # expire it (the TTL timer is not in the log) and dead-letter it
    ch.queue_declare("dur-ttl-dlq", durable=True, arguments=QQ)
    ch.queue_declare("dur-ttl", durable=True, arguments={**QQ, "x-dead-letter-exchange": "",
                                                          "x-dead-letter-routing-key": "dur-ttl-dlq"})
    ch.confirm_delivery()
    ch.basic_publish("", "dur-ttl", b"ttl", BasicProperties(delivery_mode=2, expiration="3000"))
    for i in range(5):
        ch.basic_publish("dur-x", "k", b"u%d" % i, BasicProperties(delivery_mode=2))
    # a consumer takes the five and never acks them
    consumer = connect(b.port)
    cch = consumer.channel()
    cch.basic_qos(prefetch_count=5)
    held: list[bytes] = []
    cch.basic_consume("dur-q", lambda c, m, p, body: held.append(body))
    deadline = time.monotonic() + 10
    while len(held) < 5 and time.monotonic() < deadline:
        consumer.process_data_events(0.01)
    assert held == [b"u%d" % i for i in range(5)]

    confirmed: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    t = threading.Thread(target=_publisher, args=(b.port, confirmed, stop, errors), daemon=True)
    t.start()
    _wait(lambda: len(confirmed) >= 300, 30, "300 confirmed publishes")
    b.kill()  # SIGKILL while the publisher is mid-stream
    t.join(15)
    stop.set()
    assert not t.is_alive() and not errors
    n_confirmed = len(confirmed)

    b.start()
    conn = connect(b.port)
    ch = conn.channel()
    # definitions survived
    ch.exchange_declare("dur-x", passive=True)
    # the consumer's channel died with the old process: the new leader returns
    # its five (ChannelDown for the previous incarnation), so all become ready
    _wait(lambda: ch.queue_declare("dur-q", passive=True).method.message_count >= 5 + n_confirmed,
          30, "the unacked messages to be returned")
    got = []
    while True:
        method, _props, body = ch.basic_get("dur-q", auto_ack=True)
        if method is None:
            break
        got.append((body, method.redelivered))
    # the unacked five come back, redelivered
    unacked = [(body, red) for body, red in got if body.startswith(b"u")]
    assert unacked == [(b"u%d" % i, True) for i in range(5)]
    published = [body for body, red in got if body.startswith(b"p")]
    assert all(not red for body, red in got if body.startswith(b"p"))
    # every confirmed publish is there, in order, with nothing unexpected: at most the
    # in-flight unconfirmed publish(es) after them
    assert published[:n_confirmed] == [b"p%d" % i for i in range(n_confirmed)]
    assert published[n_confirmed:] == [b"p%d" % i for i in range(n_confirmed, len(published))]
    assert len(published) - n_confirmed <= 1  # one publish at a time was in flight
    _wait(lambda: ch.queue_declare("dur-ttl-dlq", passive=True).method.message_count == 1, 30,
          "the TTL'd message to be dead-lettered after the restart")
    method, props, body = ch.basic_get("dur-ttl-dlq", auto_ack=True)
    assert body == b"ttl" and props.headers["x-death"][0]["reason"] in ("expired", b"expired")
    assert ch.queue_declare("dur-ttl", passive=True).method.message_count == 0
    # the bindings survived: dur-fan -> dur-x -(k)-> dur-q and dur-fan -> dur-classic
    ch.queue_declare("dur-classic", passive=True)
    ch.confirm_delivery()
    ch.basic_publish("dur-fan", "k", b"after", BasicProperties(delivery_mode=2), mandatory=True)
    assert [ch.basic_get(q, auto_ack=True)[2] for q in ("dur-q", "dur-classic")] == [b"after", b"after"]
    conn.close()
