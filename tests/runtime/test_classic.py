"""Durable classic queues (broker/runtime/classic.py): the node-local log is
replayed on restart; persistent messages stay, transient ones and the
earlier life's consumers go; a failed write never confirms a publish and
leaves the queue as its durable log says."""
from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from broker import queue as qm
from broker import storage as st
from broker.queue.types import ChannelRef, ConsumerId
from broker.runtime.classic import DurableClassicQueue, group_id, is_persistent
from tests.storage.helpers import fill_disk, tmpfs

PERSISTENT = b"\x10\x00\x02"  # property flags: delivery_mode present; 2
TRANSIENT = b"\x10\x00\x01"
NO_PROPS = b"\x00\x00"
OLD = "n1|0000aaaa/c1"  # a channel of this node's earlier life


class Host:
    node_name = "n1"
    incarnation = "n1|1111bbbb"

    def __init__(self) -> None:
        self.dead: list[Any] = []

    def dead_letter(self, *args: Any) -> None:
        self.dead.append(args)

    def queue_expired(self, vhost: str, name: str) -> None:
        pass

    def send_deliveries(self, *args: Any) -> None:
        pass

    def channel_gone(self, channel: str) -> bool:
        return not channel.startswith(self.incarnation)

    def channel_dead(self, channel: str) -> bool:
        return self.channel_gone(channel)


class Rig:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.mgr: st.LogManager | None = None
        self.q: DurableClassicQueue | None = None

    def open(self) -> DurableClassicQueue:
        loop = asyncio.get_running_loop()
        holder: dict[str, DurableClassicQueue] = {}

        def durable(g: str, _i: int, _t: int) -> None:
            loop.call_soon_threadsafe(lambda: holder["q"].on_durable() if "q" in holder else None)

        def error(g: str, exc: BaseException) -> None:
            loop.call_soon_threadsafe(lambda: holder["q"].on_storage_error(exc) if "q" in holder else None)

        self.mgr = st.LogManager.open(self.path, st.StorageConfig(wal_max_size_bytes=256 << 10, segment_max_entries=64),
                                 on_durable=durable, on_error=error)
        glog = self.mgr.open_group(group_id("/", "cq", 1))
        q = DurableClassicQueue(Host(), "/", "cq", qm.QueueConfig(name="cq", vhost="/"), glog,
                                snapshot_every=50)
        holder["q"] = q
        self.q = q
        return q

    def close(self) -> None:
        assert self.q is not None and self.mgr is not None
        self.q.close()
        self.q.glog.close()
        self.mgr.close()


def _enqueue(q: DurableClassicQueue, seq: int, props: bytes, body: bytes) -> asyncio.Future[Any]:
    return q.enqueue(ChannelRef(f"{OLD}/1"), seq, props, body, "", "cq", None, None)


def _bodies(q: DurableClassicQueue) -> list[bytes]:
    st_ = q.state
    idx = sorted(qm.rec_key(r) for r in [*st_.returns, *st_.hi, *st_.lo])
    return [q.message(i)[1] for i in idx]


def test_is_persistent_reads_delivery_mode_after_the_fields_before_it() -> None:
    assert is_persistent(PERSISTENT)
    assert not is_persistent(TRANSIENT) and not is_persistent(NO_PROPS) and not is_persistent(b"")
    # content type "x", content encoding "", headers {} before delivery mode 2
    raw = b"\xf0\x00" + b"\x01x" + b"\x00" + b"\x00\x00\x00\x00" + b"\x02"
    assert is_persistent(raw)
    assert not is_persistent(b"\xf0\x00\x01x\x00\x00\x00\x00")  # truncated


async def test_restart_replays_the_log_keeps_persistent_drops_transient_and_acked(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "node")
    q = rig.open()
    specs = [(PERSISTENT, b"p1"), (TRANSIENT, b"t1"), (PERSISTENT, b"p2"), (PERSISTENT, b"p3"),
             (NO_PROPS, b"t2"), (PERSISTENT, b"p4")]
    replies = await asyncio.gather(*(_enqueue(q, n, p, b) for n, (p, b) in enumerate(specs, 1)))
    assert replies == [qm.EnqueueResult.ACCEPTED] * 6
    cid = ConsumerId(ChannelRef(f"{OLD}/2"), "ctag")
    await q.command(qm.Checkout(cid, prefetch=3))  # p1, t1, p2 checked out as msg ids 0, 1, 2
    await q.settle(cid, [0])  # p1 acked
    assert q.state.messages_total() == 5
    rig.close()

    q = rig.open()
    assert q.recovered == {"replayed": 8, "channels_down": 2, "transient_dropped": 2}
    # p2 and t1 returned (their channel is gone), t1 and t2 dropped, p1 acked
    assert q.state.messages_total() == 3 and not q.state.consumers
    assert _bodies(q) == [b"p2", b"p3", b"p4"]
    # the publisher's de-duplication entry went with its channel: numbering restarts
    assert await _enqueue(q, 7, PERSISTENT, b"p5") == qm.OutOfOrder(1)
    assert await _enqueue(q, 1, PERSISTENT, b"p5") == qm.EnqueueResult.ACCEPTED
    rig.close()

    q = rig.open()  # from the recovery snapshot, plus one entry
    assert q.recovered["replayed"] == 2 and q.recovered["transient_dropped"] == 0
    assert _bodies(q) == [b"p2", b"p3", b"p4", b"p5"]
    # a consumer of this life takes them all, acks them; next start: empty
    cid = ConsumerId(ChannelRef(f"{q.host.incarnation}/c/1"), "t")
    await q.command(qm.Checkout(cid, prefetch=0))
    await q.settle(cid, list(q.state.consumers[cid].checked))
    assert q.state.messages_total() == 0
    rig.close()
    q = rig.open()
    assert q.state.messages_total() == 0
    rig.close()


