"""At-least-once dead lettering seen from outside, on a real 3-node cluster of
broker processes: the backlog of dead letters waiting for a missing target is
shown by the management API (`messages_dlx`, `message_bytes_dlx`) and the
metrics (`qq_queue_messages_dlx`, `_bytes`); the source queue's leader is
killed with SIGKILL while they wait; the new leader's dead-letter worker
delivers every one of them once the target exists (duplicates allowed, loss
not) and the backlog falls to 0 in both views.

(tests/cluster/test_dead_letter_alo.py covers a graceful leadership
transfer with in-process nodes; this one a crash.)"""
from __future__ import annotations

import pika
import pytest

from .conftest import MgmtCluster, metric, metrics_text, wait_for

pytestmark = pytest.mark.slow

ARGS = {"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "bl-dlq",
        "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
        "x-message-ttl": 50}
COUNT, SIZE = 30, 100


def _source(api: object) -> dict[str, int]:
    status, q = api.get("/api/queues/%2F/bl-src")  # type: ignore[attr-defined]
    assert status == 200, q
    return q  # type: ignore[no-any-return]


def test_backlog_shown_then_delivered_after_the_leader_is_killed(mgmt_cluster: MgmtCluster) -> None:
    names = [n.name for n in mgmt_cluster.nodes]
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", mgmt_cluster.nodes[0].port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("bl-src", durable=True, arguments=ARGS)
    bodies = [b"%03d" % i + b"x" * (SIZE - 3) for i in range(COUNT)]
    for b in bodies:
        ch.basic_publish("", "bl-src", b)  # confirmed: the publish raises otherwise
    conn.close()

    api = mgmt_cluster.apis[0]
    # expired, no target yet: they wait in the source, counted as dead letters
    wait_for(lambda: _source(api).get("messages_dlx") == COUNT, 30, f"{COUNT} dead letters waiting")
    q = _source(api)
    assert q["message_bytes_dlx"] == COUNT * SIZE and q["messages_ready"] == 0, q
    leader = q["leader"]
    li = names.index(leader)
    text = metrics_text(mgmt_cluster.nodes[li].metrics_port)
    assert metric(text, "qq_queue_messages_dlx", vhost="/", queue="bl-src") == COUNT
    assert metric(text, "qq_queue_messages_dlx_bytes", vhost="/", queue="bl-src") == COUNT * SIZE

    # the leader's node dies; another member takes over the source and its worker
    mgmt_cluster.nodes[li].kill()
    other = next(i for i in range(3) if i != li)
    oapi = mgmt_cluster.apis[other]
    wait_for(lambda: _source(oapi).get("leader") not in (None, leader), 30, "a new leader")
    assert _source(oapi)["messages_dlx"] == COUNT  # nothing lost with the old leader
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", mgmt_cluster.nodes[other].port))
    ch = conn.channel()
    ch.queue_declare("bl-dlq", durable=True, arguments={"x-queue-type": "quorum"})
    wait_for(lambda: _source(oapi).get("messages_dlx") == 0, 60, "the dead letters delivered")
    got: list[bytes] = []
    while True:
        method, props, body = ch.basic_get("bl-dlq", auto_ack=True)
        if method is None:
            break
        got.append(body)
        assert props.headers["x-death"][0]["reason"] == "expired"
    conn.close()
    assert set(got) == set(bodies)  # every one delivered (a re-sent duplicate is allowed)
    new_leader = names.index(_source(oapi)["leader"])
    text = metrics_text(mgmt_cluster.nodes[new_leader].metrics_port)
    assert metric(text, "qq_queue_messages_dlx", vhost="/", queue="bl-src") == 0
