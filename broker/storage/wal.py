"""The node's shared write-ahead log (`wal/<seq>.wal`): the writer thread,
group commit, write errors and roll-over.

Owns: the queue of `Pending` writes, the writer thread (everything queued, up
to the caps, goes out with one pwrite + one fdatasync, then each group in the
batch hears `on_durable`), the current WAL file (fd, offset, generation),
group refs and their GROUP records, the latest durable HARD_STATE record of
every group (carried into each new file), the `stats` counters, and
roll-over (start the next file, hand the old generation to the segment
writer through `on_rolled`).

Talks to groups only through `WalGroup` (GroupLog implements it): `epoch`,
the two callbacks, and the two writer-thread calls `wal_written` and
`wal_failed`, made with the node lock held.

Locking: the node lock (passed in, the same object every GroupLog uses) is
taken for the durable step of a batch, for a write error, and to switch
generations in a roll-over; never across a write or fsync. `submit` is
called with it held (FIFO order == generation order).

Imports: `codec`, `files`, `types`, `errors`; nothing else of broker/storage.
"""
from __future__ import annotations

import collections
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import broker.storage.codec as codec
from broker.common.histogram import Histogram

from .errors import StorageIOError
from .files import WAL_SUFFIX, fsync_dir, write_all, write_parts
from .types import Entry, HardState, StorageConfig

log = logging.getLogger(__name__)

OnDurable = Callable[[str, int, int], None]
OnError = Callable[[str, BaseException], None]


class RandomSource(Protocol):
    """Randomness the LogManager needs (inject a seeded random.Random in tests)."""

    def randint(self, a: int, b: int) -> int: ...


class WalGroup(Protocol):
    """What the WAL writer needs of a group (GroupLog implements it)."""

    @property
    def group_id(self) -> str: ...

    @property
    def epoch(self) -> int:
        """Bumped by `wal_failed`: queued writes of older epochs are dropped."""

    @property
    def on_durable(self) -> OnDurable | None: ...

    @property
    def on_error(self) -> OnError | None: ...

    def wal_written(self, last_entry: Entry | None, hs: HardState | None) -> tuple[int, int]:
        """Lock held: the batch holding these is durable; (durable index, its term)."""

    def wal_failed(self, err: StorageIOError) -> None:
        """Lock held: the batch failed with `err`; drop everything not durable."""


class Pending:
    """One append/set_hard_state call queued for the WAL writer."""

    __slots__ = ("group", "epoch", "parts", "nbytes", "last_entry", "hs", "hs_record", "barrier",
                 "ref", "error")

    def __init__(
        self,
        group: WalGroup | None,
        epoch: int,
        parts: list[bytes],
        nbytes: int,
        last_entry: Entry | None,
        hs: HardState | None,
        hs_record: bytes | None,
        barrier: threading.Event | None = None,
        ref: int = 0,
    ) -> None:
        #: group=None items are node-level: a sync() barrier, or a record for `ref`
        self.barrier = barrier
        #: the group ref the records are written under
        self.ref = ref
        self.error: BaseException | None = None
        self.group = group
        self.epoch = epoch
        self.parts = parts
        self.nbytes = nbytes
        self.last_entry = last_entry
        self.hs = hs
        self.hs_record = hs_record


#: upper bounds (seconds) of the buckets of `Wal.sync_hist`, each batch's
#: write + sync time (etcd's `wal_fsync_duration_seconds`)
SYNC_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512,
                1.024, 2.048, 4.096, 8.192)


def sync_fd(fd: int, method: str) -> None:
    if method == "fdatasync":
        os.fdatasync(fd)
    elif method == "fsync":
        os.fsync(fd)


def wal_path(wal_dir: str, seq: int) -> str:
    return os.path.join(wal_dir, f"{seq:020d}{WAL_SUFFIX}")


