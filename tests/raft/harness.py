"""In-memory cluster harness shared by the unit tests, the transcript
interpreter and the deterministic simulator.

A `Host` plays the role broker/runtime will play for real: it drains Ready,
writes to its (durable) MemoryStorage either at once or after a delay
(asynchronous durability: `persist_delay`), applies committed entries to a
toy state machine (the list of applied commands), takes snapshots, and can
crash (losing every write not yet persisted) and restart from storage.

The `Checker` verifies Raft's safety properties as Readies flow by.
"""
from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from broker.raft import (
    Entry,
    EntryKind,
    InstallSnapshot,
    InvariantViolation,
    MemoryStorage,
    Message,
    NodeId,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    Snapshot,
    decode_conf_entry,
)


class SafetyViolation(AssertionError):
    pass


def encode_sm(applied: list[tuple[int, bytes]]) -> bytes:
    return b"\n".join(b"%d:%s" % (i, d.hex().encode()) for i, d in applied)


def decode_sm(data: bytes) -> list[tuple[int, bytes]]:
    if not data:
        return []
    out = []
    for line in data.split(b"\n"):
        i, h = line.split(b":", 1)
        out.append((int(i), bytes.fromhex(h.decode())))
    return out


@dataclass
class Checker:
    """Global safety bookkeeping across all nodes of one cluster run."""

    leaders: dict[int, str] = field(default_factory=dict)  # term -> leader
    entries: dict[tuple[int, int], tuple[int, bytes, int | None]] = field(default_factory=dict)
    committed: dict[int, tuple[int, bytes]] = field(default_factory=dict)  # index -> (term, data)
    applied: dict[int, bytes] = field(default_factory=dict)  # index -> data (NORMAL only)
    max_committed: int = 0

    def on_leader(self, host: Host) -> None:
        n = host.node
        prev = self.leaders.get(n.term)
        if prev is not None and prev != host.id:
            raise SafetyViolation(f"two leaders in term {n.term}: {prev} and {host.id}")
        self.leaders[n.term] = host.id
        # Leader completeness (§5.4): every committed entry is in the new leader's log.
        first = n.log.first_index()
        if self.max_committed > n.log.last_index():
            raise SafetyViolation(
                f"leader {host.id} (term {n.term}) lacks committed entries: "
                f"last {n.log.last_index()} < committed {self.max_committed}"
            )
        for i, (t, _d) in self.committed.items():
            if i >= first and n.log.term(i) != t:
                raise SafetyViolation(
                    f"leader {host.id} term {n.term} has term {n.log.term(i)} at committed {i} (want {t})"
                )

    def on_entries(self, host: Host, ents: list[Entry]) -> None:
        if not ents:
            return
        try:
            prev_t: int | None = host.node.log.term(ents[0].index - 1)
        except Exception:
            prev_t = None
        for e in ents:
            key = (e.index, e.term)
            val = (int(e.kind), e.data, prev_t)
            old = self.entries.get(key)
            if old is None:
                self.entries[key] = val
            else:
                if old[0] != val[0] or old[1] != val[1]:
                    raise SafetyViolation(f"log matching: {key} differs on {host.id}: {old} vs {val}")
                if old[2] is not None and prev_t is not None and old[2] != prev_t:
                    raise SafetyViolation(f"log matching: prev term of {key} differs on {host.id}")
                if old[2] is None and prev_t is not None:
                    self.entries[key] = (old[0], old[1], prev_t)
            prev_t = e.term

    def on_commit(self, host: Host, old: int, new: int) -> None:
        log = host.node.log
        lo = max(old + 1, log.first_index())
        for i in range(lo, new + 1):
            t = log.term(i)
            e = log.slice(i, i + 1, None)[0]
            prev = self.committed.get(i)
            if prev is None:
                self.committed[i] = (t, e.data)
            elif prev != (t, e.data):
                raise SafetyViolation(f"committed entry {i} differs on {host.id}: {prev} vs {(t, e.data)}")
        if new > self.max_committed:
            self.max_committed = new

    def on_apply(self, host: Host, index: int, data: bytes) -> None:
        prev = self.applied.get(index)
        if prev is None:
            self.applied[index] = data
        elif prev != data:
            raise SafetyViolation(f"state machine safety: {host.id} applied {data!r} at {index}, others {prev!r}")
        c = self.committed.get(index)
        if c is not None and c[1] != data:
            raise SafetyViolation(f"{host.id} applied {data!r} at {index} but committed was {c[1]!r}")


