"""Unit tests named after the rules of the Raft paper (§5.1-5.4), the thesis
chapters on membership (§6 here; thesis ch. 4), log compaction (§7), and the
thesis' pre-vote / check-quorum / leadership transfer, plus the Ready
contract and misuse errors."""
from __future__ import annotations

import random

import pytest

from broker.raft import (
    AppendEntries,
    AppendResponse,
    ConfChange,
    ConfChangeKind,
    Entry,
    EntryKind,
    Heartbeat,
    HeartbeatResponse,
    Index,
    InstallSnapshot,
    InvalidConfChange,
    InvariantViolation,
    MemoryStorage,
    NodeId,
    NotLeader,
    ProposalDropped,
    RaftConfig,
    RaftNode,
    RaftUsageError,
    RequestVote,
    RequestVoteResponse,
    Role,
    Term,
    TransferRefused,
)
from broker.raft.errors import Compacted, Unavailable
from tests.raft.harness import Cluster

N = NodeId


def node(nid: str = "1", voters: tuple[str, ...] = ("1", "2", "3"), seed: int = 0, **cfg: object) -> RaftNode:
    return RaftNode(nid, MemoryStorage(voters=voters), RaftConfig(**cfg), random.Random(seed))  # type: ignore[arg-type]


def drain(n: RaftNode, persist: bool = True) -> list[object]:
    """Sync host: return every message the node wants to send."""
    out: list[object] = []
    st = n.log.storage
    assert isinstance(st, MemoryStorage)
    while n.has_ready():
        rd = n.ready()
        out += rd.messages
        if persist and rd.must_persist:
            if rd.snapshot is not None:
                st.apply_snapshot(rd.snapshot)
            st.append(rd.entries)
            if rd.hard_state is not None:
                st.set_hard_state(rd.hard_state)
        out += rd.persisted_messages
        n.advance(rd, persisted=persist and rd.must_persist)
        if not persist:
            break
    return out


def write(n: RaftNode, rd: object) -> None:
    """What a host does with a Ready's durable parts (before persisted())."""
    from broker.raft import Ready

    assert isinstance(rd, Ready)
    st = n.log.storage
    assert isinstance(st, MemoryStorage)
    st.append(rd.entries)
    if rd.hard_state is not None:
        st.set_hard_state(rd.hard_state)


def ents(*terms: int, start: int = 1) -> list[Entry]:
    return [Entry(Term(t), Index(start + k), EntryKind.NORMAL, b"e%d" % (start + k)) for k, t in enumerate(terms)]


# --- §5.1 terms -----------------------------------------------------------------


def test_5_1_higher_term_makes_any_node_a_follower_of_that_term() -> None:
    c = Cluster("123")
    c.elect("1")
    lead = c.node("1")
    lead.step(HeartbeatResponse(Term(7), N("2"), N("1")))
    assert lead.role is Role.FOLLOWER and lead.term == 7 and lead.vote is None


def test_5_1_stale_term_append_is_rejected_and_told_the_current_term() -> None:
    n = node()
    n.step(Heartbeat(Term(5), N("2"), N("1"), Index(0)))
    drain(n)
    n.step(AppendEntries(Term(3), N("3"), N("1"), Index(0), Term(0), ents(3), Index(1)))
    out = drain(n)
    assert n.log.last_index() == 0 and n.term == 5
    assert any(isinstance(m, HeartbeatResponse) and m.term == 5 and m.dst == "3" for m in out)


# --- §5.2 leader election --------------------------------------------------------


def test_5_2_follower_campaigns_after_randomized_election_timeout() -> None:
    fired = []
    for seed in range(20):
        n = node(seed=seed, pre_vote=False)
        for t in range(1, 21):
            n.tick()
            if n.role is Role.CANDIDATE:
                fired.append(t)
                break
    assert all(10 <= t < 20 for t in fired) and len(fired) == 20
    assert len(set(fired)) > 3  # randomised: different seeds, different timeouts


def test_5_2_candidate_with_majority_of_votes_becomes_leader() -> None:
    n = node(pre_vote=False)
    n.campaign()
    reqs = drain(n)
    assert n.role is Role.CANDIDATE and n.term == 1 and n.vote == "1"
    assert sorted(m.dst for m in reqs if isinstance(m, RequestVote)) == ["2", "3"]
    n.step(RequestVoteResponse(Term(1), N("2"), N("1"), True))
    assert n.role is Role.LEADER
    # §8: the new leader appends an empty entry of its term.
    assert n.log.last_index() == 1 and n.log.slice(1, 2, None)[0].kind is EntryKind.NOOP


def test_5_2_each_node_grants_at_most_one_vote_per_term() -> None:
    n = node()
    n.step(RequestVote(Term(2), N("2"), N("1"), Index(0), Term(0)))
    n.step(RequestVote(Term(2), N("3"), N("1"), Index(0), Term(0)))
    out = [m for m in drain(n) if isinstance(m, RequestVoteResponse)]
    assert [(m.dst, m.granted) for m in out] == [("2", True), ("3", False)]
    assert n.vote == "2"


