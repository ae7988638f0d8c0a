"""The delivery acknowledgement timeout on a real 3-node cluster: a consumer on
a node that is not the queue's leader holds a delivery past `consumer_timeout`;
its channel closes with 406, the management API showed the consumer and the
unacked delivery before, and the message goes back to the queue (through the
forwarded ChannelDown) and is delivered again, redelivered, on another node."""
from __future__ import annotations

import time
from collections.abc import Iterator

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from .conftest import MgmtCluster, wait_for

TIMEOUT_TEXT = ("PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout "
                "value used: 1000 ms. This timeout value can be configured, see consumers doc "
                "guide to learn more")


@pytest.fixture(scope="module")
def ct_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MgmtCluster]:
    c = MgmtCluster(tmp_path_factory.mktemp("ct-cluster"), extra="consumer_timeout = 1000\n")
    c.start()
    yield c
    c.kill_all()


def test_timeout_on_a_follower_returns_the_message(ct_cluster: MgmtCluster) -> None:
    api = ct_cluster.apis[0]
    assert api.put("/api/queues/%2F/ct-cluster", {"durable": True, "type": "quorum"})[0] == 201
    leader = wait_for(lambda: api.get("/api/queues/%2F/ct-cluster")[1].get("leader"), 30, "a leader")
    names = [n.name for n in ct_cluster.nodes]
    follower = next(i for i, n in enumerate(names) if n != leader)
    other = next(i for i, n in enumerate(names) if n not in (leader, names[follower]))
    pub = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", ct_cluster.nodes[0].port))
    pch = pub.channel()
    pch.confirm_delivery()
    pch.basic_publish("", "ct-cluster", b"held")
    pub.close()

    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", ct_cluster.nodes[follower].port))
    ch = conn.channel()
    got: list[bool] = []
    ch.basic_consume("ct-cluster", lambda _c, m, _p, _b: got.append(m.redelivered), consumer_tag="slow")
    t0 = time.monotonic()
    while not got and time.monotonic() - t0 < 10:
        conn.process_data_events(0.05)
    assert got == [False]
    fapi = ct_cluster.apis[follower]
    consumers = fapi.get("/api/consumers/%2F")[1]
    assert [c["consumer_tag"] for c in consumers] == ["slow"]
    assert consumers[0]["ack_required"] is True and consumers[0]["consumer_timeout"] == 1000
    channels = fapi.get("/api/channels")[1]
    assert [c["messages_unacknowledged"] for c in channels] == [1]
    t0 = time.monotonic()
    while ch.is_open and time.monotonic() - t0 < 10:
        conn.process_data_events(0.1)
    waited = time.monotonic() - t0
    assert not ch.is_open and waited < 10
    reason = ch._closing_reason
    assert isinstance(reason, ChannelClosedByBroker)
    assert (reason.reply_code, reason.reply_text) == (406, TIMEOUT_TEXT)
    assert conn.is_open
    conn.close()
    assert fapi.get("/api/consumers")[1] == []
    # back in the queue, delivered again (redelivered) to a consumer on another node
    wait_for(lambda: api.get("/api/queues/%2F/ct-cluster")[1]["messages_ready"] == 1, 30,
             "the message back in the queue")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", ct_cluster.nodes[other].port))
    ch = conn.channel()
    method, _props, body = ch.basic_get("ct-cluster", auto_ack=True)
    assert (body, method.redelivered) == (b"held", True)
    conn.close()
