"""Property test: GroupLog against an in-memory reference log.

Hypothesis drives appends, overwrites (new term), hard states, snapshots,
snapshot installs past the log, releases, syncs and restarts of the whole
LogManager, with tiny WAL/segment sizes so roll-over and segment flushing
happen all the time (in the background thread, at arbitrary moments).
After every step the storage must agree with the model.
"""
from __future__ import annotations

import logging
import random
import shutil
import tempfile
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.storage import CompactedError, Entry, GroupLog, HardState, LogManager, StorageConfig

from .helpers import payload

GROUPS = ["a", "%2F/b"]
# Real files, but no fsync: this test checks the log's logic (hundreds of
# restarts); durability with real fsync is what test_crash.py checks.
CFG = StorageConfig(wal_max_size_bytes=1500, segment_max_entries=3, sync_method="none")


@dataclass
class Model:
    log: dict[int, Entry] = field(default_factory=dict)
    first: int = 1  # first index the model still holds
    snap: tuple[int, int] | None = None
    hs: HardState = HardState()
    max_term: int = 1
    release_bound: int = 0  # storage may have deleted entries below this
    dead: set[int] = field(default_factory=set)  # no longer live (a queue consumed them)
    maybe_gone: set[int] = field(default_factory=set)  # dead, and compaction may have dropped it

    @property
    def log_last(self) -> int:
        return max(self.log) if self.log else self.first - 1

    @property
    def last(self) -> int:
        return max(self.log_last, self.snap[0] if self.snap else 0)


