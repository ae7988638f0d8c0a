"""GroupLog/LogManager behaviour on real files: append, durability callbacks,
overwrite, hard state, roll-over into segments, snapshots, release, reopen."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from broker.storage import (
    CompactedError,
    Entry,
    GroupAlreadyOpenError,
    GroupClosedError,
    HardState,
    InvalidEntriesError,
    InvalidGroupIdError,
    LogGapError,
    LogManager,
    StorageConfig,
    StorageConfigError,
    StorageError,
    UnavailableError,
)
from broker.storage import manager as manager_module

from .helpers import TINY, Durable, entries, manager, payload, read_all


def test_segment_max_entries_is_validated_with_the_setting_name() -> None:
    with pytest.raises(ValueError, match="raft.segment_max_entries"):
        StorageConfig(segment_max_entries=65536)
    with pytest.raises(StorageConfigError, match="raft.segment_max_entries"):
        StorageConfig(segment_max_entries=0)
    assert StorageConfig(segment_max_entries=65535).segment_max_entries == 65535
    with pytest.raises(StorageConfigError, match="sync_method"):
        StorageConfig(sync_method="sometimes")  # type: ignore[arg-type]
    with pytest.raises(StorageConfigError, match="wal_max_size_bytes"):
        StorageConfig(wal_max_size_bytes=0)


def test_append_read_and_durable_callback(tmp_path: Path) -> None:
    d = Durable()
    with manager(tmp_path, StorageConfig(), d) as m:
        log = m.open_group("%2F/orders")
        assert (log.first_index(), log.last_index(), log.durable_index()) == (1, 0, 0)
        log.append(entries("g", 1, 11, term=1, kind=2))
        # served from memory at once, durable only after the fsync
        assert log.last_index() == 10
        assert d.wait_index("%2F/orders", 10)
        assert log.durable_index() == 10
        assert d.latest["%2F/orders"] == (10, 1)
        got = log.entries(3, 6)
        assert [(e.index, e.term, e.kind, e.data) for e in got] == [
            (i, 1, 2, payload("g", i, 1)) for i in range(3, 6)
        ]
        assert log.term(10) == 1 and log.term(0) == 0
        assert m.stats["fsyncs"] >= 1
        with pytest.raises(UnavailableError):
            log.entries(5, 12)
        with pytest.raises(UnavailableError):
            log.term(11)
        with pytest.raises(ValueError):
            log.entries(6, 5)


def test_a_registered_entry_type_is_stored_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Raft layer's entries are kept as appended (no conversion each
    way); they reach the WAL, segments and a reopen like storage's own, a
    kind that is an IntEnum included. An unregistered look-alike, or a
    registered one whose data is not bytes, is converted to an Entry."""
    import enum
    from dataclasses import dataclass

    from broker.storage import accept_entry_type

    class Kind(enum.IntEnum):
        NORMAL = 0
        CONFIG = 1

    @dataclass(frozen=True, slots=True)
    class Mine:
        term: int
        index: int
        kind: Kind
        data: bytes | bytearray

    @dataclass(frozen=True, slots=True)
    class Other:
        term: int
        index: int
        kind: int
        data: bytes

    from broker.storage import group as storage_group

    # registered for this test only
    monkeypatch.setattr(storage_group, "_STORED_AS_IS", set(storage_group._STORED_AS_IS))
    accept_entry_type(Mine)
    mine = [Mine(1, i, Kind.CONFIG if i % 3 == 0 else Kind.NORMAL, payload("r", i, 1)) for i in range(1, 31)]
    with manager(tmp_path, TINY) as m:  # 4 KiB WAL: rolls over into segments
        log = m.open_group("r")
        log.append(mine[:10])
        log.append([mine[10]])
        log.append([Other(1, 12, int(mine[11].kind), mine[11].data), Mine(1, 13, mine[12].kind, bytearray(mine[12].data)),
                    *mine[13:]])
        got = log.entries(1, 31)
        assert got[0] is mine[0] and got[10] is mine[10]  # as appended, still in memory
        assert type(got[11]) is Entry and type(got[12]) is Entry and type(got[12].data) is bytes
        assert [(e.index, e.term, e.kind, e.data) for e in got] == \
            [(e.index, e.term, int(e.kind), bytes(e.data)) for e in mine]
    with manager(tmp_path, TINY) as m:
        got = read_all(m.open_group("r"))
        assert all(type(e) is Entry for e in got)
        assert [(e.index, e.term, e.kind, e.data) for e in got] == [(e.index, e.term, int(e.kind), e.data) for e in mine]


