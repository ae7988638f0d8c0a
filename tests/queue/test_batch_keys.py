"""Message keys: a batch entry's enqueues are named by the entry's index and
their position (types.msg_key); snapshots of version 1 (messages named by
raft index) are read as keys of position 0."""
from __future__ import annotations

import msgpack
import pytest

from broker.queue import (
    BATCH_MAX,
    KEY_POS_BITS,
    ChannelRef,
    Discard,
    Enqueue,
    EnqueueResult,
    Meta,
    QueueCommandError,
    ReleaseCursor,
    Return,
    Settle,
    Tick,
    apply,
    key_index,
    key_pos,
    msg_key,
    new_state,
    restore,
    snapshot,
    to_plain,
)
from broker.queue.snapshot import _dec, _enc, from_plain, is_version_1

from .harness import Harness, cid, delivered, delivered_indexes, of_type


def test_keys_order_by_entry_then_position() -> None:
    assert msg_key(7, 0) < msg_key(7, 1) < msg_key(7, BATCH_MAX - 1) < msg_key(8, 0)
    k = msg_key(123, 5)
    assert (key_index(k), key_pos(k)) == (123, 5)


def test_a_batch_entry_delivers_each_message_by_its_position() -> None:
    h = Harness()
    keys = h.enqueue_batch(4)
    entry = h.index
    assert keys == [msg_key(entry, p) for p in range(4)]
    _, eff = h.consume(prefetch=10)
    assert delivered_indexes(eff) == keys
    # the entry is live while any of its messages is
    h.run(Settle(cid(), (0, 1, 2)))
    assert h.state.smallest_live_index() == entry
    _, eff = h.run(Tick())
    assert of_type(eff, ReleaseCursor)[0].smallest_live_index == entry
    h.run(Settle(cid(), (3,)))
    assert h.state.smallest_live_index() is None


def test_messages_of_one_batch_are_deduplicated_and_returned_one_by_one() -> None:
    h = Harness(delivery_limit=1)
    keys = h.enqueue_batch(3)
    # a re-sent publish (seq 2) at the next position of the same entry is a duplicate
    r, _ = h.run(Enqueue(ChannelRef("pub"), 2, 10), pos=3)
    assert r is EnqueueResult.DUPLICATE
    assert h.state.messages_ready() == 3
    h.consume(prefetch=10)
    _, eff = h.run(Return(cid(), (1,)))
    assert delivered(eff) == [(3, keys[1], 1, True)]  # redelivered, counted
    h.run(Discard(cid(), (0,)))
    assert sorted(k for k in h.state.extra) == [keys[1]]


@pytest.mark.parametrize("pos", [-1, BATCH_MAX])
def test_a_position_outside_a_batch_is_refused(pos: int) -> None:
    st = new_state(Harness().config)
    with pytest.raises(QueueCommandError, match="batch position"):
        apply(Meta(5, 1, 0, pos), Enqueue(None, 0, 1), st)


def _as_version_1(plain: dict) -> dict:  # type: ignore[type-arg]
    """What version 1 wrote for a state whose messages are all at position 0:
    the same with every key replaced by its raft index (a test-side writer,
    the inverse of the reader under test)."""
    k = KEY_POS_BITS
    enc = _enc  # the limb codec of wide records, shared with the reader

    def rec(v: int | list[int]) -> int | list[int]:
        r = _dec(v)
        key = (r >> 32) & ((1 << 64) - 1)
        assert key_pos(key) == 0
        return enc(((r >> 96) << 96) | (key_index(key) << 32) | (r & 0xFFFFFFFF))

    out = dict(plain)
    out["v"] = 1
    for f in ("lo", "hi", "returns"):
        out[f] = [rec(x) for x in plain[f]]
    out["extra"] = [[i >> k, a, b] for i, a, b in plain["extra"]]
    out["out_of_order"] = [i >> k for i in plain["out_of_order"]]
    out["consumers"] = [[*c[:5], [[m, rec(x)] for m, x in c[5]], *c[6:]] for c in plain["consumers"]]
    out["dlx_pending"] = [[rec(x), code, dc] for x, code, dc in plain["dlx_pending"]]
    out["dlx_checked"] = [[i, rec(x), code, dc] for i, x, code, dc in plain["dlx_checked"]]
    return out


def test_a_version_1_snapshot_reads_as_keys_of_position_0() -> None:
    h = Harness(delivery_limit=5, message_ttl_ms=60_000, dead_letter_exchange="dlx",
                dead_letter_strategy="at-least-once", overflow="reject-publish")
    h.enqueue(6, priority=None)
    h.consume(prefetch=3)
    h.enqueue(2, priority=9)  # hi, ready: no credit left
    h.run(Return(cid(), (0,)))  # a return: `extra`, redelivered at once
    h.run(Discard(cid(), (1,)))  # a dead letter awaiting the worker
    plain = to_plain(h.state)
    assert plain["lo"] and plain["hi"] and plain["extra"]
    assert plain["dlx_pending"] and plain["consumers"][0][5]
    old = msgpack.packb(_as_version_1(plain), use_bin_type=True)
    assert is_version_1(old) and not is_version_1(snapshot(h.state))
    assert to_plain(restore(old)) == plain
    assert to_plain(from_plain(_as_version_1(plain))) == plain
