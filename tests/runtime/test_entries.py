"""The queue entry format (runtime/wire.py, its one owner): what is built is
what a replica decodes, through msgpack as the log stores it."""
from __future__ import annotations

import msgpack
import pytest

from broker import queue as qm
from broker.queue.types import ChannelRef, ConsumerId
from broker.runtime import wire

CID = ConsumerId(ChannelRef("node|ab/c/1"), "ctag")


def _through_the_log(payload: list) -> list:
    """What a follower (or a replay) gets back: the stored entry decoded."""
    data = msgpack.packb([1700000000000, payload], use_bin_type=True)
    ts, decoded = wire.unpack(data)
    assert ts == 1700000000000
    return decoded


def test_an_enqueue_carries_the_machine_command_and_the_message() -> None:
    p = wire.enqueue_payload("pub-1", 7, b"\x80\x00props", b"body", "ex", "rk", 5, 1000)
    assert wire.is_enqueue(p) and wire.is_plain(p) and not wire.is_command(p)
    assert wire.enqueue_properties(p) == b"\x80\x00props"
    for payload in (p, _through_the_log(p)):
        cmd, msg = wire.queue_command(payload)
        assert cmd == qm.Enqueue("pub-1", 7, 4, 5, 1000)
        assert msg == (b"\x80\x00props", b"body", "ex", "rk")
    stored = msgpack.packb([1, p], use_bin_type=True)
    assert wire.queue_message(stored) == (b"\x80\x00props", b"body", "ex", "rk")


def test_a_renumbered_enqueue_changes_only_publisher_and_number() -> None:
    p = wire.enqueue_payload("pub-1", 7, b"p", b"body", "ex", "rk", None, None, size=99)
    r = wire.renumbered(p, "pub-1~1", 1)
    cmd, msg = wire.queue_command(r)
    assert cmd == qm.Enqueue("pub-1~1", 1, 99, None, None)
    assert msg == (b"p", b"body", "ex", "rk")


def test_a_settle_is_plain_and_decodes_to_settle() -> None:
    p = wire.settle_payload(CID, (3, 4, 9))
    assert wire.is_plain(p) and not wire.is_enqueue(p)
    for payload in (p, _through_the_log(p)):
        assert wire.queue_command(payload) == (qm.Settle(CID, (3, 4, 9)), None)


@pytest.mark.parametrize("cmd", [
    qm.Return(CID, (1, 2)), qm.Discard(CID, (5,)), qm.ChannelDown(CID.channel, delivered=()),
])
def test_other_commands_are_not_plain_and_decode_to_themselves(cmd: qm.Command) -> None:
    p = wire.command_payload(cmd)
    assert wire.is_command(p) and not wire.is_plain(p)
    assert wire.queue_command(_through_the_log(p)) == (cmd, None)


def test_anything_else_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="not a queue payload: 'M'"):
        wire.queue_command(["M", "status"])
    with pytest.raises(ValueError, match="not an enqueue"):
        wire.queue_message(msgpack.packb([1, wire.settle_payload(CID, (1,))], use_bin_type=True))


def test_a_metadata_entry_written_before_a_field_was_added_still_decodes() -> None:
    from broker import metadata as md

    cmd = md.SetQueueLeader(md.VhostName("/"), md.QueueName("q"), md.NodeName("n1"), 4)
    assert wire.decode_meta_command(wire.encode_meta_command(cmd)) == cmd
    old = wire.decode_meta_command(["SetQueueLeader", ["/", "q", "n1"]])  # before `term`
    assert old == md.SetQueueLeader(md.VhostName("/"), md.QueueName("q"), md.NodeName("n1"), 0)
    with pytest.raises(ValueError, match="SetQueueLeader: 4 fields expected, got 5"):
        wire.decode_meta_command(["SetQueueLeader", ["/", "q", "n1", 4, "extra"]])
