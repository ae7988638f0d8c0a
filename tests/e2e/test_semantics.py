"""Channel-level AMQP 0-9-1 semantics against a real broker process, where
RabbitMQ 4.x behaviour differs from the 3.10 node the compatibility tests use
(delivery limit by default, quorum-queue priorities), where a broker needs its
own configuration (default queue type, relaxed equivalence checks), and where
the check is on bytes (raw properties, frame splitting, large bodies).

Clients: pika's blocking adapter, its select (callback) adapter, and the raw
frame client of bench/amqp_raw.py.
"""
from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pika
from pamqp import commands
from pika.spec import BasicProperties

from bench.amqp_raw import _FRAME_HDR, FRAME_END, RawClient

from .broker_proc import BrokerProcess
from .test_compat import QQ, attempt, connect, death_summary, drain_get, fresh, wait_count


# ---------------------------------------------------------------- delivery limit / x-delivery-count
def test_default_delivery_limit_is_20_then_dead_lettered(broker: BrokerProcess) -> None:
    """4.x: quorum queues have delivery-limit 20 by default (3.10 has none: a
    message returned forever stays). The 21st return dead-letters it with
    reason delivery_limit; x-delivery-count counts returns."""
    conn = connect(broker.port)
    ch = conn.channel()
    fresh(ch, "sem-dl-target", QQ)
    fresh(ch, "sem-dl", {**QQ, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "sem-dl-target"})
    ch.confirm_delivery()
    ch.basic_publish("", "sem-dl", b"poison")
    counts = []
    for _ in range(30):
        method, props, _body = ch.basic_get("sem-dl")
        if method is None:
            break
        counts.append(((props.headers or {}).get("x-delivery-count"), method.redelivered))
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert counts == [(None, False)] + [(i, True) for i in range(1, 21)]
    assert wait_count(ch, "sem-dl-target", 1) == 1
    method, props, body = ch.basic_get("sem-dl-target", auto_ack=True)
    assert body == b"poison"
    deaths = death_summary(props.headers)
    assert [(d["reason"], d["queue"], d["count"]) for d in deaths] == [("delivery_limit", "sem-dl", 1)]
    conn.close()


def test_unlimited_delivery_limit_keeps_returning(broker: BrokerProcess) -> None:
    conn = connect(broker.port)
    ch = conn.channel()
    fresh(ch, "sem-unl", {**QQ, "x-delivery-limit": -1})
    ch.confirm_delivery()
    ch.basic_publish("", "sem-unl", b"m")
    for i in range(25):
        method, props, _ = ch.basic_get("sem-unl")
        assert method is not None, f"message gone after {i} returns"
        ch.basic_reject(method.delivery_tag, requeue=True)
    method, props, _ = ch.basic_get("sem-unl", auto_ack=True)
    assert props.headers["x-delivery-count"] == 25
    conn.close()


# ---------------------------------------------------------------- priorities (4.x quorum queues)
def test_quorum_priorities_high_before_normal(broker: BrokerProcess) -> None:
    """4.x: two levels, priority > 4 is high; highs are served first (with a
    2:1 share when both are ready). 3.10 quorum queues ignore priorities."""
    conn = connect(broker.port)
    ch = conn.channel()
    fresh(ch, "sem-prio", QQ)
    ch.confirm_delivery()
    for body, prio in [("n1", 0), ("n2", None), ("n3", 4), ("h1", 5), ("h2", 9), ("h3", 255)]:
        ch.basic_publish("", "sem-prio", body.encode(), BasicProperties(priority=prio))
    order = [b for b, _, _ in drain_get(ch, "sem-prio")]
    assert sorted(order) == ["h1", "h2", "h3", "n1", "n2", "n3"]
    assert order[:2] == ["h1", "h2"]  # highs first
    assert order.index("h3") < order.index("n2")  # at most one normal per two highs
    assert [x for x in order if x[0] == "n"] == ["n1", "n2", "n3"]  # FIFO within a level
    conn.close()


