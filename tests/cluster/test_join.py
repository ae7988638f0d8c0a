"""A node that was not part of the cluster at creation joins it with an empty
data directory, receives the metadata, can host queue members (grow), takes a
share of the leaders (rebalance), and restarts as itself."""
from __future__ import annotations

import base64
import json
import time
import urllib.request
from pathlib import Path

import pika
import pytest

from tests.e2e.broker_proc import BrokerProcess, free_port

from .conftest import Cluster

pytestmark = pytest.mark.slow


def _api(port: int, method: str, path: str, body: object | None = None) -> tuple[int, object]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read().decode()
            return r.status, json.loads(text) if text.strip() else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode() or "null")


def test_new_node_joins_and_gets_members_and_leaders(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    for n in c.nodes:
        n.management_port = free_port()
    c.start()
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", c.nodes[0].port))
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(3):
            ch.queue_declare(f"j{i}", durable=True, arguments={"x-queue-type": "quorum"})
            ch.basic_publish("", f"j{i}", b"before-join")
        conn.close()
        # The fourth node: its seeds list everyone, the cluster was formed by the first three.
        seeds_cfg = c.nodes[0].extra_config
        initial = "".join(f"cluster.initial_members.{i + 1} = {n}\n" for i, n in enumerate(c.names))
        name4 = "rabbit-4@127.0.0.1"
        port4 = free_port()
        extra = (seeds_cfg.replace(f"cluster.port = {seeds_cfg.split('cluster.port = ')[1].split()[0]}",
                                   f"cluster.port = {port4}")
                 + f"cluster.seeds.4 = {name4}:{port4}\n" + initial)
        n4 = BrokerProcess(tmp_path / "n4", name=name4, config=extra, management_port=free_port())
        n4.start(timeout=120)
        try:
            # the new node serves the existing metadata
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", n4.port))
            ch = conn.channel()
            assert ch.queue_declare("j0", passive=True).method.message_count == 1
            conn.close()
            status, nodes = _api(c.nodes[0].management_port, "GET", "/api/nodes")
            assert status == 200 and name4 in [x["name"] for x in nodes]
            # grow every queue onto it, then rebalance leaders over the four nodes
            status, body = _api(c.nodes[1].management_port, "POST", "/api/quorum-queues/grow",
                                {"node": name4, "strategy": "all"})
            assert status == 200, body
            status, qs = _api(n4.management_port, "GET", "/api/queues/%2F")
            assert all(name4 in q["members"] for q in qs if q["name"].startswith("j")), qs
            status, body = _api(n4.management_port, "POST", "/api/quorum-queues/rebalance", {})
            assert status == 200, body
            deadline = time.monotonic() + 30
            while True:
                status, qs = _api(n4.management_port, "GET", "/api/queues/%2F")
                leaders = sorted(q["leader"] for q in qs if q["name"].startswith("j"))
                if len(set(leaders)) == 3:
                    break
                assert time.monotonic() < deadline, leaders
                time.sleep(0.2)
            # it restarts as itself (with its data: no new join)
            n4.stop()
            n4.start(timeout=120)
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", n4.port))
            ch = conn.channel()
            for i in range(3):
                method, _p, body = ch.basic_get(f"j{i}", auto_ack=True)
                assert body == b"before-join"
            conn.close()
        finally:
            n4.kill()
    finally:
        c.kill_all()