def test_max_bytes_returns_at_least_one_entry(tmp_path: Path) -> None:
    with manager(tmp_path, StorageConfig()) as m:
        log = m.open_group("g")
        log.append([Entry(i, 1, b"x" * 100) for i in range(1, 11)])
        assert len(log.entries(1, 11, max_bytes=250)) == 2
        assert len(log.entries(1, 11, max_bytes=1)) == 1


def test_bad_appends_are_typed_errors(tmp_path: Path) -> None:
    with manager(tmp_path, StorageConfig()) as m:
        log = m.open_group("g")
        with pytest.raises(LogGapError):
            log.append([Entry(2, 1, b"")])
        with pytest.raises(InvalidEntriesError):
            log.append([Entry(1, 1, b""), Entry(3, 1, b"")])
        with pytest.raises(InvalidEntriesError):
            log.append([Entry(1, 2, b""), Entry(2, 1, b"")])
        with pytest.raises(InvalidEntriesError):
            log.append([Entry(1, 1, b"", kind=256)])
        log.append([Entry(1, 3, b"")])
        with pytest.raises(InvalidEntriesError):  # term below the previous entry's
            log.append([Entry(2, 2, b"")])
        with pytest.raises(InvalidGroupIdError):
            m.open_group("")
        with pytest.raises(GroupAlreadyOpenError):
            m.open_group("g")
        log.close()
        with pytest.raises(GroupClosedError):
            log.last_index()
        assert m.open_group("g").last_index() == 1
    with pytest.raises(GroupClosedError):
        log.last_index()


def test_overwrite_truncates_suffix_and_lowers_durable_index(tmp_path: Path) -> None:
    d = Durable()
    with manager(tmp_path, StorageConfig(), d) as m:
        log = m.open_group("g")
        log.append(entries("g", 1, 11, 1))
        assert d.wait_index("g", 10)
        log.append(entries("g", 6, 8, 2))
        assert log.last_index() == 7
        assert log.durable_index() <= 5 or log.durable_index() == 7
        m.sync()
        assert log.durable_index() == 7
        assert [e.term for e in read_all(log)] == [1] * 5 + [2] * 2
        with pytest.raises(UnavailableError):
            log.entries(8, 9)
    with manager(tmp_path, StorageConfig()) as m:
        log = m.open_group("g")
        assert [(e.index, e.term, e.data) for e in read_all(log)] == [
            (e.index, e.term, e.data) for e in entries("g", 1, 6, 1) + entries("g", 6, 8, 2)
        ]


def test_hard_state_is_durable_and_recovered(tmp_path: Path) -> None:
    d = Durable()
    with manager(tmp_path, StorageConfig(), d) as m:
        log = m.open_group("g")
        assert log.hard_state() == HardState()
        log.set_hard_state(HardState(3, "node-b", 0))
        m.sync()
        assert log.durable_hard_state() == HardState(3, "node-b", 0)
        assert d.calls and d.calls[-1][0] == "g"  # hard-state-only batches notify too
        log.append(entries("g", 1, 4, 3))
        log.set_hard_state(HardState(3, None, 2))
    with manager(tmp_path, StorageConfig()) as m:
        log = m.open_group("g")
        assert log.hard_state() == HardState(3, None, 2)
        assert log.last_index() == 3


def test_group_ids_are_encoded_safely_and_listed(tmp_path: Path) -> None:
    ids = ["%2F/orders", "../../etc", ".", "ünïcode/q", "a" * 300, "A-b_c"]
    with manager(tmp_path, StorageConfig()) as m:
        for n, gid in enumerate(ids):
            log = m.open_group(gid)
            log.append([Entry(1, 1, gid.encode())])
            assert n >= 0
        m.sync()
        assert sorted(m.group_ids()) == sorted(ids)
        names = os.listdir(tmp_path / "groups")
        assert all("/" not in nme and nme not in (".", "..") and len(nme) <= 200 for nme in names)
    with manager(tmp_path, StorageConfig()) as m:
        for gid in ids:
            assert m.open_group(gid).entries(1, 2)[0].data == gid.encode()


