"""Connections, channels and consumers of the whole cluster from any node's
management API, as RabbitMQ lists them (issue 13 item 5): clients on three
nodes, one API asked; a connection on another node closed through it; the
overview counts and rates add up the cluster."""
from __future__ import annotations

import urllib.parse
from collections.abc import Iterator

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker

from .conftest import MgmtCluster, wait_for

QQ = {"arguments": {"x-queue-type": "quorum"}, "durable": True}


@pytest.fixture
def clients(mgmt_cluster: MgmtCluster) -> Iterator[list[pika.BlockingConnection]]:
    conns = [pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", n.port, client_properties={"connection_name": f"cv-{i}"}))
        for i, n in enumerate(mgmt_cluster.nodes)]
    yield conns
    for c in conns:
        if c.is_open:
            c.close()


def test_any_node_lists_the_whole_clusters_connections_channels_consumers(
        mgmt_cluster: MgmtCluster, clients: list[pika.BlockingConnection]) -> None:
    api = mgmt_cluster.apis[0]
    assert api.put("/api/queues/%2F/cv-q", QQ)[0] in (201, 204)
    chans = [c.channel() for c in clients]
    chans[2].basic_consume("cv-q", lambda *a: None, consumer_tag="cv-consumer-on-3")
    names = {n.name for n in mgmt_cluster.nodes}

    def listed() -> list[dict] | None:
        status, body = api.get("/api/connections")
        assert status == 200, body
        cs = [c for c in body if str(c["client_properties"].get("connection_name", "")).startswith("cv-")]
        return cs if len(cs) >= 3 else None

    conns = wait_for(listed, what="three connections listed")
    by_name = {c["client_properties"]["connection_name"]: c for c in conns}
    assert {by_name[f"cv-{i}"]["node"] for i in range(3)} == names
    for i, n in enumerate(mgmt_cluster.nodes):
        assert by_name[f"cv-{i}"]["node"] == n.name
        assert by_name[f"cv-{i}"]["port"] == n.port
    # every node answers the same
    for other in mgmt_cluster.apis[1:]:
        status, body = other.get("/api/connections")
        assert status == 200
        assert {c["name"] for c in conns} <= {c["name"] for c in body}
    # one channel each, found by the connection they belong to
    status, channels = api.get("/api/channels")
    assert status == 200
    ours = [c for c in channels if c["connection_details"]["name"] in {x["name"] for x in conns}]
    assert sorted(c["node"] for c in ours) == sorted(names)
    remote = by_name["cv-2"]["name"]
    status, body = api.get(f"/api/connections/{urllib.parse.quote(remote, safe='')}/channels")
    assert status == 200 and [c["node"] for c in body] == [mgmt_cluster.nodes[2].name]
    status, consumers = api.get("/api/consumers/%2F")
    assert status == 200
    found = [c for c in consumers if c["consumer_tag"] == "cv-consumer-on-3"]
    assert len(found) == 1 and found[0]["channel_details"]["node"] == mgmt_cluster.nodes[2].name
    # a queue's message_stats add up what every node's channels did
    for ch, n in ((chans[0], 3), (chans[1], 2)):
        ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish("", "cv-q", b"m%d" % i)
    wait_for(lambda: mgmt_cluster.apis[2].get("/api/queues/%2F/cv-q")[1]["message_stats"]["publish"] == 5,
             what="publish count 5 summed over two nodes' channels")
    status, listed = mgmt_cluster.apis[2].get("/api/queues/%2F")
    assert [q["message_stats"]["publish"] for q in listed if q["name"] == "cv-q"] == [5]
    # the overview counts the cluster's connections and channels
    status, ov = api.get("/api/overview")
    assert status == 200
    assert ov["object_totals"]["connections"] >= 3 and ov["object_totals"]["channels"] >= 3


def test_a_connection_on_another_node_is_closed_through_any_api(
        mgmt_cluster: MgmtCluster, clients: list[pika.BlockingConnection]) -> None:
    api = mgmt_cluster.apis[0]
    status, conns = api.get("/api/connections")
    assert status == 200
    target = next(c for c in conns if c["client_properties"].get("connection_name") == "cv-1")
    assert target["node"] == mgmt_cluster.nodes[1].name
    status, _ = api.call("DELETE", f"/api/connections/{urllib.parse.quote(target['name'], safe='')}",
                         headers={"X-Reason": "closed by the test"})
    assert status == 204
    with pytest.raises(ConnectionClosedByBroker) as err:
        for _ in range(200):
            clients[1].process_data_events(0.05)
    assert err.value.reply_code == 320
    assert "closed by the test" in err.value.reply_text
    # gone from every node's list; the others stay
    wait_for(lambda: target["name"] not in {c["name"] for c in api.get("/api/connections")[1]},
             what="the closed connection leaves the list")
    left = {c["client_properties"].get("connection_name") for c in api.get("/api/connections")[1]}
    assert {"cv-0", "cv-2"} <= left
    status, body = api.call("DELETE", "/api/connections/no-such-connection")
    assert status == 404 and "no connection 'no-such-connection'" in body["reason"]
