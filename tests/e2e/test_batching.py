"""Publishes that arrive together share a Raft entry (runtime/queues.py
`QuorumQueue.propose`), against a real broker process: 300 pipelined
publishes with confirms are all confirmed, the storage manifest shows the
queue's live messages held by fewer entries than messages, and after a
kill -9 and a restart (nothing cached: every body is read back from the
batch entries on disk) a consumer gets every message intact, in order;
acknowledged messages of a batch entry stay gone while the rest of the
entry is delivered again.
"""
from __future__ import annotations

import base64
import json
import time
import urllib.request
from typing import Any

from bench.amqp_raw import RawClient

from .broker_proc import BrokerProcess, free_port
from .test_compat import QQ, connect

N = 300
QUEUE = "batched"


def _body(i: int) -> bytes:
    return b"b%04d-" % i + bytes([i % 251]) * (i % 97)


def _publish_pipelined(port: int) -> int:
    """All N publishes in one write; returns the highest confirmed number."""
    c = RawClient("127.0.0.1", port)
    c.confirm_select()
    c.sock.sendall(b"".join(RawClient.publish_frames(QUEUE.encode(), _body(i)) for i in range(N)))
    confirmed = 0
    for tag, multiple in c.read_confirms(N, 30):
        assert multiple or tag == confirmed + 1, "confirms come in order"
        confirmed = max(confirmed, tag)
    c.close()
    return confirmed


def _storage(b: BrokerProcess) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{b.management_port}/api/nodes/{b.name}/storage",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=30) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return next(g for g in doc["groups"] if g["queue"] == QUEUE)


def test_pipelined_publishes_share_entries_and_survive_kill_9(tmp_path: Any) -> None:
    b = BrokerProcess(tmp_path / "node", management_port=free_port())
    try:
        b.start()
        conn = connect(b.port)
        conn.channel().queue_declare(QUEUE, durable=True, arguments=QQ)
        conn.close()
        assert _publish_pipelined(b.port) == N

        group = _storage(b)
        assert group["live_messages"] == N
        entries = group["live_log_entries"]
        assert 0 < entries < N, f"{N} messages in {entries} entries: nothing was batched"

        # ack the first 10 (they share an entry with others), then kill -9
        conn = connect(b.port)
        ch = conn.channel()
        for i in range(10):
            method, _props, body = ch.basic_get(QUEUE, auto_ack=False)
            assert method is not None and body == _body(i)
            ch.basic_ack(method.delivery_tag)
        ch.queue_declare(QUEUE, passive=True)  # a round trip: the acks are applied
        b.kill()

        b.start()
        conn = connect(b.port)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=50)
        got: list[bytes] = []
        redelivered: list[bool] = []

        def on_message(c: Any, m: Any, _p: Any, body: bytes) -> None:
            got.append(body)
            redelivered.append(m.redelivered)
            c.basic_ack(m.delivery_tag)

        ch.basic_consume(QUEUE, on_message)
        deadline = time.monotonic() + 30
        while len(got) < N - 10 and time.monotonic() < deadline:
            conn.process_data_events(0.05)
        assert got == [_body(i) for i in range(10, N)]
        assert not any(redelivered)
        assert ch.queue_declare(QUEUE, passive=True).method.message_count == 0
        conn.close()
    finally:
        b.kill()
