"""Value types of broker/storage: entries, hard state, snapshots, config.

These are the data crossing the GroupLog API; the Raft layer converts its own
Entry/HardState to and from these in a thin adapter (storage never imports
broker.raft).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NewType

from .errors import StorageConfigError

GroupId = NewType("GroupId", str)
Index = NewType("Index", int)
Term = NewType("Term", int)

SyncMethod = Literal["fdatasync", "fsync", "none"]

MIB = 1024 * 1024
#: Hard format limit: the segment header stores max entries as a u16.
SEGMENT_MAX_ENTRIES_LIMIT = 65535
#: Largest entry payload a record can carry (length is a u32 in both formats).
MAX_ENTRY_BYTES = 0xFFFF_FFFF - 1


@dataclass(frozen=True, slots=True)
class Entry:
    """One Raft log entry. `kind` is the Raft layer's entry kind (NORMAL,
    CONFIG, NOOP...) stored as an opaque u8; `data` is opaque bytes."""

    index: int
    term: int
    data: bytes
    kind: int = 0


@dataclass(frozen=True, slots=True)
class HardState:
    """Raft's persistent per-group state. Written through the same WAL batch
    (and fdatasync) as entries."""

    term: int = 0
    voted_for: str | None = None
    commit: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Where a snapshot sits in the log; `config` is the Raft membership blob."""

    index: int
    term: int
    config: bytes


@dataclass(frozen=True, slots=True)
class Snapshot:
    meta: SnapshotMeta
    data: bytes


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """Per-node storage settings (names follow RabbitMQ's `raft.*` keys).

    Invariant (checked here): 1 <= segment_max_entries <= 65535, because the
    segment header stores it as a u16.
    """

    #: Roll the WAL over (flush to segments, delete it) once it passes this size.
    wal_max_size_bytes: int = 512 * MIB
    #: Maximum entries per segment file (raft.segment_max_entries).
    segment_max_entries: int = 4096
    #: Group commit caps: one write + one fdatasync takes at most this much.
    max_batch_bytes: int = 32 * MIB
    max_batch_records: int = 65536
    #: "fdatasync" (default), "fsync", or "none" (NOT durable; benchmarks only).
    sync_method: SyncMethod = "fdatasync"
    #: How many segment files (open fd + parsed index) the node keeps cached.
    segment_cache_size: int = 64
    #: The first WAL after a start rolls over at a random size in
    #: [max/2, max], so nodes sharing a disk do not all flush at once (as Ra).
    stagger_first_roll_over: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.segment_max_entries, int) or isinstance(
            self.segment_max_entries, bool
        ):
            raise StorageConfigError("raft.segment_max_entries must be an integer")
        if not 1 <= self.segment_max_entries <= SEGMENT_MAX_ENTRIES_LIMIT:
            raise StorageConfigError(
                f"raft.segment_max_entries must be between 1 and {SEGMENT_MAX_ENTRIES_LIMIT} "
                f"(the segment header stores it as a u16), got {self.segment_max_entries}"
            )
        if self.wal_max_size_bytes < 1:
            raise StorageConfigError(
                f"raft.wal_max_size_bytes must be positive, got {self.wal_max_size_bytes}"
            )
        if self.max_batch_bytes < 1 or self.max_batch_records < 1:
            raise StorageConfigError("max_batch_bytes and max_batch_records must be positive")
        if self.sync_method not in ("fdatasync", "fsync", "none"):
            raise StorageConfigError(
                f"sync_method must be 'fdatasync', 'fsync' or 'none', got {self.sync_method!r}"
            )
        if self.segment_cache_size < 1:
            raise StorageConfigError("segment_cache_size must be >= 1")
