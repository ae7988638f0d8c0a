"""RaftGroup: the Raft core driven over real storage (real files, real fsync),
in one event loop. Checks the Ready contract end to end: a proposal's future
resolves only after the entry is durable on a quorum, and a restarted member
recovers its log and state."""
from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker import storage as st
from broker.raft import Membership, NodeId, RaftConfig
from broker.runtime.machine import Cursor, MachineSnapshot
from broker.runtime.raft_group import RaftGroup


class FnMachine:
    """A `Machine` over an apply function that never offers a snapshot."""

    def __init__(self, fn: Callable[[int, int, int, Any], Any]) -> None:
        self.fn = fn

    def apply(self, index: int, term: int, timestamp_ms: int, command: Any) -> Any:
        return self.fn(index, term, timestamp_ms, command)

    def release_cursor(self) -> Cursor | None:
        return None

    def snapshot(self, index: int) -> MachineSnapshot:
        raise AssertionError("no snapshot expected")

    def restore(self, data: bytes, installed: bool) -> None:
        raise AssertionError("no snapshot expected")

    def snapshot_for_follower(self, data: bytes, index: int) -> bytes:
        return data


class Member:
    """One node: a LogManager + a RaftGroup whose machine appends to a list."""

    def __init__(self, name: str, data: Path, voters: list[str], net: Net, *,
                 lazy_commit: bool = False) -> None:
        self.name = name
        self.applied: list[tuple[int, Any]] = []
        loop = asyncio.get_running_loop()
        self.mgr = st.LogManager.open(
            data, st.StorageConfig(wal_max_size_bytes=64 * 1024),
            on_durable=lambda g, i, t: loop.call_soon_threadsafe(self._durable),
        )
        glog = self.mgr.open_group("g1")
        self.group = RaftGroup(
            "g1", name, glog, Membership(frozenset(NodeId(v) for v in voters)),
            FnMachine(self._apply), net.sender(name),
            raft_config=RaftConfig(election_tick=10, lazy_commit=lazy_commit),
            rng=random.Random(hash(name) & 0xFFFF),
        )

    def _durable(self) -> None:
        self.group.on_durable()

    def _apply(self, index: int, term: int, ts: int, payload: Any) -> Any:
        self.applied.append((index, payload))
        return ("applied", payload)

    def close(self) -> None:
        self.mgr.close()


class Net:
    def __init__(self) -> None:
        self.members: dict[str, Member] = {}
        self.cut: set[str] = set()
        self.sent = 0

    def sender(self, src: str) -> Callable[[str, Any], None]:
        def send(dst: str, msg: Any) -> None:
            if src in self.cut or dst in self.cut:
                return
            self.sent += 1
            target = self.members.get(dst)
            if target is not None:
                asyncio.get_running_loop().call_soon(target.group.step, msg)
        return send

    @classmethod
    def of(cls, path: Path, names: list[str]) -> Net:
        """Members `names`, each with its storage under path/name."""
        net = cls()
        for n in names:
            net.members[n] = Member(n, path / n, names, net)
        return net

    def tick_all(self) -> None:
        for mem in self.members.values():
            mem.group.tick()


async def _until(cond: Callable[[], bool], ticker: Callable[[], None] | None = None,
                 timeout: float = 20.0) -> None:
    async def loop() -> None:
        while not cond():
            if ticker:
                ticker()
            await asyncio.sleep(0.005)
    await asyncio.wait_for(loop(), timeout)


async def test_single_member_group_commits_only_after_fsync(tmp_path: Path) -> None:
    net = Net()
    m = Member("n1", tmp_path / "n1", ["n1"], net)
    net.members["n1"] = m
    try:
        m.group.campaign()
        await _until(lambda: m.group.is_leader, m.group.tick)
        futs = [m.group.propose({"n": i}) for i in range(500)]
        replies = await asyncio.wait_for(asyncio.gather(*futs), 20)
        assert replies == [("applied", {"n": i}) for i in range(500)]
        # Everything applied is durable in the WAL.
        assert m.group.glog.durable_index() >= m.applied[-1][0]
        assert [p for _, p in m.applied] == [{"n": i} for i in range(500)]
    finally:
        m.close()
    # Restart: the log is recovered and replays the same commands.
    net2 = Net()
    m2 = Member("n1", tmp_path / "n1", ["n1"], net2)
    net2.members["n1"] = m2
    try:
        m2.group.campaign()
        await _until(lambda: m2.group.is_leader and len(m2.applied) >= 500, m2.group.tick)
        assert [p for _, p in m2.applied][:500] == [{"n": i} for i in range(500)]
        assert (await m2.group.propose("after-restart")) == ("applied", "after-restart")
    finally:
        m2.close()


