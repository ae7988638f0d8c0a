"""Node loss in a real 3-node cluster: kill -9 the queue leader's node while a
publisher (confirms) and a consumer (acks) on the surviving nodes keep going.

Checks what the Jepsen queue checker checks: every confirmed message is
consumed at least once (lost = confirmed - consumed is empty) and nothing
appears that was never published (unexpected is empty); duplicates are
counted and reported, not failed."""
from __future__ import annotations

import threading
import time

import pika
import pytest

from .conftest import Cluster

pytestmark = pytest.mark.slow


def _conn(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0,
                                                             blocked_connection_timeout=60))


def _leader_index(c: Cluster, queue: str) -> int:
    """The declaring node is the leader (client-local): node 0 declares."""
    return 0


class Consumer(threading.Thread):
    def __init__(self, port: int, queue: str) -> None:
        super().__init__(daemon=True)
        self.port, self.queue = port, queue
        self.seen: list[int] = []
        self.redelivered = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = _conn(self.port)
            ch = conn.channel()
            ch.basic_qos(prefetch_count=50)
            for method, _props, body in ch.consume(self.queue, inactivity_timeout=0.2):
                if self.stop.is_set():
                    break
                if method is None:
                    continue
                self.seen.append(int(body))
                self.redelivered += method.redelivered
                ch.basic_ack(method.delivery_tag)
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_kill_leader_while_publishing_and_consuming(tmp_path) -> None:
    c = Cluster(tmp_path).start()
    try:
        admin = _conn(c.nodes[0].port)
        admin.channel().queue_declare("jepsen", durable=True, arguments={"x-queue-type": "quorum"})
        admin.close()
        consumer = Consumer(c.nodes[2].port, "jepsen")
        consumer.start()
        pub = _conn(c.nodes[1].port)
        ch = pub.channel()
        ch.confirm_delivery()
        confirmed: list[int] = []
        published: list[int] = []
        killed_at = None
        first_confirm_after_kill = None
        for i in range(600):
            if i == 300:
                c.nodes[_leader_index(c, "jepsen")].kill()
                killed_at = time.monotonic()
            published.append(i)
            try:
                ch.basic_publish("", "jepsen", str(i).encode(), pika.BasicProperties(delivery_mode=2))
            except pika.exceptions.NackError:
                continue
            confirmed.append(i)
            if killed_at is not None and first_confirm_after_kill is None:
                first_confirm_after_kill = time.monotonic()
        pub.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not set(confirmed) <= set(consumer.seen):
            assert consumer.error is None, consumer.error
            time.sleep(0.05)
        consumer.stop.set()
        consumer.join(10)
        lost = set(confirmed) - set(consumer.seen)
        unexpected = set(consumer.seen) - set(published)
        duplicates = len(consumer.seen) - len(set(consumer.seen))
        failover = (first_confirm_after_kill or 0) - (killed_at or 0)
        print(f"\nconfirmed={len(confirmed)} consumed={len(consumer.seen)} "
              f"duplicates={duplicates} redelivered={consumer.redelivered} failover={failover:.2f}s")
        assert not lost, f"confirmed but never consumed: {sorted(lost)[:20]}"
        assert not unexpected
        assert len(confirmed) >= 550  # confirms resumed after the kill
    finally:
        c.kill_all()


def test_frozen_follower_then_resumed_and_full_restart_keeps_everything(tmp_path) -> None:
    c = Cluster(tmp_path).start()
    try:
        conn = _conn(c.nodes[0].port)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("frozen", durable=True, arguments={"x-queue-type": "quorum"})
        for i in range(100):
            ch.basic_publish("", "frozen", b"a%d" % i)
        # SIGSTOP a follower: the other two still form a quorum and confirm.
        c.nodes[2].freeze()
        t0 = time.monotonic()
        for i in range(100):
            ch.basic_publish("", "frozen", b"b%d" % i)
        confirm_time = time.monotonic() - t0
        c.nodes[2].thaw()
        # The resumed follower catches up: its node serves the whole queue.
        conn3 = _conn(c.nodes[2].port)
        ch3 = conn3.channel()
        deadline = time.monotonic() + 30
        while ch3.queue_declare("frozen", passive=True).method.message_count != 200:
            assert time.monotonic() < deadline, "follower did not catch up"
            time.sleep(0.05)
        conn3.close()
        conn.close()
        print(f"\n100 confirms with a frozen follower took {confirm_time:.2f}s")
        # Restart every node: everything confirmed is still there, in order.
        c.stop()
        c.start()
        conn = _conn(c.nodes[1].port)
        ch = conn.channel()
        bodies = []
        for method, _props, body in ch.consume("frozen", inactivity_timeout=15):
            assert method is not None, f"timed out after {len(bodies)} messages"
            bodies.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(bodies) == 200:
                break
        assert bodies == [b"a%d" % i for i in range(100)] + [b"b%d" % i for i in range(100)]
        conn.close()
    finally:
        c.kill_all()
