"""Batch entries at the runtime boundary: the payload codec (runtime/wire.py),
how one entry's reply reaches each publish (runtime/queues.py), and the
upgrade of a version-1 queue snapshot's bodies (keyed by raft index)."""
from __future__ import annotations

import asyncio

import msgpack
import pytest

from broker import queue as qm
from broker.runtime import wire
from broker.runtime.queues import QuorumQueue, _scatter


def _enq(i: int) -> list[object]:
    return wire.enqueue_payload("pub", i, b"\x00\x00", b"body%d" % i, "", "q", None, None)


def test_a_batch_entry_gives_back_each_message_by_position() -> None:
    items = [_enq(i) for i in range(1, 4)]
    data = msgpack.packb([123, wire.batch_payload(items)], use_bin_type=True)
    for pos in range(3):
        assert wire.queue_message(data, pos) == (b"\x00\x00", b"body%d" % (pos + 1), "", "q")
    with pytest.raises(ValueError, match="no position 3"):
        wire.queue_message(data, 3)
    single = msgpack.packb([123, _enq(9)], use_bin_type=True)
    assert wire.queue_message(single)[1] == b"body9"
    with pytest.raises(ValueError, match="position 1"):
        wire.queue_message(single, 1)
    assert wire.is_plain(wire.batch_payload(items))


@pytest.mark.parametrize("n", [0, 1, qm.BATCH_MAX + 1])
def test_a_batch_holds_two_to_batch_max_enqueues(n: int) -> None:
    with pytest.raises(ValueError, match="batch"):
        wire.batch_payload([_enq(i) for i in range(n)])


def test_a_batch_of_anything_but_enqueues_is_refused_when_applied() -> None:
    bad = [wire.BATCH, [_enq(1), wire.settle_payload(qm.ConsumerId(qm.ChannelRef("c"), "t"), [1])]]
    with pytest.raises(ValueError, match="bad batch"):
        wire.batch_items(bad)


async def test_each_publish_gets_its_own_reply_or_the_entrys_failure() -> None:
    loop = asyncio.get_running_loop()
    entry: asyncio.Future[object] = loop.create_future()
    futs = [loop.create_future() for _ in range(3)]
    entry.add_done_callback(lambda e: _scatter(e, futs, False))
    entry.set_result([qm.EnqueueResult.ACCEPTED, qm.EnqueueResult.DUPLICATE, qm.OutOfOrder(7)])
    await asyncio.sleep(0)
    assert [f.result() for f in futs] == [qm.EnqueueResult.ACCEPTED, qm.EnqueueResult.DUPLICATE,
                                         qm.OutOfOrder(7)]
    failed: asyncio.Future[object] = loop.create_future()
    futs2 = [loop.create_future() for _ in range(2)]
    failed.add_done_callback(lambda e: _scatter(e, futs2, False))
    failed.set_exception(RuntimeError("replaced"))
    await asyncio.sleep(0)
    assert all(isinstance(f.exception(), RuntimeError) for f in futs2)


def test_version_1_snapshot_bodies_are_keyed_as_position_0() -> None:
    state = qm.new_state(qm.QueueConfig(name="q"))
    qm.apply(qm.Meta(5, 1, 0), qm.Enqueue(None, 0, 4), state)
    plain = qm.to_plain(state)
    key = qm.msg_key(5)
    assert plain["lo"] == [key << 32 | 4]
    v1 = {**plain, "v": 1, "lo": [5 << 32 | 4]}
    old_doc = wire.pack({"state": msgpack.packb(v1, use_bin_type=True),
                         "bodies": {5: [b"p", b"body", "", "q"]}})
    restored, bodies = QuorumQueue._decode_snapshot(old_doc)
    assert qm.to_plain(restored) == plain
    assert list(bodies) == [key]
    new_doc = wire.pack({"state": qm.snapshot(state), "bodies": {key: [b"p", b"body", "", "q"]}})
    assert list(QuorumQueue._decode_snapshot(new_doc)[1]) == [key]
