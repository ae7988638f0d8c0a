"""LogManager (one per node): the storage shell that opens, deletes and
closes groups, and runs the node's two storage threads.

Pipeline position: the Raft driver in broker/runtime opens one `GroupLog`
(group.py) per Raft group and hands it each `Ready`; the groups queue their
records into the node's single WAL (wal.py: writer thread, group commit,
roll-over), which calls `on_durable(group_id, index, term)` after each
fdatasync. When the WAL rolls over, the segment-writer thread here flushes
the old file's entries into per-group segment files (segments.py) and then
deletes the old WAL.

`LogManager.open(data_dir, ...)` takes the directory lock and recovers
(recovery.py) before starting the threads; the constructor only sets fields.

Owns: the open groups (`_groups`), the node lock and `NodeShared` (what the
groups share with it: lock, config, WAL, segment cache, closed flag), the
group directories (`files.GroupDirs`), the recovered hard states, deletion
of groups, and the segment-writer thread. Talks to groups through their
documented internal methods only (see group.py), never their fields.

Locking: one node-wide lock (`NodeShared.lock`, also `self._lock`) guards
all in-memory state. It is never held across a WAL write/fsync; it is held
across segment reads (page-cache preads) and the short install step of a
flush. `_delete_lock` keeps a group from being deleted while its WAL data
is flushed.

Imports: every other storage module except `inspection`/`manifest`.
"""
from __future__ import annotations

import logging
import os
import queue
import threading

import broker.storage.codec as codec
import broker.storage.snapshots as snapshots

from .errors import (
    CorruptSnapshotError,
    CorruptWalError,
    GroupAlreadyOpenError,
    GroupClosedError,
    StorageError,
    StorageIOError,
)
from .files import (
    CORRUPT_MARKER,
    WAL_SUFFIX,
    GroupDirs,
    fsync_dir,
    lock_dir,
    makedirs_durable,
    read_file,
)
from .group import GroupLog, NodeShared
from .recovery import recover
from .segments import SegmentCache, load_segments, unlink_segments, write_segment_files
from .types import HardState, StorageConfig
from .wal import OnDurable, OnError, Pending, RandomSource, Wal, wal_path

__all__ = ["GroupLog", "LogManager", "OnDurable", "OnError", "RandomSource"]

log = logging.getLogger(__name__)


