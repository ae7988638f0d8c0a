"""Quiescence's node-level part (runtime/quiesce.py) against fake groups and
a fake cluster: when leaders go quiet and whom they tell, which peers are
unreachable, which quiet groups wake."""
from __future__ import annotations

from collections.abc import Collection

from broker.runtime import peer_wire as pw
from broker.runtime.quiesce import Quiescence


class FakeGroup:
    def __init__(self, gid: str, leader: str, me: str = "a", quiet: bool = True) -> None:
        self.group_id = gid
        self.leader = leader
        self.me = me
        self.quiet = quiet
        self.quiesced = False
        self.checks: list[frozenset[str]] = []
        self.notices: list[tuple[str, int, int]] = []
        self.still_quiet_asked: list[frozenset[str]] = []
        self.stopped = False

    @property
    def is_leader(self) -> bool:
        return self.leader == self.me

    def quiet_check(self, unreachable: Collection[str]) -> tuple[list[str], int, int] | None:
        self.checks.append(frozenset(unreachable))
        if not self.quiet:
            return None
        self.quiesced = True
        return [p for p in ("b", "c") if p not in unreachable], 3, 7

    def still_quiet(self, unreachable: Collection[str]) -> bool:
        self.still_quiet_asked.append(frozenset(unreachable))
        return len({"a", "b", "c"} - set(unreachable)) >= 2

    def note_quiet(self, leader: str, term: int, commit: int) -> None:
        self.notices.append((leader, term, commit))

    def wake(self) -> None:
        self.quiesced = False

    @property
    def leads_quietly(self) -> bool:
        return self.quiesced and self.is_leader and not self.stopped

    def members(self) -> list[str]:
        return ["a", "b", "c"] if self.is_leader else []


class FakeCluster:
    def __init__(self) -> None:
        self.peers = {"b": object(), "c": object()}
        self.up = {"b": True, "c": True}
        self.heard: dict[str, float] = {}
        self.sent: list[tuple[str, pw.PeerMessage]] = []

    def transport_up(self, peer: str) -> bool:
        return self.up[peer]

    def last_heard(self, peer: str) -> float | None:
        return self.heard.get(peer)

    def send_to(self, peer: str, msg: pw.PeerMessage) -> None:
        self.sent.append((peer, msg))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def setup(*groups: FakeGroup) -> tuple[Quiescence, FakeCluster, Clock]:
    c, clock = FakeCluster(), Clock()
    by_id = {g.group_id: g for g in groups}
    q = Quiescence(c, by_id.values, by_id.get, skip=("meta",), clock=clock, interval_s=0.5, suspect_s=2.0)
    return q, c, clock


def step(q: Quiescence, c: FakeCluster, clock: Clock, heard: Collection[str] = ("b", "c")) -> None:
    clock.t += 0.5
    for p in heard:
        c.heard[p] = clock.t
    q.run_pass()


def test_a_quiet_leader_tells_its_followers_and_every_peer_is_pinged() -> None:
    lead, busy, meta = FakeGroup("q1", "a"), FakeGroup("q2", "a", quiet=False), FakeGroup("meta", "a")
    q, c, clock = setup(lead, busy, meta)
    step(q, c, clock)
    assert lead.quiesced and not busy.quiesced and not meta.quiesced and meta.checks == []
    assert sorted((p, m) for p, m in c.sent if isinstance(m, pw.Quiesce)) == [
        ("b", pw.Quiesce("q1", 3, 7)), ("c", pw.Quiesce("q1", 3, 7))]
    assert sorted(p for p, m in c.sent if isinstance(m, pw.Ping)) == ["b", "c"]
    assert q.counts() == (1, 2)


def test_a_silent_peer_becomes_unreachable_and_its_quiet_groups_wake() -> None:
    mine, theirs, others = FakeGroup("q1", "a", quiet=False), FakeGroup("q2", "b"), FakeGroup("q3", "c")
    q, c, clock = setup(mine, theirs, others)
    theirs.quiesced = others.quiesced = True
    for _ in range(3):  # b silent for 1.5 s: still reachable
        step(q, c, clock, heard=("c",))
    assert q.unreachable == frozenset() and theirs.quiesced
    step(q, c, clock, heard=("c",))  # 2 s
    assert q.unreachable == {"b"}
    assert not theirs.quiesced and others.quiesced
    assert mine.checks[-1] == {"b"}  # a leader does not wait for b
    step(q, c, clock)  # b heard again
    assert q.unreachable == frozenset()


def test_a_broken_connection_makes_a_peer_unreachable_at_the_next_pass() -> None:
    theirs = FakeGroup("q2", "c")
    q, c, clock = setup(theirs)
    theirs.quiesced = True
    c.up["c"] = False
    step(q, c, clock)
    assert q.unreachable == {"c"} and not theirs.quiesced
    assert all(p != "c" for p, _ in c.sent)  # no ping into a dead connection


def test_after_a_stall_of_our_own_loop_nobody_is_suspected() -> None:
    theirs = FakeGroup("q2", "b")
    q, c, clock = setup(theirs)
    step(q, c, clock)
    theirs.quiesced = True
    clock.t += 5.0  # our loop was blocked: b's frames are unread, not missing
    q.run_pass()
    assert q.unreachable == frozenset() and theirs.quiesced