class Host:
    """One simulated broker node hosting one RaftNode."""

    def __init__(
        self,
        nid: str,
        storage: MemoryStorage,
        cfg: RaftConfig,
        rng: random.Random,
        checker: Checker | None = None,
        persist_delay: Callable[[], int] | None = None,
        compact_every: int = 0,
    ) -> None:
        self.id = NodeId(nid)
        self.storage = storage
        self.cfg = cfg
        self.rng = rng
        self.checker = checker
        self.persist_delay = persist_delay
        self.compact_every = compact_every
        self.alive = True
        self.removed = False
        self.outbox: list[Message] = []
        self.events: list[str] = []  # soft-state changes, for transcripts
        self._boot()

    def _boot(self) -> None:
        snap = self.storage.snapshot()
        self.sm: list[tuple[int, bytes]] = decode_sm(snap.data)
        self.sm_index = snap.meta.index
        self.node = RaftNode(self.id, self.storage, self.cfg, self.rng, applied=snap.meta.index)
        self.pending: deque[tuple[int, Ready]] = deque()
        # The durable commit, not the node's: a node may raise its commit at
        # start (every CONFIG entry but the last is committed), and the
        # checker is to see that range committed when its hard state comes.
        self.last_commit = self.storage.hard_state().commit

    def crash(self, torn: tuple[int, bool] | None = None) -> None:
        """Lose everything volatile: the node, unpersisted writes, the state machine.

        `torn=(k, entries)`: the disk kept a prefix of the unpersisted writes,
        as a log that is cut at a torn tail does: the first `k` pending Readies
        whole, then (with `entries`) the next one's snapshot and entries but
        not its hard state (written after them). Nothing of it was reported
        durable, so no message promised it."""
        if torn is not None:
            k, with_entries = torn
            for _, rd in list(self.pending)[:k]:
                self._write(rd)
            if with_entries and len(self.pending) > k:
                self._write(self.pending[k][1], hard_state=False)
        self.alive = False
        self.pending.clear()
        self.outbox.clear()

    def restart(self) -> None:
        self.alive = True
        self._boot()

    def _write(self, rd: Ready, hard_state: bool = True) -> None:
        if rd.snapshot is not None:
            self.storage.apply_snapshot(rd.snapshot)
        if rd.entries:
            self.storage.append(rd.entries)
        if hard_state and rd.hard_state is not None:
            self.storage.set_hard_state(rd.hard_state)

    def flush_writes(self, now: int) -> None:
        """Complete the delayed writes that are due (in order)."""
        while self.pending and self.pending[0][0] <= now:
            _, rd = self.pending.popleft()
            self._write(rd)
            self.node.persisted(rd.seq)

    def process(self, now: int = 0) -> None:
        """Drain every Ready the node has."""
        n = self.node
        while n.has_ready():
            rd = n.ready()
            ck = self.checker
            if rd.soft_state is not None:
                self.events.append(f"{self.id} is {rd.soft_state.role.value} term {n.term} leader {rd.soft_state.leader}")
                if rd.soft_state.role is Role.LEADER and ck is not None:
                    ck.on_leader(self)
            if ck is not None:
                ck.on_entries(self, list(rd.entries))
                if rd.hard_state is not None and rd.hard_state.commit > self.last_commit:
                    ck.on_commit(self, self.last_commit, rd.hard_state.commit)
            if rd.hard_state is not None:
                self.last_commit = max(self.last_commit, rd.hard_state.commit)
            self.outbox.extend(rd.messages)
            if rd.snapshot is not None:
                self._install(rd.snapshot)
            sync = self.persist_delay is None
            if rd.must_persist:
                if sync:
                    self._write(rd)
                else:
                    delay = self.persist_delay() if self.persist_delay else 0
                    due = max(now + delay, self.pending[-1][0] if self.pending else 0)
                    self.pending.append((due, rd))
            # Released messages depend only on already-durable state.
            self.outbox.extend(rd.persisted_messages)
            for e in rd.committed_entries:
                self._apply(e)
            n.advance(rd, persisted=sync and rd.must_persist)
            if not sync and not self.pending and rd.must_persist:
                pass
        if self.compact_every and self.sm_index - self.storage.first_index() >= self.compact_every:
            self.take_snapshot()

    def _install(self, snap: Snapshot) -> None:
        self.sm = decode_sm(snap.data)
        self.sm_index = snap.meta.index
        if self.checker is not None:
            for i, d in self.sm:
                self.checker.on_apply(self, i, d)

    def _apply(self, e: Entry) -> None:
        if e.index != self.sm_index + 1:
            raise SafetyViolation(f"{self.id} applies {e.index} after {self.sm_index}")
        self.sm_index = e.index
        if e.kind is EntryKind.NORMAL:
            self.sm.append((e.index, e.data))
            if self.checker is not None:
                self.checker.on_apply(self, e.index, e.data)
        elif e.kind is EntryKind.CONFIG:
            cc, _ = decode_conf_entry(e.data)
            if cc.node == self.id and cc.kind.value == "remove":
                self.removed = True

    def take_snapshot(self) -> None:
        idx = self.node.max_snapshot_index()
        if idx <= self.storage.snapshot().meta.index or idx != self.sm_index:
            return
        meta = self.node.snapshot_meta(idx)
        self.storage.create_snapshot(meta.index, meta.config, encode_sm(self.sm))
        self.storage.compact(meta.index)
        self.node.compacted()