class Wal:
    """The shared WAL of one node; see the module docstring."""

    def __init__(
        self,
        wal_dir: str,
        config: StorageConfig,
        lock: threading.Lock,
        groups: Mapping[str, object],
        on_rolled: Callable[[int], None],
        rng: RandomSource | None,
    ) -> None:
        self.dir = wal_dir
        self.config = config
        cfg = config
        self._roll_at = cfg.wal_max_size_bytes
        if cfg.stagger_first_roll_over:
            rand = rng if rng is not None else random.Random()
            self._roll_at = rand.randint(max(1, cfg.wal_max_size_bytes // 2), cfg.wal_max_size_bytes)
        self._do_sync = cfg.sync_method != "none"
        self._lock = lock
        #: the open groups (the LogManager's dict): a group no longer in it was deleted
        self._groups = groups
        #: called with a rolled-over generation once the new file holds every hard state
        self._on_rolled = on_rolled
        self._queue: collections.deque[Pending] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        #: generation (= seq) of the current WAL file; changed under the node lock
        self.gen = 0
        self._fd = -1
        self._offset = 0
        self._refs: dict[str, int] = {}
        # writer-thread state
        self._hs_records: dict[int, bytes] = {}  # ref -> latest durable HARD_STATE record
        self._def_records: dict[int, bytes] = {}  # ref -> GROUP record
        self._defined: set[int] = set()  # refs defined in the current WAL file
        self._carry_needed = False
        self._pending_flush: list[int] = []
        self._barriers: list[threading.Event] = []
        # counters (read by bench/metrics)
        self.stats = {"batches": 0, "fsyncs": 0, "records": 0, "bytes": 0, "write_errors": 0,
                      "rollovers": 0, "flushes": 0}
        self.sync_hist = Histogram(SYNC_BUCKETS)
        self._writer: threading.Thread | None = None

    # ----- refs and hard states (node lock held, or before the writer starts)
    def ref_for(self, group_id: str) -> int:
        ref = self._refs.get(group_id)
        if ref is None:
            ref = len(self._refs) + 1
            self._refs[group_id] = ref
            self._def_records[ref] = codec.encode_group_def(ref, group_id)
        return ref

    def forget_hard_state(self, ref: int) -> None:
        """The group was deleted: never carry its hard state into a new file."""
        self._hs_records.pop(ref, None)

    def begin(self, gen: int, hard_states: Mapping[str, HardState]) -> None:
        """Recovery: start WAL file `gen` holding these hard states (fdatasync'd)."""
        self.gen = gen
        for gid, hs in hard_states.items():
            ref = self.ref_for(gid)
            self._hs_records[ref] = codec.encode_hard_state(ref, hs.term, hs.voted_for, hs.commit)
        self._open(self.gen)
        self._carry_needed = True
        self._write_batch([])
        if self._carry_needed:
            raise StorageIOError(28, "could not write the new WAL after recovery")

    def _create(self, seq: int) -> int:
        """A new WAL file `seq` with its header, durable (file and directory);
        nothing is left behind if that fails."""
        path = wal_path(self.dir, seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, codec.encode_wal_header(seq), 0)
            sync_fd(fd, self.config.sync_method)
            if self._do_sync:
                fsync_dir(self.dir)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        return fd

    def _open(self, seq: int) -> None:
        fd = self._create(seq)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._offset = codec.WAL_HEADER_SIZE
        self._defined = set()

    # ----- the thread
    def start(self) -> None:
        self._writer = threading.Thread(target=self._writer_loop, name="qq-wal-writer",
                                        daemon=True)
        self._writer.start()

    def on_writer_thread(self) -> bool:
        return threading.current_thread() is self._writer

    def submit(self, item: Pending) -> None:
        """Lock held: FIFO order == generation order."""
        self._queue.append(item)
        if not self._wake.is_set():
            self._wake.set()

    def request_stop(self) -> None:
        """Lock held: the writer exits once the queue is written."""
        self._stopping = True

    def join(self) -> None:
        self._wake.set()
        if self._writer is not None:
            self._writer.join()

    def close_file(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _writer_loop(self) -> None:
        q = self._queue
        cfg = self.config
        while True:
            if not q:
                self._wake.clear()
                if not q:
                    if self._stopping:
                        return
                    self._wake.wait()
                    continue
            batch: list[Pending] = []
            nbytes = 0
            while q and len(batch) < cfg.max_batch_records and nbytes < cfg.max_batch_bytes:
                item = q.popleft()
                batch.append(item)
                nbytes += item.nbytes
            try:
                self._write_batch(batch)
                if self._offset >= self._roll_at:
                    self._rollover()
            except Exception:  # pragma: no cover - a bug; keep the node's WAL alive
                log.exception("storage: WAL writer error")
            finally:
                for ev in self._barriers:
                    ev.set()
                self._barriers.clear()

    # ----- group commit
    def _write_batch(self, batch: list[Pending]) -> None:
        parts: list[bytes] = []
        new_refs: set[int] = set()
        carry = self._carry_needed
        if carry:
            for ref, rec in self._hs_records.items():
                parts.append(self._def_records[ref])
                new_refs.add(ref)
                parts.append(rec)
        touched: dict[WalGroup, list[Pending]] = {}
        barriers: list[threading.Event] = []
        raw: list[Pending] = []
        nrec = 0
        for item in batch:
            g = item.group
            if g is None:
                if item.parts:  # a node-level record (DELETE) for item.ref
                    if item.ref not in self._defined and item.ref not in new_refs:
                        parts.append(self._def_records[item.ref])
                        new_refs.add(item.ref)
                    parts.extend(item.parts)
                    raw.append(item)
                if item.barrier is not None:
                    barriers.append(item.barrier)
                continue
            if item.epoch != g.epoch:
                continue  # dropped by an earlier write error
            ref = item.ref
            if ref not in self._defined and ref not in new_refs:
                parts.append(self._def_records[ref])
                new_refs.add(ref)
            parts.extend(item.parts)
            nrec += len(item.parts)
            touched.setdefault(g, []).append(item)
        # barriers are released by the writer loop after any roll-over step
        self._barriers.extend(barriers)
        if parts:
            err = self._write_parts(parts, new_refs, carry, nrec, touched)
            for item in raw:
                item.error = err
        elif carry:
            self._carry_done()

    def _write_parts(
        self,
        parts: list[bytes],
        new_refs: set[int],
        carry: bool,
        nrec: int,
        touched: dict[WalGroup, list[Pending]],
    ) -> StorageIOError | None:
        try:
            # vectored: the records' bodies go to the kernel from the buffers
            # that hold them (a join would copy every one into a new block)
            t0 = time.perf_counter()
            size = write_parts(self._fd, parts, self._offset)
            sync_fd(self._fd, self.config.sync_method)
            took = time.perf_counter() - t0
        except OSError as exc:
            return self._write_error(exc, touched)
        self._offset += size
        self._defined |= new_refs
        st = self.stats
        self.sync_hist.observe(took)
        st["batches"] += 1
        st["fsyncs"] += 1
        st["records"] += nrec
        st["bytes"] += size
        if carry:
            self._carry_done()
        notify: list[tuple[WalGroup, int, int]] = []
        with self._lock:
            for g, items in touched.items():
                if self._groups.get(g.group_id) is not g:
                    # Deleted while this batch was written (its records precede the
                    # DELETE record). Touch nothing of it: its hard state must not
                    # re-enter _hs_records (carried into the next WAL file, past the
                    # DELETE, it would be replayed as the re-created group's), and
                    # reading its term could cache a reader of a file whose path
                    # the re-created group reuses.
                    continue
                last_entry = None
                hs = None
                for item in items:
                    if item.last_entry is not None:
                        last_entry = item.last_entry
                    if item.hs is not None:
                        hs = item.hs
                        assert item.hs_record is not None
                        self._hs_records[item.ref] = item.hs_record
                index, term = g.wal_written(last_entry, hs)
                notify.append((g, index, term))
        for g, index, term in notify:
            cb = g.on_durable
            if cb is not None:
                try:
                    cb(g.group_id, index, term)
                except Exception:
                    log.exception("storage: on_durable callback failed")
        return None

    def _carry_done(self) -> None:
        """The new WAL holds every group's hard state: old WAL files may be flushed."""
        self._carry_needed = False
        for gen in self._pending_flush:
            self._on_rolled(gen)
        self._pending_flush.clear()

    def _write_error(
        self, exc: OSError, touched: dict[WalGroup, list[Pending]]
    ) -> StorageIOError:
        self.stats["write_errors"] += 1
        try:
            os.ftruncate(self._fd, self._offset)
        except OSError:
            pass
        err = StorageIOError(exc.errno or 5, f"WAL write failed: {exc.strerror or exc}")
        err.__cause__ = exc
        with self._lock:
            for g in touched:
                g.wal_failed(err)
        for g in touched:
            cb = g.on_error
            if cb is not None:
                try:
                    cb(g.group_id, err)
                except Exception:
                    log.exception("storage: on_error callback failed")
        return err

    # ----- roll-over
    def _rollover(self) -> None:
        """Start WAL gen+1; entries queued so far (gen) go into the old file,
        which the segment writer then flushes and deletes."""
        old_gen = self.gen
        old_fd = self._fd
        try:
            fd = self._create(old_gen + 1)
        except OSError as exc:
            log.warning("storage: WAL roll-over failed, retrying later: %s", exc)
            return
        with self._lock:
            self.gen = old_gen + 1
            n_old = len(self._queue)
        old = [self._queue.popleft() for _ in range(n_old)]
        cfg = self.config
        while old:
            batch, old = old[: cfg.max_batch_records], old[cfg.max_batch_records :]
            self._write_batch(batch)
        self._fd = fd
        os.close(old_fd)
        self._offset = codec.WAL_HEADER_SIZE
        self._defined = set()
        self.stats["rollovers"] += 1
        self._roll_at = self.config.wal_max_size_bytes
        self._carry_needed = True
        self._pending_flush.append(old_gen)
        self._write_batch([])  # carry group ids + hard states into the new file
