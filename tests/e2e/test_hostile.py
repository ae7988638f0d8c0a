"""Hostile input against a real broker process, compared with RabbitMQ 3.10.

Every scenario runs while a well-behaved client (`Bystander`: pika, a quorum
queue of its own, publisher confirms) keeps publishing on the same broker;
each test checks the bystander made progress after the attack and, at the
end, that every message the broker confirmed to it is in its queue, in order.

Where our reply differs from RabbitMQ's the test says so and why; the
differences found in broker/amqp are listed in the task report.
"""
from __future__ import annotations

import os
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pamqp import commands as C
from pamqp import frame as pframe

from .broker_proc import BrokerProcess
from .test_connection import HEADER, Closed, Wire, both, opened

QQ = {"x-queue-type": "quorum"}


class Bystander:
    """A well-behaved pika client publishing with confirms in a thread."""

    def __init__(self, port: int, queue: str) -> None:
        self.port = port
        self.queue = queue
        self.confirmed: list[int] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._cond = threading.Condition()

    def _connect(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port))

    def _run(self) -> None:
        try:
            conn = self._connect()
            ch = conn.channel()
            ch.confirm_delivery()
            i = 0
            # paced (~200/s) so that verifying does not dominate the test time
            while not self._stop.wait(0.005):
                ch.basic_publish("", self.queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))
                with self._cond:
                    self.confirmed.append(i)
                    self._cond.notify_all()
                i += 1
            conn.close()
        except BaseException as exc:  # reported by progressed()/stop()
            self.error = exc
            with self._cond:
                self._cond.notify_all()

    def start(self) -> Bystander:
        conn = self._connect()
        conn.channel().queue_declare(self.queue, durable=True, arguments=QQ)
        conn.close()
        self._thread.start()
        self.progressed()
        return self

    def progressed(self, by: int = 5, timeout: float = 20.0) -> None:
        """Wait until `by` more publishes were confirmed."""
        with self._cond:
            target = len(self.confirmed) + by
            ok = self._cond.wait_for(lambda: len(self.confirmed) >= target or self.error is not None,
                                     timeout)
        assert self.error is None, f"the bystander failed: {self.error!r}"
        assert ok, f"the bystander made no progress in {timeout}s ({len(self.confirmed)} confirmed)"

    def stop_and_verify(self) -> None:
        """Every confirmed message is in the queue, in publish order."""
        self._stop.set()
        self._thread.join(30)
        assert self.error is None, f"the bystander failed: {self.error!r}"
        conn = self._connect()
        try:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=1000)
            count = ch.queue_declare(self.queue, passive=True).method.message_count
            got = []
            for method, _props, body in ch.consume(self.queue, inactivity_timeout=10):
                assert method is not None, f"got {len(got)} of {count} messages"
                got.append(int(body))
                if len(got) == count:
                    ch.basic_ack(method.delivery_tag, multiple=True)
                    break
            ch.cancel()
            # anything published after the last confirm may be there too
            assert got[:len(self.confirmed)] == self.confirmed
            ch.queue_delete(self.queue)
        finally:
            conn.close()


@pytest.fixture
def bystander(defs_broker: BrokerProcess, request: pytest.FixtureRequest) -> Iterator[Bystander]:
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in request.node.name)
    b = Bystander(defs_broker.port, f"bystander-{name}"[:200]).start()
    yield b
    b.stop_and_verify()


def _seeded_junk(seed: int, n: int = 200) -> bytes:
    rnd = random.Random(seed)
    return bytes(rnd.randrange(256) for _ in range(n))


# ---------------------------------------------------------------- before the handshake
def test_random_bytes_instead_of_a_header(defs_broker: BrokerProcess, rabbitmq_defs: int,
                                          bystander: Bystander) -> None:
    def scenario(port: int) -> list[bytes]:
        out = []
        for seed in range(5):
            with Wire(port) as w:
                w.send(_seeded_junk(seed))
                out.append(w.drain_until_closed())
        return out

    ours, theirs = both(defs_broker, rabbitmq_defs, scenario)
    assert ours == theirs == [HEADER] * 5
    bystander.progressed()


