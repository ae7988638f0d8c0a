"""The metadata store (runtime/metastore.py) as three in-process replicas over
real storage, no broker process: a replica that installs the leader's
snapshot hands its node the effects of the entries it jumped over, and a
replica stopped by a full disk starts again in place, handing over the
effects of what it missed exactly once and never those of what it had
already applied."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker import metadata as md
from broker import storage as st
from broker.raft import RaftConfig
from broker.runtime.metastore import META_GROUP, MetadataStore
from tests.storage.helpers import fill_disk, tmpfs

NAMES = ["a", "b", "c"]


class Replica:
    def __init__(self, name: str, data: Path, net: dict[str, Replica], cut: set[str],
                 forward: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self.name = name
        self.effects: list[Any] = []
        self.mgr = st.LogManager.open(
            data, st.StorageConfig(wal_max_size_bytes=256 * 1024),
            on_durable=lambda g, i, t: loop.call_soon_threadsafe(self._durable),
            on_error=lambda g, e: loop.call_soon_threadsafe(self._error, e))

        def send(dst: str, msg: Any) -> None:
            if name not in cut and dst not in cut and dst in net:
                loop.call_soon(net[dst].step, msg)

        async def to_leader(leader: str, payload: bytes) -> tuple[int, bytes | None]:
            # the forwarding peer call, in process (it reaches the leader
            # even while this replica's Raft traffic is cut), answered as
            # Forwarding._lead answers it: the index and the leader's reply
            index, fut = net[leader].store.group.propose_indexed(payload)
            return index, md.reply_to_bytes(await fut)

        self.store = MetadataStore(name, self.mgr.open_group(META_GROUP), NAMES, send,
                                   RaftConfig(election_tick=10), self.effects.extend,
                                   forward=to_leader if forward else None)
        self.store.group.snapshot_interval = 4
        net[name] = self

    def step(self, msg: Any) -> None:
        self.store.group.step(msg)

    def _durable(self) -> None:
        if not self.store.group.closed:
            self.store.group.on_durable()

    def _error(self, exc: BaseException) -> None:
        if not self.store.group.closed:
            self.store.group.on_storage_error(exc)

    def declared(self) -> list[str]:
        return [e.record.name for e in self.effects if isinstance(e, md.QueueDeclared)]

    def deleted(self) -> list[str]:
        return [e.record.name for e in self.effects if isinstance(e, md.QueueDeleted)]

    def close(self) -> None:
        self.store.group.close("test over")
        self.mgr.close()


async def _until(cond: Callable[[], bool], net: dict[str, Replica], what: str,
                 timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, f"timed out: {what}"
        for r in list(net.values()):
            r.store.group.tick()
        await asyncio.sleep(0.01)


async def _leader(net: dict[str, Replica], among: list[str]) -> Replica:
    await _until(lambda: any(net[n].store.group.is_leader and net[n].store.bootstrapped
                             for n in among), net, "a leader")
    return next(net[n] for n in among if net[n].store.group.is_leader)


def _declare(name: str) -> md.DeclareQueue:
    return md.DeclareQueue(md.VhostName("/"), md.QueueName(name), members=("a", "b", "c"),
                           arguments={"x-queue-type": "quorum"})


async def _cluster(dirs: list[Path], forward: bool = False) -> tuple[dict[str, Replica], set[str]]:
    net: dict[str, Replica] = {}
    cut: set[str] = set()
    for name, d in zip(NAMES, dirs, strict=True):
        Replica(name, d, net, cut, forward)
    net["a"].store.group.campaign()
    return net, cut


async def test_a_replica_installing_the_leaders_snapshot_gets_the_effects_it_jumped_over(
        tmp_path: Path) -> None:
    net, cut = await _cluster([tmp_path / n for n in NAMES])
    try:
        lead = await _leader(net, NAMES)
        await lead.store.execute(_declare("kept"))
        await lead.store.execute(_declare("gone"))
        c = net["c"] if lead.name != "c" else net["b"]
        await _until(lambda: c.declared() == ["kept", "gone"], net, "the follower applied both")
        cut.add(c.name)
        await lead.store.execute(md.DeleteQueue(md.VhostName("/"), md.QueueName("gone")))
        for i in range(10):  # past the snapshot interval: the leader compacts
            await lead.store.execute(_declare(f"new{i}"))
        await _until(lambda: (lead.store.glog.snapshot_meta() or st.SnapshotMeta(0, 0, b"")).index
                     > c.store.group.applied_index + 1, net, "the leader compacted past the follower")
        cut.clear()
        await _until(lambda: c.store.group.applied_index >= lead.store.group.applied_index, net,
                     "the follower caught up")
        assert c.store.state.queues.keys() == lead.store.state.queues.keys()
        # by the snapshot, not entry by entry: the effects are the diff's
        assert c.deleted() == ["gone"]
        assert sorted(c.declared()) == sorted(["kept", "gone"] + [f"new{i}" for i in range(10)])
    finally:
        for r in net.values():
            r.close()


async def test_a_forwarded_command_whose_entry_arrives_in_a_snapshot_still_gets_its_reply(
        tmp_path: Path) -> None:
    """c forwards a declaration to the leader while c's Raft traffic is cut;
    the leader commits it and compacts past it, so c receives it inside the
    leader's snapshot and computes no reply for it. The caller gets the
    leader's reply, not None (which the AMQP layer answered with 541), and
    the command is not run a second time (a second DeleteQueue would delete
    a queue declared again in between)."""
    net, cut = await _cluster([tmp_path / n for n in NAMES], forward=True)
    try:
        lead = await _leader(net, NAMES)
        c = net["c"] if lead.name != "c" else net["b"]
        await _until(lambda: c.store.group.leader is not None, net, "c knows the leader")
        cut.add(c.name)
        pending = asyncio.ensure_future(c.store.execute(_declare("fwd")))
        await _until(lambda: ("/", "fwd") in lead.store.state.queues, net, "the leader applied it")
        for i in range(10):
            await lead.store.execute(_declare(f"more{i}"))
        await _until(lambda: (lead.store.glog.snapshot_meta() or st.SnapshotMeta(0, 0, b"")).index
                     > c.store.group.applied_index + 1, net, "the leader compacted past c")
        assert not pending.done()
        cut.clear()
        await _until(pending.done, net, "the forwarded declaration returned")
        reply = pending.result()
        assert isinstance(reply, md.QueueDeclareOk), reply
        assert reply.record.name == "fwd" and reply.created  # its one run created it
        assert ("/", "fwd") in c.store.state.queues
        assert lead.declared().count("fwd") == 1
    finally:
        for r in net.values():
            r.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "mnt", "2m") as mnt:
        yield mnt


@pytest.mark.root
async def test_a_replica_stopped_by_a_full_disk_restarts_in_place_and_acts_once(
        tmp_path: Path, small_disk: Path) -> None:
    """c's data is on a 2 MiB tmpfs. It fills up: c's group stops on ENOSPC
    while a and b go on. Once there is room, `restart_stopped` starts a new
    group over the same log; it replays the entries the old one applied
    without handing their effects over again, then catches up with the
    leader and hands over the effects of what it missed, once each."""
    net, cut = await _cluster([tmp_path / "a", tmp_path / "b", small_disk / "c"])
    # no snapshot on c: the new group replays every entry the old one applied
    net["c"].store.group.snapshot_interval = 10_000
    try:
        await _until(lambda: net["a"].store.group.is_leader and net["a"].store.bootstrapped, net,
                     "a leads")
        lead, c = net["a"], net["c"]
        await lead.store.execute(_declare("before"))
        await _until(lambda: c.declared() == ["before"], net, "c applied the declaration")
        assert c.store.restart_stopped(c.mgr) is None  # not stopped: nothing to do
        filler = small_disk / "filler"
        fill_disk(filler)
        for i in range(100):
            await lead.store.execute(md.SetParameter(md.VhostName("/"), "filler", f"p{i}", "x" * 4000))
            if c.store.group.stopped is not None:
                break
        await _until(lambda: c.store.group.stopped is not None, net, "c's group stopped")
        assert isinstance(c.store.group.stopped, st.StorageIOError), c.store.group.stopped
        old_group = c.store.group
        await lead.store.execute(_declare("while-stopped"))
        # Restarted with the disk still full (the node's alarm would hold it
        # back; a zero limit does not): the new group stops again on its
        # first write, and the next try waits for the back-off.
        retry = c.store.restart_stopped(c.mgr)
        assert retry is not None and retry is not old_group
        await _until(lambda: retry.stopped is not None, net, "the retry stopped on the full disk")
        assert isinstance(retry.stopped, st.StorageIOError), retry.stopped
        assert c.store.restart_stopped(c.mgr) is None  # backing off
        filler.unlink()
        c.store.restart_gate.reopen()  # the back-off is over
        # a restart that fails half-way (e.g. EIO reading the log) leaves
        # the stopped group in place and what readers saw, and is tried again
        seen = c.store.state
        real_new_group = c.store._new_group

        def broken(bootstrap: Any) -> Any:
            raise st.StorageIOError(5, "EIO reading the log")
        c.store._new_group = broken  # type: ignore[method-assign]
        with pytest.raises(st.StorageIOError):
            c.store.restart_stopped(c.mgr)
        c.store._new_group = real_new_group  # type: ignore[method-assign]
        assert c.store.group is retry and c.store.state is seen and ("/", "before") in seen.queues
        c.store.restart_gate.reopen()
        new_group = c.store.restart_stopped(c.mgr)
        assert new_group is not None and new_group is not retry and c.store.group is new_group
        assert c.store.restart_gate.attempts == 3
        # replayed before anything could read it: no empty state in between
        assert ("/", "before") in c.store.state.queues and "/" in c.store.state.vhosts
        await _until(lambda: c.store.group.applied_index >= lead.store.group.applied_index, net,
                     "c caught up")
        await lead.store.execute(_declare("after"))
        await _until(lambda: "after" in c.declared(), net, "c applied a new entry")
        assert c.declared() == ["before", "while-stopped", "after"]
        assert c.store.state.parameters.keys() == lead.store.state.parameters.keys()
        assert c.store.group.stopped is None
    finally:
        for r in net.values():
            r.close()
