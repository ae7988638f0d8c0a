"""Quiescence: idle Raft groups stop ticking, and peers are watched instead.

Why: every queue is a Raft group, and a leader heartbeats every tick (100 ms)
to each follower. With 1,000 idle queues on 3 nodes that was a quarter of a
core per node doing nothing; with 10,000 it was more than the machine has.
CockroachDB quiesces idle ranges the same way; Ra relies on a node-level
failure detector (aten) instead of per-group heartbeats.

How (one pass every `PASS_TICKS` ticks, from the node's ticker):

- A leader whose group is quiet (`RaftNode.quiet`: everything committed,
  durable, applied and known to every reachable follower, a quorum among
  them, no membership change or transfer under way) at two passes in a row
  stops ticking and tells its followers (`peer_wire.Quiesce`, sent after its
  last Raft message on the same ordered connection).
- A follower told so stops ticking once it is settled at that commit under
  that leader and term (`RaftNode.quiet_follower`).
- Any input wakes a group (`RaftGroup._kick`: a proposal, a message other
  than a late answer to the last heartbeat, a campaign, a transfer).
- Failure detection moves to the node: every node pings its peers every pass
  (`peer_wire.Ping`); a peer whose connection broke, or that sent nothing for
  `SUSPECT_S`, is *unreachable*. A quiet follower whose leader is
  unreachable wakes (and then elects a new leader after its election
  timeout, pre-vote included, as before); a broken connection also gives up
  the leader's lease at once (`PeerEvents.down`). A leader does not wait for
  unreachable followers to go quiet, and wakes the groups shared with a peer
  that comes back, so it catches that peer up. A quiet leader that no
  longer reaches a quorum of voters wakes too, so that check-quorum steps it
  down (else it would believe it leads for ever: quorum status, metrics,
  and the stale state `PeerEvents.reconnected` redelivers from).
- Keepalive: every `KEEPALIVE_PASSES` passes a node tells each peer which
  groups it still leads quietly with that peer as a member
  (`peer_wire.StillQuiet`, one list per peer, after the pass's `Quiesce`
  notices on the same ordered connection). A quiet follower whose leader's
  list does not name its group wakes: whatever ended that leader's quiet
  rule without a Raft message to this follower (its group stopped on a
  storage error, dropped, or a state this code did not foresee), the
  follower does not sleep on a live, reachable node for ever. A quiet
  follower whose leader is no longer a peer of this node wakes too.

Safety: quiescence only stops ticks, i.e. slows a group's clock. Raft's
safety never depends on timing; a quiet leader cut off from its followers
commits nothing (a proposal wakes it, and check-quorum then steps it down).
Only availability depends on the failure detector: a quiet group whose
leader is lost elects a new one `SUSPECT_S` + an election timeout later
(at once + a timeout when the connection breaks, as after a kill).

May import: the peer messages (`peer_wire`); it is handed the groups and the
cluster.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Protocol

import broker.runtime.peer_wire as pw

log = logging.getLogger("broker.quiesce")

#: passes run every this many Raft ticks (5 x 100 ms)
PASS_TICKS = 5
#: a connected peer silent for this long is suspected down
SUSPECT_S = 2.0
#: the StillQuiet keepalive goes out every this many passes (2 s)
KEEPALIVE_PASSES = 4


class Group(Protocol):
    """What quiescence needs of a Raft group (runtime/raft_group.py)."""

    group_id: str
    quiesced: bool

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader(self) -> str | None: ...

    @property
    def leads_quietly(self) -> bool: ...

    def quiet_check(self, unreachable: Collection[str]) -> tuple[list[str], int, int] | None: ...

    def still_quiet(self, unreachable: Collection[str]) -> bool: ...

    def note_quiet(self, leader: str, term: int, commit: int) -> None: ...

    def wake(self) -> None: ...

    def members(self) -> Collection[str]: ...


class PeerLinks(Protocol):
    """What quiescence needs of the cluster (runtime/cluster.py)."""

    @property
    def peers(self) -> Mapping[str, object]: ...

    def transport_up(self, peer: str) -> bool: ...

    def last_heard(self, peer: str) -> float | None: ...

    def send_to(self, peer: str, msg: pw.PeerMessage) -> None: ...


class Quiescence:
    def __init__(self, cluster: PeerLinks | None, groups: Callable[[], Iterable[Group]],
                 find: Callable[[str], Group | None], skip: Collection[str] = (),
                 clock: Callable[[], float] = time.monotonic, interval_s: float = 0.5,
                 suspect_s: float = SUSPECT_S, keepalive_passes: int = KEEPALIVE_PASSES) -> None:
        """`groups()`: every Raft group of this node; `find(id)`: one of them;
        `skip`: groups never quiesced (the metadata group)."""
        self.cluster = cluster
        self._groups = groups
        self._find = find
        self._skip = frozenset(skip)
        self._clock = clock
        self.interval_s = interval_s
        self.suspect_s = suspect_s
        self._started = clock()
        self._last_pass: float | None = None
        self.unreachable: frozenset[str] = frozenset()
        self.keepalive_passes = keepalive_passes
        self._passes = 0

    def reachable(self, peer: str, now: float) -> bool:
        c = self.cluster
        if c is None:
            return False
        if not c.transport_up(peer):
            return False
        heard = c.last_heard(peer)
        return now - (self._started if heard is None else heard) < self.suspect_s

    def run_pass(self) -> None:
        """One pass: ping, find unreachable peers, wake the followers of an
        unreachable leader and the quiet leaders that no longer reach a
        quorum, quiesce the quiet leaders."""
        now = self._clock()
        c = self.cluster
        late = self._last_pass is not None and now - self._last_pass > 3 * self.interval_s
        self._last_pass = now
        changed = False
        if c is not None:
            ping = pw.Ping()
            for p in c.peers:
                if c.transport_up(p):
                    c.send_to(p, ping)
            if not late:  # our own loop stalled: what we have not read yet is not silence
                unreachable = frozenset(p for p in c.peers if not self.reachable(p, now))
                for p in unreachable - self.unreachable:
                    log.info("peer %s is unreachable: quiet groups it leads wake up", p)
                changed = unreachable != self.unreachable
                self.unreachable = unreachable
        unreachable = self.unreachable
        skip = self._skip
        for g in list(self._groups()):
            if g.group_id in skip:
                continue
            if g.quiesced:
                if g.is_leader:
                    # A quiet leader that lost its quorum wakes, so that
                    # check-quorum steps it down: else it would believe it
                    # leads for ever, and act on it (stale redeliveries).
                    if changed and not g.still_quiet(unreachable):
                        g.wake()
                elif (unreachable and g.leader in unreachable) \
                        or (c is not None and g.leader not in c.peers):
                    g.wake()
            elif g.is_leader:
                went = g.quiet_check(unreachable)
                if went is not None and c is not None:
                    tell, term, commit = went
                    msg = pw.Quiesce(g.group_id, term, commit)
                    peers = c.peers
                    for p in tell:
                        if p in peers:  # a member whose node left: send_to would raise
                            c.send_to(p, msg)
        self._passes += 1
        if c is not None and self._passes % self.keepalive_passes == 0:
            self._keepalive(c)

    def _keepalive(self, c: PeerLinks) -> None:
        """Send each connected peer the groups this node still leads quietly
        with it as a member (an empty list too: it says "none")."""
        by_peer: dict[str, list[str]] = {p: [] for p in c.peers if c.transport_up(p)}
        skip = self._skip
        for g in list(self._groups()):
            if g.leads_quietly and g.group_id not in skip:
                for m in g.members():
                    listed = by_peer.get(m)
                    if listed is not None:
                        listed.append(g.group_id)
        for p, groups in by_peer.items():
            c.send_to(p, pw.StillQuiet(groups))

    def still_quiet_from(self, peer: str, msg: pw.StillQuiet) -> None:
        """`peer`'s keepalive: its quiet followers here that it no longer
        lists wake (it stopped leading them quietly without telling them)."""
        if type(msg.groups) is not list or not all(isinstance(x, str) for x in msg.groups):
            log.warning("dropped a malformed StillQuiet from %s", peer)
            return
        listed = frozenset(msg.groups)
        woken = 0
        for g in list(self._groups()):
            if g.quiesced and g.leader == peer and not g.is_leader and g.group_id not in listed:
                g.wake()
                woken += 1
        if woken:
            log.info("%d quiet group(s) woke: their leader %s no longer leads them quietly", woken, peer)

    def notice(self, peer: str, msg: pw.Quiesce) -> None:
        """`peer` says it went quiet as leader of `msg.group`."""
        if not (isinstance(msg.group, str) and type(msg.term) is int and type(msg.commit) is int):
            log.warning("dropped a malformed Quiesce from %s", peer)
            return
        g = self._find(msg.group)
        if g is not None and msg.group not in self._skip and g.leader == peer:
            g.note_quiet(peer, msg.term, msg.commit)

    def peer_back(self, peer: str) -> None:
        """A peer (re)connected: the quiet groups shared with it wake, so a
        leader catches it up and a follower hears its leader again."""
        for g in list(self._groups()):
            if g.quiesced and (g.leader == peer or (g.is_leader and peer in g.members())):
                g.wake()

    def leader_lost(self, peer: str) -> None:
        """The connection to `peer` broke: the quiet groups it leads wake."""
        for g in list(self._groups()):
            if g.quiesced and g.leader == peer:
                g.wake()

    def counts(self) -> tuple[int, int]:
        """(quiet groups, all groups) of this node."""
        gs = [g for g in self._groups() if g.group_id not in self._skip]
        return sum(1 for g in gs if g.quiesced), len(gs)
