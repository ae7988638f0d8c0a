"""Fuzzing the peer transport's receive path (issue 15): the frame decoder
(`transport.FrameReader` and `_decode_frame`: length prefix, size bound,
msgpack, fed in reads of any size) and the peer
message decoders after it (`peer_wire.decode`, and `raft_wire.decode_message`
for Raft messages), fed arbitrary bytes and mutations of real encoded peer
traffic. Every input must end in decoded messages or the documented
refusals: TransportError (frame refused: the connection is dropped),
asyncio.IncompleteReadError (the stream ended mid-frame), PeerMessageError
or WireError (one message dropped); never another exception, never a hang
(the reader is driven synchronously). Derandomized hypothesis with bounded
examples, so a failure replays and each test stays well under 20 s.

The same garbage sent to a running broker's peer port over a real socket is
tests/cluster/test_peer_garbage.py."""
from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.raft import (
    AppendEntries,
    AppendResponse,
    Entry,
    EntryKind,
    Index,
    NodeId,
    RequestVote,
    Term,
)
from broker.runtime import peer_wire as pw
from broker.runtime import raft_wire
from broker.runtime.transport import FrameReader, TransportError, _decode_frame, _encode

from .test_peer_wire import MESSAGES as ALL_KINDS

#: one of each kind but Raft (test_peer_wire's Raft message is a stand-in, not
#: raft_wire's encoding); real Raft messages follow
MESSAGES = [m for m in ALL_KINDS if not isinstance(m, pw.RaftMessage)]

FUZZ = settings(derandomize=True, max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MAX_FRAME = 64 * 1024

RAFT = [
    AppendEntries(Term(3), NodeId("rabbit@a"), NodeId("rabbit@b"), Index(9), Term(2),
                  [Entry(Term(3), Index(10), EntryKind.NORMAL, b"\x92\x01\xa1x")], Index(9), "/q/1"),
    AppendResponse(Term(3), NodeId("rabbit@b"), NodeId("rabbit@a"), False, Index(10)),
    RequestVote(Term(4), NodeId("rabbit@c"), NodeId("rabbit@a"), Index(10), Term(3), True, False, "__metadata__"),
]
#: real peer traffic: a handshake-sized map, then batches as the transport frames them
TRAFFIC = b"".join([
    _encode({"v": 1, "node": "rabbit@a", "challenge": b"\x01" * 16, "proof": b"\x02" * 32}),
    _encode([pw.encode(m) for m in MESSAGES]),
    _encode([pw.encode(pw.RaftMessage(raft_wire.encode_message(m))) for m in RAFT]),
])


def receive(data: bytes, chunk: int = 1000) -> list[str]:
    """What an inbound connection does with `data`, read `chunk` bytes at a
    time: frames until the stream ends or a frame is refused; each message
    of a batch decoded."""
    outcomes: list[str] = []

    def on_frame(payload: memoryview) -> None:
        batch = _decode_frame(payload)
        if not isinstance(batch, list):
            outcomes.append("not a batch")  # the transport drops the connection
            return
        for raw in batch:
            outcomes.append(decode(raw))

    reader = FrameReader(MAX_FRAME, on_frame)
    try:
        feed(reader, data, [chunk])
    except TransportError:
        return [*outcomes, "frame refused"]
    return [*outcomes, "end"]


def feed(reader: FrameReader, data: bytes, chunks: list[int]) -> None:
    """Read `data` into `reader` as a socket would: reads of at most
    chunks[0], chunks[1]... bytes (round and round), each into whatever
    buffer the reader offers."""
    pos = i = 0
    while pos < len(data):
        buf = reader.get_buffer(-1)
        assert len(buf) > 0
        n = min(len(buf), chunks[i % len(chunks)], len(data) - pos)
        buf[:n] = data[pos:pos + n]
        buf.release()
        pos += n
        i += 1
        reader.buffer_updated(n)


def decode(raw: Any) -> str:
    try:
        m = pw.decode(raw)
        if isinstance(m, pw.RaftMessage):
            raft_wire.decode_message(m.message)
    except (pw.PeerMessageError, raft_wire.WireError):
        return "message refused"
    return type(m).__name__


def test_real_traffic_decodes() -> None:
    out = receive(TRAFFIC)
    assert out == ["not a batch", *(type(m).__name__ for m in MESSAGES), "RaftMessage",
                   "RaftMessage", "RaftMessage", "end"]


@pytest.mark.parametrize("payload", [
    b"\x81\x91\x01\x02",  # a map keyed by an array: msgpack raised TypeError (found by fuzzing)
    b"\x81\x81\x01\x02\x03",  # keyed by a map
    b"\xc1",  # never used
    b"\x91" * 5000,  # nested too deep
    b"\x92\x01",  # truncated inside the payload
    b"\x01\x02",  # extra data after one value
])
def test_undecodable_frames_are_refused_as_transport_errors(payload: bytes) -> None:
    assert receive(struct.pack(">I", len(payload)) + payload) == ["frame refused"]


@FUZZ
@given(st.binary(max_size=2048))
def test_arbitrary_bytes(data: bytes) -> None:
    receive(data)


@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_payload_in_a_well_formed_frame(payload: bytes) -> None:
    receive(struct.pack(">I", len(payload)) + payload)


_EDIT = st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "length"]),
                  st.integers(0, len(TRAFFIC) - 1), st.integers(0, 255), st.integers(1, 64))


