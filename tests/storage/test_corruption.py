"""Damaged files: a WAL or segment truncated at a random byte, a flipped bit in
a segment and in the WAL, a half-written snapshot, a torn WAL header.

The rule checked everywhere: a group either reports a typed corruption error
(and stops, without affecting other groups) or serves exactly a prefix of what
was written; it never serves a corrupt or invented entry."""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from broker.storage import (
    CorruptionError,
    CorruptSegmentError,
    CorruptSnapshotError,
    CorruptWalError,
    GroupFailedError,
    LogManager,
    StorageConfig,
    codec,
)
from broker.storage.segments import SegFile, SegmentCache

from .helpers import entries, read_all

BIG_WAL = StorageConfig(wal_max_size_bytes=64 << 20, segment_max_entries=8)
N = 30


def _wal_dir_with(path: Path, layout: str) -> Path:
    """A closed node whose WAL holds group a's and b's entries 1..N (in `layout`
    order: "interleaved" or "a-then-b"). close() leaves the WAL unflushed."""
    with LogManager.open(path, BIG_WAL) as m:
        a, b = m.open_group("a"), m.open_group("b")
        if layout == "interleaved":
            for i in range(1, N + 1):
                a.append(entries("a", i, i + 1, 1))
                b.append(entries("b", i, i + 1, 1))
                m.sync()
        else:
            for log, g in ((a, "a"), (b, "b")):
                for i in range(1, N + 1):
                    log.append(entries(g, i, i + 1, 1))
                    m.sync()
    (wal,) = (path / "wal").iterdir()
    return wal


def _segment_dir_with(path: Path) -> list[Path]:
    """Groups a and b with entries 1..N in segment files (a restart flushes the WAL)."""
    _wal_dir_with(path, "interleaved")
    LogManager.open(path, BIG_WAL).close()
    return sorted((path / "groups" / "a" / "segments").iterdir())


def _check_prefix_or_error(m: LogManager, group: str) -> str:
    """'error' if the group reports corruption, else 'full'/'prefix' after
    checking every served entry is exactly one that was written."""
    try:
        log = m.open_group(group)
        got = read_all(log)
    except CorruptionError:
        return "error"
    except GroupFailedError:
        return "error"
    assert got == entries(group, 1, len(got) + 1, 1), f"{group} served a wrong entry"
    return "full" if len(got) == N else "prefix"


def test_wal_truncated_at_random_byte_recovers_a_prefix(tmp_path: Path) -> None:
    wal = _wal_dir_with(tmp_path / "orig", "interleaved")
    size = wal.stat().st_size
    rng = random.Random(7)
    seen = set()
    for trial in range(20):
        d = tmp_path / f"t{trial}"
        shutil.copytree(tmp_path / "orig", d)
        cut = rng.randrange(0, size)
        os.truncate(d / "wal" / wal.name, cut)
        with LogManager.open(d, BIG_WAL) as m:
            for g in ("a", "b"):
                outcome = _check_prefix_or_error(m, g)
                assert outcome != "error", "a torn tail is not corruption"
                seen.add(outcome)
    assert "prefix" in seen