def test_5_2_candidate_follows_a_leader_of_its_own_term() -> None:
    n = node(pre_vote=False)
    n.campaign()
    drain(n)
    n.step(Heartbeat(Term(1), N("2"), N("1"), Index(0)))
    assert n.role is Role.FOLLOWER and n.leader_id == "2"


def test_5_2_candidate_that_loses_returns_to_follower() -> None:
    n = node(pre_vote=False)
    n.campaign()
    drain(n)
    n.step(RequestVoteResponse(Term(1), N("2"), N("1"), False))
    n.step(RequestVoteResponse(Term(1), N("3"), N("1"), False))
    assert n.role is Role.FOLLOWER


def test_5_2_vote_is_durable_before_the_grant_is_sent() -> None:
    n = node()
    n.step(RequestVote(Term(2), N("2"), N("1"), Index(0), Term(0)))
    rd = n.ready()
    assert rd.hard_state is not None and rd.hard_state.vote == "2"
    assert not any(isinstance(m, RequestVoteResponse) for m in rd.messages + rd.persisted_messages)
    n.advance(rd)
    write(n, rd)
    n.persisted(rd.seq)
    rd2 = n.ready()
    assert [type(m) for m in rd2.persisted_messages] == [RequestVoteResponse]


# --- §5.3 log replication ---------------------------------------------------------


def test_5_3_leader_commits_once_replicated_on_a_majority() -> None:
    c = Cluster("123")
    c.elect("1")
    c.isolated = {"3"}
    idx = c.propose("1", b"hello")
    c.stabilize()
    assert c.node("1").commit_index >= idx and c.node("2").commit_index >= idx
    assert c.node("3").log.last_index() < idx
    assert (idx, b"hello") in c.hosts["2"].sm


def test_5_3_follower_rejects_mismatching_append_with_a_hint() -> None:
    n = node()
    n.step(AppendEntries(Term(2), N("2"), N("1"), Index(0), Term(0), ents(1, 1, 2), Index(0)))
    drain(n)
    # Leader of term 4 thinks we have (5, term 3): we only have 3 entries.
    n.step(AppendEntries(Term(4), N("3"), N("1"), Index(5), Term(3), [], Index(0)))
    out = [m for m in drain(n) if isinstance(m, AppendResponse)]
    r = out[-1]
    assert r.reject and r.index == 5
    assert r.hint_index == 3 and r.hint_term == 2  # largest index <= 3 with term <= 3


def test_5_3_conflicting_uncommitted_entries_are_overwritten() -> None:
    n = node()
    n.step(AppendEntries(Term(2), N("2"), N("1"), Index(0), Term(0), ents(1, 2, 2), Index(1)))
    drain(n)
    new = [Entry(Term(3), Index(2), EntryKind.NORMAL, b"x"), Entry(Term(3), Index(3), EntryKind.NORMAL, b"y")]
    n.step(AppendEntries(Term(3), N("3"), N("1"), Index(1), Term(1), new, Index(1)))
    drain(n)
    got = n.log.slice(1, 4, None)
    assert [(e.term, e.data) for e in got] == [(1, b"e1"), (3, b"x"), (3, b"y")]
    assert n.log.storage.term(Index(3)) == 3  # the host's storage was rewritten too


def test_5_3_delayed_duplicate_append_does_not_truncate_newer_entries() -> None:
    n = node()
    n.step(AppendEntries(Term(1), N("2"), N("1"), Index(0), Term(0), ents(1, 1, 1, 1), Index(0)))
    n.step(AppendEntries(Term(1), N("2"), N("1"), Index(0), Term(0), ents(1, 1), Index(0)))
    assert n.log.last_index() == 4


def test_5_3_fast_backoff_converges_in_few_round_trips() -> None:
    # Follower 1 holds 50 divergent entries from an old term; the fast
    # back-off hint lets the leader find the match point in O(terms) probes.
    # (No check-quorum: no leases, so 2 can be elected at once.)
    c = Cluster("123", cfg=RaftConfig(check_quorum=False))
    c.elect("1")
    c.propose("1", b"base")
    c.stabilize()
    c.isolated = {"2", "3"}
    for k in range(50):
        c.node("1").propose(b"lost%d" % k)  # never committed
    c.process()
    c.isolated = {"1"}
    c.elect("2")
    for k in range(30):
        c.propose("2", b"new%d" % k)
    c.stabilize()
    # A later leader (term 3) starts probing 1 at its last index, 33.
    c.elect("3")
    c.isolated = set()
    c.tap = []
    for _ in range(3):
        c.tick()
        c.stabilize()
    rejects = [m for m in c.tap if isinstance(m, AppendResponse) and m.reject
               and m.src == "1" and m.dst == "3"]
    assert c.node("1").log.slice(1, c.node("1").log.last_index() + 1, None) == c.node("3").log.slice(
        1, c.node("3").log.last_index() + 1, None
    )
    # One rejection (at prev 34) and the two hints jump straight to index 2;
    # decrementing one by one would have taken 32.
    assert len(rejects) == 1


