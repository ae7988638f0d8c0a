"""A closed channel's unacknowledged messages are back in their queue before
a later queue.delete or queue.declare on the same connection reports its
counts (RabbitMQ: a channel's queues learn of its end before the channel is
gone). The return is a replicated/logged command (ChannelDown) that needs an
fsync; the counts used to be read before it applied, so a queue.delete
answered message_count 0 about one run in a few (CI failed on it in
tests/e2e/test_compat.py[queue_errors]).

Repeated on a classic and a quorum queue so a race would show."""
from __future__ import annotations

from typing import Any

import pika
import pytest

from .broker_proc import BrokerProcess

ROUNDS = 15


def _held_then_closed(conn: pika.BlockingConnection, queue: str) -> None:
    """Publish one message, take it with a consumer (unacked), then make the
    server close that channel with an error (a 404 on a missing queue)."""
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"held")
    ch.basic_qos(prefetch_count=1)
    got: list[Any] = []
    ch.basic_consume(queue, lambda c, m, p, b: got.append(m.delivery_tag))
    while not got:
        conn.process_data_events(time_limit=0.1)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        ch.queue_declare("no-such-queue-here", passive=True)


@pytest.mark.parametrize("args", [{}, {"x-queue-type": "quorum"}], ids=["classic", "quorum"])
def test_returns_of_a_closed_channel_are_counted(broker: BrokerProcess, args: dict[str, Any]) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    try:
        for i in range(ROUNDS):
            name = f"cc-{args.get('x-queue-type', 'classic')}-{i}"
            ch = conn.channel()
            ch.queue_declare(name, durable=True, arguments=args)
            ch.close()
            _held_then_closed(conn, name)
            ch = conn.channel()
            assert ch.queue_declare(name, passive=True).method.message_count == 1, f"round {i}"
            _held_then_closed(conn, name)
            ch = conn.channel()
            assert ch.queue_delete(name).method.message_count == 2, f"round {i}"
            ch.close()
    finally:
        conn.close()
