"""A small blocking AMQP 0-9-1 client with a deadline on every call.

The fault suite needs what pika's BlockingConnection does not give: a bound
on how long a publish waits for its confirm (5 s, then the outcome is
"unknown"), and errors instead of hangs when a node is paused. pamqp does the
encoding; this module does the framing, one channel, and the waits.

Every method raises `AmqpError` (the connection is then unusable: close it
and connect elsewhere) or `TimeoutError`.
"""
from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

from pamqp import body as pbody
from pamqp import commands, frame, header, heartbeat
from pamqp.common import FieldTable

_HDR = struct.Struct(">BHI")


class AmqpError(Exception):
    """The server closed the channel or connection, or the socket failed."""


@dataclass(slots=True)
class Delivery:
    tag: int
    body: bytes
    redelivered: bool


class Client:
    def __init__(self, host: str, port: int, timeout: float = 5.0, user: str = "guest",
                 password: str = "guest") -> None:
        self.timeout = timeout
        self.buf = bytearray()
        self.publish_seq = 0
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise AmqpError(f"connect {host}:{port}: {exc}") from exc
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            deadline = time.monotonic() + timeout
            self._sendall(b"AMQP\x00\x00\x09\x01")
            self._expect(commands.Connection.Start, deadline)
            self._send(0, commands.Connection.StartOk(
                client_properties={"product": "qq-chaos"}, mechanism="PLAIN",
                response=f"\0{user}\0{password}", locale="en_US"))
            tune = self._expect(commands.Connection.Tune, deadline)
            self._send(0, commands.Connection.TuneOk(channel_max=tune.channel_max,
                                                     frame_max=tune.frame_max or 131072, heartbeat=0))
            self._send(0, commands.Connection.Open(virtual_host="/"))
            self._expect(commands.Connection.OpenOk, deadline)
            self._send(1, commands.Channel.Open())
            self._expect(commands.Channel.OpenOk, deadline)
        except BaseException:
            self.sock.close()
            raise

    # ---------------------------------------------------------------- framing
    def _sendall(self, data: bytes) -> None:
        try:
            self.sock.settimeout(self.timeout)
            self.sock.sendall(data)
        except OSError as exc:  # includes a send timeout: unusable either way
            raise AmqpError(f"send: {exc}") from exc

    def _send(self, channel: int, value: object) -> None:
        self._sendall(frame.marshal(value, channel))  # type: ignore[arg-type]

    def _read(self, deadline: float) -> tuple[int, object]:
        """The next frame (channel, value); TimeoutError past the deadline."""
        while True:
            if len(self.buf) >= 7:
                _t, _ch, size = _HDR.unpack_from(self.buf, 0)
                if len(self.buf) >= 8 + size:
                    raw = bytes(self.buf[:8 + size])
                    del self.buf[:8 + size]
                    _, ch, value = frame.unmarshal(raw)
                    if isinstance(value, heartbeat.Heartbeat):
                        continue
                    if isinstance(value, commands.Connection.Close):
                        raise AmqpError(f"connection closed: {value.reply_code} {value.reply_text}")
                    if isinstance(value, commands.Channel.Close):
                        raise AmqpError(f"channel closed: {value.reply_code} {value.reply_text}")
                    return ch, value
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame before the deadline")
            try:
                self.sock.settimeout(left)
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                raise
            except OSError as exc:
                raise AmqpError(f"recv: {exc}") from exc
            if not data:
                raise AmqpError("server closed the connection")
            self.buf += data

    def _expect(self, cls: type, deadline: float):  # type: ignore[no-untyped-def]
        while True:
            _ch, value = self._read(deadline)
            if isinstance(value, cls):
                return value

    def close(self) -> None:
        try:
            self.sock.settimeout(1.0)
            self.sock.sendall(frame.marshal(commands.Connection.Close(
                reply_code=200, reply_text="bye", class_id=0, method_id=0), 0))
        except OSError:
            pass
        self.sock.close()

    # ---------------------------------------------------------------- setup
    def declare(self, queue: str, arguments: dict[str, object]) -> int:
        self._send(1, commands.Queue.Declare(queue=queue, durable=True,
                                              arguments=FieldTable(arguments)))
        ok = self._expect(commands.Queue.DeclareOk, time.monotonic() + self.timeout)
        return int(ok.message_count)

    def confirm_select(self) -> None:
        self._send(1, commands.Confirm.Select())
        self._expect(commands.Confirm.SelectOk, time.monotonic() + self.timeout)

    def qos(self, prefetch: int) -> None:
        self._send(1, commands.Basic.Qos(prefetch_count=prefetch))
        self._expect(commands.Basic.QosOk, time.monotonic() + self.timeout)

    # ---------------------------------------------------------------- publish
    def publish(self, queue: str, body: bytes, timeout: float) -> bool:
        """Publish persistent to the default exchange and wait for its
        confirm: True for basic.ack, False for basic.nack; TimeoutError or
        AmqpError when the outcome is unknown."""
        self.publish_seq += 1
        seq = self.publish_seq
        props = commands.Basic.Properties(delivery_mode=2)
        data = (frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
                + frame.marshal(header.ContentHeader(0, len(body), props), 1)
                + frame.marshal(pbody.ContentBody(body), 1))
        self._sendall(data)
        deadline = time.monotonic() + timeout
        while True:
            _ch, value = self._read(deadline)
            if isinstance(value, (commands.Basic.Ack, commands.Basic.Nack)):
                tag, multiple = int(value.delivery_tag), bool(value.multiple)
                if tag == seq or (multiple and tag >= seq):
                    return isinstance(value, commands.Basic.Ack)
            elif isinstance(value, commands.Basic.Return):
                continue

    # ---------------------------------------------------------------- consume
    def consume(self, queue: str, prefetch: int) -> None:
        self.qos(prefetch)
        self._send(1, commands.Basic.Consume(queue=queue, consumer_tag="chaos"))
        self._expect(commands.Basic.ConsumeOk, time.monotonic() + self.timeout)

    def _content(self, deadline: float) -> bytes:
        hdr = self._expect(header.ContentHeader, deadline)
        size = int(hdr.body_size)
        out = b""
        while len(out) < size:
            b = self._expect(pbody.ContentBody, deadline)
            out += b.value
        return out

    def next_delivery(self, timeout: float) -> Delivery | None:
        """The next basic.deliver within `timeout`, or None."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                _ch, value = self._read(deadline)
            except TimeoutError:
                return None  # a partial frame stays buffered for the next call
            if isinstance(value, commands.Basic.Deliver):
                # a TimeoutError here (header/body missing) propagates: the
                # delivery is half read, the connection must be dropped
                body = self._content(time.monotonic() + self.timeout)
                return Delivery(int(value.delivery_tag), body, bool(value.redelivered))

    def get(self, queue: str) -> Delivery | None:
        self._send(1, commands.Basic.Get(queue=queue, no_ack=False))
        deadline = time.monotonic() + self.timeout
        while True:
            _ch, value = self._read(deadline)
            if isinstance(value, commands.Basic.GetEmpty):
                return None
            if isinstance(value, commands.Basic.GetOk):
                body = self._content(deadline)
                return Delivery(int(value.delivery_tag), body, bool(value.redelivered))

    def ack(self, tag: int) -> None:
        self._send(1, commands.Basic.Ack(delivery_tag=tag))