def test_5_3_pipelining_keeps_at_most_max_inflight_appends_outstanding() -> None:
    c = Cluster("123", cfg=RaftConfig(max_inflight_msgs=3, max_entries_per_msg=2))
    c.elect("1")
    c.node("1").propose_batch([b"x"] * 40)
    c.process()
    to2 = [m for _, _, m in c.net if isinstance(m, AppendEntries) and m.dst == "2" and m.entries]
    assert len(to2) == 3 and all(len(m.entries) <= 2 for m in to2)
    c.stabilize()
    assert c.node("2").log.last_index() == c.node("1").log.last_index() == 41


def test_5_3_batching_respects_max_bytes_per_message() -> None:
    c = Cluster("123", cfg=RaftConfig(max_size_per_msg=300, max_entries_per_msg=1000))
    c.elect("1")
    c.node("1").propose_batch([b"y" * 100] * 10)
    c.process()
    sizes = [len(m.entries) for _, _, m in c.net if isinstance(m, AppendEntries) and m.dst == "2" and m.entries]
    assert sizes and max(sizes) == 2  # 2 * (100 + 24) <= 300 < 3 * 124
    c.stabilize()
    assert c.node("3").commit_index == 11


# --- §5.4 safety ---------------------------------------------------------------


def test_5_4_1_vote_denied_to_candidate_with_less_up_to_date_log() -> None:
    n = node(check_quorum=False)  # no lease: answer vote requests at once
    n.step(AppendEntries(Term(2), N("2"), N("1"), Index(0), Term(0), ents(1, 2), Index(0)))
    drain(n)
    n.step(RequestVote(Term(3), N("3"), N("1"), Index(5), Term(1)))  # longer but older term
    n.step(RequestVote(Term(4), N("2"), N("1"), Index(2), Term(2)))  # equal: granted
    out = [m for m in drain(n) if isinstance(m, RequestVoteResponse)]
    assert [(m.src, m.dst, m.granted) for m in out] == [("1", "3", False), ("1", "2", True)]


def test_5_4_2_leader_never_commits_an_old_term_entry_by_counting_replicas() -> None:
    # Figure 8: leader of term 3 holds (2, term 1) uncommitted; replicating it
    # to a majority must not commit it until an entry of term 3 is replicated.
    n = node(pre_vote=False)
    n.step(AppendEntries(Term(1), N("2"), N("1"), Index(0), Term(0), ents(1, 1), Index(1)))
    drain(n)
    n.campaign()
    n.campaign()  # term 3 (no one answered in term 2)
    drain(n)
    n.step(RequestVoteResponse(Term(3), N("2"), N("1"), True))
    assert n.role is Role.LEADER and n.term == 3
    drain(n)
    n.step(AppendResponse(Term(3), N("2"), N("1"), False, Index(2)))
    assert n.commit_index == 1  # entry 2 is on a majority, but from term 1
    n.step(AppendResponse(Term(3), N("2"), N("1"), False, Index(3)))
    assert n.commit_index == 3


def test_5_4_leader_counts_itself_only_once_its_own_write_is_durable() -> None:
    n = node("1", voters=("1", "2", "3"), pre_vote=False)
    n.campaign()
    drain(n)
    n.step(RequestVoteResponse(Term(1), N("2"), N("1"), True))
    rd1 = n.ready()
    assert [e.kind for e in rd1.entries] == [EntryKind.NOOP]
    n.advance(rd1)  # handed out, not yet durable
    n.step(AppendResponse(Term(1), N("2"), N("1"), False, Index(1)))
    assert n.commit_index == 0  # 2 has it, but our own copy is not durable: 1 of 3
    n.step(AppendResponse(Term(1), N("3"), N("1"), False, Index(1)))
    assert n.commit_index == 1  # 2 and 3 are a quorum without us
    n.propose(b"z")
    rd = n.ready()
    n.advance(rd)
    n.step(AppendResponse(Term(1), N("2"), N("1"), False, Index(2)))
    assert n.commit_index == 1
    write(n, rd1)
    write(n, rd)
    n.persisted(rd.seq)
    assert n.commit_index == 2


def test_follower_acks_an_append_only_after_it_is_durable() -> None:
    n = node()
    n.step(AppendEntries(Term(1), N("2"), N("1"), Index(0), Term(0), ents(1, 1), Index(0)))
    rd = n.ready()
    assert len(rd.entries) == 2 and not rd.persisted_messages
    assert not any(isinstance(m, AppendResponse) for m in rd.messages)
    n.advance(rd)
    assert not n.has_ready()
    write(n, rd)
    n.persisted(rd.seq)
    rd2 = n.ready()
    assert [(type(m), m.index) for m in rd2.persisted_messages] == [(AppendResponse, 2)]  # type: ignore[attr-defined]


def test_committed_entries_are_handed_out_only_once_locally_durable() -> None:
    n = node()
    n.step(AppendEntries(Term(1), N("2"), N("1"), Index(0), Term(0), ents(1, 1), Index(2)))
    rd = n.ready()
    assert n.commit_index == 2 and rd.committed_entries == []
    n.advance(rd)
    write(n, rd)
    n.persisted(rd.seq)
    rd = n.ready()
    assert [e.index for e in rd.committed_entries] == [1, 2]
    n.advance(rd)
    assert n.status().applied == 2