def test_roll_over_moves_entries_into_segments_and_deletes_wal(tmp_path: Path) -> None:
    d = Durable()
    cfg = StorageConfig(wal_max_size_bytes=2048, segment_max_entries=4)
    with manager(tmp_path, cfg, d) as m:
        logs = [m.open_group(f"q{n}") for n in range(3)]
        for i in range(1, 41):
            for n, log in enumerate(logs):
                log.append(entries(f"q{n}", i, i + 1, 1 + i // 20))
            if i % 10 == 0:
                m.sync()  # several batches, so several roll-overs
        assert m.wait_flushed(10)
        assert m.stats["rollovers"] >= 2
        assert len(m.wal_files()) == 1
        for n, log in enumerate(logs):
            assert log.segment_files(), "entries should have been flushed to segments"
            assert all(len(e.data) >= 0 for e in read_all(log))
            assert [(e.index, e.term, e.data) for e in read_all(log)] == [
                (i, 1 + i // 20, payload(f"q{n}", i, 1 + i // 20)) for i in range(1, 41)
            ]
            assert log.durable_index() == 40
    with manager(tmp_path, cfg) as m:
        for n in range(3):
            log = m.open_group(f"q{n}")
            assert [e.index for e in read_all(log)] == list(range(1, 41))


def test_overwrite_reaching_into_segments(tmp_path: Path) -> None:
    cfg = StorageConfig(wal_max_size_bytes=1024, segment_max_entries=4)
    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        log.append(entries("g", 1, 31, 1))
        m.sync()
        assert m.wait_flushed(10)
        assert log.segment_files()
        log.append(entries("g", 5, 9, 2))
        assert log.last_index() == 8
        expected = entries("g", 1, 5, 1) + entries("g", 5, 9, 2)
        assert read_all(log) == expected
        m.sync()
        assert log.durable_index() == 8
        log.append(entries("g", 9, 30, 2))
        m.sync()
        assert m.wait_flushed(10)
        expected += entries("g", 9, 30, 2)
        assert read_all(log) == expected
    with manager(tmp_path, cfg) as m:
        assert read_all(m.open_group("g")) == expected


def test_a_release_before_the_wal_is_flushed_forgets_the_entries_and_never_writes_them(
        tmp_path: Path) -> None:
    """A snapshot and release can come while the released entries are still
    only in the WAL. They are dropped from the memory table at once (first
    index moves to the bound) and the WAL's flush does not write them to
    segment files: after the flush deleted the WAL, a restart finds the log
    starting at the bound."""
    cfg = StorageConfig(wal_max_size_bytes=64 << 10, segment_max_entries=4)
    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        log.append(entries("g", 1, 41, 1))
        m.sync()
        assert log.segment_files() == []  # all still in the WAL's memory table
        log.save_snapshot(30, 1, b"cfg", b"state@30")
        assert log.release(smallest_live_index=25) == 0  # no file to delete
        assert log.first_index() == 25 and log.last_index() == 40
        for lo in (1, 24):
            with pytest.raises(CompactedError):
                log.entries(lo, lo + 1)
        assert read_all(log) == entries("g", 25, 41, 1)
        # more appends roll the WAL over: the memory table is flushed to segments
        big = [Entry(e.index, e.term, e.data * 200, e.kind) for e in entries("g", 41, 81, 1)]
        log.append(big)
        m.sync()
        assert m.wait_flushed(10)
        assert log.segment_files(), "the WAL roll-over wrote no segment"
        assert log.first_index() == 25
        assert read_all(log) == entries("g", 25, 41, 1) + big
    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        assert log.first_index() == 25
        assert read_all(log) == entries("g", 25, 41, 1) + big


def test_a_release_keeps_the_memory_tables_last_entry(tmp_path: Path) -> None:
    """Every entry released before its WAL file's flush: the memory table
    keeps its last one (the log never empties, so the next append is no
    restart); the flush writes only that one before what followed."""
    cfg = StorageConfig(wal_max_size_bytes=64 << 10, segment_max_entries=4)
    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        log.append(entries("g", 1, 41, 1))
        m.sync()
        log.save_snapshot(40, 1, b"cfg", b"state@40")
        log.release(smallest_live_index=1000)  # the bound is the snapshot's: 41
        assert (log.first_index(), log.last_index(), log.last_entry_index()) == (40, 40, 40)
        with pytest.raises(CompactedError):
            log.entries(39, 40)
        big = [Entry(e.index, e.term, e.data * 200, e.kind) for e in entries("g", 41, 81, 2)]
        log.append(big)
        m.sync()
        assert m.wait_flushed(10)
        assert log.segment_files()
        assert read_all(log) == entries("g", 40, 41, 1) + big
    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        assert log.first_index() == 40 and read_all(log) == entries("g", 40, 41, 1) + big


@pytest.mark.parametrize("snapshot_past_the_overwrite", [0, 2])
def test_a_release_never_skips_the_flush_that_voids_an_overwritten_segment_tail(
        tmp_path: Path, snapshot_past_the_overwrite: int) -> None:
    """A new leader's entries overwrite, from index 10, entries already
    flushed to segments; the WAL rolls over and a snapshot and release cover
    the overwrite's whole WAL file before the (slow) segment writer flushes
    it. Only that flush's first file (starting at 10) voids the stale tail
    on disk, so the release must not drop those entries from memory: else,
    after a restart, the stale entries come back, and with the snapshot on
    one of them the whole log after it was discarded (found by review)."""
    cfg = StorageConfig(wal_max_size_bytes=64 << 10, segment_max_entries=8,
                        stagger_first_roll_over=False)

    def big(lo: int, hi: int, term: int) -> list[Entry]:
        return [Entry(e.index, e.term, e.data * 60 + b"x" * 2000, e.kind)
                for e in entries("g", lo, hi, term)]

    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        log.append(big(1, 61, 1))
        m.sync()
        assert m.wait_flushed(10) and log.segment_files()  # term-1 entries in segments
        m._delete_lock.acquire()  # hold the segment writer: a slow flush
        try:
            log.append(entries("g", 10, 13, 2))  # the overwrite, into the segments
            m.sync()
            gen = m._wal.gen
            i = 13
            while m._wal.gen == gen:  # roll the WAL over
                log.append(big(i, i + 1, 2))
                m.sync()
                i += 1
            g = i - 1  # the last entry queued in the overwrite's WAL file
            log.append(entries("g", i, i + 5, 2))
            m.sync()
            last = i + 4
            log.set_hard_state(HardState(2, None, last))
            m.sync()
            snap = g + snapshot_past_the_overwrite
            log.save_snapshot(snap, 2, b"cfg", b"snap")
            log.release(g + 1)
            expected = [e for e in read_all(log) if e.index >= log.first_index()]
            assert all(e.term == 2 for e in expected if e.index >= 10)
        finally:
            m._delete_lock.release()
        assert m.wait_flushed(10)
    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        assert log.last_index() == last and log.term(snap) == 2
        got = read_all(log)
        assert [e for e in got if e.index >= 10 and e.term == 1] == []
        assert [e.index for e in got if e.index > snap] == list(range(snap + 1, last + 1))


@pytest.mark.parametrize("smallest_live", [10, 12])
def test_a_release_during_a_flush_leaves_the_overwrite_that_clips_its_portion(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smallest_live: int) -> None:
    """The segment writer has taken a WAL file's entries (all term 1, in the
    memory table only: no segment file yet) and is writing them when a new
    leader's entries overwrite them from index 10, and a snapshot and
    release cover the overwrite: the stale term-1 entries never become the
    log, running or after a restart. (GroupLog._drop_released_memory skips
    the drop while a flush is in flight; this outcome holds without that
    rule too, since every piece the install keeps then lies below the
    release bound and its file is deleted at once, so the rule is a margin,
    not the only guard.)"""
    cfg = StorageConfig(wal_max_size_bytes=64 << 10, segment_max_entries=8,
                        stagger_first_roll_over=False)
    taken, go = threading.Event(), threading.Event()
    real = manager_module.write_segment_files

    def slow_writer(*args: Any, **kw: Any) -> Any:
        taken.set()  # the portion is taken; its install waits for `go`
        assert go.wait(30)
        return real(*args, **kw)

    monkeypatch.setattr(manager_module, "write_segment_files", slow_writer)

    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        gen = m._wal.gen
        i = 1
        try:
            while m._wal.gen == gen:  # roll the WAL over: its flush starts
                log.append([Entry(e.index, e.term, e.data + b"x" * 2000, e.kind)
                            for e in entries("g", i, i + 1, 1)])
                m.sync()
                i += 1
            assert i > 20 and taken.wait(10) and not log.segment_files()
            log.append(entries("g", 10, 14, 2))  # the overwrite
            m.sync()
            log.set_hard_state(HardState(2, None, 13))
            m.sync()
            log.save_snapshot(12, 2, b"cfg", b"snap")
            log.release(smallest_live)
        finally:
            go.set()
        assert m.wait_flushed(10)
        running = read_all(log)
        assert log.last_index() == 13
        assert [(e.index, e.term) for e in running if e.index >= 10] == [(k, 2) for k in range(max(10, log.first_index()), 14)]
    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        assert log.last_index() == 13 and log.term(12) == 2
        assert [(e.index, e.term) for e in read_all(log) if e.index >= 10] == \
            [(k, 2) for k in range(max(10, log.first_index()), 14)]


def test_a_release_after_a_snapshot_install_keeps_the_restart_until_flushed(tmp_path: Path) -> None:
    """A follower's log restarted by an installed snapshot: its memory table
    is not trimmed by a release before its first flush, whose reset flag
    voids the stale files. After the flush and a restart no stale entry is
    served."""
    cfg = StorageConfig(wal_max_size_bytes=64 << 10, segment_max_entries=4)
    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        log.append(entries("g", 1, 41, 1))
        m.sync()
        big = [Entry(e.index, e.term, e.data * 200, e.kind) for e in entries("g", 41, 81, 1)]
        log.append(big)
        m.sync()
        assert m.wait_flushed(10) and log.segment_files()  # stale entries in segments
        log.save_snapshot(100, 3, b"cfg", b"leader@100")  # installed past the log
        log.append(entries("g", 101, 111, 3))
        m.sync()
        log.save_snapshot(105, 3, b"cfg", b"state@105")
        log.release(smallest_live_index=106)
        assert log.first_index() == 101  # the restart's first entries stay until flushed
        assert read_all(log) == entries("g", 101, 111, 3)
        more = [Entry(e.index, e.term, e.data * 200, e.kind) for e in entries("g", 111, 151, 3)]
        log.append(more)
        m.sync()
        assert m.wait_flushed(10)
        log.release(smallest_live_index=106)
        assert log.first_index() >= 101
        kept = read_all(log)
        assert kept == (entries("g", 101, 111, 3) + more)[kept[0].index - 101:]
    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        got = read_all(log)
        assert got and all(e.term == 3 for e in got) and got[-1].index == 150
        assert got == (entries("g", 101, 111, 3) + more)[got[0].index - 101:]
        assert log.term(105) == 3


def test_snapshot_release_and_reset_after_snapshot_install(tmp_path: Path) -> None:
    cfg = StorageConfig(wal_max_size_bytes=1024, segment_max_entries=4)
    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        log.append(entries("g", 1, 41, 1))
        m.sync()
        assert m.wait_flushed(10)
        nseg = len(log.segment_files())
        assert log.release(30) == 0  # no snapshot yet: nothing may go
        meta = log.save_snapshot(20, 1, b"cfg", b"state@20")
        assert log.snapshot_meta() == meta
        deleted = log.release(smallest_live_index=12)
        assert deleted >= 2
        assert len(log.segment_files()) == nseg - deleted
        assert 2 <= log.first_index() <= 12
        assert read_all(log) == entries("g", log.first_index(), 41, 1)
        deleted = log.release(smallest_live_index=1000)  # bound is the snapshot: 21
        assert 12 < log.first_index() <= 21
        with pytest.raises(CompactedError):
            log.entries(1, 5)
        # a follower installs a snapshot past its log: the log restarts after it
        log.save_snapshot(100, 3, b"cfg2", b"state@100")
        assert log.last_index() == 100 and log.term(100) == 3
        # installing a snapshot past the log discards the whole log (issue 10 defect 6)
        assert log.last_entry_index() == 100 and log.first_index() == 101
        with pytest.raises(LogGapError):
            log.append(entries("g", 102, 103, 3))
        log.append(entries("g", 101, 104, 3))
        assert log.first_index() == 101 and log.last_index() == 103
        m.sync()
        assert log.durable_index() == 103
    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        assert read_all(log) == entries("g", 101, 104, 3)
        snap = log.latest_snapshot()
        assert snap is not None and snap.meta.index == 100 and snap.data == b"state@100"
        assert snap.meta.config == b"cfg2"


def test_snapshot_installed_over_a_stale_log_discards_it_and_answers_its_own_term(
        tmp_path: Path) -> None:
    """Issue 10 defect 6: a follower holding stale entries (terms 1 and 2) at
    and above the snapshot index installs the leader's snapshot at 30 (term
    5). term(30) must be the snapshot's, and no stale entry may be served,
    before or after a restart, or the follower rejects every append."""
    cfg = StorageConfig(wal_max_size_bytes=1024, segment_max_entries=4)
    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        log.append(entries("g", 1, 21, 1))
        log.append(entries("g", 21, 41, 2))  # uncommitted entries of an old leader
        m.sync()
        log.save_snapshot(30, 5, b"cfg", b"leader-state@30")
        assert log.term(30) == 5
        assert log.last_index() == 30 and log.first_index() == 31
        with pytest.raises((CompactedError, UnavailableError)):
            log.entries(25, 26)
        with pytest.raises(UnavailableError):
            log.term(31)
    with manager(tmp_path, cfg) as m:  # a crash before the next append changes nothing
        log = m.open_group("g")
        assert log.term(30) == 5 and log.last_index() == 30 and log.first_index() == 31
        log.append(entries("g", 31, 35, 5))
        m.sync()
    with manager(tmp_path, cfg) as m:
        log = m.open_group("g")
        assert read_all(log) == entries("g", 31, 35, 5)


def test_local_snapshot_keeps_the_log_it_was_taken_from(tmp_path: Path) -> None:
    with manager(tmp_path, TINY) as m:
        log = m.open_group("g")
        log.append(entries("g", 1, 21, 1))
        m.sync()
        log.save_snapshot(10, 1, b"cfg", b"state@10")
        assert read_all(log) == entries("g", 1, 21, 1)


def test_constructor_does_no_recovery_open_does(tmp_path: Path) -> None:
    """Recovery is LogManager.open()'s step, not the constructor's: a manager
    only constructed has touched nothing and is closed."""
    with manager(tmp_path, TINY) as m:
        m.open_group("g").append(entries("g", 1, 4, 1))
        m.sync()
    wal_before = sorted(os.listdir(tmp_path / "wal"))
    bare = LogManager(tmp_path, TINY)
    assert sorted(os.listdir(tmp_path / "wal")) == wal_before
    with pytest.raises(GroupClosedError):
        bare.open_group("g")
    bare.close()  # nothing to close
    with manager(tmp_path, TINY) as m:
        assert read_all(m.open_group("g")) == entries("g", 1, 4, 1)


def test_second_manager_on_same_directory_is_refused(tmp_path: Path) -> None:
    with manager(tmp_path, TINY):
        with pytest.raises(StorageError, match="in use"):
            LogManager.open(tmp_path, TINY)


def test_callbacks_may_call_back_into_the_log(tmp_path: Path) -> None:
    seen: list[int] = []
    box: list = []

    def on_durable(group: str, index: int, term: int) -> None:
        seen.append(box[0].durable_index())

    with manager(tmp_path, StorageConfig()) as m:
        m._on_durable = on_durable
        log = m.open_group("g", on_durable=on_durable)
        box.append(log)
        log.append(entries("g", 1, 3, 1))
        m.sync()
        assert seen and seen[-1] == 2


def test_delete_group_forgets_everything_and_survives_restart(tmp_path: Path) -> None:
    cfg = StorageConfig(wal_max_size_bytes=1024, segment_max_entries=4)
    with manager(tmp_path, cfg) as m:
        a, b = m.open_group("%2F/a"), m.open_group("b")
        a.append(entries("a", 1, 30, 1))
        a.set_hard_state(HardState(1, "n1", 10))
        a.save_snapshot(5, 1, b"c", b"s")
        b.append(entries("b", 1, 30, 1))
        m.sync()
        m.delete_group("%2F/a")
        with pytest.raises(StorageError):
            a.last_index()
        assert m.group_ids() == ["b"]
        fresh = m.open_group("%2F/a")  # the id can be reused: a new, empty log
        assert (fresh.last_index(), fresh.hard_state(), fresh.latest_snapshot()) == (
            0, HardState(), None)
        fresh.append(entries("a", 1, 3, 7))
    with manager(tmp_path, cfg) as m:
        assert read_all(m.open_group("%2F/a")) == entries("a", 1, 3, 7)
        assert m.open_group("%2F/a" + "x").last_index() == 0
        assert read_all(m.open_group("b")) == entries("b", 1, 30, 1)


class _SeesDelete(LogManager):
    """Sets `delete_queued` once delete_group() has queued its DELETE record."""

    delete_queued = threading.Event()

    def _enqueue(self, item) -> None:  # type: ignore[no-untyped-def]
        super()._enqueue(item)
        if item.group is None and item.parts:
            self.delete_queued.set()


def test_delete_while_the_groups_records_are_being_written(tmp_path: Path) -> None:
    """delete_group() while the writer still has the group's records in hand
    (blocked here in another group's callback): the writer must not bring
    back the old incarnation's hard state (carried into the next WAL file
    past the DELETE record, it was recovered as the new group's) nor cache a
    reader of its segment files (the new group reuses their paths: reads
    then served the old entries), and gets no callback for it."""
    cfg = StorageConfig(wal_max_size_bytes=2048, segment_max_entries=4,
                        stagger_first_roll_over=False)
    gate, in_callback = threading.Event(), threading.Event()
    old_calls: list[int] = []

    def blocking(group: str, index: int, term: int) -> None:
        in_callback.set()
        gate.wait(10)

    m = _SeesDelete.open(tmp_path, cfg)
    m.delete_queued = threading.Event()
    try:
        a = m.open_group("a", on_durable=lambda g, i, t: old_calls.append(i))
        blocker = m.open_group("blocker", on_durable=blocking)
        a.append(entries("a", 1, 40, 1))  # one batch past the WAL size: rolls over
        m.sync()
        assert m.wait_flushed(10) and a.segment_files() and a.durable_index() == 39
        blocker.append(entries("blocker", 1, 2, 1))
        assert in_callback.wait(10)  # the writer is now stuck in `blocking`
        a.set_hard_state(HardState(3, "n1", 9))
        calls_before = len(old_calls)
        deleting = threading.Thread(target=m.delete_group, args=("a",))
        deleting.start()
        assert m.delete_queued.wait(10)
        gate.set()
        deleting.join(10)
        assert not deleting.is_alive()
        assert len(old_calls) == calls_before
        fresh = m.open_group("a")
        fresh.append(entries("a", 1, 40, 2))  # same segment file names as before
        m.sync()
        assert m.wait_flushed(10) and m.stats["rollovers"] >= 2
        assert fresh.term(39) == 2
        assert read_all(fresh) == entries("a", 1, 40, 2)
        assert fresh.hard_state() == HardState()
    finally:
        gate.set()
        m.close()
    with manager(tmp_path, cfg) as m2:
        again = m2.open_group("a")
        assert again.hard_state() == HardState()
        assert read_all(again) == entries("a", 1, 40, 2)


class _CrashBeforeRemoving(LogManager):
    """Simulates a crash right after the durable DELETE record."""

    def _remove_group_dir(self, group_id: str) -> None:
        return None


def test_delete_interrupted_after_the_wal_record_is_finished_on_recovery(tmp_path: Path) -> None:
    cfg = StorageConfig(wal_max_size_bytes=1 << 20, segment_max_entries=4)
    with manager(tmp_path, cfg) as m:
        m.open_group("a").append(entries("a", 1, 30, 1))
    m2 = _CrashBeforeRemoving.open(tmp_path, cfg)  # recovery moves a's entries into segments
    m2.delete_group("a")
    assert (tmp_path / "groups" / "a").is_dir()
    m2.close()
    with manager(tmp_path, cfg) as m:
        assert not (tmp_path / "groups" / "a").exists()
        assert m.group_ids() == []
        assert m.open_group("a").last_index() == 0


def test_sync_from_a_callback_is_refused_not_a_deadlock(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def on_durable(group: str, index: int, term: int) -> None:
        try:
            box[0].sync()
        except StorageError as exc:
            errors.append(exc)

    box: list[LogManager] = []
    with manager(tmp_path, StorageConfig()) as m:
        box.append(m)
        log = m.open_group("g", on_durable=on_durable)
        log.append(entries("g", 1, 2, 1))
        m.sync()
        assert errors and "deadlock" in str(errors[0])


def test_group_commit_batches_many_appends_into_one_fsync(tmp_path: Path) -> None:
    d = Durable()
    with manager(tmp_path, StorageConfig(), d) as m:
        logs = [m.open_group(f"g{n}") for n in range(20)]
        m.sync()
        before = dict(m.stats)
        for i in range(1, 51):
            for n, log in enumerate(logs):
                log.append(entries(f"g{n}", i, i + 1, 1))
        m.sync()
        appends = 50 * 20
        fsyncs = m.stats["fsyncs"] - before["fsyncs"]
        assert m.stats["records"] - before["records"] >= 2 * appends
        # appends queued while an fsync runs share the next one
        assert fsyncs < appends / 10, fsyncs
        assert all(log.durable_index() == 50 for log in logs)
        assert all(d.latest[f"g{n}"] == (50, 1) for n in range(20))


def test_batch_caps_bound_each_write(tmp_path: Path) -> None:
    with manager(tmp_path, StorageConfig(max_batch_records=1)) as m:
        log = m.open_group("g")
        m.sync()
        before = m.stats["fsyncs"]
        for i in range(1, 21):
            log.append(entries("g", i, i + 1, 1))
        m.sync()
        # at most one append per write: at least one fsync each
        assert m.stats["fsyncs"] - before >= 20
        assert log.durable_index() == 20


class _Lowest:
    def randint(self, a: int, b: int) -> int:
        return a


def test_first_roll_over_is_staggered_between_half_and_full_size(tmp_path: Path) -> None:
    def wal_bytes_until_first_roll_over(stagger: bool, path: Path) -> int:
        cfg = StorageConfig(wal_max_size_bytes=8192, stagger_first_roll_over=stagger)
        with LogManager.open(path, cfg, rng=_Lowest()) as m:
            log = m.open_group("g")
            i = 0
            while m.stats["rollovers"] == 0:
                i += 1
                log.append([Entry(i, 1, b"x" * 200)])
                m.sync()
            return m.stats["bytes"]

    staggered = wal_bytes_until_first_roll_over(True, tmp_path / "a")
    plain = wal_bytes_until_first_roll_over(False, tmp_path / "b")
    assert 4096 - 16 <= staggered < 4096 + 300
    assert 8192 - 16 <= plain < 8192 + 300


def test_settled_says_whether_anything_written_is_still_on_its_way(tmp_path: Path) -> None:
    """GroupLog.settled(): usable and every entry and the hard state set
    durable (what a restart over the handle waits for). Here the writer is
    held in another group's callback, so what `a` writes stays in flight."""
    gate, in_callback = threading.Event(), threading.Event()

    def blocking(group: str, index: int, term: int) -> None:
        in_callback.set()
        gate.wait(10)

    durable = Durable()
    with manager(tmp_path, durable=durable) as m:
        a = m.open_group("a", on_durable=durable.on_durable)
        blocker = m.open_group("blocker", on_durable=blocking)
        assert a.settled()  # empty: nothing to wait for
        a.append(entries("a", 1, 3, 1))
        assert durable.wait_index("a", 2) and a.settled()
        blocker.append(entries("blocker", 1, 2, 1))
        assert in_callback.wait(10)  # the writer is now stuck in `blocking`
        a.append(entries("a", 3, 4, 1))
        assert not a.settled()  # entry 3 in flight
        gate.set()
        assert durable.wait_index("a", 3) and a.settled()
        in_callback.clear()
        gate.clear()
        blocker.append(entries("blocker", 2, 3, 1))
        assert in_callback.wait(10)
        a.set_hard_state(HardState(2, "n1", 3))
        assert not a.settled()  # the hard state in flight
        gate.set()
        m.sync()
        assert a.settled()
        a.close()
        assert not a.settled()  # closed: not usable
