"""The machine boundary (runtime/machine.py): a `RaftGroup` over a fake
`Machine` and real storage, no broker process. The group owns the snapshot
cadence (every `snapshot_interval` applied entries at the machine's next
release cursor, at once on `Cursor.NOW`, once `snapshot_bytes` were applied,
after `snapshot_idle_s` idle), the
write, the release bound and the compaction; the machine says what a
snapshot holds and takes one back (at start, and on InstallSnapshot)."""
from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from broker import storage as st
from broker.raft import Membership, NodeId, RaftConfig
from broker.runtime.machine import Cursor, Machine, MachineSnapshot
from broker.runtime.raft_group import RaftGroup

AUG = b"|bodies"  # what snapshot_for_follower adds (a queue's live bodies)


class FakeMachine:
    """Applies payloads to a list. A payload "cursor" emits a release cursor,
    "now" asks for a snapshot at once; `every` emits one on every entry."""

    def __init__(self, every: bool = False) -> None:
        self.every = every
        self.state: list[Any] = []
        self.release_bound: int | None = None  # None: index + 1
        self.keep: list[int] | None = None
        self._cursor: Cursor | None = None
        self.snapshots: list[int] = []  # indexes snapshot() was asked for
        self.restored: list[tuple[bytes, bool]] = []
        self.on_snapshot: Callable[[], None] | None = None

    def apply(self, index: int, term: int, timestamp_ms: int, command: Any) -> Any:
        self.state.append(command)
        if command == "now":
            self._cursor = Cursor.NOW
        elif command == "cursor" or self.every:
            self._cursor = Cursor.RELEASE
        return len(self.state)

    def release_cursor(self) -> Cursor | None:
        c, self._cursor = self._cursor, None
        return c

    def snapshot(self, index: int) -> MachineSnapshot:
        self.snapshots.append(index)
        if self.on_snapshot is not None:
            self.on_snapshot()
        release = index + 1 if self.release_bound is None else self.release_bound
        return MachineSnapshot(msgpack.packb(self.state), release, self.keep)

    def restore(self, data: bytes, installed: bool) -> None:
        self.restored.append((data, installed))
        self.state = list(msgpack.unpackb(data.removesuffix(AUG)))

    def snapshot_for_follower(self, data: bytes, index: int) -> bytes:
        return data + AUG


class SpyLog:
    """A GroupLog that records what the group asks of it for snapshots."""

    def __init__(self, glog: st.GroupLog) -> None:
        self._glog = glog
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._glog, name)

    def save_snapshot(self, index: int, term: int, config: bytes, data: bytes) -> None:
        self.calls.append(("save", index))
        self._glog.save_snapshot(index, term, config, data)

    def release(self, live: int) -> int:
        self.calls.append(("release", live))
        return self._glog.release(live)

    def compact(self, keep: list[int]) -> int:
        self.calls.append(("compact", list(keep)))
        return self._glog.compact(keep)


class Node:
    def __init__(self, name: str, data: Path, voters: list[str], net: dict[str, Node],
                 cut: set[str], machine: FakeMachine, **kw: Any) -> None:
        loop = asyncio.get_running_loop()
        self.name = name
        self.machine = machine
        self.mgr = st.LogManager.open(
            data, st.StorageConfig(wal_max_size_bytes=64 * 1024),
            on_durable=lambda g, i, t: loop.call_soon_threadsafe(self._durable))
        self.log = SpyLog(self.mgr.open_group("g1"))

        def send(dst: str, msg: Any) -> None:
            if name not in cut and dst not in cut and dst in net:
                loop.call_soon(net[dst].group.step, msg)

        m: Machine = machine
        self.group = RaftGroup("g1", name, self.log, Membership(frozenset(NodeId(v) for v in voters)),  # type: ignore[arg-type]
                               m, send, raft_config=RaftConfig(election_tick=10),
                               rng=random.Random(hash(name) & 0xFFFF), **kw)
        net[name] = self

    def _durable(self) -> None:
        if not self.group.closed:
            self.group.on_durable()

    def close(self) -> None:
        self.group.close("test over")
        self.mgr.close()


async def _until(cond: Callable[[], bool], tick: Callable[[], None] | None = None,
                 timeout: float = 20.0) -> None:
    async def loop() -> None:
        while not cond():
            if tick is not None:
                tick()
            await asyncio.sleep(0.005)
    await asyncio.wait_for(loop(), timeout)


async def _leader(node: Node) -> None:
    node.group.campaign()
    await _until(lambda: node.group.is_leader, node.group.tick)


def _saved(node: Node) -> list[int]:
    return [i for op, i in node.log.calls if op == "save"]


async def _settle() -> None:
    for _ in range(3):  # the write is scheduled after the Ready
        await asyncio.sleep(0)