async def test_three_members_replicate_and_survive_leader_isolation(tmp_path: Path) -> None:
    names = ["a", "b", "c"]
    net = Net.of(tmp_path, names)
    tick_all = net.tick_all

    try:
        await _until(lambda: any(m.group.is_leader for m in net.members.values()), tick_all)
        leader = next(m for m in net.members.values() if m.group.is_leader)
        futs = [leader.group.propose(i) for i in range(200)]
        await asyncio.wait_for(asyncio.gather(*futs), 20)
        # Every member applies the same commands in the same order.
        await _until(lambda: all(len(m.applied) >= 200 for m in net.members.values()), tick_all)
        logs = [[p for _, p in m.applied] for m in net.members.values()]
        assert logs[0] == logs[1] == logs[2] == list(range(200))

        # Isolate the leader: its new proposal never commits; the majority elects another.
        net.cut.add(leader.name)
        stuck = leader.group.propose("minority")
        others = [m for m in net.members.values() if m is not leader]
        await _until(lambda: any(m.group.is_leader for m in others), tick_all)
        assert not stuck.done()
        new_leader = next(m for m in others if m.group.is_leader)
        assert (await asyncio.wait_for(new_leader.group.propose("majority"), 20)) == ("applied", "majority")

        # Heal: the old leader steps down, its uncommitted entry is replaced.
        net.cut.clear()
        await _until(lambda: stuck.done(), tick_all)
        assert stuck.exception() is not None
        await _until(lambda: leader.applied and leader.applied[-1][1] == "majority", tick_all)
        assert sum(m.group.is_leader for m in net.members.values()) == 1
        assert "minority" not in [p for _, p in leader.applied]
    finally:
        for m in net.members.values():
            m.close()


def _log_with_uncommitted_learner(path: Path) -> Membership:
    """Group g1's log at `path`: a NOOP (committed) and a CONFIG entry adding
    learner n2 (not committed); returns the membership that entry carries."""
    from broker.raft import ConfChange, ConfChangeKind, EntryKind, encode_conf_entry

    learner = Membership(frozenset({NodeId("n1")}), frozenset({NodeId("n2")}))
    data = encode_conf_entry(ConfChange(ConfChangeKind.ADD_LEARNER, NodeId("n2")), learner)
    mgr = st.LogManager.open(path, st.StorageConfig(wal_max_size_bytes=64 * 1024))
    glog = mgr.open_group("g1")
    glog.append([st.Entry(1, 1, b"", EntryKind.NOOP.value),
                 st.Entry(2, 1, data, EntryKind.CONFIG.value)])
    glog.set_hard_state(st.HardState(1, "n1", 1))  # entry 2 not committed
    mgr.sync()
    mgr.close()
    return learner


async def test_member_restarting_with_only_an_uncommitted_config_entry_can_still_lead(
        tmp_path: Path) -> None:
    """Issue 10 defect 10: a log whose only CONFIG entry is uncommitted (the
    leader appended 'add learner n2' and the node stopped before it
    committed) used to start with no voters at all: it could never campaign.
    The bootstrap membership is in force until a CONFIG entry commits, and
    that entry then sets the membership it carries even when the bootstrap
    list (the metadata's members) already included the change."""

    loop = asyncio.get_running_loop()
    learner = _log_with_uncommitted_learner(tmp_path / "n1")
    mgr = st.LogManager.open(tmp_path / "n1", st.StorageConfig(wal_max_size_bytes=64 * 1024),
                        on_durable=lambda g, i, t: loop.call_soon_threadsafe(lambda: group.on_durable()))
    applied: list[Any] = []
    try:
        group = RaftGroup("g1", "n1", mgr.open_group("g1"), learner,
                          FnMachine(lambda i, t, ts, p: applied.append(p)), lambda dst, msg: None,
                          raft_config=RaftConfig(election_tick=10), rng=random.Random(7))
        assert group.node.config.voters == {NodeId("n1")}
        group.campaign()
        await _until(lambda: group.is_leader, group.tick)
        assert (await asyncio.wait_for(group.propose("x"), 10)) is None
        assert group.stopped is None
        assert group.node.config == learner and applied == ["x"]
    finally:
        mgr.close()


