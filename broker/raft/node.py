"""RaftNode: one member of one Raft group, as a deterministic state machine.

Pipeline position: the host (broker/runtime) feeds it inputs — `step(msg)`
for every message from a peer, `tick()` on a timer, `propose*()` from
clients — and drains its outputs with `ready()` / `advance()` /
`persisted()`. The node never does I/O; randomness comes from the injected
`rng`, time is counted in ticks.

The Ready contract (see `Ready` and docs/raft.md):

1. `rd = node.ready()` (only when `node.has_ready()`); the entries, hard
   state and snapshot in it are now "in progress" (the node will not hand
   them out again).
2. Send `rd.messages` at once: leader appends/heartbeats/snapshot chunks,
   pre-votes. They are safe to send before this Ready is durable (the leader
   writes its own log in parallel with replicating it, Raft thesis §10.2.1).
3. Write `rd.snapshot` (if any), then `rd.entries` (append, truncating any
   conflicting suffix), then `rd.hard_state` (if not None) to durable storage
   — in that order, or atomically. Readies must be made durable in seq order.
4. Send `rd.persisted_messages`: these were released because everything they
   depend on is already durable (votes, append acks, candidate vote requests).
5. If `rd.snapshot`: reset the state machine from `rd.snapshot.data` first.
   Then apply `rd.committed_entries` in order. They are committed and durable
   locally; they are applied once each (advance() records it).
6. `node.advance(rd)` (Readies are advanced in seq order).
7. Whenever the writes of Readies up to seq `s` are durable (possibly much
   later, after a group fsync), call `node.persisted(s)`. Only then does the
   leader count its own copy towards commit, and only then are the follower's
   acks for those entries released (in a later Ready's persisted_messages).
   A synchronous host may call `advance(rd, persisted=True)` instead.

Why one file of this size: the Raft core is one state machine. Roles,
replication, elections (pre-vote, check-quorum), membership changes,
leadership transfer, snapshots and the quiescence predicates all read and
write the same private state under one set of invariants (etcd/raft keeps
raft.go whole for the same reason); split, each piece would need the others'
internals.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Protocol

from broker.raft.errors import (
    Compacted,
    ConfChangePending,
    InvalidConfChange,
    InvariantViolation,
    NotLeader,
    ProposalDropped,
    RaftUsageError,
    StorageError,
    TransferInProgress,
    TransferRefused,
)
from broker.raft.log import RaftLog
from broker.raft.progress import Progress, ProgressState
from broker.raft.storage import LogStorage
from broker.raft.types import (
    MESSAGE_TYPES,
    AppendEntries,
    AppendResponse,
    ConfChange,
    ConfChangeKind,
    Entry,
    EntryKind,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    Index,
    InstallSnapshot,
    InstallSnapshotResponse,
    Membership,
    Message,
    NodeId,
    RequestVote,
    RequestVoteResponse,
    Role,
    Snapshot,
    SnapshotMeta,
    SoftState,
    Term,
    TimeoutNow,
    decode_conf_entry,
    encode_conf_entry,
    make_entries,
)


class RandomSource(Protocol):
    """What the node needs from a random generator (random.Random fits)."""

    def randrange(self, start: int, stop: int, /) -> int: ...


@dataclass(frozen=True, slots=True)
class RaftConfig:
    election_tick: int = 10  # followers campaign after a random [e, 2e) ticks of silence
    heartbeat_tick: int = 1  # leader heartbeats every h ticks
    max_inflight_msgs: int = 256  # un-acked appends per follower in REPLICATE
    max_size_per_msg: int = 1 << 20  # bytes of entries per AppendEntries
    max_entries_per_msg: int = 4096
    pre_vote: bool = True
    check_quorum: bool = True
    snapshot_chunk_size: int = 1 << 20
    snapshot_window: int = 4  # snapshot chunks in flight
    auto_promote: bool = True  # leader promotes a learner once it is caught up
    group: str = ""  # copied into every message this node sends
    # Hand out a hard state whose only change is the commit index only when
    # that commit passes a CONFIG entry (`_hs_due`); etcd's `MustSync`.
    lazy_commit: bool = False

    def __post_init__(self) -> None:
        if self.heartbeat_tick < 1:
            raise RaftUsageError("heartbeat_tick must be >= 1")
        if self.election_tick <= self.heartbeat_tick:
            raise RaftUsageError("election_tick must be > heartbeat_tick")
        for name in ("max_inflight_msgs", "max_size_per_msg", "max_entries_per_msg",
                     "snapshot_chunk_size", "snapshot_window"):
            if getattr(self, name) < 1:
                raise RaftUsageError(f"{name} must be >= 1")


@dataclass(frozen=True, slots=True)
class Ready:
    """One batch of work for the host; see the module docstring for the order.

    - seq: pass to `persisted(seq)` once everything below is durable.
    - soft_state: new (leader, role) if it changed, else None.
    - hard_state: persist if not None.
    - entries: append to the durable log (may overwrite a conflicting suffix).
    - snapshot: persist/install if not None (follower catching up).
    - messages: send now, in parallel with the write.
    - persisted_messages: send now; their preconditions are already durable.
    - committed_entries: apply in order (after installing `snapshot`).
    """

    seq: int
    soft_state: SoftState | None
    hard_state: HardState | None
    entries: Sequence[Entry]
    snapshot: Snapshot | None
    messages: list[Message]
    persisted_messages: list[Message]
    committed_entries: Sequence[Entry]

    @property
    def must_persist(self) -> bool:
        return self.hard_state is not None or bool(self.entries) or self.snapshot is not None


@dataclass(frozen=True, slots=True)
class PeerStatus:
    match: int
    next: int
    state: str
    is_learner: bool
    recent_active: bool


@dataclass(frozen=True, slots=True)
class Status:
    id: NodeId
    role: Role
    term: int
    leader: NodeId | None
    vote: NodeId | None
    commit: int
    applied: int
    last_index: int
    first_index: int
    config: Membership
    transferee: NodeId | None
    progress: dict[NodeId, PeerStatus] = field(default_factory=dict)


class _SnapRecv:
    """A snapshot being reassembled. Chunks are only combined from one
    sender in one term: two leaders may serialise the same state differently."""

    __slots__ = ("meta", "src", "term", "chunks", "next_offset")

    def __init__(self, meta: SnapshotMeta, src: NodeId, term: int) -> None:
        self.meta = meta
        self.src = src
        self.term = term
        self.chunks: list[bytes] = []
        self.next_offset = 0


_kind_of = attrgetter("kind")
_BYTES_ONLY = {bytes}
_NORMAL = EntryKind.NORMAL
_CONFIG = EntryKind.CONFIG
_REPLICATE = ProgressState.REPLICATE
_PROBE = ProgressState.PROBE
_SNAPSHOT = ProgressState.SNAPSHOT


class RaftNode:
    def __init__(
        self,
        node_id: str,
        storage: LogStorage,
        config: RaftConfig | None = None,
        rng: RandomSource | None = None,
        *,
        applied: int = 0,
    ) -> None:
        if rng is None:
            raise RaftUsageError("rng is required (inject a seeded random source)")
        self.id = NodeId(node_id)
        self.cfg = config or RaftConfig()
        self.rng = rng
        self._group = self.cfg.group
        hs, membership = storage.initial_state()
        self.log = RaftLog(storage, applied)
        if hs.commit > self.log.last_index():
            raise InvariantViolation(
                f"durable commit {hs.commit} beyond durable last index {self.log.last_index()}"
            )
        self.log.committed = max(self.log.committed, hs.commit)
        if self.log.applied > self.log.committed:
            raise InvariantViolation(f"applied {applied} beyond commit {self.log.committed}")
        self.term: int = hs.term
        self.vote: NodeId | None = hs.vote
        self.lead: NodeId | None = None
        self.role = Role.FOLLOWER
        snap_index = storage.first_index() - 1
        # Invariant: config == membership after every committed CONFIG entry.
        self.config = membership
        self._conf_history: list[tuple[int, Membership]] = [(snap_index, membership)]
        # Indexes of CONFIG entries in the log above the commit index, ascending.
        self._pending_confs: list[int] = []
        last = self.log.last_index()
        confs = [
            e for e in storage.entries(Index(snap_index + 1), Index(last + 1), None)
            if e.kind is _CONFIG
        ] if last > snap_index else []
        # True while the configuration is the host's bootstrap guess: the log
        # has CONFIG entries, none of them at or below the durable commit. The
        # first one adopted then sets the configuration it carries instead of
        # being checked against the guess (which may already include it).
        self._config_unverified = bool(confs) and confs[0].index > self.log.committed
        # Every CONFIG entry of a log but its last is committed: a leader
        # proposes a change only once the one before it has committed
        # (`propose_conf_change`), and log matching gives this log that
        # leader's prefix. The hard state recording such a commit can be
        # lost while the later entry survives (a Ready's hard state is
        # written after its entries; a torn tail may cut between them, and
        # the core adopts a change as it commits, before that hard state
        # is durable). Without this a restarted member could be two
        # changes behind, where majorities of its configuration and the
        # group's need not overlap.
        if len(confs) > 1:
            self.log.commit_to(confs[-2].index)
        for e in confs:
            if e.index <= self.log.committed:
                self._apply_conf_entry(e)  # clears _config_unverified
            else:
                self._pending_confs.append(e.index)
        self.progress: dict[NodeId, Progress] = {}
        self.votes: dict[NodeId, bool] = {}
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = 0
        self._reset_randomized_timeout()
        self.pending_conf_index = 0
        self.transferee: NodeId | None = None
        self.transfer_elapsed = 0
        self._snap_recv: _SnapRecv | None = None
        # Proposals since the last ready() still to be broadcast. Deferring the
        # broadcast to ready() batches every proposal made between two
        # Readies into one AppendEntries per follower.
        self._bcast_pending = False
        # Outputs.
        self._msgs: list[Message] = []
        # (seq that must be durable, message), non-decreasing seq.
        self._held: deque[tuple[int, Message]] = deque()
        self._next_seq = 1
        self._persisted_seq = 0  # all Readies with seq <= this are durable
        self._next_advance = 1
        # Readies handed out but not yet durable: (seq, last idx, last term, snap idx, must).
        self._unpersisted: deque[tuple[int, int, int, int, bool]] = deque()
        self._applied_by_seq: dict[int, int] = {}
        self._prev_hs = hs
        self._prev_ss = SoftState(None, Role.FOLLOWER)
        self._step_tables: dict[Role, dict[type, Callable[[Any], None]]] = {
            Role.FOLLOWER: {
                AppendEntries: self._follower_append,
                Heartbeat: self._follower_heartbeat,
                InstallSnapshot: self._follower_snapshot,
                TimeoutNow: self._follower_timeout_now,
            },
            Role.PRE_CANDIDATE: {
                AppendEntries: self._candidate_leader_msg,
                Heartbeat: self._candidate_leader_msg,
                InstallSnapshot: self._candidate_leader_msg,
                RequestVoteResponse: self._candidate_vote_response,
            },
            Role.CANDIDATE: {
                AppendEntries: self._candidate_leader_msg,
                Heartbeat: self._candidate_leader_msg,
                InstallSnapshot: self._candidate_leader_msg,
                RequestVoteResponse: self._candidate_vote_response,
            },
            Role.LEADER: {
                AppendResponse: self._leader_append_response,
                HeartbeatResponse: self._leader_heartbeat_response,
                InstallSnapshotResponse: self._leader_snapshot_response,
                AppendEntries: self._leader_same_term_leader,
                Heartbeat: self._leader_same_term_leader,
                InstallSnapshot: self._leader_same_term_leader,
            },
        }
        self._table = self._step_tables[Role.FOLLOWER]

    # ------------------------------------------------------------------ helpers
    def _reset_randomized_timeout(self) -> None:
        e = self.cfg.election_tick
        self.randomized_timeout = self.rng.randrange(e, 2 * e)

    def _quorum(self) -> int:
        return len(self.config.voters) // 2 + 1

    @property
    def promotable(self) -> bool:
        return self.id in self.config.voters

    def _send(self, m: Message) -> None:
        self._msgs.append(m)

    def _send_after_persist(self, m: Message) -> None:
        # Needs the next Ready (which holds everything appended so far) durable.
        self._held.append((self._next_seq, m))

    def _in_lease(self) -> bool:
        return (
            self.cfg.check_quorum
            and self.lead is not None
            and self.election_elapsed < self.cfg.election_tick
        )

    # ------------------------------------------------------------------ roles
    def _reset(self, term: int) -> None:
        if self.term != term:
            if term < self.term:
                raise InvariantViolation(f"term going backwards {self.term} -> {term}")
            self.term = term
            self.vote = None
        self.lead = None
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self._reset_randomized_timeout()
        self.votes = {}
        self.progress = {}
        self.transferee = None
        self.pending_conf_index = 0

    def _become_follower(self, term: int, lead: NodeId | None) -> None:
        self._reset(term)
        self.lead = lead
        self.role = Role.FOLLOWER
        self._table = self._step_tables[Role.FOLLOWER]

    def _become_pre_candidate(self) -> None:
        # Pre-vote does not change term or vote (thesis §9.6).
        self.votes = {self.id: True}
        self.lead = None
        self.role = Role.PRE_CANDIDATE
        self.election_elapsed = 0
        self._reset_randomized_timeout()
        self._table = self._step_tables[Role.PRE_CANDIDATE]

    def _become_candidate(self) -> None:
        self._reset(self.term + 1)
        self.vote = self.id
        self.votes = {self.id: True}
        self.role = Role.CANDIDATE
        self._table = self._step_tables[Role.CANDIDATE]

    def _become_leader(self) -> None:
        self._reset(self.term)
        self.lead = self.id
        self.role = Role.LEADER
        self._table = self._step_tables[Role.LEADER]
        last = self.log.last_index()
        mi = self.cfg.max_inflight_msgs
        for n in sorted(self.config.voters):
            self.progress[n] = Progress(last + 1, mi, False)
        for n in sorted(self.config.learners):
            self.progress[n] = Progress(last + 1, mi, True)
        if self.id in self.progress:
            me = self.progress[self.id]
            me.match = max(0, self.log.durable_index())
            me.become_replicate()
            me.next = last + 2  # the NOOP appended below
        # §8: commit an entry of our term to learn/commit what earlier terms left.
        self._append_entries([Entry(Term(self.term), Index(last + 1), EntryKind.NOOP, b"")])
        # No conf change until an entry of this term is committed (the
        # single-server change safety fix): the NOOP sets the bar.
        self.pending_conf_index = last + 1
        self._bcast_append()

    def _campaign(self, pre_vote: bool, transfer: bool = False) -> None:
        if pre_vote:
            self._become_pre_candidate()
            term = self.term + 1
        else:
            self._become_candidate()
            term = self.term
        if self._tally() >= self._quorum():
            if pre_vote:
                self._campaign(False)
            else:
                self._become_leader()
            return
        li = self.log.last_index()
        lt = self.log.last_term()
        for n in sorted(self.config.voters):
            if n == self.id:
                continue
            m = RequestVote(Term(term), self.id, n, Index(li), Term(lt), pre_vote, transfer, self._group)
            if pre_vote:
                self._send(m)
            else:
                # Our own vote for ourselves must be durable before we ask.
                self._send_after_persist(m)

    def _tally(self) -> int:
        return sum(1 for n, g in self.votes.items() if g and n in self.config.voters)

    def _rejections(self) -> int:
        return sum(1 for n, g in self.votes.items() if not g and n in self.config.voters)

    # ------------------------------------------------------------------ inputs
    def campaign(self) -> None:
        """Start an election now, as an election timeout would (pre-vote
        first if configured). A no-op on a leader."""
        if not self.promotable:
            raise RaftUsageError(f"{self.id} is not a voter and cannot campaign")
        if self.role is not Role.LEADER:
            self._campaign(self.cfg.pre_vote)

    def leader_unreachable(self) -> None:
        """The host saw its connection to the current leader break (a killed
        node's sockets close at once). The follower gives up the leader's
        lease: it now grants (pre-)votes, and campaigns at its next timeout
        check instead of waiting a full election timeout. A mistaken report is
        harmless: pre-vote still needs a quorum that no longer hears a leader."""
        if self.role is not Role.LEADER and self.lead is not None:
            self.election_elapsed = max(self.election_elapsed, self.cfg.election_tick)

    def quiet(self, unreachable: Collection[str] = ()) -> bool:
        """True on a leader with nothing left to tell anyone: every entry is
        committed, durable here and applied, no configuration change or
        leadership transfer is under way, and every follower (except those in
        `unreachable`, whose nodes the host knows to be down) has the whole
        log and was sent the commit index in an append; and a quorum of
        voters (itself included) is among them. A host may then stop ticking the group
        (quiescence, as CockroachDB quiesces idle ranges): no heartbeats, no
        check-quorum. It must tick it again on any input, and its followers
        must start ticking again when the leader's node is suspected down.
        Read-only: it changes nothing, so it cannot weaken safety (stopping
        ticks is a slow clock, which Raft's safety never depends on)."""
        if self.role is not Role.LEADER or self.transferee is not None or self._pending_confs:
            return False
        last = self.log.last_index()
        if self.log.committed != last or self.log.applied != last or self._unpersisted \
                or self.has_ready():
            return False
        voters = self.config.voters
        matched = 1 if self.id in voters else 0
        for n, pr in self.progress.items():
            if n == self.id:
                continue
            if n in unreachable:
                continue
            if pr.match != last or pr.sent_commit < last or pr.state is not _REPLICATE \
                    or pr.inflight:
                return False
            if n in voters:
                matched += 1
        # A leader that cannot reach a quorum keeps ticking, so that
        # check-quorum steps it down.
        return matched >= self._quorum()

    def quiet_follower(self, leader: str, term: int, commit: int) -> bool:
        """True on a follower of `leader` in `term` whose log ends at `commit`,
        all of it committed, durable and applied: the leader's notice that it
        went quiet (`quiet`) may stop this follower's ticks too."""
        last = self.log.last_index()
        return (self.role is Role.FOLLOWER and self.lead == leader and self.term == term
                and self.log.committed == commit == last and self.log.applied == last
                and not self._unpersisted and not self.has_ready())

    def tick(self) -> None:
        """Advance logical time by one tick."""
        if self.role is Role.LEADER:
            self._tick_leader()
        else:
            self.election_elapsed += 1
            if self.promotable and self.election_elapsed >= self.randomized_timeout:
                self.election_elapsed = 0
                self._campaign(self.cfg.pre_vote)

    def _tick_leader(self) -> None:
        self.heartbeat_elapsed += 1
        if self.transferee is not None:
            self.transfer_elapsed += 1
            if self.transfer_elapsed >= self.cfg.election_tick:
                self.transferee = None  # transfer timed out; take proposals again
        self.election_elapsed += 1
        if self.election_elapsed >= self.cfg.election_tick:
            self.election_elapsed = 0
            if self.cfg.check_quorum:
                active = sum(
                    1
                    for n in self.config.voters
                    if n == self.id or (n in self.progress and self.progress[n].recent_active)
                )
                for n, pr in self.progress.items():
                    if n != self.id:
                        pr.recent_active = False
                if active < self._quorum():
                    # §6.2 check-quorum: we may be partitioned away; step down.
                    self._become_follower(self.term, None)
                    return
        if self.heartbeat_elapsed >= self.cfg.heartbeat_tick:
            self.heartbeat_elapsed = 0
            self._bcast_heartbeat()

    def step(self, m: Message) -> None:
        """Handle one message from a peer."""
        if type(m) not in MESSAGE_TYPES:
            raise RaftUsageError(f"not a raft message: {type(m).__name__}")
        if m.dst != self.id:
            raise RaftUsageError(f"message for {m.dst!r} stepped into {self.id!r}")
        if m.term > self.term:
            t = type(m)
            if t is RequestVote:
                assert isinstance(m, RequestVote)
                if not m.transfer and self._in_lease():
                    # §4.2.3: a current leader exists; ignore disruptive campaigns.
                    return
                if not m.pre_vote:
                    self._become_follower(m.term, None)
            elif t is RequestVoteResponse:
                assert isinstance(m, RequestVoteResponse)
                if not (m.pre_vote and m.granted):
                    self._become_follower(m.term, None)
            elif t is AppendEntries or t is Heartbeat or t is InstallSnapshot:
                self._become_follower(m.term, m.src)
            else:
                self._become_follower(m.term, None)
        elif m.term < self.term:
            t = type(m)
            if (self.cfg.check_quorum or self.cfg.pre_vote) and (t is AppendEntries or t is Heartbeat):
                # Tell a stale leader about our term so it steps down.
                self._send(HeartbeatResponse(Term(self.term), self.id, m.src, self._group))
            elif t is RequestVote:
                assert isinstance(m, RequestVote)
                if m.pre_vote:
                    self._send(RequestVoteResponse(Term(self.term), self.id, m.src, False, True, self._group))
            return
        if type(m) is RequestVote:
            assert isinstance(m, RequestVote)
            self._handle_vote_request(m)
            return
        h = self._table.get(type(m))
        if h is not None:
            h(m)

    def _handle_vote_request(self, m: RequestVote) -> None:
        can_vote = (
            self.vote == m.src
            or (self.vote is None and self.lead is None)
            or (m.pre_vote and m.term > self.term)
        )
        if can_vote and self.log.is_up_to_date(m.last_log_index, m.last_log_term):
            if m.pre_vote:
                self._send(RequestVoteResponse(m.term, self.id, m.src, True, True, self._group))
            else:
                self.election_elapsed = 0
                self.vote = m.src
                self._send_after_persist(
                    RequestVoteResponse(m.term, self.id, m.src, True, False, self._group)
                )
        else:
            r = RequestVoteResponse(Term(self.term), self.id, m.src, False, m.pre_vote, self._group)
            if m.pre_vote:
                self._send(r)
            else:
                self._send_after_persist(r)

    # --- follower
    def _follower_append(self, m: AppendEntries) -> None:
        self.election_elapsed = 0
        self.lead = m.src
        log = self.log
        if m.prev_log_index < log.committed:
            self._send_after_persist(
                AppendResponse(Term(self.term), self.id, m.src, False, Index(log.committed), group=self._group)
            )
            return
        ents = m.entries if isinstance(m.entries, list) else list(m.entries)
        res = log.maybe_append(m.prev_log_index, m.prev_log_term, m.commit, ents)
        if res is not None:
            last_new, appended = res
            if appended:
                self._note_conf_entries(appended)
            self._after_commit_change()
            self._send_after_persist(
                AppendResponse(Term(self.term), self.id, m.src, False, Index(last_new), group=self._group)
            )
        else:
            hint = min(m.prev_log_index, log.last_index())
            hint = log.find_conflict_by_term(hint, m.prev_log_term)
            try:
                hint_term = log.term(hint)
            except StorageError:
                hint_term = 0
            self._send_after_persist(
                AppendResponse(
                    Term(self.term), self.id, m.src, True, m.prev_log_index,
                    Index(hint), Term(hint_term), self._group,
                )
            )

    def _follower_heartbeat(self, m: Heartbeat) -> None:
        self.election_elapsed = 0
        self.lead = m.src
        if self.log.commit_to(min(m.commit, self.log.last_index())):
            self._after_commit_change()
        self._send_after_persist(HeartbeatResponse(Term(self.term), self.id, m.src, self._group))

    def _follower_snapshot(self, m: InstallSnapshot) -> None:
        self.election_elapsed = 0
        self.lead = m.src
        log = self.log
        meta = m.meta
        if meta.index <= log.committed:
            # Already have it all: report our commit as match.
            self._snap_recv = None
            self._send_after_persist(
                InstallSnapshotResponse(
                    Term(self.term), self.id, m.src, meta.index, m.offset + len(m.data), True, self._group
                )
            )
            return
        r = self._snap_recv
        if r is None or r.meta != meta or r.src != m.src or r.term != m.term:
            if m.offset != 0:
                self._send(InstallSnapshotResponse(Term(self.term), self.id, m.src, meta.index, 0, False, self._group))
                return
            r = self._snap_recv = _SnapRecv(meta, m.src, m.term)
        if m.offset == r.next_offset:
            r.chunks.append(m.data)
            r.next_offset += len(m.data)
        if m.done and m.offset + len(m.data) == r.next_offset:
            self._snap_recv = None
            snap = Snapshot(meta, b"".join(r.chunks))
            if log.match_term(meta.index, meta.term):
                # Our log already holds the snapshot point: just fast-forward commit.
                log.commit_to(meta.index)
                self._after_commit_change()
            else:
                self._restore(snap)
            self._send_after_persist(
                InstallSnapshotResponse(Term(self.term), self.id, m.src, meta.index, r.next_offset, True, self._group)
            )
            return
        self._send(InstallSnapshotResponse(Term(self.term), self.id, m.src, meta.index, r.next_offset, False, self._group))

    def _restore(self, snap: Snapshot) -> None:
        self.log.restore(snap)
        self.config = snap.meta.config
        self._config_unverified = False
        self._conf_history = [(snap.meta.index, snap.meta.config)]
        self._pending_confs = []

    def _follower_timeout_now(self, m: TimeoutNow) -> None:
        if self.promotable:
            self._campaign(False, transfer=True)

    # --- candidates
    def _candidate_leader_msg(self, m: AppendEntries | Heartbeat | InstallSnapshot) -> None:
        # Someone won this term (§5.2); follow it.
        self._become_follower(self.term, m.src)
        self.step(m)

    def _candidate_vote_response(self, m: RequestVoteResponse) -> None:
        pre = self.role is Role.PRE_CANDIDATE
        if m.pre_vote != pre:
            return
        if pre and m.granted and m.term != self.term + 1:
            return  # a grant from an earlier pre-vote round
        self.votes.setdefault(m.src, m.granted)
        q = self._quorum()
        if self._tally() >= q:
            if pre:
                self._campaign(False)
            else:
                self._become_leader()
        elif self._rejections() > len(self.config.voters) - q:
            # Too many refusals for a quorum of grants to remain possible.
            self._become_follower(self.term, None)

    # --- leader
    def _leader_same_term_leader(self, m: Message) -> None:
        raise InvariantViolation(f"two leaders in term {self.term}: {self.id} and {m.src}")

    def _leader_heartbeat_response(self, m: HeartbeatResponse) -> None:
        pr = self.progress.get(m.src)
        if pr is None:
            return
        pr.recent_active = True
        pr.probe_sent = False
        if pr.state is _REPLICATE and len(pr.inflight) >= pr.max_inflight:
            pr.inflight.popleft()  # free a slot so a lost window cannot stall us
        if pr.state is _SNAPSHOT:
            # Resend from the last acked offset only if no chunk was acked
            # since the previous heartbeat (chunks or acks were lost).
            if pr.snap_acked == pr.snap_mark:
                self._resend_snapshot(m.src, pr)
            pr.snap_mark = pr.snap_acked
        elif pr.match < self.log.last_index():
            self._send_append(m.src, pr, True)

    def _leader_append_response(self, m: AppendResponse) -> None:
        to = m.src
        pr = self.progress.get(to)
        if pr is None:
            return
        pr.recent_active = True
        if m.reject:
            if pr.state is _SNAPSHOT:
                return
            hint: int = m.hint_index
            if m.hint_term > 0:
                hint = self.log.find_conflict_by_term(m.hint_index, m.hint_term)
            if pr.maybe_decrease_to(m.index, hint):
                if pr.state is _REPLICATE:
                    pr.become_probe()
                self._send_append(to, pr, True)
            return
        was_paused = pr.is_paused()
        if not pr.maybe_update(m.index) and not (pr.match == m.index and pr.state is _PROBE):
            return
        if pr.state is _PROBE:
            pr.become_replicate()
        elif pr.state is _SNAPSHOT:
            if pr.snapshot is None or pr.match >= pr.snapshot.meta.index:
                pr.become_probe()
        if self._maybe_commit():
            if self.role is not Role.LEADER:
                return
            # Followers learn the new commit with the next ready()'s broadcast
            # (coalesced with new entries when there are any).
            self._bcast_pending = True
        elif was_paused:
            self._send_append(to, pr, True)
        while self._send_append(to, pr, False):
            pass
        if self.transferee == to and pr.match == self.log.last_index():
            self._send(TimeoutNow(Term(self.term), self.id, to, self._group))
        if pr.is_learner and self.cfg.auto_promote:
            self._maybe_auto_promote(to, pr)

    def _leader_snapshot_response(self, m: InstallSnapshotResponse) -> None:
        pr = self.progress.get(m.src)
        if pr is None:
            return
        pr.recent_active = True
        if m.done:
            pr.maybe_update(m.snapshot_index)
            if pr.state is _SNAPSHOT:
                pr.become_probe()
            self._maybe_commit_and_bcast()
            if self.role is Role.LEADER:
                self._send_append(m.src, pr, True)
            return
        snap = pr.snapshot
        if pr.state is not _SNAPSHOT or snap is None or snap.meta.index != m.snapshot_index:
            return
        if m.next_offset < pr.snap_acked:
            pr.snap_sent = m.next_offset  # follower restarted reassembly
        pr.snap_acked = m.next_offset
        if pr.snap_sent < pr.snap_acked:
            pr.snap_sent = pr.snap_acked
        self._send_snapshot_window(m.src, pr)

    def _maybe_commit_and_bcast(self) -> None:
        if self._maybe_commit() and self.role is Role.LEADER:
            self._bcast_pending = True

    def _maybe_commit(self) -> bool:
        """§5.3/§5.4.2: commit the highest index stored on a quorum of voters,
        only if it is of the current term. Our own copy counts only once
        durable (progress[self].match tracks the durable index)."""
        voters = self.config.voters
        prog = self.progress
        matches = sorted((prog[n].match if n in prog else 0 for n in voters), reverse=True)
        if not matches:
            return False
        idx = matches[len(matches) // 2]
        log = self.log
        if idx <= log.committed:
            return False
        if log.term(idx) != self.term:
            return False
        log.commit_to(idx)
        self._after_commit_change()
        return True

    # ------------------------------------------------------------------ replication
    def _send_append(self, to: NodeId, pr: Progress, send_if_empty: bool) -> bool:
        if pr.is_paused():
            return False
        log = self.log
        nxt = pr.next
        prev = nxt - 1
        try:
            prev_term = log.term(prev)
            last = log.last_index()
            if nxt <= last:
                hi = min(last + 1, nxt + self.cfg.max_entries_per_msg)
                ents = log.slice(nxt, hi, self.cfg.max_size_per_msg)
            else:
                ents = []
        except Compacted:
            self._start_snapshot(to, pr)
            return True
        c = log.committed
        if not ents and not send_if_empty:
            return False
        pr.sent_commit = c
        self._send(
            AppendEntries(
                Term(self.term), self.id, to, Index(prev), Term(prev_term), ents,
                Index(c), self._group,
            )
        )
        if pr.state is _REPLICATE:
            if ents:
                li = ents[-1].index
                pr.next = li + 1
                pr.inflight.append(li)
        else:
            pr.probe_sent = True
        return True

    def _bcast_append(self) -> None:
        """Send every follower what it is missing (window permitting); a
        follower that gets no entries but has not been told the current
        commit index gets an empty append carrying it."""
        c = self.log.committed
        for to, pr in self.progress.items():
            if to == self.id:
                continue
            sent = False
            while self._send_append(to, pr, False):
                sent = True
            if not sent and pr.sent_commit < c and pr.state is not _SNAPSHOT:
                self._send_append(to, pr, True)

    def _bcast_heartbeat(self) -> None:
        c = self.log.committed
        for to, pr in self.progress.items():
            if to == self.id:
                continue
            self._send(Heartbeat(Term(self.term), self.id, to, Index(min(pr.match, c)), self._group))

    def _start_snapshot(self, to: NodeId, pr: Progress) -> None:
        snap = self.log.storage.snapshot()
        if snap.meta.index < self.log.first_index() - 1:
            raise InvariantViolation(
                f"log compacted to {self.log.first_index() - 1} but latest snapshot is {snap.meta.index}"
            )
        pr.become_snapshot(snap)
        self._send_snapshot_window(to, pr)

    def _resend_snapshot(self, to: NodeId, pr: Progress) -> None:
        pr.snap_sent = pr.snap_acked
        self._send_snapshot_window(to, pr)

    def _send_snapshot_window(self, to: NodeId, pr: Progress) -> None:
        snap = pr.snapshot
        if snap is None:
            return
        size = len(snap.data)
        chunk = self.cfg.snapshot_chunk_size
        window = chunk * self.cfg.snapshot_window
        while True:
            off = pr.snap_sent
            if off > size or (off == size and size > 0) or off - pr.snap_acked >= window:
                return
            data = snap.data[off : off + chunk]
            done = off + len(data) >= size
            self._send(
                InstallSnapshot(Term(self.term), self.id, to, snap.meta, off, data, done, self._group)
            )
            pr.snap_sent = off + len(data)
            if done:
                if size == 0:
                    pr.snap_sent = 1  # sentinel: the single empty chunk went out
                return

    # ------------------------------------------------------------------ proposals
    def _append_entries(self, ents: list[Entry]) -> None:
        self.log.append(ents)

    def _check_can_propose(self) -> None:
        if self.role is not Role.LEADER:
            raise NotLeader(self.lead)
        if self.transferee is not None:
            raise ProposalDropped(f"leadership transfer to {self.transferee} in progress")
        if self.id not in self.config.voters:
            raise ProposalDropped("this leader has been removed from the group")

    def propose(self, data: bytes | object) -> Index:
        """Append a command (bytes); returns its index. Raises NotLeader(leader_id),
        ProposalDropped(reason), RaftUsageError for data that is not bytes (typed
        `object` so that compiled code refuses it with that error, not a
        TypeError). The AppendEntries go out with the next ready(), together
        with every other proposal made before it."""
        if self.role is not Role.LEADER or self.transferee is not None:
            self._check_can_propose()
        if type(data) is not bytes:
            raise RaftUsageError(f"proposal data must be bytes, not {type(data).__name__}")
        # Hot path: a leader's log only grows at its end, so append straight
        # to the unstable tail (offset + len == last_index() + 1 always).
        u = self.log.unstable
        idx = u.offset + len(u.entries)
        u.entries.append(Entry(self.term, idx, _NORMAL, data))  # type: ignore[arg-type]
        self._bcast_pending = True
        return idx  # type: ignore[return-value]

    def propose_batch(self, datas: Sequence[bytes]) -> list[Index]:
        """Append several commands at once (one broadcast); returns their indexes."""
        self._check_can_propose()
        if not datas:
            return []
        if not set(map(type, datas)) <= _BYTES_ONLY:  # C-level check
            raise RaftUsageError("proposal data must be bytes")
        first = self.log.last_index() + 1
        t = Term(self.term)
        self.log.append(make_entries(t, Index(first), _NORMAL, datas))
        self._bcast_pending = True  # sent by the next ready(): one append for many proposals
        return list(range(first, first + len(datas)))  # type: ignore[arg-type]

    def propose_conf_change(self, cc: ConfChange) -> Index:
        """Propose a single-server membership change; it takes effect when
        committed. Raises NotLeader, InvalidConfChange."""
        self._check_can_propose()
        if not isinstance(cc, ConfChange) or not isinstance(cc.kind, ConfChangeKind):
            raise InvalidConfChange(f"not a ConfChange: {cc!r}")
        if self.pending_conf_index > self.log.committed or self._pending_confs:
            raise ConfChangePending(
                "a configuration change (or this leader's first entry) is still uncommitted"
            )
        result = cc.apply(self.config)  # validates; raises InvalidConfChange
        idx = self.log.last_index() + 1
        e = Entry(Term(self.term), Index(idx), _CONFIG, encode_conf_entry(cc, result))
        self.log.append([e])
        self._pending_confs.append(idx)
        self.pending_conf_index = idx
        self._bcast_pending = True  # sent by the next ready(): one append for many proposals
        return Index(idx)

    def _maybe_auto_promote(self, to: NodeId, pr: Progress) -> None:
        # Rule: a learner is promoted once its durable match reaches the
        # leader's last index at the time of the check (it is fully caught up)
        # and no other change is pending.
        if pr.match < self.log.last_index():
            return
        if self.pending_conf_index > self.log.committed or self._pending_confs:
            return
        if self.transferee is not None:
            return
        try:
            self.propose_conf_change(ConfChange(ConfChangeKind.PROMOTE, to))
        except (InvalidConfChange, ProposalDropped):
            pass  # not possible right now; retried on the next response

    def transfer_leadership(self, target: str) -> None:
        """Hand leadership to `target` (§3.10 of the thesis). Raises NotLeader,
        TransferRefused(reason)."""
        t = NodeId(target)
        if self.role is not Role.LEADER:
            raise NotLeader(self.lead)
        if t == self.id:
            raise TransferRefused(f"{t} is already the leader")
        if t not in self.config.members:
            raise TransferRefused(f"unknown node {t}")
        if t in self.config.learners:
            raise TransferRefused(f"{t} is a learner, not a voter")
        if self.transferee is not None:
            raise TransferInProgress(f"a transfer to {self.transferee} is in progress")
        pr = self.progress[t]
        if not pr.recent_active or pr.match < self.log.committed:
            raise TransferRefused(
                f"{t} is lagging (match {pr.match} < commit {self.log.committed}) or unreachable"
            )
        self.transferee = t
        self.transfer_elapsed = 0  # the transfer times out after election_tick
        if pr.match == self.log.last_index():
            self._send(TimeoutNow(Term(self.term), self.id, t, self._group))
        else:
            self._send_append(t, pr, True)

    # ------------------------------------------------------------------ config
    def _note_conf_entries(self, ents: list[Entry]) -> None:
        first = ents[0].index
        pc = self._pending_confs
        while pc and pc[-1] >= first:
            pc.pop()  # truncated away by this append
        if _CONFIG in map(_kind_of, ents):  # C-speed scan; config entries are rare
            pc.extend(e.index for e in ents if e.kind is _CONFIG)

    def _after_commit_change(self) -> None:
        pc = self._pending_confs
        c = self.log.committed
        while pc and pc[0] <= c:
            i = pc.pop(0)
            e = self.log.slice(i, i + 1, None)[0]
            if e.kind is not _CONFIG:
                raise InvariantViolation(f"entry {i} recorded as CONFIG is {e.kind}")
            self._apply_conf_entry(e)

    def _apply_conf_entry(self, e: Entry) -> None:
        cc, new = decode_conf_entry(e.data)
        if self.config.voters and not self._config_unverified:
            # A node that knows its configuration checks the change fits it; a
            # blank new node (no configuration yet) takes the carried result.
            try:
                expect = cc.apply(self.config)
            except InvalidConfChange as exc:
                raise InvariantViolation(
                    f"committed conf change {cc} at {e.index} is invalid here: {exc}"
                ) from exc
            if expect != new:
                raise InvariantViolation(
                    f"committed conf change {cc} at {e.index} yields {new}, expected {expect}"
                )
        self.config = new
        self._config_unverified = False
        self._conf_history.append((e.index, new))
        if self.role is not Role.LEADER:
            return
        mi = self.cfg.max_inflight_msgs
        last = self.log.last_index()
        for n in sorted(new.members):
            if n not in self.progress:
                self.progress[n] = Progress(last + 1, mi, n in new.learners)
            else:
                self.progress[n].is_learner = n in new.learners
        for n in list(self.progress):
            if n not in new.members and n != self.id:
                del self.progress[n]
        if self.transferee is not None and self.transferee not in new.voters:
            self.transferee = None
        if self.id not in new.voters:
            # Removed (§6): tell everyone the commit index, then step down.
            self._bcast_append()
            self._become_follower(self.term, None)
            return
        self._maybe_commit_and_bcast()

    def config_at(self, index: int) -> Membership:
        """Membership in force after applying the log up to `index` (for
        snapshots taken by the host at its applied index)."""
        best = None
        for i, m in self._conf_history:
            if i <= index:
                best = m
        if best is None:
            raise RaftUsageError(f"no configuration known at {index} (compacted)")
        return best

    def max_snapshot_index(self) -> int:
        """Highest index the host may snapshot at: applied and durable."""
        return min(self.log.applied, self.log.durable_index())

    def snapshot_meta(self, index: int) -> SnapshotMeta:
        """Metadata for a snapshot the host takes at `index`
        (<= max_snapshot_index(): applied by the host and durable)."""
        if index > self.max_snapshot_index():
            raise RaftUsageError(
                f"snapshot at {index} beyond applied-and-durable {self.max_snapshot_index()}"
            )
        return SnapshotMeta(Index(index), Term(self.log.term(index)), self.config_at(index))

    def compacted(self) -> None:
        """Tell the node the host compacted storage (drops stale history)."""
        first = self.log.first_index() - 1
        hist = self._conf_history
        while len(hist) > 1 and hist[1][0] <= first:
            hist.pop(0)

    # ------------------------------------------------------------------ outputs
    def has_ready(self) -> bool:
        if self._msgs or self._bcast_pending:
            return True
        held = self._held
        if held and (held[0][0] <= self._persisted_seq or held[-1][0] >= self._next_seq):
            return True
        u = self.log.unstable
        if len(u.entries) > u.in_progress or (u.snapshot is not None and not u.snapshot_in_progress):
            return True
        if self.log.has_next_committed():
            return True
        if self._prev_ss.leader != self.lead or self._prev_ss.role is not self.role:
            return True
        return self._hs_due()

    def _hs_due(self) -> bool:
        """Is a hard state to be handed out (and written by the host)? When
        term or vote changed, always. When only the commit index did: always,
        unless `cfg.lazy_commit`; then only when the new commit passes a
        CONFIG entry, that is when the last committed one (it was applied
        as the commit reached it) lies above the commit last handed out.
        Raft needs term, vote and entries durable; the commit index is
        volatile state a restarted member relearns from its leader. But a
        host's restart rule may read the membership from the CONFIG entries
        at or below the recovered commit (runtime/raft_group.py
        `initial_state`), so those commits are written. The last CONFIG
        entry of the log at construction, when above the recovered commit,
        is in `_pending_confs` and goes into `_conf_history` the same way
        when it commits (the ones before it are committed at construction,
        which also hands out their commit)."""
        p = self._prev_hs
        if p.term != self.term or p.vote != self.vote:
            return True
        if p.commit == self.log.committed:
            return False
        return not self.cfg.lazy_commit or self._conf_history[-1][0] > p.commit

    def ready(self) -> Ready:
        """Hand out the pending work (see module docstring). Entries, hard
        state and snapshot returned here are never returned again."""
        if self._bcast_pending:
            self._bcast_pending = False
            if self.role is Role.LEADER:
                self._bcast_append()
        seq = self._next_seq
        self._next_seq = seq + 1
        ss: SoftState | None = None
        if self._prev_ss.leader != self.lead or self._prev_ss.role is not self.role:
            ss = SoftState(self.lead, self.role)
            self._prev_ss = ss
        hs: HardState | None = None
        log = self.log
        if self._hs_due():
            hs = HardState(Term(self.term), self.vote, Index(log.committed))
            self._prev_hs = hs
        u = log.unstable
        snap: Snapshot | None = None
        if u.snapshot is not None and not u.snapshot_in_progress:
            snap = u.snapshot
            u.snapshot_in_progress = True
        ents: list[Entry] = []
        if len(u.entries) > u.in_progress:
            ents = u.entries[u.in_progress :]
            u.in_progress = len(u.entries)
        msgs = self._msgs
        self._msgs = []
        released: list[Message] = []
        held = self._held
        ps = self._persisted_seq
        while held and held[0][0] <= ps:
            released.append(held.popleft()[1])
        committed = log.next_committed()
        if committed:
            log.applying = committed[-1].index
            self._applied_by_seq[seq] = log.applying
        elif snap is not None:
            self._applied_by_seq[seq] = snap.meta.index
        must = hs is not None or bool(ents) or snap is not None
        self._unpersisted.append(
            (
                seq,
                ents[-1].index if ents else 0,
                ents[-1].term if ents else 0,
                snap.meta.index if snap is not None else 0,
                must,
            )
        )
        if not must:
            self._drain_persisted()
        return Ready(seq, ss, hs, ents, snap, msgs, released, committed)

    def advance(self, rd: Ready, *, persisted: bool = False) -> None:
        """The host has applied rd.committed_entries (and installed
        rd.snapshot). With persisted=True, also acknowledges durability of
        everything up to rd.seq (synchronous hosts)."""
        if rd.seq != self._next_advance:
            raise RaftUsageError(f"advance({rd.seq}) out of order; expected {self._next_advance}")
        self._next_advance = rd.seq + 1
        a = self._applied_by_seq.pop(rd.seq, None)
        if a is not None and a > self.log.applied:
            self.log.applied = a
        if persisted:
            self.persisted(rd.seq)

    def persisted(self, seq: int) -> None:
        """Everything in the Readies with seq <= `seq` is durable."""
        if seq >= self._next_seq:
            raise RaftUsageError(f"persisted({seq}) but only {self._next_seq - 1} Readies handed out")
        if seq <= self._persisted_seq:
            return
        log = self.log
        unp = self._unpersisted
        while unp and unp[0][0] <= seq:
            _, li, lt, si, _must = unp.popleft()
            if si:
                log.unstable.stable_snap_to(si)
            if li:
                log.unstable.stable_to(li, lt)
        self._persisted_seq = seq
        self._drain_persisted()
        if self.role is Role.LEADER:
            me = self.progress.get(self.id)
            if me is not None:
                d = log.durable_index()
                if d > me.match:
                    me.match = d
                    me.next = d + 1
                    self._maybe_commit_and_bcast()

    def _drain_persisted(self) -> None:
        unp = self._unpersisted
        while unp and not unp[0][4] and unp[0][0] == self._persisted_seq + 1:
            self._persisted_seq = unp.popleft()[0]

    # ------------------------------------------------------------------ introspection
    def status(self) -> Status:
        prog = {
            n: PeerStatus(p.match, p.next, p.state.value, p.is_learner, p.recent_active)
            for n, p in self.progress.items()
        }
        return Status(
            self.id, self.role, self.term, self.lead, self.vote, self.log.committed,
            self.log.applied, self.log.last_index(), self.log.first_index(), self.config,
            self.transferee, prog,
        )

    @property
    def leader_id(self) -> NodeId | None:
        return self.lead

    @property
    def config_index(self) -> int:
        """Where `config` took effect: the index of the committed CONFIG entry
        that made it (or of the snapshot that carries it; 0 for the bootstrap
        configuration). It grows with every configuration change, so two
        reports of one group's configuration are ordered by it."""
        return self._conf_history[-1][0]

    @property
    def commit_index(self) -> int:
        return self.log.committed