# ---------------------------------------------------------------- after the handshake
def _attack(port: int, data: bytes, answer: bool = True, **handshake: Any) -> Any:
    """Open a connection and channel 1, send `data`; the close it causes (or
    'closed' if the socket was closed without a close frame). With `answer`,
    reply close-ok and check the server then hangs up."""
    with opened(port, **handshake) as w:
        w.open_channel()
        w.send(data)
        try:
            reply = w.close_reply()
        except Closed:
            return "closed"
        if answer and reply[0] == 0:  # a connection.close: answer it, the server must hang up
            w.send_method(0, C.Connection.CloseOk())
            assert w.drain_until_closed() == b""
        return reply


def test_random_bytes_after_the_handshake(defs_broker: BrokerProcess, rabbitmq_defs: int,
                                          bystander: Bystander) -> None:
    def scenario(port: int) -> list[Any]:
        # no close-ok: it would be swallowed as part of the huge "frame"
        return [_attack(port, _seeded_junk(seed), answer=False) for seed in range(5)]

    ours, theirs = both(defs_broker, rabbitmq_defs, scenario)
    assert ours == theirs
    assert {r[1] for r in ours} == {501}   # random frame sizes are all far above frame_max
    bystander.progressed()


PUBLISH = struct.pack(">HHHB", 60, 40, 0, 0) + b"\x01q\x00"  # basic.publish to '' with key 'q'


@pytest.mark.parametrize("data,reply", [
    # frame larger than the negotiated frame_max (4096)
    (Wire.raw_frame(1, 1, b"\x00" * 5000),
     (0, 501, "FRAME_ERROR - type 1, all octets = <<>>: {frame_too_large,5000,4088}", 0, 0)),
    # a method on a channel that was never opened
    (pframe.marshal(C.Queue.Declare(queue="x"), 7),
     (0, 504, "CHANNEL_ERROR - expected 'channel.open'", 50, 10)),
    # a content header / body without basic.publish before it
    (Wire.raw_frame(2, 1, struct.pack(">HHQH", 60, 0, 3, 0)),
     (0, 505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0)),
    (Wire.raw_frame(3, 1, b"abc"),
     (0, 505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0)),
    # basic.publish followed by a method instead of the content header
    (Wire.raw_frame(1, 1, PUBLISH) + Wire.raw_frame(1, 1, struct.pack(">HHHB", 60, 10, 0, 0) + b"\x00\x00"),
     (0, 505, "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame "
              "instead", 60, 40)),
    # a content header of another class
    (Wire.raw_frame(1, 1, PUBLISH) + Wire.raw_frame(2, 1, struct.pack(">HHQH", 50, 0, 3, 0)),
     (0, 505, "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead",
      60, 40)),
    # the header announces 3 body bytes, a method arrives instead of the rest
    (Wire.publish_frames("q", b"", declared_size=3)
     + Wire.raw_frame(1, 1, struct.pack(">HHHB", 60, 10, 0, 0) + b"\x00\x00"),
     (0, 505, "UNEXPECTED_FRAME - expected content body, got non content body frame instead", 60, 40)),
    (Wire.raw_frame(8, 1, b""), (0, 505, "UNEXPECTED_FRAME - type 8, all octets = <<>>", 0, 0)),
    (Wire.raw_frame(9, 1, b"abc"), (0, 501, "FRAME_ERROR - type 9, all octets = <<\"abc\">>: unknown_frame",
                                    0, 0)),
    (Wire.raw_frame(1, 1, b"\x00"), (0, 501, "FRAME_ERROR - type 1, all octets = <<0>>: unknown_frame", 0, 0)),
    (Wire.raw_frame(1, 1, struct.pack(">HH", 50, 10) + b"\x00\x00\xff"),
     (0, 501, "FRAME_ERROR - cannot decode <<0,0,255>>", 50, 10)),
    (Wire.raw_frame(1, 1, struct.pack(">HH", 20, 10) + b"\x00"),
     (0, 504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)),
], ids=["oversized-frame", "unopened-channel", "header-without-publish", "body-without-publish",
        "method-instead-of-header", "header-of-other-class", "method-instead-of-body",
        "heartbeat-on-channel", "unknown-frame-type", "short-method-frame", "undecodable-method",
        "channel-open-twice"])