async def test_unexpected_error_while_applying_stops_the_group_and_fails_its_waiters(
        tmp_path: Path) -> None:
    """Issue 10 defect 9: an exception other than a storage error inside the
    Ready loop used to leave the batch half applied and the group silently
    frozen. It stops the group, loudly: waiters fail, nothing is confirmed,
    the reason is kept, and the group no longer claims to lead."""
    net = Net()
    m = Member("n1", tmp_path / "n1", ["n1"], net)
    net.members["n1"] = m
    try:
        m.group.campaign()
        await _until(lambda: m.group.is_leader, m.group.tick)
        assert (await m.group.propose("ok")) == ("applied", "ok")

        def boom(index: int, term: int, ts: int, payload: Any) -> Any:
            if payload == "bad":
                raise ValueError("broken invariant")
            return ("applied", payload)
        m.group.machine = FnMachine(boom)
        bad = m.group.propose("bad")
        later = m.group.propose("later")
        await _until(lambda: bad.done() and later.done())
        assert isinstance(m.group.stopped, ValueError)
        assert bad.exception() is not None and later.exception() is not None
        assert not m.group.is_leader
        with pytest.raises(Exception, match="stopped"):
            m.group.propose("after")
        # nor any other proposal: its waiter would never be resolved
        from broker.raft import ConfChange, ConfChangeKind, NodeId
        from broker.runtime.raft_group import ProposalFailed
        with pytest.raises(ProposalFailed, match="stopped"):
            m.group.propose_conf(ConfChange(ConfChangeKind.ADD_LEARNER, NodeId("n2")))
        with pytest.raises(ProposalFailed, match="stopped"):
            m.group.propose_nowait("after")
        m.group.stopped = None
        m.group.close("member removed")  # a closed member refuses too
        with pytest.raises(ProposalFailed, match="closed"):
            m.group.propose_conf(ConfChange(ConfChangeKind.ADD_LEARNER, NodeId("n2")))
    finally:
        m.close()


async def test_proposals_truncated_by_a_new_leader_fail_even_on_a_quiet_group(tmp_path: Path) -> None:
    """Safety review of issue 10: an isolated leader's proposals beyond the new
    leader's log end are truncated when it rejoins; nothing is ever written at
    those indexes on a quiet group, so their waiters must fail right then
    (ProposalReplaced: never applied, safe to send again), not wait for ever."""
    from broker.runtime.raft_group import ProposalReplaced

    names = ["a", "b", "c"]
    net = Net.of(tmp_path, names)
    tick_all = net.tick_all

    try:
        await _until(lambda: any(m.group.is_leader for m in net.members.values()), tick_all)
        old = next(m for m in net.members.values() if m.group.is_leader)
        assert (await asyncio.wait_for(old.group.propose("first"), 20)) == ("applied", "first")
        net.cut.add(old.name)
        stuck = [old.group.propose(f"lost-{i}") for i in range(3)]
        others = [m for m in net.members.values() if m is not old]
        await _until(lambda: any(m.group.is_leader for m in others), tick_all)
        net.cut.clear()  # the new leader has only its no-op: the group stays quiet
        await _until(lambda: all(f.done() for f in stuck), tick_all)
        assert all(isinstance(f.exception(), ProposalReplaced) for f in stuck)
        assert not any(p.startswith("lost") for _, p in old.applied if isinstance(p, str))
    finally:
        for m in net.members.values():
            m.close()