# ---------------------------------------------------------------- select adapter
def test_select_adapter_confirms_consume_ack(broker: BrokerProcess) -> None:
    """pika's callback (select) adapter: declare, confirm 20 publishes, consume
    with prefetch 5 and ack each; the queue ends empty."""
    n = 20
    state: dict[str, Any] = {"acked": [], "bodies": [], "error": None, "count": None}

    def on_open(conn: pika.SelectConnection) -> None:
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch: Any) -> None:
        state["ch"] = ch
        ch.queue_declare("sem-select", durable=True, arguments=QQ, callback=lambda _f: ch.queue_purge(
            "sem-select", callback=lambda _f2: ch.confirm_delivery(on_confirm, callback=lambda _f3: publish(ch))))

    def publish(ch: Any) -> None:
        for i in range(n):
            ch.basic_publish("", "sem-select", b"s%d" % i)

    def on_confirm(frame: Any) -> None:
        m = frame.method
        if m.NAME != "Basic.Ack":
            state["error"] = f"unexpected {m.NAME}"
        state["acked"].append((m.delivery_tag, m.multiple))
        if m.delivery_tag == n:
            ch = state["ch"]
            ch.basic_qos(prefetch_count=5, callback=lambda _f: ch.basic_consume("sem-select", on_message))

    def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
        state["bodies"].append(body)
        ch.basic_ack(method.delivery_tag)
        if len(state["bodies"]) == n:
            ch.queue_declare("sem-select", passive=True, callback=done)

    def done(frame: Any) -> None:
        state["count"] = frame.method.message_count
        state["conn"].close()

    def on_open_error(c: Any, e: Any) -> None:
        state["error"] = repr(e)
        c.ioloop.stop()

    conn = pika.SelectConnection(pika.ConnectionParameters("127.0.0.1", broker.port), on_open_callback=on_open,
                                 on_open_error_callback=on_open_error,
                                 on_close_callback=lambda c, e: c.ioloop.stop())
    state["conn"] = conn
    timer = conn.ioloop.call_later(20, conn.ioloop.stop)
    conn.ioloop.start()
    conn.ioloop.remove_timeout(timer)
    assert state["error"] is None
    assert state["bodies"] == [b"s%d" % i for i in range(n)]
    assert state["acked"][-1][0] == n  # every publish confirmed (possibly as multiple acks)
    assert state["count"] == 0


