"""An unauthenticated peer sending garbage to a running broker's peer port
(issue 15): each such connection is dropped, nothing is logged as an
unhandled error, the cluster stays healthy and an AMQP client keeps
publishing with confirms to a quorum queue replicated over the very peer
links under attack. (The decoders themselves are fuzzed in
tests/runtime/test_peer_fuzz.py.)"""
from __future__ import annotations

import random
import re
import socket
import struct
import time

import msgpack
import pika

from .conftest import Cluster


def peer_port(c: Cluster, i: int) -> int:
    found = re.search(r"^cluster\.port = (\d+)$", c.nodes[i].extra_config, re.M)
    assert found
    return int(found.group(1))


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


_rng = random.Random(1515)
GARBAGE = [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    struct.pack(">I", 2**31) + b"\x00" * 16,  # absurd length
    frame(b"\xc1\xc1\xc1"),  # not msgpack
    frame(b"\x81\x91\x01\x02"),  # a map keyed by an array (raised TypeError before)
    frame(b"\x91" * 3000),  # nested too deep
    frame(msgpack.packb({"v": 1, "node": "rabbit@evil", "challenge": b"\x00" * 16,
                         "proof": b"\x00" * 32})),  # well formed, wrong proof
    frame(msgpack.packb([["r", ["AppendEntries"]]])),  # a batch before any handshake
    struct.pack(">I", 5000) + b"\x00" * 5000,  # over the handshake's 4 KiB bound
    *(bytes(_rng.randrange(256) for _ in range(_rng.randrange(1, 600))) for _ in range(12)),
]


def send_garbage(port: int, garbage: bytes) -> None:
    """Connect, take the challenge, send `garbage`: the node must hang up."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        header = s.recv(4, socket.MSG_WAITALL)
        assert len(header) == 4
        s.recv(struct.unpack(">I", header)[0], socket.MSG_WAITALL)  # the challenge
        try:
            s.sendall(garbage)
            s.shutdown(socket.SHUT_WR)
            while s.recv(4096):  # an error frame may come first, then EOF
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass  # dropped while we were still writing: as good


def publish_confirmed(ch: pika.adapters.blocking_connection.BlockingChannel, start: int, n: int) -> None:
    for i in range(start, start + n):
        ch.basic_publish("", "garbage-q", str(i).encode(), pika.BasicProperties(delivery_mode=2),
                         mandatory=True)


def test_garbage_on_the_peer_port_is_dropped_and_the_cluster_keeps_working(cluster3: Cluster) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster3.nodes[0].port))
    ch = conn.channel()
    ch.queue_declare("garbage-q", durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    publish_confirmed(ch, 0, 20)
    log_offsets = [n.log_path.stat().st_size for n in cluster3.nodes]

    started = time.monotonic()
    for i in range(3):
        for garbage in GARBAGE:
            send_garbage(peer_port(cluster3, i), garbage)
        publish_confirmed(ch, 20 + 10 * i, 10)  # replication over the peer links goes on
    assert time.monotonic() - started < 60

    assert all(n.proc is not None and n.proc.poll() is None for n in cluster3.nodes)
    reader = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster3.nodes[2].port))
    rch = reader.channel()
    bodies = []
    while True:
        method, _props, body = rch.basic_get("garbage-q", auto_ack=True)
        if method is None:
            break
        bodies.append(int(body))
    assert bodies == list(range(50))
    for node, offset in zip(cluster3.nodes, log_offsets, strict=True):
        with open(node.log_path, "rb") as f:
            f.seek(offset)
            new = f.read().decode(errors="replace")
        assert "Traceback" not in new and "Unhandled exception" not in new, new[-3000:]
        assert "refused unauthenticated peer" in new  # and it said so
    reader.close()
    conn.close()