def test_crash_loses_the_unpersisted_tail_and_restart_recovers() -> None:
    c = Cluster("123", persist_delay=(5, 5))
    c.node("1").campaign()
    for _ in range(30):
        c.step_sim()
    assert c.node("1").role is Role.LEADER
    c.node("1").propose(b"durable")
    for _ in range(12):
        c.step_sim()
    c.node("1").propose(b"volatile")
    c.process()
    c.crash("2")
    c.crash("3")
    c.crash("1")
    c.restart("1")
    assert [d for _, d in c.hosts["1"].sm] == []
    assert c.node("1").log.last_index() == 2  # NOOP + durable; volatile was lost
    for nid in "23":
        c.restart(nid)
    for _ in range(80):
        c.step_sim()
    lead = c.leader()
    assert lead is not None
    assert [d for _, d in lead.sm][:1] == [b"durable"]


# --- pre-vote and check-quorum (thesis §9.6, §6.2) -----------------------------------


def test_prevote_rejoining_partitioned_node_does_not_disrupt_the_leader() -> None:
    c = Cluster("123")
    c.elect("1")
    c.isolated = {"3"}
    for _ in range(100):
        c.tick()
        c.stabilize()
    assert c.node("3").term == 1  # pre-votes failed: its term never grew
    c.isolated = set()
    for _ in range(5):
        c.tick()
        c.stabilize()
    assert c.node("1").role is Role.LEADER and c.node("1").term == 1
    assert c.node("3").leader_id == "1"


def test_without_prevote_a_rejoining_node_forces_a_new_term() -> None:
    c = Cluster("123", cfg=RaftConfig(pre_vote=False))
    c.elect("1")
    c.isolated = {"3"}
    for _ in range(60):
        c.tick()
        c.stabilize()
    assert c.node("3").term > 1  # the contrast the pre-vote test relies on


def test_check_quorum_leader_steps_down_when_it_cannot_reach_a_quorum() -> None:
    c = Cluster("123")
    c.elect("1")
    c.isolated = {"1"}
    for _ in range(25):
        c.tick(["1"])
        c.process()
    assert c.node("1").role is Role.FOLLOWER


def test_leader_in_lease_ignores_vote_requests() -> None:
    c = Cluster("123")
    c.elect("1")
    c.node("2").step(RequestVote(Term(5), N("3"), N("2"), Index(99), Term(9)))
    assert c.node("2").term == 1 and c.node("2").leader_id == "1"


def test_leader_unreachable_ends_the_lease_so_votes_are_granted() -> None:
    c = Cluster("123")
    c.elect("1")
    c.node("2").leader_unreachable()
    c.node("2").step(RequestVote(Term(5), N("3"), N("2"), Index(99), Term(9)))
    assert c.node("2").term == 5  # no longer in the old leader's lease


def test_leader_unreachable_reported_by_both_followers_elects_a_new_leader_at_once() -> None:
    """What the runtime does when a leader's connections break: both followers
    give up the lease and one campaigns; without the report the other would
    refuse its pre-vote until its own election timeout."""
    c = Cluster("123")
    c.elect("1")
    c.isolated = {"1"}
    c.node("2").campaign()  # still in lease at "3": refused
    c.stabilize()
    assert c.node("2").role is not Role.LEADER
    for n in ("2", "3"):
        c.node(n).leader_unreachable()
    c.node("2").campaign()
    c.stabilize()
    assert c.node("2").role is Role.LEADER and c.node("2").term == 2


def test_leader_unreachable_is_a_no_op_on_a_leader() -> None:
    c = Cluster("123")
    c.elect("1")
    c.node("1").leader_unreachable()
    assert c.node("1").role is Role.LEADER


# --- proposals and misuse -------------------------------------------------------------


def test_proposal_on_a_follower_is_refused_with_the_leader_id() -> None:
    c = Cluster("123")
    c.elect("2")
    with pytest.raises(NotLeader) as ei:
        c.node("1").propose(b"x")
    assert ei.value.leader_id == "2"
    with pytest.raises(NotLeader) as ei:
        node().propose(b"x")
    assert ei.value.leader_id is None


def test_advance_out_of_order_and_bogus_persisted_are_usage_errors() -> None:
    n = node()
    n.campaign()
    r1 = n.ready()
    with pytest.raises(RaftUsageError):
        n.persisted(r1.seq + 5)
    n.step(RequestVote(Term(9), N("2"), N("1"), Index(0), Term(0)))
    r2 = n.ready()
    with pytest.raises(RaftUsageError):
        n.advance(r2)
    n.advance(r1)
    n.advance(r2)


def test_bad_inputs_get_typed_errors() -> None:
    n = node()
    with pytest.raises(RaftUsageError):
        n.step("hello")  # type: ignore[arg-type]
    with pytest.raises(RaftUsageError):
        n.step(Heartbeat(Term(1), N("2"), N("9"), Index(0)))
    with pytest.raises(RaftUsageError):
        RaftConfig(election_tick=1, heartbeat_tick=1)
    with pytest.raises(RaftUsageError):
        RaftNode("1", MemoryStorage(voters=["1"]), RaftConfig(), None)
    with pytest.raises(RaftUsageError):
        node("9").campaign()  # not a voter
    c = Cluster("1")
    c.elect("1")
    with pytest.raises(RaftUsageError):
        c.node("1").propose("text")  # type: ignore[arg-type]
    with pytest.raises(RaftUsageError):
        c.node("1").propose_batch([b"ok", 5])  # type: ignore[list-item]
    assert c.node("1").log.last_index() == 1  # nothing was appended