async def test_snapshots_release_segments_and_replay_matches_the_live_state(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "node")
    q = rig.open()
    cid = ConsumerId(ChannelRef(f"{q.host.incarnation}/c/1"), "t")
    await q.command(qm.Checkout(cid, prefetch=0))
    seq = 0
    for _round in range(50):  # the machine asks for a release cursor every 4096 commands
        futs = []
        for _ in range(100):
            seq += 1
            futs.append(_enqueue(q, seq, PERSISTENT if seq % 3 else TRANSIENT, b"m%d" % seq))
        await asyncio.gather(*futs)
        if _round < 49:  # the last round stays unacked
            await q.settle(cid, list(q.state.consumers[cid].checked))
    live = q.state.overview()
    assert live["messages"] == 100
    rig.mgr.wait_flushed()  # type: ignore[union-attr]
    assert q.glog.snapshot_meta() is not None, "no snapshot was taken"
    assert q.glog.first_index() > 1, "no segment was released"
    unacked = sorted((q.message(qm.rec_key(r)) for r in q.state.consumers[cid].checked.values()),
                     key=lambda m: int(m[1][1:]))
    rig.close()
    q = rig.open()
    # every channel of this node is from an earlier life now: the unacked
    # messages return, the transient ones among them go
    assert q.recovered["channels_down"] == 2 and q.recovered["transient_dropped"] == 33  # consumer + publisher
    assert not q.state.consumers
    assert _bodies(q) == [m[1] for m in unacked if m[0] == PERSISTENT]
    rig.close()


class _FailingLog:
    """A GroupLog whose appends fail with ENOSPC while `full` is set."""

    def __init__(self, glog: st.GroupLog) -> None:
        self._glog = glog
        self.full = False

    def append(self, entries: Any) -> None:
        if self.full:
            raise st.StorageIOError(errno.ENOSPC, "no space left on device")
        self._glog.append(entries)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._glog, name)


async def test_a_failed_write_nacks_the_publish_and_changes_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "node")
    q = rig.open()
    assert await _enqueue(q, 1, PERSISTENT, b"a") == qm.EnqueueResult.ACCEPTED
    failing = _FailingLog(q.glog)
    q.glog = failing  # type: ignore[assignment]
    failing.full = True
    assert await _enqueue(q, 2, PERSISTENT, b"b") == qm.EnqueueResult.REJECTED
    with pytest.raises(st.StorageIOError):
        await q.command(qm.Purge())
    assert q.state.messages_total() == 1
    failing.full = False
    # the session renumbers after a nack; an untracked publish goes in
    assert await q.enqueue(None, 0, PERSISTENT, b"c", "", "cq", None, None) == qm.EnqueueResult.ACCEPTED
    q.glog = failing._glog
    rig.close()
    q = rig.open()
    assert _bodies(q) == [b"a", b"c"]
    rig.close()


async def test_an_append_refused_over_a_dropped_batch_is_tried_once_more(tmp_path: Path) -> None:
    """A WAL batch failed and its on_error has not reached the queue yet: the
    log refuses an append that builds on what it dropped (StorageIOError,
    GroupLog.wal_failed). The queue resyncs to what is durable and tries
    once more, as it did when that refusal was a LogGapError."""
    rig = Rig(tmp_path / "node")
    q = rig.open()
    failing = _FailingLog(q.glog)
    q.glog = failing  # type: ignore[assignment]
    failing.full = True
    real_append = failing.append

    def once(entries: Any) -> None:
        failing.full = False  # refused this once
        failing.append = real_append  # type: ignore[method-assign]
        raise st.StorageIOError(errno.ENOSPC, "append at 2 needs writes that failed")
    failing.append = once  # type: ignore[method-assign]
    assert await _enqueue(q, 1, PERSISTENT, b"a") == qm.EnqueueResult.ACCEPTED
    assert q.state.messages_total() == 1
    q.glog = failing._glog
    rig.close()
    q = rig.open()
    assert _bodies(q) == [b"a"]
    rig.close()


@pytest.mark.root
async def test_enospc_on_a_real_full_disk_never_confirms_and_recovers(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt", "2m") as mnt:
        rig = Rig(mnt / "node")
        q = rig.open()
        (mnt / "filler").write_bytes(b"\0" * 1024)
        fill_disk(mnt / "filler2")
        outcomes: dict[int, Any] = {}
        body = b"x" * 8192
        for n in range(1, 200):
            outcomes[n] = await q.enqueue(None, 0, PERSISTENT, body + b"%d" % n, "", "cq", None, None)
            if outcomes[n] is qm.EnqueueResult.REJECTED:
                break
        assert qm.EnqueueResult.REJECTED in outcomes.values(), "the disk never filled"
        accepted = [n for n, r in outcomes.items() if r is qm.EnqueueResult.ACCEPTED]
        assert q.state.messages_total() == len(accepted)
        os.unlink(mnt / "filler2")
        assert await q.enqueue(None, 0, PERSISTENT, b"after", "", "cq", None, None) == \
            qm.EnqueueResult.ACCEPTED
        rig.close()
        q = rig.open()
        assert _bodies(q) == [body + b"%d" % n for n in accepted] + [b"after"]
        rig.close()
