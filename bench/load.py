"""Load generator for the side-by-side report (bench/report.py): P publisher
and C consumer processes on raw frames (bench/amqp_raw.py) over Q quorum
queues, against any AMQP 0-9-1 broker.

Publishers send persistent messages with confirms (a window of in-flight
messages each), rotating over the queues; consumers subscribe to their share
of the queues with a prefetch and ack with `multiple` every `ack_every`.
Every body starts with the monotonic publish time, so consumers measure
publish->deliver latency. A row either publishes for `duration` seconds while
consumers drain (steady state), or, with `backlog`, publishes that many
messages with no consumer and then consumes them all.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from bench.amqp_raw import RawClient

_TS = struct.Struct(">Q")
# In-flight bytes per client, so 1 MiB rows do not put a gigabyte in flight.
_INFLIGHT_BYTES = 64 << 20


@dataclass(frozen=True)
class Workload:
    name: str
    size: int
    queues: int = 1
    pairs: int = 1
    duration: float = 10.0
    backlog: int = 0

    @property
    def window(self) -> int:
        """Confirms in flight per publisher: 1,000, fewer for big bodies."""
        return max(8, min(1000, _INFLIGHT_BYTES // max(self.size, 1)))

    @property
    def prefetch(self) -> int:
        return self.window

    @property
    def ack_every(self) -> int:
        return max(1, min(100, self.prefetch // 10))


def publish(host: str, port: int, queues: list[str], size: int, window: int, *,
            duration: float = 0.0, count: int = 0, go: Any = None) -> tuple[int, int, float, float]:
    """Publish to `queues` in turn, `count` messages or for `duration` seconds,
    with at most `window` unconfirmed; wait for every confirm. Returns
    (confirmed, nacked, start, end) in time.monotonic() seconds."""
    c = RawClient(host, port)
    c.confirm_select()
    if go is not None:
        go.wait()
    rks = [q.encode() for q in queues]
    pad = b"x" * max(0, size - 8)
    fm = c.frame_max
    sent = confirmed = nacked = 0
    # Confirms may come out of order (one queue's single ack before another's
    # `multiple` ack covering lower tags): count each tag once.
    pending: deque[int] = deque()  # unconfirmed tags, in publish order
    single: set[int] = set()  # tags confirmed one by one, still in `pending`
    t0 = time.monotonic()
    end = t0 + duration if count == 0 else float("inf")
    i = 0

    def more() -> bool:
        return sent < count if count else time.monotonic() < end

    while True:
        sending = more()
        if not sending and confirmed + nacked >= sent:
            break
        burst = min(window - (sent - confirmed - nacked), 100) if sending else 0
        if count:
            burst = min(burst, count - sent)
        if burst > 0:
            frames = []
            for _ in range(burst):
                frames.append(RawClient.publish_frames(
                    rks[i % len(rks)], _TS.pack(time.monotonic_ns()) + pad, frame_max=fm))
                i += 1
                pending.append(i)
            c.sock.sendall(b"".join(frames))
            sent += burst
            if sent - confirmed - nacked < window and more():
                continue
        for ftype, _ch, p in c.read_frames():
            if ftype != 1:
                continue
            cls, meth = struct.unpack_from(">HH", p)
            if cls == 60 and meth in (80, 120):  # basic.ack / basic.nack
                tag, bits = struct.unpack_from(">QB", p, 4)
                n = 0
                if bits & 1:
                    while pending and pending[0] <= tag:
                        t = pending.popleft()
                        if t in single:
                            single.discard(t)
                        else:
                            n += 1
                elif tag not in single and pending and pending[0] <= tag:
                    single.add(tag)
                    n = 1
                while pending and pending[0] in single:
                    single.discard(pending.popleft())
                if meth == 80:
                    confirmed += n
                else:
                    nacked += n
            elif cls in (10, 20) and meth == 40:
                raise SystemExit(f"publisher: closed by server: {p!r}")
    end_t = time.monotonic()
    c.close()
    return confirmed, nacked, t0, end_t


def consume(host: str, port: int, queues: list[str], prefetch: int, ack_every: int, *,
            count: int | None = None, target: Any = None, total: Any = None,
            ready: Any = None) -> tuple[int, int, int, list[int]]:
    """Consume from `queues`, acking with `multiple` every `ack_every`: until
    `count` messages, or, shared between consumer processes, until `total`
    (an mp.Value this adds to) reaches `target` (an mp.Value, -1 until the
    publishers know it) or nothing came for 30 s after that. Returns (got,
    first and last delivery in monotonic ns, publish->deliver latencies)."""
    c = RawClient(host, port)
    c.qos(prefetch)
    for j, q in enumerate(queues):
        c.consume(q, tag=f"c{j}")
    c.sock.settimeout(0.25)
    if ready is not None:
        ready.set()
    got = unacked = 0
    tag = 0
    lat: list[int] = []
    remaining = -1
    body_start = b""
    first = last = 0
    idle_since = time.monotonic()
    while True:
        if count is not None:
            if got >= count:
                break
        elif target.value >= 0 and (total.value >= target.value or time.monotonic() - idle_since > 30):
            break
        try:
            frames = c.read_frames()
        except TimeoutError:
            if unacked:
                c.sock.sendall(RawClient.ack_frame(tag, True))
                unacked = 0
            continue
        n0 = got
        for ftype, _ch, p in frames:
            if ftype == 1:
                cls, meth = struct.unpack_from(">HH", p)
                if cls == 60 and meth == 60:  # basic.deliver
                    (tag,) = struct.unpack_from(">Q", p, 5 + p[4])
                    remaining = -1
                    body_start = b""
                elif cls in (10, 20) and meth == 40:
                    raise SystemExit(f"consumer: closed by server: {p!r}")
            elif ftype == 2:
                (remaining,) = struct.unpack_from(">Q", p, 4)
            elif ftype == 3:
                if not body_start:
                    body_start = p[:8]
                remaining -= len(p)
                if remaining == 0:
                    now = time.monotonic_ns()
                    first = first or now
                    last = now
                    lat.append(now - _TS.unpack(body_start)[0])
                    got += 1
                    unacked += 1
                    if unacked >= ack_every:
                        c.sock.sendall(RawClient.ack_frame(tag, True))
                        unacked = 0
        if got != n0:
            idle_since = time.monotonic()
            if total is not None:
                with total.get_lock():
                    total.value += got - n0
    if unacked:
        c.sock.sendall(RawClient.ack_frame(tag, True))
    c.sock.settimeout(None)
    c.close()
    return got, first, last, lat


def _publisher(out: Any, *args: Any, **kw: Any) -> None:
    res = publish(*args, **kw)
    out.put(("pub", *res, time.process_time()))  # + this client's CPU seconds


def _consumer(out: Any, *args: Any, **kw: Any) -> None:
    res = consume(*args, **kw)
    out.put(("con", *res, time.process_time()))


class RssSampler:
    """Peak resident memory (sum over the broker's OS processes), sampled every 0.2 s."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def rss(pids: list[int]) -> int:
        total = 0
        page = os.sysconf("SC_PAGE_SIZE")
        for pid in pids:
            try:
                with open(f"/proc/{pid}/statm") as f:
                    total += int(f.read().split()[1]) * page
            except OSError:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self.rss(self.pids))

    def __enter__(self) -> RssSampler:
        self.peak = self.rss(self.pids)
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def _pct(sorted_ns: list[int], q: float) -> float:
    if not sorted_ns:
        return float("nan")
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q))] / 1e6