@FUZZ
@given(st.lists(_EDIT, min_size=1, max_size=8), st.integers(0, len(TRAFFIC)))
def test_mutations_of_real_traffic(edits: list[tuple[str, int, int, int]], cut: int) -> None:
    data = bytearray(TRAFFIC)
    for op, pos, byte, n in edits:
        pos %= max(1, len(data))
        if op == "flip":
            data[pos] ^= 1 << (byte % 8)
        elif op == "set":
            data[pos] = byte
        elif op == "insert":
            data[pos:pos] = bytes([byte]) * n
        elif op == "delete":
            del data[pos:pos + n]
        elif op == "length":  # rewrite a 4-byte length prefix where one might be
            data[pos:pos + 4] = struct.pack(">I", (byte << 8 | n) % (MAX_FRAME * 2))
    receive(bytes(data[:max(cut, len(data) // 2)]), chunk=1 + cut % 97)


@FUZZ
@given(st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
              st.text(max_size=8), st.binary(max_size=8),
              st.sampled_from(["h", "r", "q", "a", "d", "j", "i", "o", "w"])),
    lambda inner: st.lists(inner, max_size=6), max_leaves=20))
def test_well_formed_msgpack_of_any_shape(value: Any) -> None:
    """Valid frames whose messages have the wrong shape: tags with garbage fields,
    Raft messages with garbage inside."""
    batch = value if isinstance(value, list) else [value]
    batch = [*batch, ["r", batch], ["r", [0, *batch]], ["r", [1, *batch]]]
    receive(_encode(batch))


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 3, 4, 5, 100, 4096, 65_535, 65_536, 70_000, 262_140, 262_144,
                                 300_000, 1_000_000]), min_size=1, max_size=12),
       st.lists(st.integers(1, 400_000), min_size=1, max_size=8),
       st.sampled_from([16, 8192, 256 * 1024]))
def test_frames_come_out_whole_and_in_order_however_the_stream_is_cut(
        sizes: list[int], chunks: list[int], buffer_size: int) -> None:
    """Frames of every size around the reader's buffer (256 KiB, or the
    handshake's 8 KiB, or smaller than a header) and its read-alone size
    (64 KiB), read in reads of varying sizes: each frame comes out once,
    whole, in order."""
    frames = [bytes((i * 7 + j) % 251 for j in range(min(n, 300))) * (n // 300 + 1) for i, n in
              enumerate(sizes)]
    frames = [f[:n] for f, n in zip(frames, sizes, strict=True)]
    data = b"".join(struct.pack(">I", len(f)) + f for f in frames)
    got: list[bytes] = []
    reader = FrameReader(2_000_000, lambda payload: got.append(bytes(payload)), buffer_size=buffer_size)
    feed(reader, data, chunks)
    assert got == frames


def test_a_frame_over_the_limit_is_refused_from_its_header() -> None:
    reader = FrameReader(1000, lambda payload: None)
    buf = reader.get_buffer(-1)
    buf[:4] = struct.pack(">I", 1001)
    with pytest.raises(TransportError, match="1001 bytes exceeds the 1000-byte limit"):
        reader.buffer_updated(4)
