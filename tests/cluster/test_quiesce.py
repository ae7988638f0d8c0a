"""Quiet (idle) quorum queues in a real 3-node cluster (runtime/quiesce.py).

Idle queues stop heartbeating, so a lost leader is no longer noticed by its
followers' election timeouts: the node's failure detector must wake them.
The nasty case is a leader's node that hangs without closing its
connections (SIGSTOP here; a network cut behaves the same): the peers only
notice the silence. Publishers on the other nodes must get their confirms,
and every confirmed message must be there once the node is back."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pika
import pytest

from tests.e2e.broker_proc import free_port
from tests.mgmt.conftest import metric, metrics_text

from .conftest import Cluster

pytestmark = pytest.mark.slow

QUEUES = [f"quiet-{i}" for i in range(12)]


def _conn(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, heartbeat=0, blocked_connection_timeout=60, socket_timeout=60))


def _until(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.1)


def _quiet_everywhere(c: Cluster) -> bool:
    for n in c.nodes:
        text = metrics_text(n.metrics_port)
        if any(metric(text, "qq_raft_quiet", queue=q) != 1 for q in QUEUES):
            return False
    return True


def test_quiet_queues_survive_a_hung_leader_node(tmp_path) -> None:
    c = Cluster(tmp_path)
    for n in c.nodes:
        n.metrics_port = free_port()
    c.start()
    frozen = None
    try:
        conn = _conn(c.nodes[0].port)
        ch = conn.channel()
        ch.confirm_delivery()
        for q in QUEUES:  # declared on node 0: its node leads them (client-local)
            ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
            ch.basic_publish("", q, b"before", pika.BasicProperties(delivery_mode=2))
        conn.close()
        _until(lambda: _quiet_everywhere(c), "every member of every queue is quiet")
        text = metrics_text(c.nodes[0].metrics_port)
        assert all(metric(text, "qq_raft_is_leader", queue=q) == 1 for q in QUEUES)

        frozen = c.nodes[0]
        frozen.freeze()  # hangs: its sockets stay open, it just goes silent
        confirmed: list[str] = []

        def publish() -> None:
            conn = _conn(c.nodes[1].port)
            ch = conn.channel()
            ch.confirm_delivery()
            for q in QUEUES:  # each publish returns once confirmed (or raises)
                ch.basic_publish("", q, b"during", pika.BasicProperties(delivery_mode=2))
                confirmed.append(q)
            conn.close()
        t = threading.Thread(target=publish, daemon=True)
        t.start()
        t.join(45)
        assert confirmed == QUEUES, f"confirmed within 45 s with the leader's node hung: {confirmed}"
        frozen.thaw()
        frozen = None

        conn = _conn(c.nodes[2].port)
        ch = conn.channel()
        for q in QUEUES:
            bodies = []
            _until(lambda q=q: ch.queue_declare(q, passive=True).method.message_count == 2,
                   f"{q} holds both messages")
            for _ in range(2):
                method, _props, body = ch.basic_get(q, auto_ack=True)
                assert method is not None
                bodies.append(body)
            assert sorted(bodies) == [b"before", b"during"]
        conn.close()
    finally:
        if frozen is not None:
            frozen.thaw()
        c.kill_all()
