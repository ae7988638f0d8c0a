"""Benchmark: AMQP hot-path codec cost, pamqp (generic) vs broker.amqp fast path.

Prints the per-message cost of decoding basic.publish + content header + 1 KiB
body and of encoding basic.deliver + content header + body, plus basic.ack
decoding, for pamqp, for the bare fast-path functions and for the full
ServerConnection (framing, validation, events). Best of --repeat runs, in
process CPU time (stable on a shared 2-core box) with wall time alongside.

    .venv/bin/python bench/amqp_codec.py [--messages 20000] [--repeat 3] [--body 1024]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from pamqp import body as pbody
from pamqp import commands as C
from pamqp import frame as pframe
from pamqp import header as pheader

from broker.amqp import (
    NEED_DATA,
    ServerConnection,
    decode_content_header,
    decode_publish,
    encode_deliver,
    validate_properties,
)
from broker.amqp.codec import decode_ack


def props() -> C.Basic.Properties:
    return C.Basic.Properties(
        content_type="application/json",
        delivery_mode=2,
        headers={"trace-id": "abc123", "attempt": 1},
        message_id="msg-0001",
        timestamp=None,
    )


def publish_bytes(body: bytes, n: int) -> bytes:
    p = props()
    one = (
        pframe.marshal(C.Basic.Publish(exchange="amq.direct", routing_key="orders"), 1)
        + pframe.marshal(pheader.ContentHeader(0, len(body), p), 1)
        + pframe.marshal(pbody.ContentBody(body), 1)
    )
    return one * n


def bench(fn: Callable[[], int], repeat: int) -> tuple[list[float], list[float]]:
    """Run fn (which returns the number of messages it handled) `repeat` times;
    return (CPU seconds per message, wall seconds per message) for each run.
    CPU time is the stable number on a shared machine; wall time is shown too."""
    cpu, wall = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        n = fn()
        cpu.append((time.process_time() - c0) / n)
        wall.append((time.perf_counter() - w0) / n)
    return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--body", type=int, default=1024)
    args = ap.parse_args()
    n, body = args.messages, bytes(range(256)) * (args.body // 256) + b"x" * (args.body % 256)
    stream = publish_bytes(body, n)
    one_len = len(stream) // n

    frames = []
    pos = 0
    for _ in range(3):
        size = int.from_bytes(stream[pos + 3 : pos + 7], "big")
        frames.append(stream[pos + 7 : pos + 7 + size])
        pos += size + 8
    m_payload, h_payload, b_payload = frames
    m_frame = stream[: len(m_payload) + 8]
    h_frame = stream[len(m_frame) : len(m_frame) + len(h_payload) + 8]
    b_frame = stream[len(m_frame) + len(h_frame) : one_len]

    def pamqp_decode() -> int:
        # pure unmarshal cost of the three frames (no stream splitting)
        unmarshal = pframe.unmarshal
        for _ in range(n):
            unmarshal(m_frame)
            unmarshal(h_frame)
            unmarshal(b_frame)
        return n

    def fast_decode_funcs() -> int:
        for _ in range(n):
            decode_publish(m_payload)
            _c, _w, size, raw = decode_content_header(h_payload)
            validate_properties(raw)
            assert size == len(b_payload)
        return n

    def machine_decode() -> int:
        conn = ServerConnection()
        conn.receive_data(b"AMQP\x00\x00\x09\x01")
        conn.next_event()
        conn.receive_data(
            pframe.marshal(C.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\0u\0p"), 0)
        )
        conn.next_event()
        conn.accept_login()
        conn.receive_data(pframe.marshal(C.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0), 0))
        conn.next_event()
        conn.receive_data(pframe.marshal(C.Connection.Open(virtual_host="/"), 0))
        conn.next_event()
        conn.accept_open()
        conn.receive_data(pframe.marshal(C.Channel.Open(), 1))
        conn.next_event()
        count = 0
        chunk = 65536
        for i in range(0, len(stream), chunk):
            conn.receive_data(stream[i : i + chunk])
            while conn.next_event() is not NEED_DATA:
                count += 1
        assert count == n, count
        return count

    p = props()
    raw = p.marshal()

    def pamqp_encode() -> int:
        for i in range(n):
            b"".join(
                (
                    pframe.marshal(
                        C.Basic.Deliver(consumer_tag="ctag-1", delivery_tag=i + 1, redelivered=False,
                                        exchange="amq.direct", routing_key="orders"),
                        1,
                    ),
                    pframe.marshal(pheader.ContentHeader(0, len(body), p), 1),
                    pframe.marshal(pbody.ContentBody(body), 1),
                )
            )
        return n

    def fast_encode() -> int:
        for i in range(n):
            encode_deliver(1, "ctag-1", i + 1, False, "amq.direct", "orders", raw, body, 131072)
        return n

    conn2 = ServerConnection()
    # drive conn2 to OPEN with channel 1 for send_deliver
    for data in (
        b"AMQP\x00\x00\x09\x01",
        pframe.marshal(C.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\0u\0p"), 0),
    ):
        conn2.receive_data(data)
        conn2.next_event()
    conn2.accept_login()
    for data in (
        pframe.marshal(C.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0), 0),
        pframe.marshal(C.Connection.Open(virtual_host="/"), 0),
    ):
        conn2.receive_data(data)
        conn2.next_event()
    conn2.accept_open()
    conn2.receive_data(pframe.marshal(C.Channel.Open(), 1))
    conn2.next_event()
    conn2.data_to_send()

    def machine_encode() -> int:
        for i in range(n):
            conn2.send_deliver(1, "ctag-1", i + 1, False, "amq.direct", "orders", raw, body)
        return n

    ack = pframe.marshal(C.Basic.Ack(delivery_tag=12345, multiple=False), 1)

    def pamqp_ack() -> int:
        for _ in range(n):
            pframe.unmarshal(ack)
        return n

    ack_payload = ack[7:-1]

    def fast_ack() -> int:
        for _ in range(n):
            decode_ack(ack_payload)
        return n

    rows = [
        ("decode publish+header+body", "pamqp frame.unmarshal", pamqp_decode),
        ("decode publish+header+body", "fast path functions", fast_decode_funcs),
        ("decode publish+header+body", "ServerConnection (events)", machine_decode),
        ("encode deliver+header+body", "pamqp frame.marshal", pamqp_encode),
        ("encode deliver+header+body", "fast encode_deliver", fast_encode),
        ("encode deliver+header+body", "ServerConnection.send_deliver", machine_encode),
        ("decode basic.ack", "pamqp frame.unmarshal", pamqp_ack),
        ("decode basic.ack", "fast decode_ack", fast_ack),
    ]
    print(f"messages={n} body={len(body)}B repeat={args.repeat}: best run; spread = worst/best - 1 (CPU time)")
    print(f"{'operation':28} {'implementation':31} {'CPU us/msg':>10} {'msgs/s/core':>11} {'spread':>6} {'wall us':>8}")
    for op, impl, fn in rows:
        cpu, wall = bench(fn, args.repeat)
        best = min(cpu)
        spread = max(cpu) / best - 1
        print(f"{op:28} {impl:31} {best * 1e6:10.2f} {1 / best:11,.0f} {spread:6.0%} {min(wall) * 1e6:8.2f}")


if __name__ == "__main__":
    main()
