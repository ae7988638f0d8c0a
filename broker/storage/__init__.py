"""Node storage: shared WAL, per-group segments, snapshots. The only package touching files.

Pipeline position: below the Raft driver (broker/runtime). The runtime turns
each group's Raft `Ready` into `GroupLog.append(entries)` and
`GroupLog.set_hard_state(hs)`, and sends the messages that must wait for
persistence only once `on_durable` says the entries/hard state are on disk.

API (see docs/STORAGE.md for formats and directory layout):

    mgr = LogManager.open(data_dir, StorageConfig(...), on_durable=cb, on_error=ecb)
    log = mgr.open_group("%2F/orders")          # recovers that group
    log.append([Entry(index, term, data, kind)])  # non-blocking; overwrite if index <= last
    log.set_hard_state(HardState(term, voted_for, commit))
    log.entries(lo, hi, max_bytes=None)   # [lo, hi)
    log.term(i); log.first_index(); log.last_index(); log.durable_index()
    log.last_entry_index()    # < last_index() right after a snapshot install
    log.hard_state(); log.durable_hard_state()
    log.save_snapshot(index, term, config, data)  # blocking, durable
    log.latest_snapshot(); log.snapshot_meta()
    log.release(smallest_live_index)   # delete segments below min(live, snapshot+1)
    log.close(); mgr.sync(); mgr.wait_flushed(); mgr.close()
    mgr.delete_group(group_id); mgr.group_ids()
    scan_node(data_dir)       # offline, read-only: segments/live ranges/snapshots per group

Threads: appends and set_hard_state only queue work; one WAL writer thread
per node writes everything queued with one pwrite + one fdatasync (group
commit; the batch is whatever queued during the previous fsync, capped by
max_batch_bytes/max_batch_records) and then calls
`on_durable(group_id, durable_index, term_of_that_index)` once per group in
the batch (hard-state-only batches too). `on_error(group_id, exc)` reports a
failed write (StorageIOError): the group's non-durable entries and hard state
are dropped, it must re-append from durable_index() + 1. Both callbacks run
on the writer thread: wrap them with loop.call_soon_threadsafe. A segment
writer thread flushes rolled-over WAL files into segment files.
"""
from .codec import decode_group_dir, encode_group_dir
from .errors import (
    CompactedError,
    CorruptionError,
    CorruptSegmentError,
    CorruptSnapshotError,
    CorruptWalError,
    GroupAlreadyOpenError,
    GroupClosedError,
    GroupFailedError,
    InvalidEntriesError,
    InvalidGroupIdError,
    InvariantError,
    LogGapError,
    StorageConfigError,
    StorageError,
    StorageIOError,
    UnavailableError,
)
from .group import accept_entry_type
from .inspection import GroupInfo, SegmentInfo, read_segment_info, scan_group, scan_node
from .manager import GroupLog, LogManager, OnDurable, OnError, RandomSource
from .types import (
    SEGMENT_MAX_ENTRIES_LIMIT,
    Entry,
    GroupId,
    HardState,
    Index,
    Snapshot,
    SnapshotMeta,
    StorageConfig,
    SyncMethod,
    Term,
)

__all__ = [
    "SEGMENT_MAX_ENTRIES_LIMIT",
    "accept_entry_type",
    "CompactedError",
    "CorruptSegmentError",
    "CorruptSnapshotError",
    "CorruptWalError",
    "CorruptionError",
    "Entry",
    "GroupAlreadyOpenError",
    "GroupClosedError",
    "GroupFailedError",
    "GroupId",
    "GroupInfo",
    "GroupLog",
    "HardState",
    "Index",
    "InvalidEntriesError",
    "InvalidGroupIdError",
    "InvariantError",
    "LogGapError",
    "LogManager",
    "OnDurable",
    "OnError",
    "RandomSource",
    "SegmentInfo",
    "Snapshot",
    "SnapshotMeta",
    "StorageConfig",
    "StorageConfigError",
    "StorageError",
    "StorageIOError",
    "SyncMethod",
    "Term",
    "UnavailableError",
    "decode_group_dir",
    "encode_group_dir",
    "read_segment_info",
    "scan_group",
    "scan_node",
]
