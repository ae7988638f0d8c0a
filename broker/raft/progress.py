"""The leader's per-follower replication state (etcd-raft's tracker.Progress).

Pipeline position: owned by a leading RaftNode; consulted whenever it decides
what to send a follower, updated by the follower's responses.

States:
- PROBE: we do not know where the follower's log matches ours; send one
  append at a time (`probe_sent` pauses until a response or a heartbeat).
- REPLICATE: the follower matches up to `match`; stream appends optimistically
  (next advances on send) up to `max_inflight` un-acked messages.
- SNAPSHOT: the follower needs entries we compacted; we stream a snapshot in
  chunks and send no appends until it is installed.

Invariant: match < next; in REPLICATE every entry of `inflight` is > match.
"""
from __future__ import annotations

import enum
from collections import deque

from broker.raft.types import Snapshot


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Progress:
    __slots__ = (
        "match",
        "next",
        "state",
        "probe_sent",
        "inflight",
        "max_inflight",
        "recent_active",
        "is_learner",
        "snapshot",
        "snap_acked",
        "snap_sent",
        "sent_commit",
        "snap_mark",
    )

    def __init__(self, next_index: int, max_inflight: int, is_learner: bool) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.probe_sent = False
        # Last index of each un-acked append sent in REPLICATE, oldest first.
        self.inflight: deque[int] = deque()
        self.max_inflight = max_inflight
        self.recent_active = True
        self.is_learner = is_learner
        self.snapshot: Snapshot | None = None  # being sent (SNAPSHOT state)
        self.snap_acked = 0  # bytes the follower confirmed
        self.snap_sent = 0  # bytes sent so far
        self.sent_commit = 0  # highest commit index sent in an append
        self.snap_mark = -1  # snap_acked at the previous heartbeat (stall detection)

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT and self.snapshot is not None:
            self.next = max(self.match + 1, self.snapshot.meta.index + 1)
        else:
            self.next = self.match + 1
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight.clear()
        self.snapshot = None

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflight.clear()

    def become_snapshot(self, snap: Snapshot) -> None:
        self.state = ProgressState.SNAPSHOT
        self.inflight.clear()
        self.probe_sent = False
        self.snapshot = snap
        self.snap_acked = 0
        self.snap_sent = 0
        self.snap_mark = -1

    def is_paused(self) -> bool:
        st = self.state
        if st is ProgressState.REPLICATE:
            return len(self.inflight) >= self.max_inflight
        if st is ProgressState.PROBE:
            return self.probe_sent
        return True

    def maybe_update(self, n: int) -> bool:
        """An accepted append up to n. Returns whether match advanced."""
        updated = False
        if self.match < n:
            self.match = n
            updated = True
            self.probe_sent = False
            infl = self.inflight
            while infl and infl[0] <= n:
                infl.popleft()
        if self.next < n + 1:
            self.next = n + 1
        return updated

    def maybe_decrease_to(self, rejected: int, match_hint: int) -> bool:
        """A rejected append at prev index `rejected`; the follower (and our
        own log) suggest probing after `match_hint`. False if stale."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, match_hint + 1), self.match + 1)
        self.probe_sent = False
        return True
