"""End-to-end throughput of one quorum queue: 1 KiB persistent messages,
publisher confirms with a window of 1,000 in flight, a consumer with prefetch
1,000 acking with `multiple` every 100. Publisher and consumer run in separate
processes on raw frames (bench/amqp_raw.py) so the client is not the limit.

    .venv/bin/python bench/throughput.py                      # our broker (+ RabbitMQ if installed)
    .venv/bin/python bench/throughput.py --target rmq=127.0.0.1:5700
    .venv/bin/python bench/throughput.py --messages 200000 --no-rabbitmq

Prints, per target: messages/s end to end, p50/p99 publish->consume latency,
and the ratio to RabbitMQ when both ran.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import rabbitmq_local  # noqa: E402
from bench.amqp_raw import RawClient  # noqa: E402

_TS = struct.Struct(">Q")


def publisher(host: str, port: int, queue: str, n: int, size: int, window: int,
              ready: mp.synchronize.Event, out: mp.Queue) -> None:  # type: ignore[name-defined]
    c = RawClient(host, port)
    c.confirm_select()
    ready.wait()
    rk = queue.encode()
    pad = b"x" * (size - 8)
    sent = confirmed = nacked = 0
    last_acked = 0
    t0 = time.monotonic()
    while confirmed + nacked < n:
        burst = min(window - (sent - confirmed - nacked), n - sent, 100)
        if burst > 0:
            c.sock.sendall(b"".join(
                RawClient.publish_frames(rk, _TS.pack(time.monotonic_ns()) + pad) for _ in range(burst)))
            sent += burst
            if sent - confirmed - nacked < window and sent < n:
                continue
        for ftype, _ch, p in c.read_frames():
            if ftype != 1:
                continue
            cls, meth = struct.unpack_from(">HH", p)
            if cls == 60 and meth in (80, 120):  # basic.ack / basic.nack
                tag, bits = struct.unpack_from(">QB", p, 4)
                count = tag - last_acked if bits & 1 else 1
                last_acked = max(last_acked, tag)
                if meth == 80:
                    confirmed += count
                else:
                    nacked += count
            elif cls in (10, 20) and meth == 40:
                raise SystemExit(f"publisher: closed by server: {p!r}")
    out.put(("pub", confirmed, nacked, time.monotonic() - t0))
    c.close()


def consumer(host: str, port: int, queue: str, n: int, prefetch: int, ack_every: int,
             ready: mp.synchronize.Event, out: mp.Queue) -> None:  # type: ignore[name-defined]
    c = RawClient(host, port)
    c.qos(prefetch)
    c.consume(queue)
    ready.set()
    got = 0
    tag = 0
    lat: list[int] = []
    remaining = -1
    body_start = b""
    first = None
    while got < n:
        for ftype, _ch, p in c.read_frames():
            if ftype == 1:
                cls, meth = struct.unpack_from(">HH", p)
                if cls == 60 and meth == 60:  # basic.deliver
                    ctag_len = p[4]
                    (tag,) = struct.unpack_from(">Q", p, 5 + ctag_len)
                    remaining = -1
                    body_start = b""
                elif cls in (10, 20) and meth == 40:
                    raise SystemExit(f"consumer: closed by server: {p!r}")
            elif ftype == 2:
                (remaining,) = struct.unpack_from(">Q", p, 4)
                if remaining == 0:
                    got += 1
            elif ftype == 3:
                if not body_start:
                    body_start = p[:8]
                remaining -= len(p)
                if remaining == 0:
                    now = time.monotonic_ns()
                    if first is None:
                        first = now
                    lat.append(now - _TS.unpack(body_start)[0])
                    got += 1
                    if got % ack_every == 0 or got == n:
                        c.sock.sendall(RawClient.ack_frame(tag, True))
    out.put(("con", got, first, time.monotonic_ns(), lat))
    c.close()


def run_one(label: str, host: str, port: int, n: int, size: int, window: int,
            prefetch: int, ack_every: int) -> dict[str, float]:
    queue = "qq-bench"
    setup = RawClient(host, port)
    setup.declare_quorum_queue(queue)
    setup.purge(queue)
    setup.close()
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    cons = ctx.Process(target=consumer, args=(host, port, queue, n, prefetch, ack_every, ready, out))
    pub = ctx.Process(target=publisher, args=(host, port, queue, n, size, window, ready, out))
    t0 = time.monotonic()
    cons.start()
    pub.start()
    results = {}
    for _ in range(2):
        item = out.get(timeout=600)
        results[item[0]] = item
    pub.join()
    cons.join()
    wall = time.monotonic() - t0
    _, got, first_ns, last_ns, lat = results["con"]
    _, confirmed, nacked, pub_s = results["pub"]
    lat.sort()
    p50 = lat[len(lat) // 2] / 1e6
    p99 = lat[int(len(lat) * 0.99)] / 1e6
    rate = got / ((last_ns - first_ns) / 1e9) if last_ns > first_ns else float("nan")
    print(f"{label:>10}: {rate:10,.0f} msg/s end to end | confirms {confirmed:,} "
          f"(nacked {nacked}) in {pub_s:.1f}s | p50 {p50:.1f} ms, p99 {p99:.1f} ms | wall {wall:.1f}s",
          flush=True)
    cleanup = RawClient(host, port)
    cleanup.delete_queue(queue)
    cleanup.close()
    return {"rate": rate, "p50": p50, "p99": p99}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--prefetch", type=int, default=1000)
    ap.add_argument("--ack-every", type=int, default=100)
    ap.add_argument("--target", action="append", default=[], help="label=host:port (repeatable)")
    ap.add_argument("--no-rabbitmq", action="store_true", help="do not start a RabbitMQ node for comparison")
    args = ap.parse_args()

    results: dict[str, dict[str, float]] = {}
    for t in args.target:
        label, _, hp = t.partition("=")
        host, _, port = hp.rpartition(":")
        results[label] = run_one(label, host, int(port), args.messages, args.size, args.window,
                                 args.prefetch, args.ack_every)
    if not args.target:
        print("our broker: the node runtime is not built yet; pass --target to measure one", flush=True)
    if not args.no_rabbitmq and rabbitmq_local.installed():
        with tempfile.TemporaryDirectory(prefix="qq-bench-rmq-") as d:
            node = rabbitmq_local.start_node(Path(d), 5700, f"qqbench{os.getpid()}@localhost")
            try:
                results["rabbitmq"] = run_one("rabbitmq", "127.0.0.1", 5700, args.messages, args.size,
                                              args.window, args.prefetch, args.ack_every)
            finally:
                node.stop()
    ours = [k for k in results if k != "rabbitmq"]
    if "rabbitmq" in results:
        for k in ours:
            print(f"ratio {k}/rabbitmq: {results[k]['rate'] / results['rabbitmq']['rate']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