async def _gone_quiet(net: Net) -> tuple[Member, list[Member], tuple[list[str], int, int]]:
    """Elect a leader, commit one entry everywhere, then run quiet checks until
    the leader goes quiet (two in a row): (leader, followers, its notice)."""
    tick_all = net.tick_all
    await _until(lambda: any(m.group.is_leader for m in net.members.values()), tick_all)
    leader = next(m for m in net.members.values() if m.group.is_leader)
    await asyncio.wait_for(leader.group.propose("x"), 20)
    followers = [m for m in net.members.values() if m is not leader]
    await _until(lambda: all(len(m.applied) == len(leader.applied) for m in followers), tick_all)
    went = None

    def check() -> bool:
        nonlocal went
        went = went or leader.group.quiet_check(())
        return went is not None
    await _until(check, tick_all)
    assert went is not None
    return leader, followers, went


async def test_an_idle_group_goes_quiet_sends_nothing_and_wakes_on_a_proposal(tmp_path: Path) -> None:
    """Quiescence (runtime/quiesce.py): the leader of an idle group stops
    ticking once every follower has the log and the commit; told so, the
    followers stop too; ticks then send nothing; a proposal wakes them all."""
    net = Net.of(tmp_path, ["a", "b", "c"])
    tick_all = net.tick_all
    try:
        leader, followers, went = await _gone_quiet(net)
        assert leader.group.quiesced
        tell, term, commit = went
        assert sorted(tell) == sorted(m.name for m in followers)
        for m in followers:
            m.group.note_quiet(leader.name, term, commit)
        await _until(lambda: all(m.group.quiesced for m in followers), tick_all)
        await asyncio.sleep(0.05)  # late answers to the last heartbeats land
        assert leader.group.quiesced, "a late heartbeat answer woke the leader"
        sent = net.sent
        for _ in range(50):  # five election timeouts of ticks
            tick_all()
            await asyncio.sleep(0)
        assert net.sent == sent and all(m.group.role.value == "follower" for m in followers)

        assert (await asyncio.wait_for(leader.group.propose("y"), 20)) == ("applied", "y")
        assert not leader.group.quiesced
        await _until(lambda: all(m.applied[-1][1] == "y" for m in followers), tick_all)
        assert not any(m.group.quiesced for m in followers)
    finally:
        for m in net.members.values():
            m.close()


async def test_a_quiet_follower_woken_without_its_leader_elects_a_new_one(tmp_path: Path) -> None:
    """The leader's node is lost while its group is quiet: the followers,
    woken by the node's failure detector (`wake`), elect a new leader."""
    net = Net.of(tmp_path, ["a", "b", "c"])
    tick_all = net.tick_all
    try:
        leader, followers, went = await _gone_quiet(net)
        for m in followers:
            m.group.note_quiet(leader.name, went[1], went[2])
        await _until(lambda: all(m.group.quiesced for m in followers), tick_all)
        net.cut.add(leader.name)
        for _ in range(50):
            tick_all()
            await asyncio.sleep(0)
        assert not any(m.group.is_leader for m in followers)  # quiet: nobody noticed
        for m in followers:
            m.group.wake()
        await _until(lambda: any(m.group.is_leader for m in followers), tick_all)
        new = next(m for m in followers if m.group.is_leader)
        assert (await asyncio.wait_for(new.group.propose("z"), 20)) == ("applied", "z")
    finally:
        for m in net.members.values():
            m.close()


class _Links:
    """One member's cluster as Quiescence sees it (runtime/quiesce.py
    `PeerLinks`): members in `net.cut` are disconnected from everyone;
    Quiesce notices are handed to the destination's Quiescence."""

    def __init__(self, net: Net, me: str, qs: dict[str, Any], clock: list[float]) -> None:
        self.net, self.me, self.qs, self.clock = net, me, qs, clock

    def _ok(self, peer: str) -> bool:
        return self.me not in self.net.cut and peer not in self.net.cut

    @property
    def peers(self) -> dict[str, object]:
        return {n: None for n in self.net.members if n != self.me}

    def transport_up(self, peer: str) -> bool:
        return self._ok(peer)

    def last_heard(self, peer: str) -> float | None:
        return self.clock[0]

    def send_to(self, peer: str, msg: Any) -> None:
        from broker.runtime import peer_wire as pw
        if isinstance(msg, pw.Quiesce) and self._ok(peer):
            asyncio.get_running_loop().call_soon(self.qs[peer].notice, self.me, msg)