def test_corrupt_storage_commit_beyond_log_raises_invariant_violation() -> None:
    from broker.raft import HardState

    st = MemoryStorage(voters=["1", "2", "3"])
    st.append(ents(1, 1))
    st.set_hard_state(HardState(Term(1), None, Index(5)))
    with pytest.raises(InvariantViolation):
        RaftNode("1", st, RaftConfig(), random.Random(0))


def test_conflict_below_commit_raises_invariant_violation() -> None:
    from broker.raft.log import RaftLog

    st = MemoryStorage(voters=["1"])
    log = RaftLog(st)
    log.append(ents(1, 1, 1))
    log.commit_to(3)
    with pytest.raises(InvariantViolation):
        log.maybe_append(1, 1, 3, [Entry(Term(2), Index(2), EntryKind.NORMAL, b"evil")])
    with pytest.raises(InvariantViolation):
        log.commit_to(9)


def test_two_leaders_in_one_term_raise_invariant_violation() -> None:
    c = Cluster("123")
    c.elect("1")
    with pytest.raises(InvariantViolation):
        c.node("1").step(Heartbeat(Term(1), N("2"), N("1"), Index(0)))


# --- §6 membership (thesis ch. 4: single-server changes) --------------------------------


def test_6_new_learner_catches_up_and_is_promoted_automatically() -> None:
    c = Cluster("123", spares=["4"])
    c.elect("1")
    for k in range(10):
        c.propose("1", b"p%d" % k)
    c.stabilize()
    c.node("1").propose_conf_change(ConfChange(ConfChangeKind.ADD_LEARNER, N("4")))
    c.stabilize()
    for _ in range(3):
        c.tick()
        c.stabilize()
    cfg = c.node("1").config
    assert "4" in cfg.voters and not cfg.learners
    assert c.node("4").config == cfg  # learned it from the log (carried membership)
    assert [d for _, d in c.hosts["4"].sm] == [b"p%d" % k for k in range(10)]


def test_6_learner_does_not_count_toward_commit_and_auto_promote_can_be_off() -> None:
    c = Cluster("12", spares=["3"], cfg=RaftConfig(auto_promote=False))
    c.elect("1")
    c.node("1").propose_conf_change(ConfChange(ConfChangeKind.ADD_LEARNER, N("3")))
    c.stabilize()
    assert c.node("1").config.learners == {"3"}
    c.isolated = {"2"}
    idx = c.propose("1", b"x")
    c.stabilize()
    assert c.node("3").log.last_index() >= idx  # replicated to the learner...
    assert c.node("1").commit_index < idx  # ...which does not make a quorum
    assert "3" in c.node("1").status().progress and c.node("1").status().progress[N("3")].is_learner


def test_6_one_change_at_a_time_and_invalid_changes_are_refused() -> None:
    c = Cluster("123", spares=["4", "5"])
    c.elect("1")
    n1 = c.node("1")
    with pytest.raises(InvalidConfChange):
        n1.propose_conf_change(ConfChange(ConfChangeKind.REMOVE, N("9")))  # unknown
    with pytest.raises(InvalidConfChange):
        n1.propose_conf_change(ConfChange(ConfChangeKind.PROMOTE, N("2")))  # not a learner
    with pytest.raises(InvalidConfChange):
        n1.propose_conf_change(ConfChange(ConfChangeKind.ADD_LEARNER, N("2")))  # already member
    n1.propose_conf_change(ConfChange(ConfChangeKind.ADD_LEARNER, N("4")))
    with pytest.raises(InvalidConfChange):
        n1.propose_conf_change(ConfChange(ConfChangeKind.ADD_LEARNER, N("5")))  # one at a time
    with pytest.raises(NotLeader):
        c.node("2").propose_conf_change(ConfChange(ConfChangeKind.ADD_LEARNER, N("5")))


def test_6_cannot_remove_the_last_voter() -> None:
    c = Cluster("1")
    c.elect("1")
    with pytest.raises(InvalidConfChange):
        c.node("1").propose_conf_change(ConfChange(ConfChangeKind.REMOVE, N("1")))


def test_6_removing_the_leader_makes_it_step_down_and_others_continue() -> None:
    c = Cluster("123")
    c.elect("1")
    c.node("1").propose_conf_change(ConfChange(ConfChangeKind.REMOVE, N("1")))
    c.stabilize()
    assert c.node("1").role is Role.FOLLOWER
    assert c.node("1").config.voters == {"2", "3"}
    with pytest.raises(RaftUsageError):
        c.node("1").campaign()
    for _ in range(60):
        c.tick()
        c.stabilize()
    lead = c.leader()
    assert lead is not None and lead.id in ("2", "3")
    idx = lead.node.propose(b"after")
    c.stabilize()
    assert lead.node.commit_index >= idx
    assert c.node("1").term <= lead.node.term  # the removed node never campaigned
    assert c.node("1").role is Role.FOLLOWER