def test_notices_are_taken_from_the_groups_leader_only_and_checked() -> None:
    g, meta = FakeGroup("q2", "b"), FakeGroup("meta", "b")
    q, c, clock = setup(g, meta)
    q.notice("c", pw.Quiesce("q2", 3, 7))  # c does not lead q2
    q.notice("b", pw.Quiesce("q2", "3", 7))  # type: ignore[arg-type]  # garbage
    q.notice("b", pw.Quiesce("nope", 3, 7))
    q.notice("b", pw.Quiesce("meta", 3, 7))  # the metadata group never goes quiet
    assert g.notices == [] and meta.notices == []
    q.notice("b", pw.Quiesce("q2", 3, 7))
    assert g.notices == [("b", 3, 7)]


def test_a_peer_that_comes_back_wakes_the_groups_shared_with_it() -> None:
    mine, theirs, other = FakeGroup("q1", "a"), FakeGroup("q2", "b"), FakeGroup("q3", "c")
    q, c, clock = setup(mine, theirs, other)
    for g in (mine, theirs, other):
        g.quiesced = True
    q.peer_back("b")
    assert not mine.quiesced and not theirs.quiesced and other.quiesced
    q.leader_lost("c")
    assert not other.quiesced


def test_a_quiet_leader_wakes_when_it_no_longer_reaches_a_quorum() -> None:
    """A quiet leader does not tick, so check-quorum cannot step it down: the
    pass wakes it once the peers it can reach are no quorum (`still_quiet`),
    and leaves it quiet while they are."""
    lead = FakeGroup("q1", "a")
    q, c, clock = setup(lead)
    step(q, c, clock)
    assert lead.quiesced
    c.up["c"] = False
    step(q, c, clock, heard=("b",))
    assert lead.quiesced and lead.still_quiet_asked == [{"c"}]  # a and b: a quorum
    c.up["b"] = False
    step(q, c, clock, heard=())
    assert not lead.quiesced


def test_a_member_whose_node_is_no_peer_is_not_told_and_the_pass_goes_on() -> None:
    """A group's member on a node that is not (or no longer) a cluster peer:
    `Cluster.send_to` raises KeyError for it, which used to escape run_pass
    and end Node._ticker, i.e. every group of the node stopped ticking
    (no elections, no heartbeats) for good."""
    class WithDeparted(FakeGroup):
        def quiet_check(self, unreachable: Collection[str]) -> tuple[list[str], int, int] | None:
            self.quiesced = True
            return ["b", "c", "d"], 3, 7  # d: its node left the cluster

    lead = WithDeparted("q1", "a")
    q, c, clock = setup(lead)
    sent = c.send_to

    def send_to(peer: str, msg: pw.PeerMessage) -> None:
        if peer not in c.peers:
            raise KeyError(f"unknown peer {peer!r}: add_peer() it first")
        sent(peer, msg)
    c.send_to = send_to  # type: ignore[method-assign]
    step(q, c, clock)
    assert lead.quiesced
    assert sorted(p for p, m in c.sent if isinstance(m, pw.Quiesce)) == ["b", "c"]


def keepalives(c: FakeCluster) -> dict[str, list[str]]:
    return {p: m.groups for p, m in c.sent if isinstance(m, pw.StillQuiet)}


def test_every_fourth_pass_each_peer_hears_which_groups_still_lead_quietly() -> None:
    """The keepalive names the groups this node leads quietly with the peer as
    a member (FakeGroup: a leader's members are a, b, c), not the busy ones
    nor those stopped by a storage error, and goes out after the Quiesce
    notices of its pass."""
    quiet, busy, stopped, theirs = (FakeGroup("q1", "a"), FakeGroup("q2", "a", quiet=False),
                                    FakeGroup("q3", "a"), FakeGroup("q4", "b"))
    q, c, clock = setup(quiet, busy, stopped, theirs)
    for _ in range(3):
        step(q, c, clock)
    assert keepalives(c) == {}
    stopped.stopped = True  # quiet, then its group stopped (ENOSPC) while idle
    c.sent.clear()
    step(q, c, clock)
    assert keepalives(c) == {"b": ["q1"], "c": ["q1"]}
    c.up["c"] = False  # nothing into a broken connection
    c.sent.clear()
    for _ in range(4):
        step(q, c, clock, heard=("b",))
    assert keepalives(c) == {"b": ["q1"]}


def test_a_quiet_follower_its_leader_no_longer_lists_wakes() -> None:
    listed, dropped, led_by_c, mine = (FakeGroup("q1", "b"), FakeGroup("q2", "b"),
                                       FakeGroup("q3", "c"), FakeGroup("q4", "a"))
    q, c, clock = setup(listed, dropped, led_by_c, mine)
    for g in (listed, dropped, led_by_c, mine):
        g.quiesced = True
    q.still_quiet_from("b", pw.StillQuiet(["q1", "q4"]))
    assert listed.quiesced and not dropped.quiesced
    assert led_by_c.quiesced and mine.quiesced  # other leaders' groups, our own
    q.still_quiet_from("b", pw.StillQuiet("q1"))  # type: ignore[arg-type]  # garbage: ignored
    q.still_quiet_from("b", pw.StillQuiet([1]))  # type: ignore[list-item]
    assert listed.quiesced
    q.still_quiet_from("b", pw.StillQuiet([]))
    assert not listed.quiesced


def test_a_quiet_follower_whose_leader_is_no_longer_a_peer_wakes() -> None:
    orphan, fine = FakeGroup("q1", "d"), FakeGroup("q2", "b")
    q, c, clock = setup(orphan, fine)
    orphan.quiesced = fine.quiesced = True
    step(q, c, clock)
    assert not orphan.quiesced and fine.quiesced


def test_still_quiet_round_trips_the_peer_codec() -> None:
    msg = pw.StillQuiet(["q/%2F/a", "q/%2F/b"])
    assert pw.decode(pw.encode(msg)) == msg