def _with_quiescence(net: Net) -> Callable[[], None]:
    """Give every member a Quiescence; returns Node._ticker's body (a pass
    every PASS_TICKS ticks, then the ticks) over a fake clock."""
    from broker.runtime.quiesce import PASS_TICKS, Quiescence
    clock = [1000.0]
    qs: dict[str, Any] = {}
    for name, m in net.members.items():
        g = m.group
        qs[name] = Quiescence(_Links(net, name, qs, clock), lambda g=g: [g],
                              lambda gid, g=g: g if gid == g.group_id else None,
                              clock=lambda: clock[0], interval_s=0.5)
    n = [0]

    def tick() -> None:
        clock[0] += 0.1
        n[0] += 1
        if n[0] % PASS_TICKS == 0:
            for q in qs.values():
                q.run_pass()
        net.tick_all()
    return tick


async def test_a_quiet_leader_cut_off_from_its_quorum_steps_down(tmp_path: Path) -> None:
    """Review of quiescence: a quiet leader whose followers both became
    unreachable used to stay quiet, so check-quorum never ran and it
    believed it led for ever (30 s here; in a node, `PeerEvents.reconnected`
    then redelivers checked-out messages from its stale state, messages
    the new leader may have had acked since). It wakes, and steps down."""
    names = ["a", "b", "c"]
    net = Net.of(tmp_path, names)
    tick = _with_quiescence(net)
    try:
        await _until(lambda: any(m.group.is_leader for m in net.members.values()), tick)
        leader = next(m for m in net.members.values() if m.group.is_leader)
        await asyncio.wait_for(leader.group.propose("x"), 20)
        await _until(lambda: all(m.group.quiesced for m in net.members.values()), tick)
        net.cut.add(leader.name)
        others = [m for m in net.members.values() if m is not leader]
        await _until(lambda: any(m.group.is_leader for m in others), tick)
        for _ in range(50):  # 5 s: up to two election timeouts after it wakes
            tick()
            await asyncio.sleep(0)
        assert not leader.group.is_leader and not leader.group.quiesced
    finally:
        for m in net.members.values():
            m.close()


async def _lazy_single_leader(path: Path) -> Member:
    """A one-member group with lazy commit over storage at `path`, elected."""
    net = Net()
    m = Member("n1", path, ["n1"], net, lazy_commit=True)
    net.members["n1"] = m
    m.group.campaign()
    await _until(lambda: m.group.is_leader, m.group.tick)
    return m


async def test_lazy_commit_writes_no_commit_only_hard_state_and_a_restart_relearns_the_commit(
        tmp_path: Path) -> None:
    """Lazy commit (queue groups): a hard state whose only change is the
    commit index is not written (no WAL record, no durability round). The
    durable commit stays behind what was applied, and a restarted member
    relearns it: everything confirmed is applied again once it leads."""
    m = await _lazy_single_leader(tmp_path / "n1")
    try:
        m.mgr.sync()
        elected = m.group.glog.durable_hard_state()
        for i in range(50):  # one entry at a time: each commit is its own hard state
            assert (await asyncio.wait_for(m.group.propose(i), 10)) == ("applied", i)
        m.mgr.sync()
        durable = m.group.glog.durable_hard_state()
        assert (durable.term, durable.voted_for) == (elected.term, "n1")
        assert durable.commit <= elected.commit + 1 < m.applied[-1][0]
        assert m.group.glog.durable_index() >= m.applied[-1][0]
    finally:
        m.close()
    m2 = await _lazy_single_leader(tmp_path / "n1")
    try:
        await _until(lambda: len(m2.applied) >= 50, m2.group.tick)
        assert [p for _, p in m2.applied] == list(range(50))
    finally:
        m2.close()