class LogManager:
    """Storage of one node: the shared WAL (group commit), per-group segment
    files and snapshots, under `data_dir`. Obtain it with `LogManager.open()`,
    which recovers; a LogManager only constructed is closed."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        config: StorageConfig | None = None,
        on_durable: OnDurable | None = None,
        on_error: OnError | None = None,
        rng: RandomSource | None = None,
    ) -> None:
        """Fields only, no I/O: use `LogManager.open()`."""
        self.config = config if config is not None else StorageConfig()
        self.data_dir = os.fspath(data_dir)
        self._wal_dir = os.path.join(self.data_dir, "wal")
        self._groups_dir = os.path.join(self.data_dir, "groups")
        self._on_durable = on_durable
        self._on_error = on_error
        self._do_sync = self.config.sync_method != "none"
        self._lock = threading.Lock()
        self._delete_lock = threading.Lock()
        self._groups: dict[str, GroupLog] = {}
        self._dirs = GroupDirs(self._groups_dir, self._do_sync)
        self._flush_q: queue.Queue[int | None] = queue.Queue()
        self._flush_stop = threading.Event()
        self._wal = Wal(self._wal_dir, self.config, self._lock, self._groups,
                        self._flush_q.put, rng)
        self._shared = NodeShared(self._lock, self.config, self._do_sync, self._wal,
                                  SegmentCache(self.config.segment_cache_size))
        # counters (read by bench/metrics)
        self.stats = self._wal.stats
        self.sync_hist = self._wal.sync_hist
        self._recovered_hs: dict[str, HardState] = {}
        self._dir_lock = -1
        self._flushed_upto = -1
        self._flushed_cv = threading.Condition()
        self._flusher = threading.Thread(target=self._flusher_loop, name="qq-segment-writer",
                                         daemon=True)

    @classmethod
    def open(
        cls,
        data_dir: str | os.PathLike[str],
        config: StorageConfig | None = None,
        on_durable: OnDurable | None = None,
        on_error: OnError | None = None,
        rng: RandomSource | None = None,
    ) -> LogManager:
        """Lock `data_dir`, recover it (docs/STORAGE.md "Recovery"), start the
        WAL writer and segment writer threads. Raises StorageError if another
        LogManager has the directory, StorageIOError if recovery fails
        (nothing was deleted then)."""
        mgr = cls(data_dir, config, on_durable, on_error, rng)
        mgr._recover_and_start()
        return mgr

    def _recover_and_start(self) -> None:
        makedirs_durable(self._wal_dir)
        makedirs_durable(self._groups_dir)
        self._dir_lock = lock_dir(self.data_dir)
        try:
            self._recovered_hs = recover(self._wal, self._dirs, self.config, self._do_sync,
                                         self._remove_group_dir)
        except BaseException as exc:
            self._wal.close_file()
            os.close(self._dir_lock)
            if isinstance(exc, OSError) and not isinstance(exc, StorageError):
                raise StorageIOError(
                    exc.errno or 5,
                    f"recovery of {self.data_dir} failed (nothing was deleted): {exc}",
                ) from exc
            raise
        self._flushed_upto = self._wal.gen - 1
        self._shared.closed = False
        self._wal.start()
        self._flusher.start()

    @property
    def closed(self) -> bool:
        return self._shared.closed

    # ----- paths / ids
    def group_dir(self, group_id: str) -> str:
        return self._dirs.path(group_id)

    def group_ids(self) -> list[str]:
        """Ids of every group with a directory on this node."""
        return self._dirs.ids()

    # ----- groups
    def open_group(
        self,
        group_id: str,
        on_durable: OnDurable | None = None,
        on_error: OnError | None = None,
    ) -> GroupLog:
        """Open (recovering) the log of `group_id`. Raises CorruptSegmentError /
        CorruptWalError if its files are corrupt: that group stays stopped,
        others are unaffected. Callbacks default to the LogManager's."""
        path = self.group_dir(group_id)  # validates the id
        on_durable = on_durable or self._on_durable
        on_error = on_error or self._on_error
        with self._lock:
            if self._shared.closed:
                raise GroupClosedError("LogManager is closed")
            g = self._groups.get(group_id)
            if g is not None:
                g.reopen(on_durable, on_error)
                return g
        try:
            self._dirs.ensure(group_id)
        except OSError as exc:  # a full disk, an I/O error: this group stays stopped
            raise StorageIOError(exc.errno or 5, f"group {group_id!r}: creating its directory: "
                                            f"{exc.strerror or exc}") from exc
        marker = os.path.join(path, CORRUPT_MARKER)
        if os.path.exists(marker):
            raise CorruptWalError(read_file(marker).decode("utf-8", "replace"))
        files = load_segments(os.path.join(path, "segments"))
        snapdir = os.path.join(path, "snapshots")
        snapshots.remove_tmp_files(snapdir)
        snap = snapshots.load_latest_snapshot(snapdir)
        with self._lock:
            if group_id in self._groups:
                raise GroupAlreadyOpenError(f"group {group_id!r} is already open")
            ref = self._wal.ref_for(group_id)
            g = GroupLog(self._shared, group_id, ref, path, files,
                         snap.meta if snap is not None else None,
                         self._recovered_hs.get(group_id, HardState()), on_durable, on_error)
            newest = snapshots.snapshot_files(snapdir)
            have = snap.meta.index if snap is not None else 0
            if newest and newest[0][0] > have:
                # The newest snapshot is unreadable. Falling back is only sound
                # if the log still holds every entry after the older one (none
                # released, none compacted away).
                if not g.holds_all_after(have):
                    raise CorruptSnapshotError(
                        f"group {group_id!r}: snapshot {newest[0][1]} is unreadable and the log no "
                        f"longer holds the entries after {'snapshot ' + str(have) if have else 'the start'}")
            dropped = g.drop_void_leading()
            self._groups[group_id] = g
        unlink_segments(path, dropped, self._do_sync)
        return g

    def delete_group(self, group_id: str) -> None:
        """Remove a group from this node for good (queue deleted, member
        removed): its log, segments, snapshots and hard state. Blocking: a
        DELETE record is made durable in the WAL first (so replay forgets the
        group's older records), then the directory is renamed away and removed.
        Raises StorageIOError if the DELETE record cannot be written."""
        if self._wal.on_writer_thread():
            raise StorageError("delete_group() called from a callback would deadlock")
        path = self.group_dir(group_id)
        with self._delete_lock:
            done = threading.Event()
            with self._lock:
                if self._shared.closed:
                    raise GroupClosedError("LogManager is closed")
                g = self._groups.pop(group_id, None)
                if g is not None:
                    g.mark_deleted()
                ref = self._wal.ref_for(group_id)
                self._wal.forget_hard_state(ref)
                self._recovered_hs.pop(group_id, None)
                rec = codec.encode_record(
                    codec.REC_DELETE, 0, ref, 0, 0, self._dirs.incarnation(group_id)
                )
                item = Pending(None, 0, [rec], len(rec), None, None, None, done, ref)
                self._enqueue(item)
            done.wait()
            with self._lock:
                # every write of the old incarnation is done: close its cached
                # readers (an open fd would keep the deleted files' space)
                self._shared.cache.evict_under(os.path.join(path, ""))
            if item.error is not None:
                raise item.error
            if os.path.isdir(path):
                self._remove_group_dir(group_id)

    def _remove_group_dir(self, group_id: str) -> None:
        """Atomic rename out of the way (so no half-deleted group is ever seen), then rmtree."""
        self._dirs.remove(group_id)

    def _enqueue(self, item: Pending) -> None:
        """Lock held: queue a node-level item (DELETE record, sync barrier)."""
        self._wal.submit(item)

    # ----- segment writer thread
    def _flusher_loop(self) -> None:
        while True:
            gen = self._flush_q.get()
            if gen is None:
                return
            while True:
                try:
                    self._flush_gen(gen)
                    break
                except OSError as exc:
                    log.warning("storage: flushing WAL %d failed, will retry: %s", gen, exc)
                    if self._flush_stop.wait(0.5):
                        return

    def _flush_gen(self, gen: int) -> None:
        with self._delete_lock:  # a group is never deleted while its WAL data is flushed
            self._flush_gen_locked(gen)

    def _flush_gen_locked(self, gen: int) -> None:
        with self._lock:
            groups = list(self._groups.values())
        todo: list[GroupLog] = []
        jobs = []
        n = self.config.segment_max_entries
        for g in groups:
            with self._lock:
                got = g.flush_portion(gen)
            if got is None:
                continue
            portion, reset, seqs = got
            chunks = [portion[k : k + n] for k in range(0, len(portion), n)]
            todo.append(g)
            jobs.append((os.path.join(g.path, "segments"), chunks, reset, seqs))
        written = write_segment_files(jobs, n, self._do_sync)
        for g, files in zip(todo, written, strict=True):
            with self._lock:
                dropped = g.install_flushed(gen, files)
            unlink_segments(g.path, dropped, self._do_sync)
        try:
            os.unlink(wal_path(self._wal_dir, gen))
        except FileNotFoundError:
            pass
        if self._do_sync:
            fsync_dir(self._wal_dir)
        self.stats["flushes"] += 1
        with self._flushed_cv:
            self._flushed_upto = gen
            self._flushed_cv.notify_all()

    def wait_flushed(self, timeout: float | None = None) -> bool:
        """Block until every WAL file before the current one has been flushed
        into segments and deleted. Returns False on timeout."""
        with self._flushed_cv:
            return self._flushed_cv.wait_for(lambda: self._flushed_upto >= self._wal.gen - 1,
                                             timeout)

    def wal_files(self) -> list[str]:
        return sorted(n for n in os.listdir(self._wal_dir) if n.endswith(WAL_SUFFIX))

    def sync(self, timeout: float | None = None) -> None:
        """Block until everything queued so far is written and fsynced (or failed)."""
        if self._wal.on_writer_thread():
            raise StorageError("sync() called from an on_durable/on_error callback would deadlock")
        done = threading.Event()
        with self._lock:
            if self._shared.closed:
                raise GroupClosedError("LogManager is closed")
            self._enqueue(Pending(None, 0, [], 0, None, None, None, done))
        done.wait(timeout)

    def close(self) -> None:
        """Write what is queued, stop the threads, close files. Idempotent;
        nothing to do for a LogManager that was never opened."""
        with self._lock:
            if self._shared.closed:
                return
            self._shared.closed = True
            self._wal.request_stop()
        self._wal.join()
        self._flush_stop.set()
        self._flush_q.put(None)
        self._flusher.join()
        self._wal.close_file()
        with self._lock:
            self._shared.cache.close_all()
        os.close(self._dir_lock)

    def __enter__(self) -> LogManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