def test_wal_bit_flip_is_reported_or_cut_never_served(tmp_path: Path) -> None:
    wal = _wal_dir_with(tmp_path / "orig", "a-then-b")
    data = wal.read_bytes()
    rng = random.Random(11)
    errors = 0
    for trial in range(24):
        d = tmp_path / f"t{trial}"
        shutil.copytree(tmp_path / "orig", d)
        # flip a bit inside group a's records (never the last record of the file)
        pos = rng.randrange(16, len(data) // 2)
        buf = bytearray(data)
        buf[pos] ^= 1 << rng.randrange(8)
        (d / "wal" / wal.name).write_bytes(bytes(buf))
        with LogManager.open(d, BIG_WAL) as m:
            out_a = _check_prefix_or_error(m, "a")
            out_b = _check_prefix_or_error(m, "b")
        # records of both groups follow the damage: neither may silently lose them
        assert out_a == "error" and out_b == "error", (pos, out_a, out_b)
        errors += 1
        # the failure is remembered across restarts (the WAL is gone by now)
        with LogManager.open(d, BIG_WAL) as m, pytest.raises(CorruptWalError):
            m.open_group("a")
    assert errors == 24


def test_wal_bit_flip_in_one_groups_tail_spares_the_other(tmp_path: Path) -> None:
    wal = _wal_dir_with(tmp_path / "orig", "a-then-b")
    data = wal.read_bytes()
    d = tmp_path / "t"
    shutil.copytree(tmp_path / "orig", d)
    buf = bytearray(data)
    buf[len(data) - 200] ^= 0x10  # inside b's last record(s)
    (d / "wal" / wal.name).write_bytes(bytes(buf))
    with LogManager.open(d, BIG_WAL) as m:
        assert _check_prefix_or_error(m, "a") == "full"
        assert _check_prefix_or_error(m, "b") in ("prefix", "error")


def test_torn_header_of_newest_wal_is_ignored(tmp_path: Path) -> None:
    _wal_dir_with(tmp_path, "interleaved")
    (tmp_path / "wal" / f"{99:020d}.wal").write_bytes(b"QQW")
    with LogManager.open(tmp_path, BIG_WAL) as m:
        assert _check_prefix_or_error(m, "a") == "full"
        assert len(m.wal_files()) == 1


def test_segment_truncated_at_random_byte_stops_only_that_group(tmp_path: Path) -> None:
    segs = _segment_dir_with(tmp_path / "orig")
    rng = random.Random(3)
    for trial in range(15):
        d = tmp_path / f"t{trial}"
        shutil.copytree(tmp_path / "orig", d)
        victim = d / "groups" / "a" / "segments" / rng.choice(segs).name
        os.truncate(victim, rng.randrange(0, victim.stat().st_size))
        with LogManager.open(d, BIG_WAL) as m:
            with pytest.raises(CorruptSegmentError):
                read_all(m.open_group("a"))
            assert _check_prefix_or_error(m, "b") == "full"


def test_segment_bit_flip_is_detected_and_stops_only_that_group(tmp_path: Path) -> None:
    segs = _segment_dir_with(tmp_path / "orig")
    rng = random.Random(5)
    outcomes = []
    for trial in range(20):
        d = tmp_path / f"t{trial}"
        shutil.copytree(tmp_path / "orig", d)
        victim = d / "groups" / "a" / "segments" / rng.choice(segs).name
        buf = bytearray(victim.read_bytes())
        pos = rng.randrange(len(buf))
        buf[pos] ^= 1 << rng.randrange(8)
        victim.write_bytes(bytes(buf))
        with LogManager.open(d, BIG_WAL) as m:
            outcome = _check_prefix_or_error(m, "a")
            # a flip in the unused, preallocated index slots changes nothing
            assert outcome in ("error", "full"), outcome
            if outcome == "error" and "a" in [g for g in m._groups]:
                with pytest.raises(GroupFailedError):
                    m._groups["a"].last_index()
            assert _check_prefix_or_error(m, "b") == "full"
        outcomes.append(outcome)
    assert outcomes.count("error") >= 5


def test_half_written_snapshot_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    with LogManager.open(tmp_path, BIG_WAL) as m:
        log = m.open_group("a")
        log.append(entries("a", 1, 21, 1))
        log.save_snapshot(5, 1, b"c5", b"state5")
        log.save_snapshot(9, 1, b"c9", b"state9")
    snapdir = tmp_path / "groups" / "a" / "snapshots"
    newest = sorted(snapdir.iterdir())[-1]
    # a crash mid-write leaves a tmp file; a damaged final file must not win either
    (snapdir / (f"{15:020d}_{1:020d}.snapshot.tmp")).write_bytes(newest.read_bytes()[:30])
    (snapdir / (f"{12:020d}_{1:020d}.snapshot")).write_bytes(newest.read_bytes()[:-3])
    with LogManager.open(tmp_path, BIG_WAL) as m:
        log = m.open_group("a")
        snap = log.latest_snapshot()
        assert snap is not None and (snap.meta.index, snap.data) == (9, b"state9")
        assert not any(p.name.endswith(".tmp") for p in snapdir.iterdir())
    # flip a bit in snapshot 9: the previous one (5) is kept as a fallback
    buf = bytearray(newest.read_bytes())
    buf[-1] ^= 1
    newest.write_bytes(bytes(buf))
    with LogManager.open(tmp_path, BIG_WAL) as m:
        snap = m.open_group("a").latest_snapshot()
        assert snap is not None and (snap.meta.index, snap.data) == (5, b"state5")


def test_corrupt_newest_snapshot_after_the_log_was_released_stops_the_group(tmp_path: Path) -> None:
    """Issue 10 defect 10: falling back to an older snapshot is only sound
    while the log still holds every entry after it. Here segments up to the
    newest snapshot (20) were released, so snapshot 5 plus the log would skip
    entries 6..: the group must refuse to open, not serve a gap."""
    cfg = StorageConfig(wal_max_size_bytes=1024, segment_max_entries=4)
    with LogManager.open(tmp_path, cfg) as m:
        log = m.open_group("a")
        log.append(entries("a", 1, 31, 1))
        m.sync()
        assert m.wait_flushed(10)
        log.save_snapshot(5, 1, b"c5", b"state5")
        log.save_snapshot(20, 1, b"c20", b"state20")
        assert log.release(21) > 0 and log.first_index() > 6
    snapdir = tmp_path / "groups" / "a" / "snapshots"
    newest = sorted(snapdir.iterdir())[-1]
    buf = bytearray(newest.read_bytes())
    buf[-1] ^= 1
    newest.write_bytes(bytes(buf))
    with LogManager.open(tmp_path, cfg) as m:
        with pytest.raises(CorruptSnapshotError, match="no longer holds"):
            m.open_group("a")
        m.open_group("b").append(entries("b", 1, 3, 1))  # other groups unaffected


def test_a_slot_whose_term_went_bad_is_never_served(tmp_path: Path) -> None:
    """An index slot has no checksum of its own; its entry's crc covers its
    term. A term raised on disk (still non-decreasing, so the structure
    checks pass) would let a stale log win an election: `term()` checks the
    entry first, and the group stops instead of answering."""
    segs = _segment_dir_with(tmp_path)
    last = segs[-1]
    buf = bytearray(last.read_bytes())
    _flags, _max, count = codec.decode_segment_header(bytes(buf[: codec.SEG_HEADER_SIZE]), str(last))
    pos = codec.SEG_HEADER_SIZE + (count - 1) * codec.SEG_SLOT_SIZE
    idx, term, offset, length, crc = codec.SEG_SLOT.unpack_from(buf, pos)
    codec.SEG_SLOT.pack_into(buf, pos, idx, term + 5, offset, length, crc)
    last.write_bytes(bytes(buf))
    with LogManager.open(tmp_path, BIG_WAL) as m:
        with pytest.raises((CorruptionError, GroupFailedError)):
            log = m.open_group("a")
            log.term(idx)  # never term + 5
        with pytest.raises(GroupFailedError):
            log.term(idx)
        assert _check_prefix_or_error(m, "b") == "full"


def test_a_compacted_segment_whose_index_went_bad_is_not_a_hole(tmp_path: Path) -> None:
    """In a compacted (sparse) segment a missing index is a compacted hole.
    A slot index changed on disk (still increasing) must not pass for one:
    such a file is checked whole when its reader opens."""
    path = tmp_path / f"{1:020d}.segment"
    buf = bytearray(codec.encode_segment(3, [(1, 1, 0, b"a"), (7, 2, 0, b"bb"), (9, 2, 0, b"ccc")],
                                         reset=True, sparse=True))
    pos = codec.SEG_HEADER_SIZE + codec.SEG_SLOT_SIZE  # the slot of entry 7
    _idx, term, offset, length, crc = codec.SEG_SLOT.unpack_from(buf, pos)
    path.write_bytes(bytes(buf))
    seg = SegFile(1, str(path), 1, 9, True, True)
    assert SegmentCache(4).reader(seg).checked_term(7) == 2  # intact: served
    codec.SEG_SLOT.pack_into(buf, pos, 8, term, offset, length, crc)
    path.write_bytes(bytes(buf))
    with pytest.raises(CorruptSegmentError):
        SegmentCache(4).reader(SegFile(1, str(path), 1, 9, True, True))