async def test_lazy_commit_still_writes_a_commit_that_passes_a_config_entry(tmp_path: Path) -> None:
    """The restart rule for membership reads the CONFIG entries at or below
    the recovered commit: a commit passing one is written even when it is
    the hard state's only change, so a member restarting right after a
    membership change committed starts with the new membership."""
    from broker.raft import ConfChange, ConfChangeKind

    m = await _lazy_single_leader(tmp_path / "n1")
    try:
        for i in range(5):
            await asyncio.wait_for(m.group.propose(i), 10)
        await asyncio.wait_for(m.group.propose_conf(ConfChange(ConfChangeKind.ADD_LEARNER, NodeId("n2"))), 10)
        conf_index = m.group.applied_index
        m.mgr.sync()
        assert m.group.glog.durable_hard_state().commit >= conf_index
        for i in range(5, 10):  # commit-only again after it
            await asyncio.wait_for(m.group.propose(i), 10)
        m.mgr.sync()
        assert m.group.glog.durable_hard_state().commit < m.group.applied_index
    finally:
        m.close()
    m2 = Member("n1", tmp_path / "n1", ["n1"], Net(), lazy_commit=True)
    try:
        # before any election: the membership is the committed CONFIG entry's
        assert m2.group.node.config.learners == {NodeId("n2")}
        assert m2.group.node.config.voters == {NodeId("n1")}
    finally:
        m2.close()


async def test_lazy_commit_writes_the_commit_of_a_config_entry_the_member_restarted_with(
        tmp_path: Path) -> None:
    """A member restarting with a CONFIG entry above its recovered commit
    (the core finds it in the log at start): the commit that passes it
    after the restart is written, so the entry is in force at the next
    restart."""

    loop = asyncio.get_running_loop()
    boot = Membership(frozenset({NodeId("n1")}))
    learner = _log_with_uncommitted_learner(tmp_path / "n1")
    cfg = st.StorageConfig(wal_max_size_bytes=64 * 1024)

    def start() -> tuple[st.LogManager, RaftGroup]:
        holder: list[RaftGroup] = []
        mgr = st.LogManager.open(tmp_path / "n1", cfg, on_durable=lambda g, i, t: loop.call_soon_threadsafe(
            lambda: holder[0].on_durable()))
        group = RaftGroup("g1", "n1", mgr.open_group("g1"), boot, FnMachine(lambda i, t, ts, p: p),
                          lambda dst, msg: None, raft_config=RaftConfig(election_tick=10, lazy_commit=True),
                          rng=random.Random(7))
        holder.append(group)
        return mgr, group

    mgr, group = start()
    try:
        assert group.node.config == boot
        group.campaign()
        await _until(lambda: group.is_leader, group.tick)
        assert (await asyncio.wait_for(group.propose("x"), 10)) == "x"
        assert group.node.config == learner
        mgr.sync()
        assert group.glog.durable_hard_state().commit >= 2
    finally:
        mgr.close()
    mgr, group = start()
    try:
        assert group.node.config == learner
    finally:
        mgr.close()


async def test_lazy_commit_a_follower_restarting_after_a_membership_change_takes_the_new_membership(
        tmp_path: Path) -> None:
    """Followers learn a CONFIG entry and, in a later append, the commit that
    passes it; each writes that commit (not the ones after it), so a
    follower restarted right after the change starts with the membership the
    entry carries, before it hears from any leader."""
    from broker.raft import ConfChange, ConfChangeKind

    names = ["a", "b", "c"]
    net = Net()
    for n in names:
        net.members[n] = Member(n, tmp_path / n, names, net, lazy_commit=True)
    try:
        await _until(lambda: any(m.group.is_leader for m in net.members.values()), net.tick_all)
        leader = next(m for m in net.members.values() if m.group.is_leader)
        for i in range(5):
            await asyncio.wait_for(leader.group.propose(i), 10)
        gone, stays = [n for n in names if n != leader.name]
        await asyncio.wait_for(leader.group.propose_conf(ConfChange(ConfChangeKind.REMOVE, NodeId(gone))), 10)
        conf_index = leader.group.applied_index
        for i in range(5, 20):
            await asyncio.wait_for(leader.group.propose(i), 10)
        follower = net.members[stays]
        await _until(lambda: len(follower.applied) >= 20, net.tick_all)
        follower.mgr.sync()
        durable = follower.group.glog.durable_hard_state()
        assert conf_index <= durable.commit < follower.group.applied_index
    finally:
        for m in net.members.values():
            m.close()
    again = Member(follower.name, tmp_path / follower.name, names, Net(), lazy_commit=True)
    try:
        assert again.group.node.config.voters == {NodeId(leader.name), NodeId(stays)}
    finally:
        again.close()


