"""The Raft group driver: one `RaftNode` over the node's shared storage.

Where it sits: between the pure Raft core (`broker.raft`) and everything with
I/O. It turns the core's `Ready` into storage writes (`GroupLog.append` /
`set_hard_state`, group-committed by the WAL writer thread), peer messages
(through a `send` callback, normally the peer transport) and applied commands
(through its `Machine`, runtime/machine.py: the queue or metadata adapter).

The Ready contract (broker/raft/node.py) is followed literally:
  1. `rd.messages` are sent at once (leader appends go out in parallel with
     the leader's own WAL write);
  2. snapshot, entries and hard state are queued to the WAL (with
     `RaftConfig.lazy_commit`, queue groups, the core hands out no hard state whose
     only change is the commit index: `RaftNode._hs_due`);
  3. `rd.persisted_messages` are sent (their preconditions are durable);
  4. committed entries are applied in order, then `advance(rd)`;
  5. when the WAL writer reports the writes durable (`on_durable`, hopped
     onto the event loop), `persisted(seq)` lets the leader count its own
     copy and releases the follower's acknowledgements.

Snapshots are the group's: it restores the machine from the log's snapshot
at start and from the leader's on InstallSnapshot, and decides when to take
one (every `snapshot_interval` applied entries at the machine's next release
cursor, at once on a `Cursor.NOW`, once the entries applied since the last
one hold `snapshot_bytes`, and after `snapshot_idle_s` with nothing
applied); it writes the machine's serialised state once the entry is applied
and durable here, then compacts the Raft core's history, releases segments
below the machine's release bound and compacts the log to the entries the
machine still needs (docs/STORAGE.md "Compaction").

Proposals return futures resolved with the machine's reply when the entry is
applied (so a publisher confirm is only sent once the entry is committed,
which needs it durable on a quorum), or failed when the entry is overwritten
by another leader's entry, or the node is not the leader.

Log entries for NORMAL commands carry `[timestamp_ms, payload]` (msgpack):
the leader's wall clock at proposal is the machine's only notion of time.

Why one file of this size: it is the one driver of the Ready contract (above),
with the storage adapter Raft reads through (`GroupLogStorage`), proposals and
their waiters, quiescence's per-group part and the snapshot cadence of its
`Machine`; they share the Ready loop's ordering, which is the safety argument.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgpack

import broker.storage as st
from broker.common.packing import packb
from broker.raft import (
    AppendResponse,
    Compacted,
    Entry,
    EntryKind,
    HardState,
    HeartbeatResponse,
    Index,
    Membership,
    Message,
    NodeId,
    NotLeader,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
    Term,
    Unavailable,
)

from .machine import Cursor, Machine, MachineSnapshot

log = logging.getLogger("broker.raft_group")

_ENTRY_KINDS = {k.value: k for k in EntryKind}

#: Bytes of applied entries after which a group snapshots (at the next entry,
#: without waiting for the machine's cursor). Each snapshot releases the log
#: below the smallest live message, and released entries are dropped from
#: the memory table and never written to segment files (docs/STORAGE.md), so
#: with big bodies this is what keeps each body to one write, to the WAL.
SNAPSHOT_BYTES = 64 * 1024 * 1024
# What a quiet leader may still receive from the heartbeats it sent last.
_ECHOES = (HeartbeatResponse, AppendResponse)


def encode_membership(m: Membership) -> bytes:
    data: bytes = msgpack.packb([sorted(m.voters), sorted(m.learners)])
    return data


def decode_membership(b: bytes) -> Membership:
    voters, learners = msgpack.unpackb(b)
    return Membership(frozenset(NodeId(v) for v in voters), frozenset(NodeId(n) for n in learners))


def _raft_entry(e: st.Entry | Entry) -> Entry:
    if type(e) is Entry:  # appended by this layer and still in memory: as it was
        return e
    return Entry(Term(e.term), Index(e.index), _ENTRY_KINDS[e.kind], e.data)


# GroupLog.append stores the Raft layer's entries as they are
st.accept_entry_type(Entry)


class GroupLogStorage:
    """`broker.raft.LogStorage` over a `broker.storage.GroupLog`.

    Index conventions differ: storage keeps entries below its snapshot until
    they are released (live queue messages), Raft wants etcd's view where
    `first_index() == snapshot index + 1`. This adapter presents Raft's view;
    the runtime reads message bodies below the snapshot straight from the
    GroupLog.
    """

    __slots__ = ("glog", "bootstrap", "augment")

    def __init__(self, glog: st.GroupLog, bootstrap: Membership,
                 augment: Callable[[bytes, int], bytes] | None = None) -> None:
        self.glog = glog
        self.bootstrap = bootstrap
        # Called when Raft reads the snapshot to send it to a follower: lets the
        # machine add what the follower needs beyond its state (queue bodies
        # of live messages below the snapshot index).
        self.augment = augment

    def initial_state(self) -> tuple[HardState, Membership]:
        """The membership is the snapshot's; else, when the log holds a CONFIG
        entry, none: the node replays the log and takes the configuration the
        committed CONFIG entries carry (the bootstrap list is only right for a
        log that never changed membership, e.g. the group's original members);
        else the bootstrap membership."""
        hs = self.glog.hard_state()
        meta = self.glog.snapshot_meta()
        if meta is not None:
            membership = decode_membership(meta.config)
        elif self._has_config_entry(hs.commit):
            membership = Membership(frozenset(), frozenset())
        else:
            # No committed CONFIG entry: the bootstrap membership is in force
            # (an uncommitted CONFIG entry changes nothing until committed,
            # and a member restarting with one must still be able to vote).
            membership = self.bootstrap
        vote = NodeId(hs.voted_for) if hs.voted_for is not None else None
        return HardState(Term(hs.term), vote, Index(hs.commit)), membership

    def _has_config_entry(self, upto: int) -> bool:
        """Does the log hold a CONFIG entry at or below `upto` (committed)?"""
        lo, last = self.glog.first_index(), min(self.glog.last_index(), upto)
        config = EntryKind.CONFIG.value
        while lo <= last:
            batch = self.glog.entries(lo, last + 1, 16 << 20)
            if any(e.kind == config for e in batch):
                return True
            lo = batch[-1].index + 1
        return False

    def _snap_index(self) -> int:
        meta = self.glog.snapshot_meta()
        return meta.index if meta is not None else 0

    def first_index(self) -> Index:
        snap = self._snap_index()
        return Index(max(snap + 1, self.glog.first_index()))

    def last_index(self) -> Index:
        return Index(self.glog.last_index())

    def term(self, index: Index) -> Term:
        snap = self._snap_index()
        if index < snap:
            raise Compacted(f"index {index} is below the snapshot at {snap}")
        try:
            return Term(self.glog.term(index))
        except st.CompactedError as compacted:
            raise Compacted(str(compacted)) from None
        except st.UnavailableError as unavailable:
            raise Unavailable(str(unavailable)) from None

    def entries(self, lo: Index, hi: Index, max_bytes: int | None) -> list[Entry]:
        snap = self._snap_index()
        if lo <= snap:
            raise Compacted(f"entries from {lo} are below the snapshot at {snap}")
        try:
            return [_raft_entry(e) for e in self.glog.entries(lo, hi, max_bytes)]
        except st.CompactedError as compacted:
            raise Compacted(str(compacted)) from None
        except st.UnavailableError as unavailable:
            raise Unavailable(str(unavailable)) from None

    def snapshot(self) -> Snapshot:
        snap = self.glog.latest_snapshot()
        if snap is None:
            return Snapshot(SnapshotMeta(Index(0), Term(0), self.bootstrap), b"")
        m = snap.meta
        data = self.augment(snap.data, m.index) if self.augment is not None else snap.data
        return Snapshot(SnapshotMeta(Index(m.index), Term(m.term), decode_membership(m.config)), data)


@dataclass(slots=True)
class _PendingWrite:
    seq: int
    last_index: int  # 0: no entries in this Ready
    hs: st.HardState | None


def _hs_covers(durable: st.HardState, hs: st.HardState) -> bool:
    """Is `hs` durable, given the latest durable hard state? Hard states only
    move forward (term up; within a term the vote is fixed and commit grows)."""
    if durable.term != hs.term:
        return durable.term > hs.term
    return durable.voted_for == hs.voted_for and durable.commit >= hs.commit


class ProposalFailed(Exception):
    """The proposal will not be applied: overwritten by another leader's entry,
    or the group stopped."""


class ProposalReplaced(ProposalFailed):
    """A new leader's entry took the proposal's place: it was never applied,
    so proposing it again (to the new leader) is safe."""


class ProposalUnknown(ProposalFailed):
    """The proposal's fate cannot be known here (a snapshot was installed
    over its index, or this member was closed while it was pending): it may
    or may not be applied. Re-sending is safe only for commands the machine
    de-duplicates or that are idempotent (enqueues, settles, channel down)."""


class RaftGroup:
    """One member of one Raft group on this node."""

    def __init__(
        self,
        group_id: str,
        node_id: str,
        glog: st.GroupLog,
        members: Membership,
        machine: Machine,
        send: Callable[[str, Message], None],
        *,
        raft_config: RaftConfig | None = None,
        rng: random.Random | None = None,
        on_role_change: Callable[[Role, NodeId | None], None] | None = None,
        clock_ms: Callable[[], int] | None = None,
        snapshot_interval: int = 20_000,
        snapshot_idle_s: float | None = None,
        snapshot_bytes: int = SNAPSHOT_BYTES,
    ) -> None:
        self.group_id = group_id
        self.node_id = NodeId(node_id)
        self.glog = glog
        self.machine = machine
        self._send = send
        self._on_role_change = on_role_change
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        cfg = raft_config or RaftConfig()
        if cfg.group != group_id:
            cfg = replace(cfg, group=group_id)
        # The machine starts from this log's snapshot, if any; Raft replays
        # the committed entries after it.
        applied = 0
        snap = glog.latest_snapshot()
        if snap is not None:
            machine.restore(snap.data, False)
            applied = snap.meta.index
        self.storage = GroupLogStorage(glog, members, machine.snapshot_for_follower)
        self.node = RaftNode(node_id, self.storage, cfg, rng or random.Random(), applied=applied)
        self._loop = asyncio.get_running_loop()
        self._scheduled = False
        self._pending_writes: deque[_PendingWrite] = deque()
        # (index -> (term, future)): resolved when that index is applied.
        self._waiters: dict[int, tuple[int, asyncio.Future[Any]]] = {}
        # index -> (term, timestamp, payload) of this leader's own hot-path proposals
        self._proposed: dict[int, tuple[int, int, Any]] = {}
        self.stopped: BaseException | None = None
        self.shutting_down = False  # set by the node when it stops
        self.role = Role.FOLLOWER
        self.leader: NodeId | None = None
        self.applied_index = applied
        self.last_applied_ms = 0
        # Quiescence (runtime/quiesce.py): a quiet group is not ticked; any
        # input (`_kick`) wakes it.
        self.quiesced = False
        self._quiet_streak = 0  # consecutive quiet checks (leader)
        self._notice: tuple[str, int, int] | None = None  # the leader's Quiesce
        self._notice_ticks = 0
        # Snapshot cadence (the group's, for every machine): NORMAL entries
        # applied since the last snapshot taken (or tried), and their bytes;
        # the idle timer.
        self.snapshot_interval = snapshot_interval
        self.snapshot_idle_s = snapshot_idle_s
        self.snapshot_bytes = snapshot_bytes
        self.applied_since_snapshot = 0
        self.applied_bytes_since_snapshot = 0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_applied_at = 0.0
        self.closed = False  # the member is closing: no more snapshots

    # ------------------------------------------------------------ inputs
    def tick(self) -> None:
        if self.stopped is not None or self.quiesced:
            return
        notice = self._notice
        if notice is not None:
            if self.node.quiet_follower(*notice):
                self._notice = None
                self.quiesced = True
                return
            self._notice_ticks -= 1
            if self._notice_ticks <= 0:
                self._notice = None
        self.node.tick()
        self._schedule()

    def quiet_check(self, unreachable: Collection[str]) -> tuple[list[str], int, int] | None:
        """On a leader: quiesce once `RaftNode.quiet` held at two checks in a
        row; returns the followers to tell (`Quiesce`), the term and the
        commit index, else None."""
        if self.quiesced or self.stopped is not None or self.role is not Role.LEADER \
                or not self.node.quiet(unreachable):
            self._quiet_streak = 0
            return None
        self._quiet_streak += 1
        if self._quiet_streak < 2:
            return None
        self._quiet_streak = 0
        self.quiesced = True
        me = self.node_id
        node = self.node
        tell = [str(n) for n in node.progress if n != me and n not in unreachable]
        return tell, node.term, node.log.committed

    def still_quiet(self, unreachable: Collection[str]) -> bool:
        """On a quiet leader: may it stay quiet now that `unreachable` changed?
        Not once it no longer reaches a quorum (`RaftNode.quiet`): it must
        tick again, so that check-quorum steps it down."""
        return self.stopped is not None or self.node.quiet(unreachable)

    @property
    def leads_quietly(self) -> bool:
        """A quiet leader that still serves (not stopped by a storage error):
        what the node's `StillQuiet` keepalive lists (runtime/quiesce.py)."""
        return self.quiesced and self.stopped is None and self.role is Role.LEADER

    def members(self) -> list[str]:
        """The nodes this leader replicates to (itself included); [] elsewhere."""
        return [str(n) for n in self.node.progress]

    def note_quiet(self, leader: str, term: int, commit: int) -> None:
        """The leader's `Quiesce`: this follower goes quiet at its next tick if
        it is then settled at `commit` under that leader and term (its last
        writes may still be on their way to disk: it waits up to 10 ticks)."""
        if self.stopped is None and not self.quiesced and self.role is not Role.LEADER:
            self._notice = (leader, term, commit)
            self._notice_ticks = 10

    def wake(self) -> None:
        """Tick again (the leader's node is suspected down, a peer came back)."""
        self.quiesced = False
        self._notice = None

    def step(self, msg: Message) -> None:
        if self.stopped is None:
            node = self.node
            node.step(msg)
            if self.quiesced and type(msg) in _ECHOES and msg.term == node.term \
                    and not node.has_ready():
                return  # a late answer to the last heartbeat: changes nothing
            self._kick()

    def campaign(self) -> None:
        """Start an election now; nothing on a member that cannot campaign
        (a learner, or a member whose log removed it: the callers, a lost
        leader's connection or a new group's first leader, do not check)."""
        if not self.node.promotable:
            return
        self.node.campaign()
        self._kick()

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def propose(self, payload: Any, plain: bool = False) -> asyncio.Future[Any]:
        """Propose a command; the future gets the machine's reply once applied.
        Raises NotLeader(leader) at once on a follower. `plain`: the payload
        is made of msgpack scalars only, so this leader may apply it without
        decoding it again (it applies exactly what followers decode)."""
        if self.stopped is not None:
            raise ProposalFailed(f"group {self.group_id} stopped: {self.stopped}")
        ts = self._clock_ms()
        data = packb([ts, payload])
        index = self.node.propose(data)
        fut: asyncio.Future[Any] = self._loop.create_future()
        term = self.node.term
        self._add_waiter(index, term, fut)
        if plain:  # hot path: no decode of the leader's own proposal
            self._proposed[index] = (term, ts, payload)
        self._kick()
        return fut

    def propose_conf(self, cc: Any) -> asyncio.Future[Any]:
        """Propose a membership change; the future resolves once it is applied.
        Raises ProposalFailed on a stopped or closed member (its waiters
        would never be resolved)."""
        self._check_open()
        index = self.node.propose_conf_change(cc)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._add_waiter(index, self.node.term, fut)
        self._kick()
        return fut

    def _check_open(self) -> None:
        if self.stopped is not None:
            raise ProposalFailed(f"group {self.group_id} stopped: {self.stopped}")
        if self.closed:
            raise ProposalFailed(f"group {self.group_id} is closed")

    def _add_waiter(self, index: int, term: int, fut: asyncio.Future[Any]) -> None:
        """Invariant: every waiter ends, resolved by the entry it proposed
        (same index and term) or failed. A waiter of an earlier term at the
        same index lost its entry to a truncation: it fails now."""
        old = self._waiters.get(index)
        if old is not None and not old[1].done():
            old[1].set_exception(ProposalReplaced(
                f"entry {index} of term {old[0]} was replaced by a new leader's entry"))
        self._waiters[index] = (term, fut)

    def propose_indexed(self, payload: Any) -> tuple[int, asyncio.Future[Any]]:
        """Like propose, also returning the entry's index."""
        fut = self.propose(payload)
        return self.node.log.last_index(), fut

    def propose_nowait(self, payload: Any) -> int:
        """Propose without waiting for the reply (the effects carry the result)."""
        self._check_open()
        data = packb([self._clock_ms(), payload])
        index = self.node.propose(data)
        self._kick()
        return index

    # ------------------------------------------------------------ the Ready loop
    def _kick(self) -> None:
        """An input other than a tick: wakes a quiet group, then schedules
        the Ready loop."""
        self.quiesced = False
        self._notice = None
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._process)

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._process)

    def process_now(self) -> None:
        """Handle what is ready at once, not on the next loop pass: a group
        started in place of one that served (runtime/metastore.py) replays
        its log's committed entries before anything reads its machine."""
        self._process()

    def _process(self) -> None:
        self._scheduled = False
        if self.shutting_down:
            return  # the node is stopping: storage and peers are going away
        node = self.node
        try:
            while self.stopped is None and node.has_ready():
                self._handle_ready(node.ready())
        except st.StorageError as failed:
            self._stop(failed)
        except Exception as exc:  # noqa: BLE001 - a broken invariant stops this group only
            # A Ready half handled cannot be resumed: the group stops, loudly,
            # fails its waiters (nothing more is confirmed through it) and
            # reports the reason (status, metrics, health check).
            log.exception("group %s: stopped by an unexpected error", self.group_id)
            self._stop(exc)

    def _handle_ready(self, rd: Ready) -> None:
        if rd.soft_state is not None:
            self.role = rd.soft_state.role
            self.leader = rd.soft_state.leader
            if self._on_role_change is not None:
                self._on_role_change(self.role, self.leader)
        send = self._send
        for m in rd.messages:
            send(m.dst, m)
        persist_now = False
        if rd.must_persist:
            glog = self.glog
            hs = None
            if rd.snapshot is not None:  # synchronous: save_snapshot fsyncs
                sm = rd.snapshot.meta
                glog.save_snapshot(sm.index, sm.term, encode_membership(sm.config), rd.snapshot.data)
            if rd.entries:
                # a raft Entry has the fields storage needs (stored as it is)
                glog.append(rd.entries)  # type: ignore[arg-type]
                if self._waiters and self.role is not Role.LEADER:
                    self._overwritten(rd.entries)
            if rd.hard_state is not None:
                h = rd.hard_state
                hs = st.HardState(h.term, h.vote, h.commit)
                glog.set_hard_state(hs)
            last = rd.entries[-1].index if rd.entries else 0
            if last or hs is not None:
                self._pending_writes.append(_PendingWrite(rd.seq, last, hs))
            elif not self._pending_writes:
                persist_now = True  # snapshot only, nothing earlier outstanding
            else:
                self._pending_writes.append(_PendingWrite(rd.seq, 0, None))
        for m in rd.persisted_messages:
            send(m.dst, m)
        if rd.snapshot is not None:
            self.machine.restore(rd.snapshot.data, True)
            self.applied_index = rd.snapshot.meta.index
            self._snapshot_over_waiters(rd.snapshot.meta.index)
        for e in rd.committed_entries:
            self._apply_entry(e)
        self.node.advance(rd)
        if persist_now:
            self.node.persisted(rd.seq)

    def _apply_entry(self, e: Entry) -> None:
        waiter = self._waiters.pop(e.index, None)
        reply: Any = None
        if e.kind is EntryKind.NORMAL:
            mine = self._proposed.pop(e.index, None) if self._proposed else None
            if mine is not None and mine[0] == e.term:
                ts, payload = mine[1], mine[2]
            else:
                ts, payload = msgpack.unpackb(e.data, raw=False, strict_map_key=False)
            self.last_applied_ms = ts
            machine = self.machine
            try:
                reply = machine.apply(e.index, e.term, ts, payload)
            except BaseException as exc:
                if waiter is not None and not waiter[1].done():
                    waiter[1].set_exception(ProposalFailed(
                        f"group {self.group_id} stopped applying entry {e.index}: {exc}"))
                raise
            n = self.applied_since_snapshot + 1
            self.applied_since_snapshot = n
            nbytes = self.applied_bytes_since_snapshot + len(e.data)
            self.applied_bytes_since_snapshot = nbytes
            try:
                cursor = machine.release_cursor()
                if (cursor is not None and (cursor is Cursor.NOW or n >= self.snapshot_interval)
                        or nbytes >= self.snapshot_bytes):
                    self._take_snapshot(e.index)
            except Exception:  # noqa: BLE001 - a snapshot is optional; the entry is applied
                # (and its waiter, popped above, must still get its reply)
                log.exception("group %s: snapshot at %d failed; skipped", self.group_id, e.index)
            if self.snapshot_idle_s is not None:
                self._last_applied_at = self._loop.time()
                if self._idle_timer is None:
                    self._arm_idle()
        self.applied_index = e.index
        if waiter is not None:
            term, fut = waiter
            if fut.done():
                return
            if term == e.term:
                fut.set_result(reply)
            else:
                fut.set_exception(ProposalReplaced(f"entry {e.index} was replaced by a new leader"))

    # ------------------------------------------------------------ snapshots
    def _take_snapshot(self, index: int) -> None:
        """Serialise the machine's state now (it is the state as of `index`,
        the entry just applied) and write it once Raft recorded the entry as
        applied (after this Ready), which is also when it is known durable
        here."""
        self.applied_since_snapshot = 0
        self.applied_bytes_since_snapshot = 0
        snap = self.machine.snapshot(index)
        self._loop.call_soon(self._write_snapshot, index, snap)

    def _write_snapshot(self, index: int, snap: MachineSnapshot) -> None:
        """Write the snapshot, then compact the core's history, release the
        segments below `snap.release` and compact the log to `snap.keep`.
        Skipping one is always safe (the log still holds everything after
        the previous snapshot)."""
        node = self.node
        if self.closed or self.stopped is not None:
            return
        if index > node.max_snapshot_index():
            # Not durable here yet: the idle check retries, else the next cursor.
            self.applied_since_snapshot = max(
                self.applied_since_snapshot, 1 if self.snapshot_idle_s is not None else self.snapshot_interval)
            self._arm_idle()
            return
        current = self.glog.snapshot_meta()
        if current is not None and current.index >= index:
            return
        meta = node.snapshot_meta(index)
        try:
            self.glog.save_snapshot(meta.index, meta.term, encode_membership(meta.config), snap.data)
            node.compacted()
            self.glog.release(snap.release)
        except (st.StorageError, OSError) as exc:
            # written atomically or not at all; the group goes on from its log
            # (a failing WAL stops it through on_storage_error)
            log.error("group %s: snapshot at %d not written: %s", self.group_id, index, exc)
            return
        if snap.keep is not None:
            # segments below the snapshot holding few live entries are rewritten
            # (docs/STORAGE.md "Compaction"); optional: a failure only logs
            try:
                self.glog.compact(snap.keep)
            except (st.StorageError, OSError) as exc:
                log.warning("group %s: log compaction failed: %s", self.group_id, exc)

    def _arm_idle(self) -> None:
        if self._idle_timer is None and self.snapshot_idle_s is not None and not self.closed:
            self._idle_timer = self._loop.call_later(self.snapshot_idle_s, self._idle_check)

    def _idle_check(self) -> None:
        """Snapshot (release, compact) a member that applied entries since its
        last snapshot and then nothing for `snapshot_idle_s`."""
        self._idle_timer = None
        idle_s = self.snapshot_idle_s
        if self.closed or idle_s is None or self.stopped is not None or self.applied_since_snapshot == 0:
            return
        wait = self._last_applied_at + idle_s - self._loop.time()
        if wait > 0:
            self._idle_timer = self._loop.call_later(wait, self._idle_check)
            return
        index = self.applied_index
        if index > self.node.max_snapshot_index():  # not yet durable here
            self._arm_idle()
            return
        self._take_snapshot(index)

    # ------------------------------------------------------------ durability
    def on_durable(self) -> None:
        """Called on the loop after the WAL writer made some of our writes durable."""
        if self.stopped is not None or not self._pending_writes:
            return
        d_idx = self.glog.durable_index()
        d_hs = self.glog.durable_hard_state()
        pending = self._pending_writes
        best = -1
        # WAL writes are FIFO: once a later write is durable, all earlier are.
        # Entries (0, None) wrote nothing to the WAL and are no evidence.
        for k in range(len(pending) - 1, -1, -1):
            pw = pending[k]
            if pw.last_index == 0 and pw.hs is None:
                continue
            if (pw.last_index <= d_idx) and (pw.hs is None or _hs_covers(d_hs, pw.hs)):
                best = k
                break
        if best < 0:
            return
        # Following entries that wrote nothing are durable as soon as these are.
        while best + 1 < len(pending) and pending[best + 1].last_index == 0 and pending[best + 1].hs is None:
            best += 1
        seq = pending[best].seq
        for _ in range(best + 1):
            pending.popleft()
        self.node.persisted(seq)
        self._kick()

    def _overwritten(self, entries: Sequence[Entry]) -> None:
        """A leader's entries replaced this node's log from entries[0].index:
        a proposal waiting at an index now holding another term's entry, or
        beyond the new end of the log, was truncated away: never applied."""
        first, last = entries[0].index, entries[-1].index
        terms: dict[int, int] = {e.index: e.term for e in entries}
        for i in [i for i in self._waiters if i >= first]:
            term, fut = self._waiters[i]
            if i > last or terms.get(i) != term:
                del self._waiters[i]
                self._proposed.pop(i, None)
                if not fut.done():
                    fut.set_exception(ProposalReplaced(
                        f"entry {i} of term {term} was truncated by a new leader"))

    def _snapshot_over_waiters(self, index: int) -> None:
        """A snapshot installed at `index` replaces the entries up to it: a
        proposal waiting there will never be applied one by one, and whether
        the snapshot includes it is unknown."""
        for i in [i for i in self._waiters if i <= index]:
            term, fut = self._waiters.pop(i)
            self._proposed.pop(i, None)
            if not fut.done():
                fut.set_exception(ProposalUnknown(
                    f"a snapshot at {index} was installed over entry {i} (term {term})"))

    def on_storage_error(self, exc: BaseException) -> None:
        log.error("group %s: storage error: %s", self.group_id, exc)
        self._stop(exc)

    def _stop(self, exc: BaseException) -> None:
        """A broken invariant or a storage failure stops this group, not the node."""
        if self.stopped is None:
            self.stopped = exc
            # A stopped member leads nothing: its node routes the queue's
            # commands to whoever the others elect (and stops what it ran
            # as leader: timers, the dead-letter worker).
            was_leader = self.role is Role.LEADER
            self.role = Role.FOLLOWER
            self.leader = None
            if was_leader and self._on_role_change is not None:
                try:
                    self._on_role_change(self.role, None)
                except Exception:  # noqa: BLE001 - stopping anyway
                    log.exception("group %s: role change on stop failed", self.group_id)
            for _term, fut in self._waiters.values():
                if not fut.done():
                    fut.set_exception(ProposalFailed(f"group {self.group_id} stopped: {exc}"))
            self._waiters.clear()

    def close(self, reason: str) -> None:
        """This member is closing (queue deleted, member removed or replaced,
        node stopping): no more snapshots (its log may be deleted next), and
        its pending proposals fail (`fail_waiters`)."""
        self.closed = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.fail_waiters(reason)

    def fail_waiters(self, reason: str) -> None:
        """This member is closing (queue deleted or member removed/replaced):
        its pending proposals may still be committed by the other members."""
        for _term, fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(ProposalUnknown(reason))
        self._waiters.clear()
        self._proposed.clear()


__all__ = ["GroupLogStorage", "NotLeader", "ProposalFailed", "ProposalReplaced", "ProposalUnknown", "RaftGroup", "decode_membership",
           "encode_membership"]