class _Errors(logging.Handler):
    """Errors storage logs instead of raising (e.g. in its writer threads)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(self.format(record))


class StorageMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.errors = _Errors()
        logging.getLogger("broker.storage").addHandler(self.errors)
        self.dir = tempfile.mkdtemp(prefix="qq-storage-model-")
        self.models = {g: Model() for g in GROUPS}
        self.mgr: LogManager
        self.logs: dict[str, GroupLog] = {}
        self._open()

    def _open(self) -> None:
        self.mgr = LogManager.open(self.dir, CFG, rng=random.Random(0))
        self.logs = {g: self.mgr.open_group(g) for g in GROUPS}

    def teardown(self) -> None:
        logging.getLogger("broker.storage").removeHandler(self.errors)
        self.mgr.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _append(self, g: str, f: int, n: int, term: int, sizes: list[int]) -> None:
        m = self.models[g]
        new = [Entry(i, term, payload(g, i, term, sizes[(i - f) % len(sizes)]), i % 3)
               for i in range(f, f + n)]
        self.logs[g].append(new)
        if m.snap is not None and f == m.snap[0] + 1 and m.log_last < f - 1:
            m.log.clear()
            m.first = f
        for i in [i for i in m.log if i >= f]:
            del m.log[i]
        for e in new:
            m.log[e.index] = e

    @rule(g=st.sampled_from(GROUPS), n=st.integers(1, 6),
          sizes=st.lists(st.integers(0, 200), min_size=1, max_size=3))
    def append(self, g: str, n: int, sizes: list[int]) -> None:
        m = self.models[g]
        self._append(g, m.last + 1, n, m.max_term, sizes)

    @rule(g=st.sampled_from(GROUPS), n=st.integers(10, 40))
    def append_burst(self, g: str, n: int) -> None:
        """Longer logs, so compaction has whole segments below the snapshot."""
        m = self.models[g]
        self._append(g, m.last + 1, n, m.max_term, [30])

    @rule(g=st.sampled_from(GROUPS), back=st.integers(0, 12), n=st.integers(1, 5),
          sizes=st.lists(st.integers(0, 200), min_size=1, max_size=3))
    def overwrite(self, g: str, back: int, n: int, sizes: list[int]) -> None:
        m = self.models[g]
        if not m.log:
            return
        # Raft never overwrites a snapshotted (committed) entry. Chosen from the
        # model only (not from first_index(), which depends on when background
        # flushes ran): the operations must be a function of hypothesis' draws.
        lo = max(m.first, (m.snap[0] + 1) if m.snap else 0)
        f = max(lo, m.log_last - back)
        if m.snap is not None and m.snap[0] > m.log_last:
            return  # after an install the next append restarts the log instead
        m.max_term += 1
        self._append(g, f, n, m.max_term, sizes)

    @rule(g=st.sampled_from(GROUPS), vote=st.sampled_from([None, "n1", "n2"]),
          commit=st.integers(0, 50))
    def hard_state(self, g: str, vote: str | None, commit: int) -> None:
        m = self.models[g]
        m.hs = HardState(m.max_term, vote, commit)
        self.logs[g].set_hard_state(m.hs)

    @rule(g=st.sampled_from(GROUPS), back=st.integers(0, 10))
    def snapshot(self, g: str, back: int) -> None:
        m = self.models[g]
        if not m.log:
            return
        idx = max(m.first, m.log_last - back, m.snap[0] if m.snap else 0)
        if idx not in m.log:
            return
        self.logs[g].save_snapshot(idx, m.log[idx].term, b"c", f"s{idx}".encode())
        m.snap = (idx, m.log[idx].term)

    @rule(g=st.sampled_from(GROUPS), gap=st.integers(1, 5))
    def install_snapshot(self, g: str, gap: int) -> None:
        m = self.models[g]
        m.max_term += 1
        idx = m.last + gap
        self.logs[g].save_snapshot(idx, m.max_term, b"c", b"installed")
        m.snap = (idx, m.max_term)
        # the log does not hold the snapshot's entry: it is discarded, the log
        # restarts after the snapshot (issue 10 defect 6)
        m.log.clear()
        m.first = idx + 1

    @rule(g=st.sampled_from(GROUPS), live=st.integers(0, 80))
    def release(self, g: str, live: int) -> None:
        m = self.models[g]
        self.logs[g].release(live)
        if m.snap is not None:
            m.release_bound = max(m.release_bound, min(live, m.snap[0] + 1))

    @rule(g=st.sampled_from(GROUPS), keep_every=st.integers(2, 9))
    def compact(self, g: str, keep_every: int) -> None:
        m = self.models[g]
        if m.log and m.log_last >= (m.snap[0] if m.snap else 0):
            self.snapshot(g, 0)  # the runtime compacts right after a snapshot
        if m.snap is None:
            return
        # entries below the snapshot die (not every keep_every-th); a dead one never lives again
        m.dead.update(i for i in m.log if i < m.snap[0] and i % keep_every)
        live = [i for i in sorted(m.log) if i not in m.dead]
        self.mgr.sync()
        assert self.mgr.wait_flushed(10)  # segments below the snapshot, more often
        self.logs[g].compact(live, min_gain=0.0)  # whenever it frees anything
        m.maybe_gone.update(i for i in m.dead if i < m.snap[0])

    @rule()
    def sync(self) -> None:
        self.mgr.sync()
        for g, log in self.logs.items():
            m = self.models[g]
            if m.log and log.first_index() <= m.log_last:
                assert log.durable_index() == m.log_last
            assert log.durable_hard_state() == m.hs

    @rule()
    def wait_flushed(self) -> None:
        self.mgr.sync()
        assert self.mgr.wait_flushed(10)

    @rule(g=st.sampled_from(GROUPS))
    def delete_and_recreate(self, g: str) -> None:
        self.mgr.delete_group(g)
        self.models[g] = Model()
        self.logs[g] = self.mgr.open_group(g)

    @rule()
    def restart(self) -> None:
        self.mgr.close()
        self._open()
        for g, log in self.logs.items():
            m = self.models[g]
            assert log.hard_state() == m.hs
            if m.log and log.first_index() <= m.log_last:
                assert log.durable_index() == m.log_last

    @invariant()
    def no_error_logged(self) -> None:
        assert not self.errors.seen, self.errors.seen

    @invariant()
    def agrees_with_model(self) -> None:
        for g, log in self.logs.items():
            m = self.models[g]
            assert log.last_index() == m.last
            first = log.first_index()
            # whole segments below the release bound may be gone, nothing else
            must_keep = [i for i in m.log if i >= m.release_bound]
            assert m.first <= first <= min(must_keep, default=m.last + 1), (first, m)
            if first <= m.log_last and not m.maybe_gone:
                got = log.entries(first, m.log_last + 1)
                assert got == [m.log[i] for i in range(first, m.log_last + 1)]
                assert log.term(m.log_last) == m.log[m.log_last].term
            elif first <= m.log_last:  # compacted: holes only where entries died
                for i in range(first, m.log_last + 1):
                    try:
                        got = log.entries(i, i + 1)
                    except CompactedError:
                        assert i in m.maybe_gone, (i, m)
                        continue
                    assert got == [m.log[i]]
                    assert log.term(i) == m.log[i].term
            if m.snap is not None:
                assert log.term(m.snap[0]) == m.snap[1]
                meta = log.snapshot_meta()
                assert meta is not None and (meta.index, meta.term) == m.snap
            assert log.hard_state() == m.hs

    @precondition(lambda self: True)
    @rule(g=st.sampled_from(GROUPS))
    def latest_snapshot_is_readable(self, g: str) -> None:
        m = self.models[g]
        snap = self.logs[g].latest_snapshot()
        if m.snap is None:
            assert snap is None
        else:
            assert snap is not None and (snap.meta.index, snap.meta.term) == m.snap


StorageMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40)
TestStorageModel = StorageMachine.TestCase
