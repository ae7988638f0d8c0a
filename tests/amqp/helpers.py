"""Test helpers: a scripted AMQP client that talks to ServerConnection in memory.

Client frames are built with pamqp (an independent encoder), server output is
parsed with pamqp, so every test also checks our bytes against pamqp's.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import body as pbody
from pamqp import commands as C
from pamqp import frame as pframe
from pamqp import header as pheader

from broker.amqp import (
    CLOSED,
    NEED_DATA,
    PAUSED,
    ConnectionState,
    ServerConfig,
    ServerConnection,
)

HEADER = b"AMQP\x00\x00\x09\x01"


def method(m: Any, channel: int = 0) -> bytes:
    return pframe.marshal(m, channel)


def content_header(body_size: int, props: C.Basic.Properties | None = None, channel: int = 1) -> bytes:
    return pframe.marshal(pheader.ContentHeader(0, body_size, props or C.Basic.Properties()), channel)


def body_frame(data: bytes, channel: int = 1) -> bytes:
    return pframe.marshal(pbody.ContentBody(data), channel)


def raw_frame(ftype: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + end


def publish(
    data: bytes,
    *,
    channel: int = 1,
    exchange: str = "",
    routing_key: str = "q",
    props: C.Basic.Properties | None = None,
    frame_max: int = 131072,
    mandatory: bool = False,
) -> bytes:
    out = [method(C.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory), channel)]
    out.append(content_header(len(data), props, channel))
    step = frame_max - 8
    for i in range(0, len(data), step):
        out.append(body_frame(data[i : i + step], channel))
    return b"".join(out)


def parse_frames(data: bytes) -> list[tuple[int, Any]]:
    """Split server output into (channel, pamqp frame) pairs; must consume everything."""
    out: list[tuple[int, Any]] = []
    while data:
        if data.startswith(b"AMQP"):
            out.append((0, data[:8]))
            data = data[8:]
            continue
        n, ch, f = pframe.unmarshal(data)
        out.append((ch, f))
        data = data[n:]
    return out


def one(frames: list[tuple[int, Any]], channel: int) -> Any:
    """The single frame in `frames`, checking it is on `channel`."""
    assert len(frames) == 1, frames
    ch, f = frames[0]
    assert ch == channel, (ch, channel)
    return f


def feed(conn: ServerConnection, data: bytes, chunk: int = 1) -> list[Any]:
    """Feed `data` in `chunk`-sized pieces, draining events after each piece."""
    events: list[Any] = []
    for i in range(0, len(data), chunk):
        conn.receive_data(data[i : i + chunk])
        while True:
            ev = conn.next_event()
            if ev is NEED_DATA or ev is CLOSED or ev is PAUSED:
                break
            events.append(ev)
    return events


class Client:
    """Drives a ServerConnection through the handshake and records its output."""

    def __init__(self, config: ServerConfig | None = None, chunk: int = 1) -> None:
        self.conn = ServerConnection(config)
        self.chunk = chunk
        self.out = b""

    def send(self, data: bytes) -> list[Any]:
        events = feed(self.conn, data, self.chunk)
        self.out += self.conn.data_to_send()
        return events

    def take(self) -> list[tuple[int, Any]]:
        """Parse and clear everything the server produced so far."""
        frames = parse_frames(self.out)
        self.out = b""
        return frames

    def open(
        self,
        *,
        frame_max: int = 131072,
        channel_max: int = 2047,
        heartbeat: int = 60,
        capabilities: dict[str, Any] | None = None,
        channels: tuple[int, ...] = (1,),
    ) -> None:
        caps = capabilities if capabilities is not None else {
            "authentication_failure_close": True,
            "connection.blocked": True,
        }
        self.send(HEADER)
        self.send(
            method(
                C.Connection.StartOk(
                    client_properties={"product": "test", "capabilities": caps},
                    mechanism="PLAIN",
                    response="\x00guest\x00guest",
                )
            )
        )
        self.out += self.conn.accept_login()
        self.send(method(C.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat)))
        self.send(method(C.Connection.Open(virtual_host="/")))
        self.out += self.conn.accept_open()
        for ch in channels:
            self.send(method(C.Channel.Open(), ch))
        assert self.conn.state is ConnectionState.OPEN
        self.take()
