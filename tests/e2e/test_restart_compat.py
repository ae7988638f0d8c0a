"""What survives a restart, compared with RabbitMQ 3.10.

One client scenario runs against a RabbitMQ node of its own and against our
broker, each restarted in the middle (a clean stop and start, as an operator
restarts a node): durable classic queues keep their persistent messages
(unacked ones come back redelivered), transient messages and acked ones are
gone, non-durable and exclusive queues are deleted, a durable auto-delete
queue that never had a consumer is kept, and quorum queues keep everything
confirmed. The results must be equal.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pika.spec import BasicProperties

from bench import rabbitmq_local

from .broker_proc import BrokerProcess, rabbitmq_port_pair
from .test_compat import attempt, connect, drain_get

pytestmark = pytest.mark.slow

QUEUES = {
    "rs-durable": {"durable": True, "arguments": {"x-queue-type": "classic"}},
    "rs-transient": {"durable": False},
    "rs-autodelete": {"durable": True, "auto_delete": True},
    "rs-quorum": {"durable": True, "arguments": {"x-queue-type": "quorum"}},
}


def scenario(port: int, restart: Callable[[], None]) -> dict[str, Any]:
    conn = connect(port)
    ch = conn.channel()
    ch.confirm_delivery()
    for name, kw in QUEUES.items():
        ch.queue_declare(name, **kw)
    owner = connect(port)  # holds an exclusive queue until the node stops
    owner.channel().queue_declare("rs-exclusive", exclusive=True)
    for name in QUEUES:
        for body, mode in (("p1", 2), ("t1", 1), ("p2", 2), ("t2", 1), ("p3", 2)):
            ch.basic_publish("", name, body.encode(), BasicProperties(delivery_mode=mode))
    held = conn.channel()
    for name in QUEUES:
        # p1 acked, t1 acked, p2 delivered and still unacked when the node stops
        for _ in range(2):
            method, _props, _body = ch.basic_get(name)
            ch.basic_ack(method.delivery_tag)
        method, _props, body = held.basic_get(name)
        assert body == b"p2"
    ch.queue_declare("rs-durable", passive=True)  # a round trip: the acks are in
    restart()
    conn = connect(port)
    out: dict[str, Any] = {}
    for name in [*QUEUES, "rs-exclusive"]:
        def look(c: Any, name: str = name) -> Any:
            count = c.queue_declare(name, passive=True).method.message_count
            return count, drain_get(c, name)
        out[name] = attempt(conn, look)
    conn.close()
    return out


def test_what_survives_a_restart_matches_rabbitmq(tmp_path: Path) -> None:
    if not rabbitmq_local.installed():
        pytest.fail("rabbitmq-server is not installed (make test installs it when run as root)")
    import tempfile

    # RabbitMQ runs as the `rabbitmq` user: its directory must be reachable
    base = Path(tempfile.mkdtemp(prefix="qq-restart-"))
    base.chmod(0o755)
    rport = rabbitmq_port_pair()
    rabbit = rabbitmq_local.RabbitNode(f"qqrestart{os.getpid()}@localhost", rport, base / "node")
    rabbit.start()
    try:
        def restart_rabbit() -> None:
            rabbit.stop()
            rabbit.start()
        theirs = scenario(rport, restart_rabbit)
    finally:
        rabbit.stop()
        shutil.rmtree(base, ignore_errors=True)

    ours_node = BrokerProcess(tmp_path / "node").start()
    try:
        def restart_ours() -> None:
            ours_node.stop()
            ours_node.start()
        ours = scenario(ours_node.port, restart_ours)
    finally:
        ours_node.kill()

    # 4.x: a quorum queue's first delivery carries no x-delivery-count (3.10
    # adds 0; see test_compat._delivery_limit_to_4x)
    count, seen = theirs["rs-quorum"]
    theirs["rs-quorum"] = (count, [(b, r, None if c == 0 else c) for b, r, c in seen])
    # what RabbitMQ does, spelled out (so a change on either side is visible)
    assert theirs["rs-transient"] == (404, "NOT_FOUND - no queue 'rs-transient' in vhost '/'")
    assert theirs["rs-exclusive"] == (404, "NOT_FOUND - no queue 'rs-exclusive' in vhost '/'")
    assert theirs["rs-durable"][1][0][:2] == ("p2", True)
    assert ours == theirs


def test_a_new_connection_never_inherits_a_stale_exclusive_queue(tmp_path: Path) -> None:
    """Connection ids restart with the node: an exclusive queue left in the
    metadata by the last run would belong to whichever new connection got
    the same id. It is deleted at start-up instead, so the name is free."""
    b = BrokerProcess(tmp_path / "node").start()
    try:
        conn = connect(b.port)
        conn.channel().queue_declare("rs-mine", exclusive=True)
        b.kill()
        b.start()
        for _ in range(3):  # the first connections after a restart
            c = connect(b.port)
            assert attempt(c, lambda ch: ch.queue_declare("rs-mine", passive=True)) == (
                404, "NOT_FOUND - no queue 'rs-mine' in vhost '/'")
            c.close()
        c = connect(b.port)
        c.channel().queue_declare("rs-mine", exclusive=True)  # free for a new owner
        other = connect(b.port)
        assert attempt(other, lambda ch: ch.queue_declare("rs-mine", passive=True))[0] == 405
        other.close()
        c.close()
    finally:
        b.kill()
