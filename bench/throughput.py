"""End-to-end throughput of one quorum queue: 1 KiB persistent messages,
publisher confirms with a window of 1,000 in flight, a consumer with prefetch
1,000 acking with `multiple` every 100. Publisher and consumer run in separate
processes on raw frames (bench/amqp_raw.py) so the client is not the limit.

    .venv/bin/python bench/throughput.py                 # ours and RabbitMQ, 1 and 3 nodes
    .venv/bin/python bench/throughput.py --setups ours,rabbitmq --messages 200000
    .venv/bin/python bench/throughput.py --setups ours-cluster --failover
    .venv/bin/python bench/throughput.py --setups "" --target mine=127.0.0.1:5672

Prints, per target: messages/s end to end, p50/p99 publish->consume latency,
and the ratio to RabbitMQ when both ran.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing as mp
import os
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
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


def run_one(label: str, host: str, port: int, *, n: int, size: int, window: int,
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


@contextlib.contextmanager
def our_broker(nodes: int) -> Iterator[list[int]]:
    """Start our broker (1 node, or a 3-node cluster) on free ports; yield AMQP ports."""
    from tests.cluster.conftest import Cluster
    from tests.e2e.broker_proc import BrokerProcess

    with tempfile.TemporaryDirectory(prefix="qq-bench-") as d:
        if nodes == 1:
            b = BrokerProcess(Path(d) / "n1", env={"QQ_LOG_LEVEL": "WARNING"}).start()
            try:
                yield [b.port]
            finally:
                b.stop()
        else:
            c = Cluster(Path(d), size=nodes)
            for n in c.nodes:
                n.env["QQ_LOG_LEVEL"] = "WARNING"
            c.start()
            try:
                yield [n.port for n in c.nodes]
            finally:
                c.stop()


@contextlib.contextmanager
def rabbitmq(nodes: int) -> Iterator[list[int]]:
    """A throw-away RabbitMQ node, or `nodes` of them joined into one cluster."""
    with tempfile.TemporaryDirectory(prefix="qq-bench-rmq-") as d:
        started = []
        try:
            for i in range(nodes):
                started.append(rabbitmq_local.start_node(
                    Path(d) / f"r{i}", 5700 + i, f"qqbench{os.getpid()}r{i}@localhost"))
            for n in started[1:]:
                for cmd in (["stop_app"], ["join_cluster", started[0].name], ["start_app"]):
                    r = n.ctl(*cmd)
                    if r.returncode != 0:
                        raise RuntimeError(f"rabbitmqctl {' '.join(cmd)}: {r.stderr}")
            yield [n.port for n in started]
        finally:
            for n in reversed(started):
                n.stop()


def failover(window_s: float = 60.0) -> None:
    """kill -9 the queue leader's node of our 3-node cluster while a publisher on
    another node publishes with confirms (one at a time); print the gap between
    the kill and the next confirm."""
    from tests.cluster.conftest import Cluster

    with tempfile.TemporaryDirectory(prefix="qq-bench-fo-") as d:
        c = Cluster(Path(d))
        for n in c.nodes:
            n.env["QQ_LOG_LEVEL"] = "WARNING"
        c.start()
        try:
            setup = RawClient("127.0.0.1", c.nodes[0].port)
            setup.declare_quorum_queue("failover")  # declared on node 1: its leader (client-local)
            setup.close()
            pub = RawClient("127.0.0.1", c.nodes[1].port)
            pub.confirm_select()
            killed = None
            for i in range(100000):
                if i == 200:
                    c.nodes[0].kill()
                    killed = time.monotonic()
                pub.sock.sendall(RawClient.publish_frames(b"failover", b"x" * 1024))
                acked = False
                while not acked:
                    for ftype, _ch, p in pub.read_frames():
                        if ftype == 1 and struct.unpack_from(">HH", p) in ((60, 80), (60, 120)):
                            acked = True
                if killed is not None:
                    print(f"failover: first confirm {time.monotonic() - killed:.2f} s after kill -9 "
                          f"of the leader's node", flush=True)
                    break
        finally:
            c.kill_all()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--prefetch", type=int, default=1000)
    ap.add_argument("--ack-every", type=int, default=100)
    ap.add_argument("--target", action="append", default=[], help="label=host:port (repeatable)")
    ap.add_argument("--setups", default="ours,rabbitmq,ours-cluster,rabbitmq-cluster",
                    help="comma-separated: ours, rabbitmq, ours-cluster, rabbitmq-cluster")
    ap.add_argument("--failover", action="store_true", help="also measure failover time (3 nodes)")
    args = ap.parse_args()
    run = functools.partial(run_one, n=args.messages, size=args.size, window=args.window,
                            prefetch=args.prefetch, ack_every=args.ack_every)

    results: dict[str, dict[str, float]] = {}
    for t in args.target:
        label, _, hp = t.partition("=")
        host, _, port = hp.rpartition(":")
        results[label] = run(label, host, int(port))
    setups = [s for s in args.setups.split(",") if s]
    have_rmq = rabbitmq_local.installed()
    for setup in setups:
        if setup.startswith("rabbitmq") and not have_rmq:
            print(f"{setup}: rabbitmq-server is not installed; skipped", flush=True)
            continue
        nodes = 3 if setup.endswith("cluster") else 1
        ctx = our_broker(nodes) if setup.startswith("ours") else rabbitmq(nodes)
        with ctx as ports:
            results[setup] = run(setup, "127.0.0.1", ports[0])
    for ours, theirs in (("ours", "rabbitmq"), ("ours-cluster", "rabbitmq-cluster")):
        if ours in results and theirs in results:
            print(f"ratio {ours}/{theirs}: {results[ours]['rate'] / results[theirs]['rate']:.2f}")
    if args.failover:
        failover()
    return 0


if __name__ == "__main__":
    sys.exit(main())
