"""A far-behind member catches up from a snapshot that carries the bodies of
the live messages below the snapshot index, then serves them as leader."""
from __future__ import annotations

import time

import pika
import pytest

from .conftest import Cluster

pytestmark = pytest.mark.slow


def _conn(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))


def test_far_behind_member_installs_snapshot_with_live_bodies(tmp_path) -> None:
    c = Cluster(tmp_path, extra="raft.snapshot_interval = 100\n").start()
    try:
        conn = _conn(c.nodes[0].port)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("snap", durable=True, arguments={"x-queue-type": "quorum"})
        c.nodes[2].stop()
        # > 4096 commands so the machine reports a release cursor and the
        # leader snapshots; half of the messages stay live below the snapshot.
        for i in range(3000):
            ch.basic_publish("", "snap", b"body-%d" % i)
        taken = 0
        for method, _p, body in ch.consume("snap", inactivity_timeout=10):
            assert method is not None
            assert body == b"body-%d" % taken
            ch.basic_ack(method.delivery_tag)
            taken += 1
            if taken == 1500:
                break
        ch.cancel()
        for i in range(3000, 3200):
            ch.basic_publish("", "snap", b"body-%d" % i)
        conn.close()
        leader_snaps = list((tmp_path / "n1" / "raft" / "groups").rglob("*.snapshot"))
        assert leader_snaps, "the leader took no snapshot"

        c.nodes[2].start()
        snaps = tmp_path / "n3" / "raft" / "groups"
        deadline = time.monotonic() + 60
        while not [p for p in snaps.rglob("*.snapshot") if "__metadata__" not in str(p)]:
            assert time.monotonic() < deadline, "the restarted member installed no snapshot"
            time.sleep(0.1)
        # Make the caught-up member the only source: stop the two others one at a
        # time after it has the whole log, and read everything from it.
        conn3 = _conn(c.nodes[2].port)
        ch3 = conn3.channel()
        while ch3.queue_declare("snap", passive=True).method.message_count != 1700:
            assert time.monotonic() < deadline, "member did not catch up"
            time.sleep(0.1)
        conn3.close()
        c.nodes[0].stop()  # the leader goes; node 3 or node 2 leads
        conn3 = _conn(c.nodes[2].port)
        ch3 = conn3.channel()
        got = []
        for method, _p, body in ch3.consume("snap", inactivity_timeout=20):
            assert method is not None, f"stalled after {len(got)}"
            got.append(body)
            ch3.basic_ack(method.delivery_tag)
            if len(got) == 1700:
                break
        assert got == [b"body-%d" % i for i in range(1500, 3200)]
        conn3.close()
    finally:
        c.kill_all()