def run(wl: Workload, host: str, ports: list[int], pids: list[int],
        consume: bool = True) -> dict[str, float]:
    """Run one row; returns rate (msg/s end to end), publish rate, latency
    percentiles (ms) and the brokers' peak RSS (MiB). With `consume` false
    (backlog rows only) the messages stay in their queues."""
    port = ports[0]
    queues = [f"bench-{wl.name}-{i}" for i in range(wl.queues)]
    setup = RawClient(host, port)
    for q in queues:
        setup.declare_quorum_queue(q)
        setup.purge(q)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    go = ctx.Event()
    target = ctx.Value("q", -1)
    total = ctx.Value("q", 0)
    res: dict[str, float] = {}
    with RssSampler(pids) as rss:
        pubs = [ctx.Process(target=_publisher, args=(
            out, host, port, queues[i::wl.pairs] or queues, wl.size, wl.window), kwargs=dict(
            duration=wl.duration, go=go,
            count=(wl.backlog // wl.pairs + (1 if i < wl.backlog % wl.pairs else 0)) if wl.backlog else 0,
        )) for i in range(wl.pairs)]
        for p in pubs:
            p.start()
        pub_results = []
        cons: list[Any] = []
        if not wl.backlog:
            cons = _start_consumers(ctx, wl, host, port, queues, target, total, out)
        go.set()
        for _ in pubs:
            pub_results.append(out.get(timeout=3600))
        for p in pubs:
            p.join()
        confirmed = sum(r[1] for r in pub_results)
        nacked = sum(r[2] for r in pub_results)
        p_start = min(r[3] for r in pub_results)
        p_end = max(r[4] for r in pub_results)
        res["publish_rate"] = confirmed / (p_end - p_start)
        if not consume:
            setup.close()
            res.update(confirmed=confirmed, nacked=nacked)
            return res
        if wl.backlog:
            res["backlog_rss_mib"] = RssSampler.rss(pids) / 2**20
            depth = sum(setup.depth(q) for q in queues)
            res["depth"] = depth
            cons = _start_consumers(ctx, wl, host, port, queues, target, total, out)
        target.value = confirmed
        con_results = [out.get(timeout=3600) for _ in cons]
        for p in cons:
            p.join()
    got = sum(r[1] for r in con_results)
    first = min(r[2] for r in con_results if r[2]) if got else 0
    last = max(r[3] for r in con_results) if got else 0
    lat = sorted(x for r in con_results for x in r[4])
    # the clients' CPU, in cores over the run (they share the machine with the brokers)
    res["publishers_cpu"] = sum(r[5] for r in pub_results) / max(p_end - p_start, 1e-9)
    res["consumers_cpu"] = sum(r[5] for r in con_results) / max((last - first) / 1e9, 1e-9)
    res.update(
        rate=got / ((last - first) / 1e9) if last > first else float("nan"),
        confirmed=confirmed, nacked=nacked, consumed=got,
        p50=_pct(lat, 0.50), p95=_pct(lat, 0.95), p99=_pct(lat, 0.99),
        rss_peak_mib=rss.peak / 2**20,
    )
    for q in queues:
        setup.delete_queue(q)
    setup.close()
    return res


def _start_consumers(ctx: Any, wl: Workload, host: str, port: int, queues: list[str],
                     target: Any, total: Any, out: Any) -> list[Any]:
    procs = []
    readies = []
    for i in range(wl.pairs):
        ready = ctx.Event()
        mine = queues[i::wl.pairs] or queues
        p = ctx.Process(target=_consumer, args=(out, host, port, mine, wl.prefetch, wl.ack_every),
                        kwargs=dict(target=target, total=total, ready=ready))
        p.start()
        procs.append(p)
        readies.append(ready)
    for r in readies:
        if not r.wait(120):
            raise RuntimeError("a consumer did not subscribe within 120 s")
    return procs
