"""The machine boundary: what a `RaftGroup` drives (Ra's `ra_machine`).

Where it sits: between the Raft group driver (`runtime/raft_group.py`) and a
replicated state machine's runtime adapter (`QuorumQueue` over
`broker.queue`, `MetadataStore` over `broker.metadata`). The group applies
committed entries through `apply`, asks after each one whether the machine
offers a release cursor, and decides itself *when* to snapshot (every
`snapshot_interval` applied entries at a cursor, at once on a `NOW` cursor,
after `snapshot_idle_s` with nothing applied) and does the writing: the
snapshot file, `RaftNode.compacted`, `GroupLog.release`, `GroupLog.compact`.
The machine only says *what* a snapshot holds (`snapshot`), takes one back
(`restore`) and, for a snapshot sent to a follower, what the follower needs
beyond the state (`snapshot_for_follower`: a queue's live bodies below the
snapshot index).

Differences from Ra, and why: `apply` takes the entry's index, term and the
leader's timestamp unpacked (one call per applied entry on the hot path, no
meta object); the release cursor is polled after `apply` instead of returned
as an effect, because the queue adapter interprets its own effects
(deliveries, timers) and only this one concerns the group; and the snapshot
is at the entry just applied, not at the smallest live index, because a
queue's live bodies below it stay in the log (release never deletes a
segment holding one, compaction keeps them).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol


class Cursor(enum.Enum):
    """What a machine's last `apply` offers the group (Ra's `release_cursor`)."""

    #: The state as of the entry just applied may be snapshotted: the group
    #: does so if `snapshot_interval` entries were applied since its last one.
    RELEASE = 1
    #: Snapshot now, whatever the interval (a purge freed most of the log).
    NOW = 2


@dataclass(frozen=True, slots=True)
class MachineSnapshot:
    """A machine's state as of one applied index, serialised when asked.

    Invariant: `release <= index + 1`, and no log entry below `release` holds
    anything the state still needs (for a queue: no live message), so storage
    may delete whole segments below it. `keep`, when given, lists every index
    below the snapshot whose entry the state still needs (a queue's live
    messages): the log may then be compacted to those (docs/STORAGE.md
    "Compaction"); None: do not compact."""

    data: bytes
    release: int
    keep: list[int] | None = None


class Machine(Protocol):
    """A replicated state machine as a `RaftGroup` drives it."""

    def apply(self, index: int, term: int, timestamp_ms: int, command: Any) -> Any:
        """Apply one committed NORMAL entry (in index order, once per entry in
        this process's life); the reply resolves the entry's proposal.
        Raising stops the group (a broken invariant)."""
        ...

    def release_cursor(self) -> Cursor | None:
        """Polled right after each `apply`: the cursor that apply emitted, if
        any; taken once (the next call answers None until another apply
        emits one)."""
        ...

    def snapshot(self, index: int) -> MachineSnapshot:
        """The state now, which is the state as of `index` (the last entry
        applied), serialised now (the group writes it later, once the entry
        is known applied and durable)."""
        ...

    def restore(self, data: bytes, installed: bool) -> None:
        """Replace the state by a snapshot's `data`: this replica's own at
        start (`installed` False), or the leader's, sent with
        `snapshot_for_follower` and installed over this replica's state."""
        ...

    def snapshot_for_follower(self, data: bytes, index: int) -> bytes:
        """A snapshot's `data` (at `index`) as sent to a follower: the
        machine adds what a replica without this log needs (else `data`)."""
        ...


__all__ = ["Cursor", "Machine", "MachineSnapshot"]
