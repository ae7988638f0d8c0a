"""Typed errors of the storage layer (broker/storage).

Whose fault: `ValueError` subclasses are the caller's (bad arguments, bad
config); `StorageIOError` is the disk's (ENOSPC, EIO); `CorruptionError`
means bytes on disk failed their checksum or structure check. A corruption
or a broken invariant stops one Raft group (its `GroupLog` refuses further
calls), never the node.
"""
from __future__ import annotations


class StorageError(Exception):
    """Base class of every error raised by broker.storage."""


class StorageConfigError(StorageError, ValueError):
    """A `StorageConfig` value is out of range (the message names the setting)."""


class InvalidGroupIdError(StorageError, ValueError):
    """A group id cannot be stored (empty, or not valid UTF-8 text)."""


class LogGapError(StorageError, ValueError):
    """append() would leave a hole: first index > last_index + 1 and no snapshot covers it."""


class InvalidEntriesError(StorageError, ValueError):
    """append() got entries that are not consecutive, or with a bad kind/term."""


class CompactedError(StorageError, LookupError):
    """The requested index is below first_index(): its segment was released."""


class UnavailableError(StorageError, LookupError):
    """The requested index is above last_index()."""


class GroupClosedError(StorageError):
    """The GroupLog (or its LogManager) was closed."""


class GroupAlreadyOpenError(StorageError):
    """open_group() was called for a group that is already open."""


class GroupFailedError(StorageError):
    """The group stopped after an earlier corruption or invariant error (see __cause__)."""


class CorruptionError(StorageError):
    """Bytes on disk failed a checksum or structure check."""


class CorruptSegmentError(CorruptionError):
    """A segment file of one group is corrupt; that group stops."""


class CorruptWalError(CorruptionError):
    """The shared WAL lost records of this group in the middle of a file (not a torn tail)."""


class CorruptSnapshotError(CorruptionError):
    """A snapshot file failed its checks (only raised when no valid snapshot remains)."""


class StorageIOError(StorageError, OSError):
    """A write or fsync failed (ENOSPC, EIO...). Nothing durable is lost; the
    failed, never-acknowledged appends were dropped and the group must
    re-append from durable_index() + 1. `errno` is that of the cause."""


class InvariantError(StorageError, AssertionError):
    """A storage invariant broke (a bug); the group stops."""