async def test_a_member_restarting_two_config_entries_behind_its_log_takes_the_first_as_committed(
        tmp_path: Path) -> None:
    """Real storage: a log with 'add learner n2' and then 'promote n2', its
    durable commit below both (the hard state recording the first one's
    commit was lost, the later entry kept). A leader proposed the promotion
    only once the learner's entry had committed, so the member starts with
    the learner in force, and writes that commit before anything else."""
    from broker.raft import ConfChange, ConfChangeKind, EntryKind, encode_conf_entry

    loop = asyncio.get_running_loop()
    boot = Membership(frozenset({NodeId("n1")}))
    learner = Membership(frozenset({NodeId("n1")}), frozenset({NodeId("n2")}))
    both = Membership(frozenset({NodeId("n1"), NodeId("n2")}))
    cfg = st.StorageConfig(wal_max_size_bytes=64 * 1024)
    mgr = st.LogManager.open(tmp_path / "n1", cfg)
    glog = mgr.open_group("g1")
    glog.append([
        st.Entry(1, 1, b"", EntryKind.NOOP.value),
        st.Entry(2, 1, encode_conf_entry(ConfChange(ConfChangeKind.ADD_LEARNER, NodeId("n2")), learner),
                 EntryKind.CONFIG.value),
        st.Entry(3, 1, encode_conf_entry(ConfChange(ConfChangeKind.PROMOTE, NodeId("n2")), both),
                 EntryKind.CONFIG.value),
    ])
    glog.set_hard_state(st.HardState(1, "n1", 1))
    mgr.sync()
    mgr.close()
    holder: list[RaftGroup] = []
    mgr = st.LogManager.open(tmp_path / "n1", cfg, on_durable=lambda g, i, t: loop.call_soon_threadsafe(
        lambda: holder[0].on_durable()))
    try:
        group = RaftGroup("g1", "n1", mgr.open_group("g1"), boot, FnMachine(lambda i, t, ts, p: p),
                          lambda dst, msg: None, raft_config=RaftConfig(election_tick=10, lazy_commit=True),
                          rng=random.Random(7))
        holder.append(group)
        assert group.node.config == learner and group.node.commit_index == 2
        group.process_now()
        mgr.sync()
        assert group.glog.durable_hard_state().commit == 2
        # The promotion commits with the NOOP of the member's own term.
        group.campaign()
        await _until(lambda: group.node.config == both, group.tick)
    finally:
        mgr.close()


async def test_campaign_on_a_member_that_cannot_campaign_does_nothing(tmp_path: Path) -> None:
    """A learner (or a member its log removed) is asked to campaign by
    callers that do not check (its leader's connection broke): nothing
    happens, where the Raft core refuses with RaftUsageError."""
    from broker.raft import RaftUsageError, Role

    mgr = st.LogManager.open(tmp_path / "n1", st.StorageConfig(wal_max_size_bytes=64 * 1024))
    try:
        sent: list[Any] = []
        group = RaftGroup("g1", "n1", mgr.open_group("g1"),
                          Membership(frozenset({NodeId("n2")}), frozenset({NodeId("n1")})),
                          FnMachine(lambda i, t, ts, p: p), lambda dst, msg: sent.append(msg),
                          raft_config=RaftConfig(election_tick=10), rng=random.Random(7))
        with pytest.raises(RaftUsageError):
            group.node.campaign()
        group.campaign()
        group.process_now()
        assert group.role is Role.FOLLOWER and group.node.term == 0 and sent == []
    finally:
        mgr.close()
