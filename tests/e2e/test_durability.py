"""Durability across kill -9: a publisher with confirms is running when the
broker process is killed; after a restart every confirmed message is there,
messages that were delivered but not acknowledged come back with the
redelivered flag, and the queue/exchange/binding definitions are intact.

A confirm is sent only after the enqueue is committed, and on a single node
commit means the WAL write was fsynced: so nothing confirmed can be missing.
"""
from __future__ import annotations

import struct
import threading
import time

import pika
import pika.exceptions
import pytest
from pika.spec import BasicProperties

from bench.amqp_raw import RawClient

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


def _raw_publisher(port: int, state: dict[str, int], stop: threading.Event) -> None:
    """Pipelined publishes of 'r<seq>' with confirms (up to ~400 in flight, at
    most 30000 in all, so draining stays quick); state['confirmed'] is the
    highest seq acked (acks come in order)."""
    try:
        c = RawClient("127.0.0.1", port)
        c.confirm_select()
        seq = 0
        while not stop.is_set() and state["confirmed"] < 30000:
            if seq < 30000:
                c.sock.sendall(b"".join(RawClient.publish_frames(b"dur-raw", b"r%d" % (seq + i + 1))
                                        for i in range(100)))
                seq += 100
                state["sent"] = seq
            while state["confirmed"] < seq - (300 if seq < 30000 else 0):
                for ftype, _ch, payload in c.read_frames():
                    if ftype != 1:
                        continue
                    method = struct.unpack_from(">HH", payload)
                    if method == (60, 80):
                        state["confirmed"] = max(state["confirmed"], struct.unpack_from(">Q", payload, 4)[0])
                    elif method == (60, 120):
                        state["nacked"] += 1
    except (OSError, ConnectionError):
        return


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
    # TTL: 'ttl-short' is dead-lettered before the kill and must not be dead-lettered
    # again when the restarted node replays its log; 'ttl' runs out around the
    # restart: the new leader must still expire it (the timer is not in the log)
    ch.queue_declare("dur-ttl-dlq", durable=True, arguments=QQ)
    ch.queue_declare("dur-ttl", durable=True, arguments={**QQ, "x-dead-letter-exchange": "",
                                                          "x-dead-letter-routing-key": "dur-ttl-dlq"})
    ch.confirm_delivery()
    ch.basic_publish("", "dur-ttl", b"ttl-short", BasicProperties(delivery_mode=2, expiration="50"))
    _wait(lambda: ch.queue_declare("dur-ttl-dlq", passive=True).method.message_count == 1, 10,
          "the short-TTL message to be dead-lettered")
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
    ch.queue_declare("dur-raw", durable=True, arguments=QQ)
    raw: dict[str, int] = {"sent": 0, "confirmed": 0, "nacked": 0}
    threads = [threading.Thread(target=_publisher, args=(b.port, confirmed, stop, errors), daemon=True),
               threading.Thread(target=_raw_publisher, args=(b.port, raw, stop), daemon=True)]
    for t in threads:
        t.start()
    _wait(lambda: len(confirmed) >= 30 and raw["confirmed"] >= 3000, 60, "confirmed publishes")
    b.kill()  # SIGKILL while both publishers are mid-stream
    for t in threads:
        t.join(15)
    stop.set()
    assert not any(t.is_alive() for t in threads) and not errors and raw["nacked"] == 0
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
    _wait(lambda: ch.queue_declare("dur-ttl", passive=True).method.message_count == 0, 30,
          "the TTL'd message to expire after the restart")
    _wait(lambda: ch.queue_declare("dur-ttl-dlq", passive=True).method.message_count >= 2, 30,
          "the TTL'd message to be dead-lettered after the restart")
    dead = []
    while True:
        method, props, body = ch.basic_get("dur-ttl-dlq", auto_ack=True)
        if method is None:
            break
        dead.append((body, props.headers["x-death"][0]["reason"]))
    assert sorted(dead) == [(b"ttl", "expired"), (b"ttl-short", "expired")]  # each once
    # the pipelined publisher: every confirmed one is there, in order, and
    # nothing that was never sent
    n_raw = ch.queue_declare("dur-raw", passive=True).method.message_count
    assert raw["confirmed"] <= n_raw <= raw["sent"]
    bodies = []
    for method, _props, body in ch.consume("dur-raw", auto_ack=True, inactivity_timeout=10):
        assert method is not None, "delivery timed out"
        bodies.append(body)
        if len(bodies) == n_raw:
            break
    ch.cancel()
    assert bodies == [b"r%d" % i for i in range(1, n_raw + 1)]
    # the bindings survived: dur-fan -> dur-x -(k)-> dur-q and dur-fan -> dur-classic
    ch.queue_declare("dur-classic", passive=True)
    ch.confirm_delivery()
    ch.basic_publish("dur-fan", "k", b"after", BasicProperties(delivery_mode=2), mandatory=True)
    assert [ch.basic_get(q, auto_ack=True)[2] for q in ("dur-q", "dur-classic")] == [b"after", b"after"]
    conn.close()


def test_kill_9_durable_classic_queue_keeps_confirmed_persistent_messages_only(
        fresh_broker: BrokerProcess) -> None:
    """A durable classic queue (node-local, no Raft) logs its commands: after
    kill -9 the confirmed persistent messages are there (unacked ones
    redelivered), transient and acked ones are gone, and a non-durable
    queue's messages are gone."""
    b = fresh_broker.start()
    conn = connect(b.port)
    ch = conn.channel()
    ch.queue_declare("cq-dur", durable=True, arguments={"x-queue-type": "classic"})
    ch.queue_declare("cq-tmp", durable=False)
    ch.confirm_delivery()
    for i in range(20):
        mode = 2 if i % 2 == 0 else 1
        ch.basic_publish("", "cq-dur", b"m%d" % i, BasicProperties(delivery_mode=mode))
    ch.basic_publish("", "cq-tmp", b"gone", BasicProperties(delivery_mode=2))
    # take 6 (m0..m5), ack m0..m2: m3..m5 stay unacked when the broker dies
    got = []
    for _ in range(6):
        method, _props, body = ch.basic_get("cq-dur")
        got.append((method.delivery_tag, body))
    assert [b for _t, b in got] == [b"m%d" % i for i in range(6)]
    for tag, _body in got[:3]:
        ch.basic_ack(tag)
    ch.queue_declare("cq-dur", passive=True)  # a round trip: the acks are applied
    b.kill()
    b.start()
    conn = connect(b.port)
    ch = conn.channel()
    q = ch.queue_declare("cq-dur", passive=True)
    want = [b"m%d" % i for i in range(3, 20) if i % 2 == 0]
    assert q.method.message_count == len(want)
    bodies = []
    while True:
        method, _props, body = ch.basic_get("cq-dur", auto_ack=True)
        if method is None:
            break
        bodies.append((body, method.redelivered))
    assert sorted(b for b, _r in bodies) == sorted(want)
    assert {b for b, r in bodies if r} == {b"m4"}  # the unacked persistent one
    conn.close()
    # the non-durable queue is gone with its messages, as in RabbitMQ
    # (tests/e2e/test_restart_compat.py compares the whole picture)
    conn = connect(b.port)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        conn.channel().queue_declare("cq-tmp", passive=True)
    assert err.value.reply_code == 404
    conn.close()
    # a third start replays from the recovery snapshot: still empty, still there
    b.kill()
    b.start()
    conn = connect(b.port)
    assert conn.channel().queue_declare("cq-dur", passive=True).method.message_count == 0
    conn.close()
