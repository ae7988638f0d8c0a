"""Disk use stays bounded when one old message pins a quorum queue's log
(issue 13 item 4), against a real broker process: one message is held
unacknowledged while thousands after it are consumed (or purged); the
queue's segment files shrink to a few (idle snapshot + release +
compaction; a purge snapshots at once), and the held message is still
delivered intact afterwards.

`raft.snapshot_interval` is set far above the number of entries, so only
the idle-queue and after-purge snapshots can free anything here.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pika

from .broker_proc import BrokerProcess
from .test_compat import QQ, connect

CONFIG = ("raft.snapshot_interval = 1000000\n"
          "raft.wal_max_size_bytes = 65536\n"
          "raft.segment_max_entries = 32\n")
N = 2000


def _segments(data_dir: Path, queue: str) -> list[str]:
    out = []
    for gdir in (data_dir / "raft" / "groups").iterdir():
        gfile = gdir / "GROUP"
        if gfile.exists() and f"/{queue}/" in gfile.read_text():
            seg = gdir / "segments"
            out += [n for n in os.listdir(seg) if n.endswith(".segment")]
    return out


def _wait(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def _fill(b: BrokerProcess, queue: str) -> tuple[pika.BlockingConnection, bytes]:
    conn = connect(b.port)
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments=QQ)
    ch.confirm_delivery()
    for i in range(N):
        ch.basic_publish("", queue, b"m%05d" % i + b"x" * 100)
    held = conn.channel()
    method, _props, body = held.basic_get(queue, auto_ack=False)  # the old, pinning message
    assert method is not None and body.startswith(b"m00000")
    return conn, body


def _check_held(b: BrokerProcess, conn: pika.BlockingConnection, queue: str, body: bytes) -> None:
    conn.close()  # the held message returns to the queue
    c2 = connect(b.port)
    ch = c2.channel()
    assert _wait(lambda: ch.queue_declare(queue, passive=True).method.message_count == 1, 10)
    method, _props, got = ch.basic_get(queue, auto_ack=True)
    assert method is not None and got == body
    c2.close()


def test_idle_queue_releases_and_compacts_its_pinned_log(fresh_broker: BrokerProcess) -> None:
    b = fresh_broker
    b.extra_config = CONFIG
    b.start()
    q = "compact-idle"
    conn, body = _fill(b, q)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=500)
    got = 0
    for method, _props, _body in ch.consume(q, inactivity_timeout=10):
        assert method is not None, "consume stalled"
        ch.basic_ack(method.delivery_tag, multiple=True)
        got += 1
        if got == N - 1:
            break
    ch.cancel()
    before = len(_segments(b.data_dir, q))
    assert before > 20, before
    # nothing more is applied: the idle snapshot releases and compacts
    assert _wait(lambda: len(_segments(b.data_dir, q)) <= 3, 30), _segments(b.data_dir, q)
    print(f"\nidle queue: {before} segment files -> {len(_segments(b.data_dir, q))}")
    _check_held(b, conn, q, body)


def test_purge_snapshots_at_once(fresh_broker: BrokerProcess) -> None:
    b = fresh_broker
    b.extra_config = CONFIG
    b.start()
    q = "compact-purge"
    conn, body = _fill(b, q)
    before = len(_segments(b.data_dir, q))
    ch = conn.channel()
    t0 = time.monotonic()
    assert ch.queue_purge(q).method.message_count == N - 1
    # well before the idle snapshot (5 s after the last applied entry)
    assert _wait(lambda: len(_segments(b.data_dir, q)) <= 3, 4), _segments(b.data_dir, q)
    print(f"\npurge: {before} segment files -> {len(_segments(b.data_dir, q))} "
          f"in {time.monotonic() - t0:.2f} s")
    _check_held(b, conn, q, body)