# ---------------------------------------------------------------- configuration: default type, relaxed checks
def test_default_queue_type_per_node_and_vhost_and_relaxed_checks(fresh_broker: BrokerProcess,
                                                                  tmp_path: Path) -> None:
    defs = {"users": [{"name": "guest", "password": "guest", "tags": ["administrator"]}],
            "vhosts": [{"name": "/"}, {"name": "vq", "default_queue_type": "classic"}],
            "permissions": [{"user": "guest", "vhost": v, "configure": ".*", "write": ".*", "read": ".*"}
                            for v in ("/", "vq")]}
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(defs))
    fresh_broker.extra_config = ("default_queue_type = quorum\n"
                                 "quorum_queue.property_equivalence.relaxed_checks_on_redeclaration = true\n"
                                 f"load_definitions = {path}\n")
    fresh_broker.start()
    conn = connect(fresh_broker.port)
    ch = conn.channel()
    ch.queue_declare("dq", durable=True)  # no x-queue-type: the node default, quorum
    # redeclaring as classic passes the relaxed check (strict by default: see test_compat)
    assert attempt(conn, lambda c: c.queue_declare("dq", durable=True, arguments={"x-queue-type": "classic"})
                   .method.queue) == "dq"
    assert attempt(conn, lambda c: c.queue_declare("dq", durable=False)) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'dq' in vhost '/': "
             "received 'false' but current is 'true'")
    ch.confirm_delivery()
    ch.basic_publish("", "dq", b"x")
    m, props, _ = ch.basic_get("dq")
    ch.basic_nack(m.delivery_tag, requeue=True)
    m, props, _ = ch.basic_get("dq", auto_ack=True)
    assert props.headers == {"x-delivery-count": 1}  # a quorum queue counts deliveries
    # temporaries stay classic under a quorum default
    tmp = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_declare("transient", durable=False)
    ch.queue_declare("autodel", durable=True, auto_delete=True)
    for name in (tmp, "transient", "autodel"):
        ch.basic_publish("", name, b"x")
        m, _p, _ = ch.basic_get(name)
        ch.basic_nack(m.delivery_tag, requeue=True)
        m, props, _ = ch.basic_get(name, auto_ack=True)
        assert props.headers is None, name  # classic: no x-delivery-count
    conn.close()
    # vhost 'vq' says classic
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", fresh_broker.port, "vq"))
    ch = conn.channel()
    ch.queue_declare("vq-q", durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", "vq-q", b"x")
    m, _p, _ = ch.basic_get("vq-q")
    ch.basic_nack(m.delivery_tag, requeue=True)
    m, props, _ = ch.basic_get("vq-q", auto_ack=True)
    assert props.headers is None
    conn.close()


# ---------------------------------------------------------------- bytes: properties, frames, large bodies
def _short(s: bytes) -> bytes:
    return bytes([len(s)]) + s


def _all_properties() -> bytes:
    """Every basic property, headers with many field types, hand-encoded."""
    headers = (_short(b"str") + b"S" + struct.pack(">I", 5) + b"hello"
               + _short(b"i32") + b"I" + struct.pack(">i", -7)
               + _short(b"i64") + b"l" + struct.pack(">q", 1 << 40)
               + _short(b"bool") + b"t\x01"
               + _short(b"dbl") + b"d" + struct.pack(">d", 2.5)
               + _short(b"dec") + b"D\x02" + struct.pack(">i", 12345)
               + _short(b"ts") + b"T" + struct.pack(">Q", 1700000000)
               + _short(b"void") + b"V"
               + _short(b"bytes") + b"x" + struct.pack(">I", 3) + b"\x00\xff\x01"
               + _short(b"arr") + b"A" + struct.pack(">I", 7) + b"I" + struct.pack(">i", 1) + b"t\x00"
               + _short(b"tbl") + b"F" + struct.pack(">I", 8) + _short(b"k") + b"S" + struct.pack(">I", 1) + b"v")
    flags = 0xFFFC  # all 14 property bits
    return (struct.pack(">H", flags) + _short(b"text/plain") + _short(b"gzip")
            + struct.pack(">I", len(headers)) + headers
            + b"\x02" + b"\x07" + _short(b"corr-1") + _short(b"reply-q") + _short(b"60000")
            + _short(b"msg-1") + struct.pack(">Q", 1700000001) + _short(b"type-x") + _short(b"guest")
            + _short(b"app-1") + _short(b""))


def _raw_publish(c: RawClient, rk: bytes, props: bytes, body: bytes) -> None:
    m = struct.pack(">HHHB", 60, 40, 0, 0) + _short(rk) + b"\x00"
    h = struct.pack(">HHQ", 60, 0, len(body)) + props
    out = _FRAME_HDR.pack(1, 1, len(m)) + m + FRAME_END + _FRAME_HDR.pack(2, 1, len(h)) + h + FRAME_END
    step = c.frame_max - 8
    for i in range(0, len(body), step):
        chunk = body[i:i + step]
        out += _FRAME_HDR.pack(3, 1, len(chunk)) + chunk + FRAME_END
    c.sock.sendall(out)


def _raw_get(c: RawClient, queue: str) -> tuple[bytes, bytes, int]:
    """basic.get (no-ack); returns (raw property bytes, body, body frame count)."""
    c._send(1, commands.Basic.Get(queue=queue, no_ack=True))
    frames: list[tuple[int, int, bytes]] = []
    while True:
        frames.extend(c.read_frames())
        # publisher confirms (basic.ack) may arrive in between
        methods = [f for f in frames if f[0] == 1 and struct.unpack_from(">HH", f[2]) != (60, 80)]
        if not methods:
            continue
        cls_meth = struct.unpack_from(">HH", methods[0][2])
        assert cls_meth == (60, 71), f"expected basic.get-ok, got {cls_meth}"
        headers = [f for f in frames if f[0] == 2]
        if not headers:
            continue
        size = struct.unpack_from(">Q", headers[0][2], 4)[0]
        bodies = [f[2] for f in frames if f[0] == 3]
        if sum(map(len, bodies)) >= size:
            return headers[0][2][12:], b"".join(bodies), len(bodies)


def test_all_properties_round_trip_byte_exact(broker: BrokerProcess) -> None:
    c = RawClient("127.0.0.1", broker.port)
    c.declare_quorum_queue("sem-props")
    c.purge("sem-props")
    c.confirm_select()
    props = _all_properties()
    _raw_publish(c, b"sem-props", props, b"payload")
    _raw_publish(c, b"sem-props", b"\x00\x00", b"")  # no properties, empty body
    deadline = time.monotonic() + 10
    acked = 0
    while acked < 2 and time.monotonic() < deadline:
        for ftype, _ch, payload in c.read_frames():
            if ftype == 1 and struct.unpack_from(">HH", payload) == (60, 80):
                acked = struct.unpack_from(">Q", payload, 4)[0]
    assert acked == 2
    got_props, body, _ = _raw_get(c, "sem-props")
    assert (got_props, body) == (props, b"payload")
    got_props, body, nbodies = _raw_get(c, "sem-props")
    assert (got_props, body, nbodies) == (b"\x00\x00", b"", 0)
    c.close()


def test_small_frame_max_splits_bodies(broker: BrokerProcess) -> None:
    body = bytes(range(256)) * 400  # 100 KiB
    c = RawClient("127.0.0.1", broker.port, frame_max=4096)
    assert c.frame_max == 4096
    c.declare_quorum_queue("sem-frames")
    c.purge("sem-frames")
    c.confirm_select()
    _raw_publish(c, b"sem-frames", b"\x00\x00", body)  # 26 body frames in
    got_props, got, nframes = _raw_get(c, "sem-frames")
    assert got == body
    assert nframes == -(-len(body) // (4096 - 8))  # and split to the negotiated frame_max out
    c.close()
    # pika with a small frame_max too
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port, frame_max=4096))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "sem-frames", body)
    _m, _p, got = ch.basic_get("sem-frames", auto_ack=True)
    assert got == body
    conn.close()