def test_protocol_violations_get_rabbitmqs_reply(defs_broker: BrokerProcess, rabbitmq_defs: int,
                                                 bystander: Bystander, data: bytes,
                                                 reply: tuple[Any, ...]) -> None:
    ours, theirs = both(defs_broker, rabbitmq_defs, lambda port: _attack(port, data, frame_max=4096))
    assert ours == theirs == reply
    bystander.progressed()


def test_body_larger_than_announced(defs_broker: BrokerProcess, rabbitmq_defs: int,
                                    bystander: Bystander) -> None:
    """The header announces 3 bytes, a 5-byte body frame arrives. Both close
    the connection with 505 UNEXPECTED_FRAME; RabbitMQ only notices at the next
    frame ("expected content body, got non content body frame instead": it keeps
    waiting for a body that can never add up), we at once with our own text."""
    data = Wire.publish_frames("q", b"hello", declared_size=3) + Wire.raw_frame(
        1, 1, struct.pack(">HHIHB", 60, 10, 0, 1, 0))  # then basic.qos
    ours, theirs = both(defs_broker, rabbitmq_defs, lambda port: _attack(port, data))
    assert ours[:2] == theirs[:2] == (0, 505)
    assert ours[2] == "UNEXPECTED_FRAME - content body larger than declared: got 5 bytes, 3 remaining"
    assert theirs[2] == "UNEXPECTED_FRAME - expected content body, got non content body frame instead"
    bystander.progressed()


def test_unknown_method(defs_broker: BrokerProcess, rabbitmq_defs: int, bystander: Bystander) -> None:
    """RabbitMQ drops the socket without a reply on a method id it does not
    know; we say 540 NOT_IMPLEMENTED first. Either way the connection ends."""
    data = Wire.raw_frame(1, 1, struct.pack(">HH", 60, 99))
    ours, theirs = both(defs_broker, rabbitmq_defs, lambda port: _attack(port, data))
    assert theirs == "closed"
    assert ours == (0, 540, "NOT_IMPLEMENTED - unknown method {60,99}", 60, 99)
    bystander.progressed()


def test_queue_names_outside_pamqps_alphabet(defs_broker: BrokerProcess, rabbitmq_defs: int,
                                              bystander: Bystander) -> None:
    """RabbitMQ takes any UTF-8 queue name up to 255 bytes (pamqp's client-side
    pattern is narrower): declare, publish, get and delete them."""
    names = ["a[b] é", "заказы", "q" * 255, "tab\there", "emoji-\U0001f600"]

    def scenario(port: int) -> list[Any]:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        out: list[Any] = []
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            for name in names:
                declared = ch.queue_declare(name, durable=True, arguments=QQ).method.queue
                ch.basic_publish("", name, name.encode())
                body = ch.basic_get(name, auto_ack=True)[2]
                ch.queue_delete(name)
                out.append((declared, body))
        finally:
            conn.close()
        return out

    ours, theirs = both(defs_broker, rabbitmq_defs, scenario)
    assert ours == theirs == [(n, n.encode()) for n in names]
    bystander.progressed()


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_truncated_frames_then_close_leak_nothing(defs_broker: BrokerProcess, rabbitmq_defs: int,
                                                  bystander: Bystander) -> None:
    """Half a frame, then the client half-closes (the server must hang up) or
    closes: after 30 such connections the broker holds no more sockets than before."""
    publish = Wire.publish_frames("q", b"x" * 100)

    def half_close(port: int, cut: int) -> bytes:
        with opened(port) as w:
            w.open_channel()
            w.send(publish[:cut])
            w.sock.shutdown(socket.SHUT_WR)
            return w.drain_until_closed()

    cuts = [1, 7, 12, len(publish) - 1]
    ours, theirs = both(defs_broker, rabbitmq_defs, lambda port: [half_close(port, c) for c in cuts])
    assert ours == theirs == [b""] * len(cuts)

    assert defs_broker.proc is not None
    pid = defs_broker.proc.pid
    before = _open_fds(pid)
    for i in range(30):
        w = opened(defs_broker.port)
        w.open_channel()
        w.send(publish[: 1 + i * 3 % (len(publish) - 1)])
        w.sock.close()
    deadline = time.monotonic() + 10
    while _open_fds(pid) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _open_fds(pid) <= before
    bystander.progressed()


