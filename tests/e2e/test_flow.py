"""Publisher flow control against a real broker process: a connection stops
being read while its publishes waiting for their queues weigh more than
`channel.HIGH_WATER` (one per message plus one per 4 KiB of body), and the
management API shows it in state "flow", as RabbitMQ shows a connection
held by credit flow. Big bodies weigh by their size: 2,000 pipelined 64 KiB
publishes (far fewer messages than the limit of 4,000 small ones) hold the
connection; every one is confirmed and in the queue afterwards.
"""
from __future__ import annotations

import base64
import json
import threading
import urllib.request
from typing import Any

from bench.amqp_raw import RawClient

from .broker_proc import BrokerProcess, free_port
from .test_compat import QQ, connect

QUEUE = "flow"


def _connection_states(b: BrokerProcess) -> list[str]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{b.management_port}/api/connections",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return [c["state"] for c in json.loads(resp.read())]


def _flood(b: BrokerProcess, n: int, size: int) -> set[str]:
    """Send n pipelined publishes of `size` bytes with confirms from one raw
    connection while watching the connections' states; returns the states
    seen, once every publish is confirmed."""
    c = RawClient("127.0.0.1", b.port)
    c.confirm_select()
    frames = RawClient.publish_frames(QUEUE.encode(), b"x" * size)
    sent = threading.Event()
    errors: list[BaseException] = []

    def send() -> None:
        try:
            for _ in range(n):
                c.sock.sendall(frames)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            sent.set()

    threading.Thread(target=send, daemon=True).start()
    seen: set[str] = set()
    while not sent.is_set():
        seen.update(_connection_states(b))
    assert not errors, errors
    confirmed = max((tag for tag, _multiple in c.read_confirms(n, 60)), default=0)
    c.close()
    assert confirmed == n
    return seen


def test_big_bodies_hold_a_publishing_connection_by_their_size(tmp_path: Any) -> None:
    b = BrokerProcess(tmp_path / "node", management_port=free_port())
    try:
        b.start()
        conn = connect(b.port)
        ch = conn.channel()
        ch.queue_declare(QUEUE, durable=True, arguments=QQ)
        seen = _flood(b, 2000, 64 * 1024)
        assert "flow" in seen, f"states seen while flooding: {seen}"
        assert ch.queue_declare(QUEUE, passive=True).method.message_count == 2000
        assert set(_connection_states(b)) == {"running"}  # the hold ends with the flood
        conn.close()
    finally:
        b.stop()