def test_6_removed_node_that_missed_its_removal_does_not_disrupt() -> None:
    c = Cluster("1234")
    c.elect("1")
    c.isolated = {"4"}
    c.node("1").propose_conf_change(ConfChange(ConfChangeKind.REMOVE, N("4")))
    c.stabilize()
    assert c.node("1").config.voters == {"1", "2", "3"}
    for _ in range(60):
        c.tick()
        c.stabilize()
    c.isolated = set()
    for _ in range(30):
        c.tick()
        c.stabilize()
    assert c.node("1").role is Role.LEADER and c.node("1").term == 1


# --- leadership transfer (thesis §3.10) ---------------------------------------------------


def _promotions_log(commit: int, last: int = 4) -> MemoryStorage:
    """Voters 1-3, learners 4 and 5; the log (term 1, up to `last`): NOOP,
    CONFIG promote 4, NORMAL, CONFIG promote 5; durable commit `commit`. With
    commit 1 and both CONFIG entries, the hard state recording the first
    promotion's commit was lost while the second promotion's entry survived
    (a torn tail between a Ready's entries and its hard state)."""
    from broker.raft import HardState, Membership, encode_conf_entry

    st = MemoryStorage(voters=("1", "2", "3"), learners=("4", "5"))
    m4 = Membership(frozenset(N(v) for v in "1234"), frozenset({N("5")}))
    m5 = Membership(frozenset(N(v) for v in "12345"), frozenset())
    p4 = ConfChange(ConfChangeKind.PROMOTE, N("4"))
    p5 = ConfChange(ConfChangeKind.PROMOTE, N("5"))
    st.append([
        Entry(Term(1), Index(1), EntryKind.NOOP, b""),
        Entry(Term(1), Index(2), EntryKind.CONFIG, encode_conf_entry(p4, m4)),
        Entry(Term(1), Index(3), EntryKind.NORMAL, b"x"),
        Entry(Term(1), Index(4), EntryKind.CONFIG, encode_conf_entry(p5, m5)),
    ][:last])
    st.set_hard_state(HardState(Term(1), N("1"), Index(commit)))
    return st


def _votes_to_lead(n: RaftNode) -> list[str]:
    """Campaign (no pre-vote) and grant votes 2, 3, ... until it leads."""
    n.campaign()
    drain(n)
    got = []
    for v in "2345":
        n.step(RequestVoteResponse(Term(n.term), N(v), N("1"), True))
        got.append(v)
        if n.role is Role.LEADER:
            return got
    raise AssertionError("never won")


@pytest.mark.parametrize("commit", [1, 2])
def test_6_restart_takes_every_config_entry_but_the_last_as_committed(commit: int) -> None:
    # A leader proposes a change only once the one before it committed, so in
    # any log every CONFIG entry but the last is committed. A member whose
    # hard state lost that commit must not restart two changes behind: with
    # voters {1,2,3} it would win an election on votes 1 and 2, which no
    # majority of {1,2,3,4,5} (the group's configuration if promote-5
    # committed) need overlap.
    n = RaftNode("1", _promotions_log(commit), RaftConfig(pre_vote=False, lazy_commit=True),
                 random.Random(0))
    assert n.config.voters == {"1", "2", "3", "4"} and n.config.learners == {"5"}
    assert n.commit_index == 2 and n.config_index == 2
    rd = n.ready()
    # A raised commit passes a CONFIG entry: written even with lazy commit;
    # the entries it covers are handed out to be applied.
    assert (rd.hard_state.commit if rd.hard_state else None) == (2 if commit == 1 else None)
    assert [e.index for e in rd.committed_entries] == [1, 2]
    n.advance(rd, persisted=True)
    assert _votes_to_lead(n) == ["2", "3"]  # 3 of {1,2,3,4}
    # Promote-5 is still pending: no other change until it commits.
    with pytest.raises(InvalidConfChange):
        n.propose_conf_change(ConfChange(ConfChangeKind.REMOVE, N("2")))


def test_6_restart_with_one_config_entry_above_the_commit_keeps_the_old_configuration() -> None:
    # One change behind is a state any slow follower may be in (single-server
    # changes: majorities of the two configurations overlap).
    n = RaftNode("1", _promotions_log(1, last=3), RaftConfig(pre_vote=False), random.Random(0))
    assert n.config.voters == {"1", "2", "3"} and n.commit_index == 1
    assert _votes_to_lead(n) == ["2"]  # 2 of {1,2,3}
    drain(n)
    assert n.commit_index == 1  # the NOOP of term 2 needs a follower's ack