# ---------------------------------------------------------------- a client that never reads
def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _roundtrip(port: int, queue: str) -> None:
    """Another client: 5 confirmed publishes and 5 gets on its own queue."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True, arguments=QQ)
        for i in range(5):
            ch.basic_publish("", queue, b"%d" % i)
        got = [ch.basic_get(queue, auto_ack=True)[2] for _ in range(5)]
        assert got == [b"%d" % i for i in range(5)]
    finally:
        conn.close()


def test_slow_consumer_that_never_reads_is_bounded(tmp_path: Path) -> None:
    """A no-ack consumer that never reads its socket, on a queue receiving
    8 x 32 MiB: the broker stops pushing to it (it got at most the no-ack
    credit plus what the socket buffers hold), the broker's RSS levels off
    (it grew by ~40 MiB per round before the fix), and another client's
    confirmed publishes and gets keep working after every round. x-max-length
    keeps the queue itself small and a 4 MiB WAL keeps the log's memory small,
    so RSS measures buffering."""
    broker = BrokerProcess(tmp_path / "node", config="raft.wal_max_size_bytes = 4194304\n").start()
    try:
        assert broker.proc is not None
        pid = broker.proc.pid
        with opened(broker.port) as pub:
            slow = Wire(broker.port)
            # A fixed receive buffer (4 MiB asked, 8 MiB with the kernel's
            # bookkeeping): autotuning may grow it to tcp_rmem's maximum (32
            # MiB here), and then what the kernel holds, not the broker's
            # credit, decides how many deliveries the client never read
            # (518 once under a loaded full run).
            slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            slow.handshake()
            slow.open_channel()
            pub.open_channel()
            pub.send_method(1, C.Queue.Declare(queue="slow", durable=True,
                                               arguments={**QQ, "x-max-length": 10}))
            pub.expect(C.Queue.DeclareOk)
            pub.send_method(1, C.Confirm.Select())
            pub.expect(C.Confirm.SelectOk)
            slow.send_method(1, C.Basic.Consume(queue="slow", no_ack=True))
            slow.expect(C.Basic.ConsumeOk)
            batch = Wire.publish_frames("slow", b"y" * 65536) * 512   # 32 MiB
            rss, published = [], 0
            for _ in range(8):
                pub.send(batch)
                published += 512
                confirmed = 0
                while confirmed < published:
                    _, m = pub.read(timeout=60)
                    assert not isinstance(m, C.Basic.Nack | C.Connection.Close | C.Channel.Close), m
                    if isinstance(m, C.Basic.Ack):
                        confirmed = m.delivery_tag
                rss.append(_rss_mib(pid))
                _roundtrip(broker.port, "slow-other")
            # the slow client now reads what the broker sent it: few deliveries
            delivered = 0
            while True:
                try:
                    _, m = slow.read(timeout=2.0)
                except TimeoutError:
                    break
                if isinstance(m, C.Basic.Deliver):
                    delivered += 1
            slow.sock.close()
        # no-ack credit (256) + what fits in the socket buffers (<= 12 MiB: 8 + 4 sending)
        assert delivered <= 256 + 256, f"{delivered} of {published} messages were pushed to a client that never read"
        # Before the fix every byte published went to the slow client's write
        # buffer (RSS +40 MiB per 32 MiB round, without end). Now RSS levels off
        # once the queue's body cache is full (64 MiB: the slow client's
        # unsettled deliveries pin the bodies published after them), by the
        # 4th round: the last 3 rounds (96 MiB) must add less than half that.
        # (It also grew ~25 MiB a round while glibc's default, a dynamic mmap
        # threshold and no trimming, carved 64 KiB bodies from a fragmenting
        # heap; app.tune_malloc now fixes the thresholds and a thread trims
        # the heap: ~230 MiB, level from the 5th round.)
        assert rss[-1] - rss[-4] < 48, f"broker RSS kept growing: {rss} MiB"
    finally:
        broker.kill()
