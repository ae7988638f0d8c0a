"""A minimal raw-frame AMQP 0-9-1 client for benchmarks.

The publishers and consumers of `bench/load.py` must not be the bottleneck,
so the hot frames (basic.publish + header + body out, basic.deliver + header +
body in, basic.ack both ways) are packed and parsed by hand with `struct`;
pamqp is used only for the handshake and the few setup methods.
"""
from __future__ import annotations

import socket
import struct
import time

from pamqp import commands, frame, heartbeat
from pamqp.common import FieldTable

FRAME_END = b"\xce"
_FRAME_HDR = struct.Struct(">BHI")


class RawClient:
    def __init__(self, host: str, port: int, user: str = "guest", password: str = "guest",
                 vhost: str = "/", frame_max: int = 131072) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.frame_max = frame_max
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self._expect(commands.Connection.Start)
        self._send(0, commands.Connection.StartOk(
            client_properties={"product": "qq-bench"}, mechanism="PLAIN",
            response=f"\0{user}\0{password}", locale="en_US"))
        tune = self._expect(commands.Connection.Tune)
        fm = min(frame_max, tune.frame_max) if tune.frame_max else frame_max
        self.frame_max = fm
        self._send(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=fm, heartbeat=0))
        self._send(0, commands.Connection.Open(virtual_host=vhost))
        self._expect(commands.Connection.OpenOk)
        self._send(1, commands.Channel.Open())
        self._expect(commands.Channel.OpenOk)

    # -- generic (slow) path, setup only
    def _send(self, channel: int, method: object) -> None:
        self.sock.sendall(frame.marshal(method, channel))  # type: ignore[arg-type]

    def _read_raw_frame(self) -> tuple[int, int, bytes]:
        while True:
            if len(self.buf) >= 7:
                ftype, ch, size = _FRAME_HDR.unpack_from(self.buf, 0)
                if len(self.buf) >= 8 + size:
                    payload = bytes(self.buf[7:7 + size])
                    del self.buf[:8 + size]
                    return ftype, ch, payload
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("server closed the connection")
            self.buf += data

    def _expect(self, cls: type) -> object:
        while True:
            ftype, ch, payload = self._read_raw_frame()
            raw = _FRAME_HDR.pack(ftype, ch, len(payload)) + payload + FRAME_END
            _, _, value = frame.unmarshal(raw)
            if isinstance(value, heartbeat.Heartbeat):
                continue
            if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
                raise ConnectionError(f"closed by server: {value.reply_code} {value.reply_text}")
            if isinstance(value, cls):
                return value

    def declare_quorum_queue(self, name: str) -> None:
        self._send(1, commands.Queue.Declare(queue=name, durable=True,
                                              arguments=FieldTable({"x-queue-type": "quorum"})))
        self._expect(commands.Queue.DeclareOk)

    def depth(self, name: str) -> int:
        """Ready messages in `name` (a passive queue.declare)."""
        self._send(1, commands.Queue.Declare(queue=name, passive=True))
        ok = self._expect(commands.Queue.DeclareOk)
        return int(ok.message_count)  # type: ignore[attr-defined]

    def purge(self, name: str) -> None:
        self._send(1, commands.Queue.Purge(queue=name))
        self._expect(commands.Queue.PurgeOk)

    def delete_queue(self, name: str) -> None:
        self._send(1, commands.Queue.Delete(queue=name))
        self._expect(commands.Queue.DeleteOk)

    def confirm_select(self) -> None:
        self._send(1, commands.Confirm.Select())
        self._expect(commands.Confirm.SelectOk)

    def qos(self, prefetch: int) -> None:
        self._send(1, commands.Basic.Qos(prefetch_count=prefetch))
        self._expect(commands.Basic.QosOk)

    def consume(self, queue: str, tag: str = "bench") -> None:
        self._send(1, commands.Basic.Consume(queue=queue, consumer_tag=tag))
        self._expect(commands.Basic.ConsumeOk)

    def close(self) -> None:
        try:
            self._send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            self._expect(commands.Connection.CloseOk)
        except (OSError, ConnectionError):
            pass
        self.sock.close()

    # -- hot path
    @staticmethod
    def publish_frames(routing_key: bytes, body: bytes, channel: int = 1,
                       frame_max: int = 131072) -> bytes:
        """basic.publish to the default exchange, persistent: method, header and
        as many body frames as `frame_max` needs (one for bodies up to it)."""
        # method: class 60 method 40, reserved-1 u16, exchange shortstr "", routing key, bits
        m = struct.pack(">HHHB", 60, 40, 0, 0) + bytes([len(routing_key)]) + routing_key + b"\x00"
        # content header: class 60, weight 0, body size u64, flags: delivery-mode (bit 12)
        h = struct.pack(">HHQH", 60, 0, len(body), 0x1000) + b"\x02"
        out = _FRAME_HDR.pack(1, channel, len(m)) + m + FRAME_END
        out += _FRAME_HDR.pack(2, channel, len(h)) + h + FRAME_END
        step = frame_max - 8
        if len(body) <= step:
            return out + _FRAME_HDR.pack(3, channel, len(body)) + body + FRAME_END
        parts = [out]
        for i in range(0, len(body), step):
            chunk = body[i:i + step]
            parts.append(_FRAME_HDR.pack(3, channel, len(chunk)) + chunk + FRAME_END)
        return b"".join(parts)

    @staticmethod
    def ack_frame(delivery_tag: int, multiple: bool, channel: int = 1) -> bytes:
        m = struct.pack(">HHQB", 60, 80, delivery_tag, 1 if multiple else 0)
        return _FRAME_HDR.pack(1, channel, len(m)) + m + FRAME_END

    def read_confirms(self, n: int, timeout: float) -> list[tuple[int, bool]]:
        """Read basic.ack confirms (delivery tag, multiple) until one covers
        publish `n` or `timeout` seconds pass; any other method raises."""
        acks: list[tuple[int, bool]] = []
        deadline = time.monotonic() + timeout
        while max((tag for tag, _m in acks), default=0) < n and time.monotonic() < deadline:
            for ftype, _ch, payload in self.read_frames():
                if ftype != 1:
                    continue
                method = struct.unpack_from(">HH", payload)
                if method != (60, 80):
                    raise AssertionError(f"unexpected method {method}")
                tag, multiple = struct.unpack_from(">QB", payload, 4)
                acks.append((tag, bool(multiple)))
        return acks

    def read_frames(self) -> list[tuple[int, int, bytes]]:
        """Block for at least one frame; return every complete frame buffered."""
        out: list[tuple[int, int, bytes]] = []
        while not out:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("server closed the connection")
            self.buf += data
            pos, n = 0, len(self.buf)
            buf = self.buf
            while n - pos >= 7:
                ftype, ch, size = _FRAME_HDR.unpack_from(buf, pos)
                end = pos + 7 + size
                if end + 1 > n:
                    break
                if buf[end] != 0xCE:
                    raise ConnectionError("bad frame end")
                out.append((ftype, ch, bytes(buf[pos + 7:end])))
                pos = end + 1
            del self.buf[:pos]
        return out
