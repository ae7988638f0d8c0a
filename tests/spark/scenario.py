"""Real data for the audit tests: a 3-node cluster with tiny segments and WAL
files, and a workload that leaves every kind of disk usage behind (seeded).

- `orders`: 400 messages; the first 10 stay unacknowledged by a consumer
  that keeps its channel open, the rest are acknowledged: after snapshots,
  the old segments are pinned by those 10.
- `dlx-src`: at-least-once dead lettering to a missing target queue: 30
  rejected messages stay in the source queue, held by dead-lettering.
- `churn`: 300 messages, all acknowledged: nothing live.
- `shrunk`: its member on rabbit-2 is deleted (the runtime deletes its log).
- `gone`: deleted while rabbit-3 is stopped (second phase): its directory on
  rabbit-3 is an orphan.
"""
from __future__ import annotations

import random
import urllib.parse
from pathlib import Path
from typing import Any

import pika

from tests.mgmt.conftest import MgmtCluster, wait_for

CONFIG = ("raft.segment_max_entries = 16\n"
          "raft.wal_max_size_bytes = 65536\n"
          "raft.snapshot_interval = 64\n")
QQ = {"x-queue-type": "quorum"}
# Dead letters go to a queue that does not exist: the at-least-once worker
# keeps retrying, so they stay in the source queue, pinning its segments.
DLX_ARGS = {**QQ, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlx-nowhere",
            "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}


def connect(c: MgmtCluster, i: int = 0) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", c.nodes[i].port,
                                                             heartbeat=0))


def publish(ch: Any, queue: str, n: int, rng: random.Random) -> None:
    for k in range(n):
        body = (f"{queue}-{k}-".encode() + rng.randbytes(rng.randint(200, 2000)))
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))


def drain_ack(ch: Any, queue: str, n: int) -> None:
    got = 0
    while got < n:
        method, _props, _body = ch.basic_get(queue, auto_ack=False)
        if method is None:
            continue
        ch.basic_ack(method.delivery_tag)
        got += 1


class Workload:
    """Phase 1 runs with all three nodes; the holder connection stays open so
    its unacknowledged messages stay live."""

    def __init__(self, c: MgmtCluster, seed: int = 12) -> None:
        self.c = c
        self.rng = random.Random(seed)
        self.holder: pika.BlockingConnection | None = None
        self.held: list[int] = []

    def phase1(self) -> None:
        c, rng = self.c, self.rng
        conn = connect(c)
        ch = conn.channel()
        ch.confirm_delivery()
        for q, args in (("orders", QQ), ("dlx-src", DLX_ARGS), ("dlx-target", QQ),
                        ("churn", QQ), ("shrunk", QQ), ("gone", QQ)):
            ch.queue_declare(q, durable=True, arguments=args)
        publish(ch, "orders", 400, rng)
        # The holder takes the first 10 and never acknowledges them.
        self.holder = connect(c, 1)
        hch = self.holder.channel()
        hch.basic_qos(prefetch_count=10)
        hch.basic_consume("orders", lambda _c, m, _p, _b: self.held.append(m.delivery_tag),
                          consumer_tag="stuck-consumer")
        wait_for(lambda: (self.holder.process_data_events(0.05), len(self.held) >= 10)[1],
                 what="held deliveries")
        drain_ack(ch, "orders", 390)
        self.purge("orders")  # a purge makes the machine emit a release cursor: snapshot
        publish(ch, "dlx-src", 60, rng)
        for k in range(60):
            method = None
            while method is None:
                method, _p, _b = ch.basic_get("dlx-src", auto_ack=False)
            if k % 2 == 0:
                ch.basic_reject(method.delivery_tag, requeue=False)
            else:
                ch.basic_ack(method.delivery_tag)
        self.purge("dlx-src")
        publish(ch, "churn", 300, rng)
        drain_ack(ch, "churn", 300)
        self.purge("churn")
        publish(ch, "shrunk", 100, rng)
        publish(ch, "gone", 100, rng)
        conn.close()
        status, _ = c.apis[0].delete(f"/api/queues/%2F/shrunk/members/{urllib.parse.quote(c.names[1])}")
        assert status == 204, status

    def purge(self, queue: str) -> None:
        status, _ = self.c.apis[0].delete(f"/api/queues/%2F/{queue}/contents")
        assert status == 204, status

    def phase2(self) -> None:
        """rabbit-3 stops; `gone` is deleted; `orders` grows."""
        c = self.c
        c.nodes[2].stop()
        status, _ = c.apis[0].delete("/api/queues/%2F/gone")
        assert status == 204, status
        conn = connect(c)
        ch = conn.channel()
        ch.confirm_delivery()
        publish(ch, "orders", 200, self.rng)
        conn.close()

    def close(self) -> None:
        if self.holder is not None and self.holder.is_open:
            self.holder.close()


def storage_dir(c: MgmtCluster, i: int) -> Path:
    return c.nodes[i].data_dir / "raft"