def test_6_follower_torn_after_two_promotions_restarts_with_the_first_in_force() -> None:
    # Follower 3 is cut off while 4 and 5 join and are promoted (four CONFIG
    # entries), then gets them all in one append with the commit, and
    # crashes once the entries are on disk but not the hard state after
    # them (a torn tail). Restarted, it has the last change (promote 5) to
    # wait for, and every one before it in force: voters {1,2,3,4}, not the
    # {1,2,3} its durable commit alone would give.
    c = Cluster("123", spares=["4", "5"])
    c.elect("1")
    c.isolated = {"3"}
    lead = c.node("1")
    for spare in "45":
        lead.propose_conf_change(ConfChange(ConfChangeKind.ADD_LEARNER, N(spare)))
        c.stabilize()
        for _ in range(3):
            c.tick(["1", "2", "4", "5"])
            c.stabilize()
        assert spare in lead.config.voters
    confs = [e.index for e in lead.log.slice(1, lead.log.last_index() + 1, None) if e.kind is EntryKind.CONFIG]
    assert len(confs) == 4 and lead.log.committed >= confs[-1]
    f = c.hosts["3"]
    f.persist_delay = lambda: 1_000_000  # its writes stay pending
    c.isolated = set()
    c.tick(["1"])
    c.stabilize()
    assert c.node("3").log.last_index() >= confs[-1]
    k = next(i for i, (_, rd) in enumerate(f.pending) if rd.entries and rd.entries[-1].index >= confs[-1])
    assert f.pending[k][1].hard_state is not None  # the commit came in the same Ready
    c.crash("3", torn=(k, True))
    assert f.storage.last_index() >= confs[-1] and f.storage.hard_state().commit < confs[0]
    f.persist_delay = None
    c.restart("3")
    n3 = c.node("3")
    assert n3.commit_index == confs[-2]
    assert n3.config.voters == {"1", "2", "3", "4"} and n3.config.learners == {"5"}
    c.stabilize()
    for _ in range(3):
        c.tick()
        c.stabilize()
    assert n3.config == lead.config and n3.commit_index == lead.log.committed


def test_transfer_leadership_to_an_up_to_date_voter() -> None:
    c = Cluster("123")
    c.elect("1")
    c.propose("1", b"x")
    c.stabilize()
    c.node("1").transfer_leadership("3")
    c.stabilize()
    assert c.node("3").role is Role.LEADER and c.node("1").role is Role.FOLLOWER
    assert c.node("1").leader_id == "3"


def test_transfer_refused_for_unknown_learner_lagging_and_self() -> None:
    c = Cluster("123", spares=["4"], cfg=RaftConfig(auto_promote=False))
    c.elect("1")
    n1 = c.node("1")
    n1.propose_conf_change(ConfChange(ConfChangeKind.ADD_LEARNER, N("4")))
    c.stabilize()
    with pytest.raises(TransferRefused, match="unknown"):
        n1.transfer_leadership("9")
    with pytest.raises(TransferRefused, match="learner"):
        n1.transfer_leadership("4")
    with pytest.raises(TransferRefused, match="already"):
        n1.transfer_leadership("1")
    c.isolated = {"3"}
    for k in range(5):
        c.propose("1", b"%d" % k)
    c.stabilize()
    with pytest.raises(TransferRefused, match="lagging"):
        n1.transfer_leadership("3")
    with pytest.raises(NotLeader):
        c.node("2").transfer_leadership("3")


def test_transfer_in_progress_drops_proposals_then_times_out() -> None:
    c = Cluster("123")
    c.elect("1")
    c.isolated = {"3"}
    c.propose("1", b"x")
    c.stabilize()
    c.isolated = set()
    # 3 is recently active but one entry behind commit? it has match < last
    n1 = c.node("1")
    n1.progress[N("3")].match = n1.commit_index  # pretend caught up to commit, not last
    c.isolated = {"3"}
    n1.transfer_leadership("3")
    with pytest.raises(ProposalDropped):
        n1.propose(b"y")
    for _ in range(12):
        c.tick(["1", "2"])
        c.stabilize()
    assert n1.role is Role.LEADER and n1.status().transferee is None
    n1.propose(b"y")


# --- §7 log compaction ----------------------------------------------------------------


def test_7_lagging_follower_is_sent_a_chunked_snapshot_and_resumes() -> None:
    c = Cluster("123", cfg=RaftConfig(snapshot_chunk_size=16))
    c.elect("1")
    c.isolated = {"3"}
    for k in range(20):
        c.propose("1", b"v%d" % k)
    c.stabilize()
    c.hosts["1"].take_snapshot()
    assert c.node("1").log.first_index() > 5
    c.isolated = set()
    c.tap = []
    for _ in range(5):
        c.tick()
        c.stabilize()
    chunks = [m for m in c.tap if isinstance(m, InstallSnapshot) and m.dst == "3"]
    assert len({m.offset for m in chunks}) > 3 and chunks[-1].done
    assert c.hosts["3"].sm == c.hosts["1"].sm
    idx = c.propose("1", b"after")
    c.stabilize()
    assert c.hosts["3"].sm[-1] == (idx, b"after")
    assert c.node("1").status().progress[N("3")].state == "replicate"