class Cluster:
    """A set of hosts plus a network. `lossy`/delay settings make it the
    simulator's network; the defaults make it a perfect, ordered network for
    unit tests and transcripts."""

    def __init__(
        self,
        ids: Iterable[str],
        seed: int = 0,
        cfg: RaftConfig | None = None,
        persist_delay: tuple[int, int] | None = None,
        compact_every: int = 0,
        spares: Iterable[str] = (),
        check: bool = True,
    ) -> None:
        self.ids = [str(i) for i in ids]
        self.rng = random.Random(seed)
        self.cfg = cfg or RaftConfig(election_tick=10, heartbeat_tick=1)
        self.checker = Checker() if check else None
        self.now = 0
        self.hosts: dict[str, Host] = {}
        self.isolated: set[str] = set()
        self.groups: list[set[str]] | None = None  # partition groups
        self.drop_rate = 0.0
        self.dup_rate = 0.0
        self.delay: tuple[int, int] = (0, 0)
        self.net: list[tuple[int, int, Message]] = []
        #: when a list: every message stepped into a node, in order (for tests
        #: that watch what a node receives)
        self.tap: list[Message] | None = None
        self._mseq = 0
        self.snapshot_chunks = 0
        pd: Callable[[], int] | None = None
        if persist_delay is not None:
            lo, hi = persist_delay
            prng = random.Random(seed * 7 + 1)

            def pd() -> int:
                return prng.randint(lo, hi)

        for k, nid in enumerate(self.ids):
            self.hosts[nid] = Host(
                nid, MemoryStorage(voters=self.ids), self.cfg, random.Random(seed * 1000 + k),
                self.checker, pd, compact_every,
            )
        for k, nid in enumerate(spares):
            self.hosts[nid] = Host(
                nid, MemoryStorage(), self.cfg, random.Random(seed * 1000 + 500 + k),
                self.checker, pd, compact_every,
            )

    def node(self, nid: str) -> RaftNode:
        return self.hosts[nid].node

    def leader(self) -> Host | None:
        best = None
        for h in self.hosts.values():
            if h.alive and h.node.role is Role.LEADER and (best is None or h.node.term > best.node.term):
                best = h
        return best

    def can_reach(self, a: str, b: str) -> bool:
        if a in self.isolated or b in self.isolated:
            return False
        if self.groups is not None:
            return any(a in g and b in g for g in self.groups)
        return True

    def process(self) -> None:
        for h in self.hosts.values():
            if h.alive:
                h.flush_writes(self.now)
                h.process(self.now)
        self._collect()

    def _collect(self) -> None:
        for h in self.hosts.values():
            if not h.outbox:
                continue
            out, h.outbox = h.outbox, []
            for m in out:
                self.send(m)

    def send(self, m: Message) -> None:
        if type(m) is InstallSnapshot:
            self.snapshot_chunks += 1
        if self.drop_rate and self.rng.random() < self.drop_rate:
            return
        copies = 2 if self.dup_rate and self.rng.random() < self.dup_rate else 1
        for _ in range(copies):
            lo, hi = self.delay
            d = self.rng.randint(lo, hi) if hi else 0
            self._mseq += 1
            heapq.heappush(self.net, (self.now + d, self._mseq, m))

    def deliver_due(self) -> int:
        """Deliver every message due by now; returns how many were stepped."""
        n = 0
        while self.net and self.net[0][0] <= self.now:
            _, _, m = heapq.heappop(self.net)
            dst = self.hosts.get(m.dst)
            if dst is None or not dst.alive or not self.can_reach(m.src, m.dst):
                continue
            if self.tap is not None:
                self.tap.append(m)
            try:
                dst.node.step(m)
            except InvariantViolation as exc:
                raise SafetyViolation(f"{m.dst}: {exc}") from exc
            n += 1
        return n

    def stabilize(self, max_rounds: int = 10_000) -> None:
        """Deliver messages and drain readies until the cluster is quiet
        (with delays zero this is immediate delivery in send order)."""
        for _ in range(max_rounds):
            self.process()
            if not self.net:
                return
            # jump time to the next message if everything is delayed
            self.now = max(self.now, self.net[0][0])
            self.deliver_due()
        raise AssertionError("cluster did not stabilize")

    def tick(self, ids: Iterable[str] | None = None) -> None:
        self.now += 1
        for nid in ids if ids is not None else list(self.hosts):
            h = self.hosts[nid]
            if h.alive:
                h.node.tick()

    def step_sim(self) -> None:
        """One simulator step: tick everyone, deliver what is due, drain."""
        self.tick()
        self.process()
        self.deliver_due()
        self.process()

    def elect(self, nid: str) -> None:
        self.node(nid).campaign()
        self.stabilize()
        assert self.node(nid).role is Role.LEADER, f"{nid} failed to become leader"

    def propose(self, nid: str, data: bytes) -> int:
        idx = self.node(nid).propose(data)
        return idx

    def crash(self, nid: str, torn: tuple[int, bool] | None = None) -> None:
        self.hosts[nid].crash(torn)

    def restart(self, nid: str) -> None:
        self.hosts[nid].restart()

    def flush_all(self) -> None:
        for h in self.hosts.values():
            if h.alive:
                h.flush_writes(1 << 60)