async def test_snapshot_every_interval_entries_at_a_release_cursor(tmp_path: Path) -> None:
    net: dict[str, Node] = {}
    n = Node("n1", tmp_path / "n1", ["n1"], net, set(), FakeMachine(every=True), snapshot_interval=10)
    try:
        await _leader(n)  # index 1: the leader's empty entry (not applied to the machine)
        for i in range(25):
            await n.group.propose(i)
        await _settle()
        # NORMAL entries at 2..26: the 10th is index 11, the 20th index 21.
        assert n.machine.snapshots == [11, 21]
        assert _saved(n) == [11, 21]
        assert n.log.calls[:2] == [("save", 11), ("release", 12)]
        snap = n.log.latest_snapshot()
        assert snap is not None and snap.meta.index == 21
        assert msgpack.unpackb(snap.data) == list(range(20))  # the state as of 21, no more
        assert n.group.applied_since_snapshot == 5
    finally:
        n.close()


async def test_no_snapshot_without_a_release_cursor(tmp_path: Path) -> None:
    """The interval alone takes no snapshot: the machine must offer the state
    (Ra's release_cursor); the first cursor after the interval does."""
    net: dict[str, Node] = {}
    m = FakeMachine()
    m.release_bound = 5  # a live message at 5: nothing below may go... from 5 on
    n = Node("n1", tmp_path / "n1", ["n1"], net, set(), m, snapshot_interval=10)
    try:
        await _leader(n)
        for i in range(30):
            await n.group.propose(i)
        await _settle()
        assert m.snapshots == [] and _saved(n) == []
        await n.group.propose("cursor")  # index 32
        await _settle()
        assert m.snapshots == [32] and _saved(n) == [32]
        assert ("release", 5) in n.log.calls  # the machine's bound, not the snapshot's
        # a cursor before the next interval is not taken
        await n.group.propose("cursor")
        await _settle()
        assert m.snapshots == [32]
    finally:
        n.close()


async def test_snapshot_once_the_applied_entries_hold_snapshot_bytes(tmp_path: Path) -> None:
    """Big entries snapshot by their bytes, with no cursor and far below the
    entry interval; the release that follows drops the released entries
    from the memory table at once (they will not be written to segments)."""
    net: dict[str, Node] = {}
    m = FakeMachine()
    n = Node("n1", tmp_path / "n1", ["n1"], net, set(), m, snapshot_interval=1000,
             snapshot_bytes=20_000)
    try:
        await _leader(n)  # index 1
        body = b"x" * 4_000
        for _ in range(4):
            await n.group.propose(body)
        await _settle()
        assert m.snapshots == [] and n.log.first_index() == 1
        await n.group.propose(body)  # index 6: 5 entries of ~4 KB since the start
        await _settle()
        assert m.snapshots == [6] and _saved(n) == [6]
        assert n.group.applied_bytes_since_snapshot == 0
        assert n.log.first_index() == 6  # nothing live: released but the last entry
        for _ in range(4):
            await n.group.propose(body)
        await _settle()
        assert m.snapshots == [6]  # the count starts again after each snapshot
        assert n.group.applied_bytes_since_snapshot > 16_000
    finally:
        n.close()


async def test_now_cursor_snapshots_whatever_the_interval(tmp_path: Path) -> None:
    net: dict[str, Node] = {}
    m = FakeMachine()
    m.keep = [3]
    n = Node("n1", tmp_path / "n1", ["n1"], net, set(), m, snapshot_interval=1000)
    try:
        await _leader(n)
        for i in range(3):
            await n.group.propose(i)
        await n.group.propose("now")  # index 5 (a purge)
        await _settle()
        assert m.snapshots == [5]
        assert n.log.calls == [("save", 5), ("release", 6), ("compact", [3])]
    finally:
        n.close()


async def test_idle_group_snapshots_what_it_applied(tmp_path: Path) -> None:
    net: dict[str, Node] = {}
    m = FakeMachine()
    n = Node("n1", tmp_path / "n1", ["n1"], net, set(), m, snapshot_interval=1000,
             snapshot_idle_s=0.05)
    try:
        await _leader(n)
        for i in range(4):
            await n.group.propose(i)
        await _until(lambda: bool(_saved(n)), timeout=5)
        assert _saved(n) == [5] and m.snapshots == [5]
        assert n.group.applied_since_snapshot == 0
        await asyncio.sleep(0.2)
        assert _saved(n) == [5]  # nothing applied since: no new snapshot
    finally:
        n.close()


async def test_a_closed_group_writes_no_snapshot(tmp_path: Path) -> None:
    net: dict[str, Node] = {}
    m = FakeMachine()
    n = Node("n1", tmp_path / "n1", ["n1"], net, set(), m, snapshot_idle_s=0.05)
    try:
        await _leader(n)
        # the member closes (queue deleted) after the state was serialised,
        # before the write: its log may be deleted next
        m.on_snapshot = lambda: n.group.close("deleted")
        await n.group.propose("now")
        await asyncio.sleep(0.2)
        assert m.snapshots == [2] and _saved(n) == []
    finally:
        n.mgr.close()