def test_7_restart_from_snapshot_restores_state_and_config() -> None:
    c = Cluster("123")
    c.elect("1")
    for k in range(8):
        c.propose("1", b"v%d" % k)
    c.stabilize()
    c.hosts["2"].take_snapshot()
    snap = c.hosts["2"].storage.snapshot()
    assert snap.meta.index == c.node("2").status().applied and snap.meta.config.voters == {"1", "2", "3"}
    c.crash("2")
    c.restart("2")
    assert [d for _, d in c.hosts["2"].sm] == [b"v%d" % k for k in range(8)]
    assert c.node("2").log.first_index() == snap.meta.index + 1


def test_memory_storage_answers_compacted_and_unavailable() -> None:
    s = MemoryStorage(voters=["1"])
    s.append(ents(1, 1, 2, 2))
    s.create_snapshot(Index(2), s.initial_state()[1], b"snap")
    s.compact(Index(2))
    assert s.first_index() == 3 and s.last_index() == 4 and s.term(Index(2)) == 1
    with pytest.raises(Compacted):
        s.term(Index(1))
    with pytest.raises(Compacted):
        s.entries(Index(2), Index(4), None)
    with pytest.raises(Unavailable):
        s.term(Index(5))
    assert [e.index for e in s.entries(Index(3), Index(5), 1)] == [3]  # max_bytes: at least one
    with pytest.raises(RaftUsageError):
        s.compact(Index(4))  # beyond the snapshot


def test_make_entries_builds_the_same_frozen_entries_as_the_constructor() -> None:
    from dataclasses import FrozenInstanceError

    from broker.raft.types import make_entries

    got = make_entries(Term(3), Index(7), EntryKind.NORMAL, [b"a", b"bb"])
    assert got == [Entry(Term(3), Index(7), EntryKind.NORMAL, b"a"), Entry(Term(3), Index(8), EntryKind.NORMAL, b"bb")]
    with pytest.raises(FrozenInstanceError):
        got[0].term = Term(4)  # type: ignore[misc]


def test_7_snapshot_chunks_from_another_leader_restart_reassembly() -> None:
    from broker.raft import InstallSnapshotResponse, Membership, SnapshotMeta

    n = node(check_quorum=False)
    meta = SnapshotMeta(Index(10), Term(1), Membership(frozenset({N("1"), N("2"), N("3")})))
    n.step(InstallSnapshot(Term(1), N("2"), N("1"), meta, 0, b"A" * 8, False))
    # Same snapshot point, new leader and term: its bytes may differ, so the
    # follower asks it to start over instead of mixing the two.
    n.step(InstallSnapshot(Term(2), N("3"), N("1"), meta, 8, b"B" * 8, True))
    acks = [m for m in drain(n) if isinstance(m, InstallSnapshotResponse)]
    assert [(m.dst, m.next_offset, m.done) for m in acks] == [("2", 8, False), ("3", 0, False)]
    n.step(InstallSnapshot(Term(2), N("3"), N("1"), meta, 0, b"B" * 8, False))
    n.step(InstallSnapshot(Term(2), N("3"), N("1"), meta, 8, b"B" * 8, True))
    rd = n.ready()
    assert rd.snapshot is not None and rd.snapshot.data == b"B" * 16
    assert n.commit_index == 10 and n.log.last_index() == 10


def test_5_3_proposals_between_two_readies_leave_in_one_append_per_follower() -> None:
    c = Cluster("123")
    c.elect("1")
    n1 = c.node("1")
    idxs = [n1.propose(b"p%d" % k) for k in range(5)]
    assert idxs == [2, 3, 4, 5, 6] and n1.has_ready()
    rd = n1.ready()
    apps = [m for m in rd.messages if isinstance(m, AppendEntries)]
    assert sorted(m.dst for m in apps) == ["2", "3"]
    assert all([e.index for e in m.entries] == idxs for m in apps)


# ---------------------------------------------------------------- quiescence
def test_quiet_once_every_follower_has_the_log_and_was_told_the_commit() -> None:
    c = Cluster("123")
    c.elect("1")
    n = c.node("1")
    c.propose("1", b"x")
    assert not n.quiet()  # proposed, not yet committed
    c.stabilize()
    assert n.quiet()
    assert c.node("2").quiet_follower("1", n.term, n.log.committed)
    assert not c.node("2").quiet()  # only a leader is quiet
    assert not c.node("2").quiet_follower("3", n.term, n.log.committed)  # not its leader
    assert not c.node("2").quiet_follower("1", n.term, n.log.committed + 1)


def test_not_quiet_while_a_reachable_follower_lags() -> None:
    c = Cluster("123")
    c.elect("1")
    c.isolated = {"3"}
    c.propose("1", b"x")
    c.stabilize()
    n = c.node("1")
    assert n.log.committed == n.log.last_index()  # committed by 1 and 2
    assert not n.quiet()  # 3 is behind and, as far as the host knows, reachable
    assert n.quiet(unreachable={"3"})  # the host knows its node is down
    assert not n.quiet(unreachable={"2", "3"})  # no quorum has the log


def test_not_quiet_during_a_membership_change_or_a_transfer() -> None:
    c = Cluster("123")
    c.elect("1")
    n = c.node("1")
    n.propose_conf_change(ConfChange(ConfChangeKind.REMOVE, N("3")))
    assert not n.quiet()
    c.stabilize()
    assert n.quiet()
    n.transfer_leadership("2")
    assert not n.quiet()