def test_consumed_big_bodies_are_split_and_interleave_with_small_ones(broker: BrokerProcess) -> None:
    """Deliveries of bodies of 16 KiB and more are written from the stored
    body (vectored), the others as one joined buffer: with a 4 KiB frame_max
    every size, each side of the threshold and both kinds in one write, comes
    out whole, in order, to a pika consumer."""
    import random

    rng = random.Random(1616)
    sizes = [0, 1, 4088, 4089, 16383, 16384, 16385, 65536, 100_000, 1 << 20]
    sizes += [rng.choice([rng.randrange(0, 300), rng.randrange(16384, 200_000)]) for _ in range(30)]
    bodies = [rng.randbytes(n) for n in sizes]
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port, frame_max=4096))
    ch = conn.channel()
    fresh(ch, "sem-vectored", QQ)
    ch.confirm_delivery()
    for b in bodies:
        ch.basic_publish("", "sem-vectored", b, BasicProperties(delivery_mode=2))
    got: list[bytes] = []
    ch.basic_qos(prefetch_count=100)
    ch.basic_consume("sem-vectored", lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    deadline = time.monotonic() + 60
    while len(got) < len(bodies) and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert [len(b) for b in got] == sizes
    assert got == bodies
    ch.queue_delete("sem-vectored")
    conn.close()


def test_20_mib_message(broker: BrokerProcess) -> None:
    body = (b"0123456789abcdef" * 65536) * 20  # 20 MiB
    conn = connect(broker.port)
    ch = conn.channel()
    fresh(ch, "sem-big", QQ)
    ch.confirm_delivery()
    ch.basic_publish("", "sem-big", body, BasicProperties(delivery_mode=2))
    got: list[bytes] = []
    ch.basic_consume("sem-big", lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert len(got) == 1 and got[0] == body
    ch.queue_delete("sem-big")
    conn.close()


# ---------------------------------------------------------------- tx and confirms
def test_tx_publish_invisible_until_commit_and_acks_in_tx(broker: BrokerProcess) -> None:
    conn = connect(broker.port)
    ch = conn.channel()
    fresh(ch, "sem-tx", QQ)
    ch.tx_select()
    for i in range(5):
        ch.basic_publish("", "sem-tx", b"%d" % i)
    assert ch.queue_declare("sem-tx", passive=True).method.message_count == 0
    ch.tx_commit()  # commit-ok only after every publish is committed in the queue
    assert ch.queue_declare("sem-tx", passive=True).method.message_count == 5
    tags = [ch.basic_get("sem-tx")[0].delivery_tag for _ in range(5)]
    ch.basic_ack(tags[2], multiple=True)
    ch.basic_reject(tags[3], requeue=True)
    ch.tx_rollback()   # both undone: five still unacked here
    ch.basic_ack(tags[-1], multiple=True)
    ch.tx_commit()
    assert ch.queue_declare("sem-tx", passive=True).method.message_count == 0
    assert ch.basic_get("sem-tx")[0] is None
    conn.close()


def test_confirms_cover_every_routed_queue_and_unroutable(broker: BrokerProcess) -> None:
    """A publish routed to two queues is confirmed once both have it; an
    unroutable one is confirmed at once (after the mandatory return)."""
    conn = connect(broker.port)
    ch = conn.channel()
    ch.exchange_declare("sem-fan", "fanout")
    fresh(ch, "sem-fan-a", QQ)
    fresh(ch, "sem-fan-b", QQ)
    ch.queue_bind("sem-fan-a", "sem-fan")
    ch.queue_bind("sem-fan-b", "sem-fan")
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("sem-fan", "", b"%d" % i)
    assert ch.queue_declare("sem-fan-a", passive=True).method.message_count == 50
    assert ch.queue_declare("sem-fan-b", passive=True).method.message_count == 50
    conn.close()


# ---------------------------------------------------------------- queue TTL (x-expires)
def test_x_expires_deletes_unused_queues_only(broker: BrokerProcess) -> None:
    """x-expires: a queue unused (no consumers, no basic.get) for that long is
    deleted, quorum and classic alike; one with a consumer stays until the
    consumer goes. (RabbitMQ checks quorum queues on its 5 s tick; we tick
    every min(x-expires, 1 s) on the leader while there are no consumers.)"""
    conn = connect(broker.port)
    ch = conn.channel()
    ch.queue_declare("sem-exp-q", durable=True, arguments={**QQ, "x-expires": 300})
    ch.queue_declare("sem-exp-c", arguments={"x-expires": 300})
    ch.queue_declare("sem-exp-kept", durable=True, arguments={**QQ, "x-expires": 300})
    keeper = conn.channel()
    tag = keeper.basic_consume("sem-exp-kept", lambda *a: None)
    t0 = time.monotonic()

    def gone(name: str) -> bool:
        return isinstance(attempt(conn, lambda c: c.queue_declare(name, passive=True)), tuple)

    for name in ("sem-exp-q", "sem-exp-c"):
        deadline = time.monotonic() + 15
        while not gone(name):
            assert time.monotonic() < deadline, f"{name} did not expire"
            conn.process_data_events(0.05)
    assert time.monotonic() - t0 >= 0.3
    assert attempt(conn, lambda c: c.queue_declare("sem-exp-kept", passive=True).method.consumer_count) == 1
    keeper.basic_cancel(tag)
    deadline = time.monotonic() + 15
    while not gone("sem-exp-kept"):
        assert time.monotonic() < deadline, "sem-exp-kept did not expire after its consumer left"
        conn.process_data_events(0.05)
    conn.close()


# ---------------------------------------------------------------- single active consumer + priorities (4.x)
def test_sac_higher_priority_consumer_takes_over(broker: BrokerProcess) -> None:
    """4.x: under single active consumer, a waiting consumer with a higher
    x-priority takes over once the active one has settled what it holds
    (3.10 ignores consumer priority for SAC)."""
    conn = connect(broker.port)
    ch = conn.channel()
    fresh(ch, "sem-sac", {**QQ, "x-single-active-consumer": True})
    ch.confirm_delivery()
    got: list[tuple[str, bytes, int]] = []
    low = conn.channel()
    low.basic_qos(prefetch_count=1)
    low.basic_consume("sem-sac", lambda c, m, p, b: got.append(("low", b, m.delivery_tag)),
                      arguments={"x-priority": 1})
    ch.basic_publish("", "sem-sac", b"m0")
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        conn.process_data_events(0.01)
    assert [(who, body) for who, body, _ in got] == [("low", b"m0")]
    high = conn.channel()
    high.basic_qos(prefetch_count=1)
    high.basic_consume("sem-sac", lambda c, m, p, b: got.append(("high", b, m.delivery_tag)),
                       arguments={"x-priority": 10})
    ch.basic_publish("", "sem-sac", b"m1")
    # the low consumer still holds m0: it is quiescing, so m1 waits for the switch
    assert ch.queue_declare("sem-sac", passive=True).method.message_count == 1
    low.basic_ack(got[0][2])
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        conn.process_data_events(0.01)
    assert [(who, body) for who, body, _ in got] == [("low", b"m0"), ("high", b"m1")]
    conn.close()