async def test_restart_restores_the_snapshot_and_replays_only_what_follows(tmp_path: Path) -> None:
    net: dict[str, Node] = {}
    n = Node("n1", tmp_path / "n1", ["n1"], net, set(), FakeMachine(every=True), snapshot_interval=10)
    try:
        await _leader(n)
        for i in range(15):
            await n.group.propose(i)
        await _settle()
        assert _saved(n) == [11]
    finally:
        n.close()
    net = {}
    m = FakeMachine()
    n = Node("n1", tmp_path / "n1", ["n1"], net, set(), m, snapshot_interval=10)
    try:
        assert len(m.restored) == 1 and m.restored[0][1] is False  # its own, at start
        assert m.state == list(range(10))
        assert n.group.applied_index == 11
        await _leader(n)
        await _until(lambda: len(m.state) == 15, n.group.tick)
        assert m.state == list(range(15))  # 12..16 replayed once each
    finally:
        n.close()


async def test_a_far_behind_follower_installs_the_leaders_snapshot(tmp_path: Path) -> None:
    names = ["a", "b", "c"]
    net: dict[str, Node] = {}
    cut: set[str] = set()
    nodes = [Node(x, tmp_path / x, names, net, cut, FakeMachine(every=True), snapshot_interval=10)
             for x in names]

    def tick() -> None:
        for x in nodes:
            x.group.tick()
    a, b, c = nodes
    try:
        a.group.campaign()
        await _until(lambda: a.group.is_leader, tick)
        cut.add("c")
        for i in range(25):
            await a.group.propose(i)
        await _settle()
        assert _saved(a) == [11, 21]
        cut.clear()
        await _until(lambda: len(c.machine.state) == 25, tick)
        installed = [(d, inst) for d, inst in c.machine.restored if inst]
        assert len(installed) == 1
        data, _ = installed[0]
        assert data.endswith(AUG)  # sent with what the follower needs (bodies)
        assert msgpack.unpackb(data.removesuffix(AUG)) == list(range(20))
        assert c.machine.state == list(range(25))
        assert c.log.snapshot_meta() is not None and c.log.snapshot_meta().index == 21
    finally:
        for x in nodes:
            x.close()


async def test_metadata_snapshot_holds_the_state_as_of_its_index(tmp_path: Path) -> None:
    """The metadata store is its group's machine. Its snapshot is at the entry
    whose state it holds: before the group owned the cadence, the store wrote
    the state *after* entry i as the snapshot at i - 1 (the group's applied
    index was not yet i while applying it), so a restart applied i twice."""
    from broker import metadata as md
    from broker.runtime.metastore import MetadataStore

    def store(effects: list[Any]) -> MetadataStore:
        loop = asyncio.get_running_loop()
        mgr = st.LogManager.open(tmp_path / "n1", st.StorageConfig(wal_max_size_bytes=64 * 1024),
                                 on_durable=lambda g, i, t: loop.call_soon_threadsafe(
                                     lambda: s.group.closed or s.group.on_durable()))
        s = MetadataStore("n1", mgr.open_group("__metadata__"), ["n1"], lambda d, m: None,
                          RaftConfig(election_tick=10), effects.extend)
        s.group.snapshot_interval = 4
        stores.append((s, mgr))
        return s

    stores: list[tuple[MetadataStore, st.LogManager]] = []
    try:
        s = store([])
        s.group.campaign()
        await _until(lambda: s.group.is_leader and s.bootstrapped, s.group.tick)
        for i in range(5):
            await s.execute(md.AddVhost(md.VhostName(f"v{i}")))
        await _settle()
        # NOOP at 1, Bootstrap at 2, AddVhost v0..v4 at 3..7: the 4th NORMAL entry is 5
        snap = s.glog.latest_snapshot()
        assert snap is not None and snap.meta.index == 5
        assert sorted(md.from_bytes(snap.data).vhosts) == ["/", "v0", "v1", "v2"]
        s.group.close("restart")
        stores[0][1].close()
        effects: list[Any] = []
        s2 = store(effects)
        assert sorted(s2.state.vhosts) == ["/", "v0", "v1", "v2"] and s2.bootstrapped
        s2.group.campaign()
        await _until(lambda: s2.group.is_leader and "v4" in s2.state.vhosts, s2.group.tick)
        # only v3 and v4 were applied again
        added = [e for e in effects if isinstance(e, md.VhostAdded)]
        assert [e.record.name for e in added] == ["v3", "v4"]
    finally:
        for s_, mgr in stores:
            s_.group.close("test over")
            mgr.close()
