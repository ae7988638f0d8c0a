"""Peer messages (runtime/peer_wire.py): every kind survives the transport's
msgpack framing as itself; anything else is refused by name."""
from __future__ import annotations

from typing import Any

import msgpack
import pytest

from broker.runtime import peer_wire as pw

MESSAGES: list[pw.PeerMessage] = [
    pw.Hello("rabbit@a|0badf00d"),
    pw.RaftMessage(["AppendEntries", 3, "q/x/1", [1, 2]]),
    pw.QueueRequest(17, "/", "orders", ["E", "pub", 1, 3, None, None, b"\x00", b"abc", "", "orders"]),
    pw.QueueReply(17, "ok", ["e", "EnqueueResult", "enqueued"]),
    pw.Deliveries("/", "orders", "n|1/c/1", "ctag", [[5, 1, 0, False]], {5: [b"p", b"body", "", "k"]}),
    pw.Join("rabbit@b", "10.0.0.2", 25672),
    pw.Call(9, "connections", None),
    pw.CallReply(9, True, [{"name": "c1"}]),
    pw.AlarmState(["disk"]),
    pw.Ping(),
    pw.Quiesce("//orders/1795683621399", 4, 1203),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_msgpack(msg: pw.PeerMessage) -> None:
    wire = msgpack.unpackb(msgpack.packb(pw.encode(msg), use_bin_type=True), raw=False,
                           strict_map_key=False)
    assert wire[0] == msg.TAG
    assert pw.decode(wire) == msg


def test_tags_are_unique() -> None:
    assert len({m.TAG for m in MESSAGES}) == len(MESSAGES)


@pytest.mark.parametrize(("raw", "why"), [
    ({"h": 1}, "not a tagged array"),
    ([], "not a tagged array"),
    (["?", 1], "unknown peer message tag '?'"),
    ([7, 1], "unknown peer message tag 7"),
    (["h"], "Hello: 1 fields expected, got 0"),
    (["j", "rabbit@b", "host"], "Join: 3 fields expected, got 2"),
    (["o", 1, True, "v", "extra"], "CallReply: 3 fields expected, got 4"),
])
def test_garbage_is_refused_by_name(raw: Any, why: str) -> None:
    with pytest.raises(pw.PeerMessageError, match=why):
        pw.decode(raw)
