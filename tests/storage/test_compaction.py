"""Compaction (GroupLog.compact): a few live entries below the snapshot no
longer pin every segment after them. Real files, real fdatasync.

The crash tests kill a forked child with SIGKILL at each step of a
compaction (and at random moments of a write/snapshot/compact/release loop)
and check, after recovery, that every entry that was live at the last
compaction started is served intact, every entry above the snapshot is
there, and nothing else is served wrongly.
"""
from __future__ import annotations

import functools
import hashlib
import os
import random
import select
import signal
from pathlib import Path

import pytest

from broker.storage import (
    CompactedError,
    CorruptSegmentError,
    CorruptSnapshotError,
    Entry,
    LogManager,
    StorageConfig,
    codec,
    scan_node,
)

from .helpers import entries, manager, payload

CFG = StorageConfig(wal_max_size_bytes=4096, segment_max_entries=16)
G = "%2F/pinned"


def _fill(m: LogManager, lo: int, hi: int, term: int = 1) -> None:
    log = m.open_group(G) if G not in m._groups else m._groups[G]
    for k in range(lo, hi, 50):
        log.append(entries(G, k, min(k + 50, hi), term))
    m.sync()
    # one more roll-over: everything appended so far is flushed into segments
    log.append(entries(G, hi, hi + 60, term))
    m.sync()
    assert m.wait_flushed(10)


def _segdir(path: Path) -> Path:
    return path / "groups" / codec.encode_group_dir(G) / "segments"


def _files(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(_segdir(path)) if n.endswith(".segment"))


def test_compact_keeps_live_entries_and_frees_the_pinned_log(tmp_path: Path) -> None:
    with manager(tmp_path, CFG) as m:
        _fill(m, 1, 2000)
        log = m._groups[G]
        log.save_snapshot(1990, 1, b"cfg", b"state")
        assert log.release(5) == 0  # entry 5 pins everything
        before = _files(tmp_path)
        assert len(before) > 100
        live = [5, 777, 1500, 1995]  # 1995 is above the snapshot: not touched
        assert log.compaction_span() > 1000
        replaced = log.compact(live)
        after = _files(tmp_path)
        assert replaced > 100 and len(after) < 10, after
        for i in (5, 777, 1500):
            assert log.entries(i, i + 1) == [Entry(i, 1, payload(G, i, 1))]
            assert log.term(i) == 1
        for i in (6, 776, 1000, 1501):
            with pytest.raises(CompactedError):
                log.entries(i, i + 1)
            with pytest.raises(CompactedError):
                log.term(i)
        # everything from the snapshot on is untouched
        assert [e.index for e in log.entries(1990, 2060)] == list(range(1990, 2060))
        assert log.term(1990) == 1
        assert log.compaction_span() == 0
        assert log.compact(live) == 0  # nothing more to gain
    # after a restart: same answers, the audit's reader sees a sparse segment
    with manager(tmp_path, CFG) as m:
        log = m.open_group(G)
        assert log.entries(777, 778)[0].data == payload(G, 777, 1)
        with pytest.raises(CompactedError):
            log.entries(778, 779)
        assert [e.index for e in log.entries(1990, 2060)] == list(range(1990, 2060))
        info = scan_node(str(tmp_path))[0]
        first = info.segments[0]
        assert first.live is not None and first.live[0] == 1 and first.count < 10
        # once the pinning message is gone, release deletes the compacted file
        log.save_snapshot(2000, 1, b"cfg", b"state2")
        assert log.release(2001) >= 1
        assert log.first_index() > 1500


def test_compacted_segment_format_and_audit_reader(tmp_path: Path) -> None:
    from spark import formats as fm

    buf = codec.encode_segment(3, [(1, 1, 0, b"a"), (7, 2, 0, b"bb"), (9, 2, 0, b"")],
                               reset=True, sparse=True)
    flags, max_count, count = codec.decode_segment_header(buf, "t")
    assert flags == codec.SEG_FLAG_RESET | codec.SEG_FLAG_SPARSE and max_count == count == 3
    slots = codec.decode_segment_index(buf[16:], count, len(buf), "t", sparse=True)
    assert [s.idx for s in slots] == [1, 7, 9]
    with pytest.raises(CorruptSegmentError):  # a reader that ignores the flag refuses it
        codec.decode_segment_index(buf[16:], count, len(buf), "t")
    bad = codec.encode_segment(2, [(5, 1, 0, b"a"), (5, 1, 0, b"b")], sparse=True)
    with pytest.raises(CorruptSegmentError):
        codec.decode_segment_index(bad[16:], 2, len(bad), "t", sparse=True)
    p = tmp_path / f"{4:020d}.segment"
    p.write_bytes(buf)
    r = fm.LocalReader(str(p))
    h = fm.read_segment(r, p.name)
    r.close()
    assert (h.first_index, h.last_index, h.entries, h.reset) == (1, 9, 3, True)


def test_compaction_repeats_as_the_log_grows(tmp_path: Path) -> None:
    with manager(tmp_path, CFG) as m:
        _fill(m, 1, 600)
        log = m._groups[G]
        log.save_snapshot(590, 1, b"cfg", b"s")
        assert log.compact([3]) > 0
        n1 = len(_files(tmp_path))
        log.append(entries(G, 660, 1400, 1))
        m.sync()
        log.append(entries(G, 1400, 1460, 1))
        m.sync()
        assert m.wait_flushed(10)
        log.save_snapshot(1390, 1, b"cfg", b"s2")
        assert log.compact([3, 1000]) > 1
        assert len(_files(tmp_path)) <= n1 + 2
        assert log.entries(3, 4)[0].data == payload(G, 3, 1)
        assert log.entries(1000, 1001)[0].data == payload(G, 1000, 1)
        assert [e.index for e in log.entries(1390, 1460)] == list(range(1390, 1460))


def test_no_compaction_when_most_entries_are_live(tmp_path: Path) -> None:
    with manager(tmp_path, CFG) as m:
        _fill(m, 1, 400)
        log = m._groups[G]
        log.save_snapshot(390, 1, b"cfg", b"s")
        before = _files(tmp_path)
        assert log.compact([i for i in range(1, 390) if i % 3]) == 0  # under the 50 % gain
        assert _files(tmp_path) == before
        assert log.compact(range(1, 390)) == 0
        assert [e.index for e in log.entries(1, 400)] == list(range(1, 400))


def test_no_compaction_without_snapshot_and_snapshot_entry_kept(tmp_path: Path) -> None:
    with manager(tmp_path, CFG) as m:
        _fill(m, 1, 400)
        log = m._groups[G]
        assert log.compact([]) == 0
        log.save_snapshot(200, 1, b"cfg", b"s")
        assert log.compact([]) > 0
        assert log.term(200) == 1
        assert log.entries(200, 201)[0].index == 200  # the snapshot's entry is kept
        assert log.first_index() == 1  # first entry of the range is kept


def test_fallback_to_an_older_snapshot_refused_over_a_compacted_range(tmp_path: Path) -> None:
    with manager(tmp_path, CFG) as m:
        _fill(m, 1, 800)
        log = m._groups[G]
        log.save_snapshot(100, 1, b"cfg", b"old")
        log.save_snapshot(700, 1, b"cfg", b"new")
        assert log.compact([50]) > 0
    snapdir = tmp_path / "groups" / codec.encode_group_dir(G) / "snapshots"
    newest = sorted(os.listdir(snapdir))[-1]
    assert newest.startswith(f"{700:020d}")
    with open(snapdir / newest, "r+b") as f:
        f.seek(45)
        f.write(b"\xff")
    with manager(tmp_path, CFG) as m, pytest.raises(CorruptSnapshotError):
        m.open_group(G)


# ------------------------------------------------------------------ crashes
CRASH_CFG = StorageConfig(wal_max_size_bytes=4096, segment_max_entries=16)
STAGES = ["written", "renamed", "dir_synced", "unlinked"]


@functools.cache
def _death(i: int) -> int:
    """The compaction round after which entry i is dead: most entries die at
    once, some live a few rounds, a few for ever (shrinking live sets, as a
    queue's)."""
    h = hashlib.blake2b(str(i).encode(), digest_size=4).digest()
    v = int.from_bytes(h, "little")
    if v % 53 == 0:
        return 1 << 30
    if v % 11 == 0:
        return 1 + v % 7
    return 0


def _live(upto: int, rnd: int) -> list[int]:
    return [i for i in range(1, upto + 1) if _death(i) > rnd]


def _crash_child(path: Path, wfd: int, seed: int, rnd: int, stage: str | None
                 ) -> None:  # pragma: no cover - runs in the child
    rng = random.Random(seed)

    def out(line: str) -> None:
        os.write(wfd, (line + "\n").encode())

    try:
        m = LogManager.open(path, CRASH_CFG, on_durable=lambda g, i, t: out(f"D {i}"), rng=rng)
        log = m.open_group(G)
        if stage is not None:
            def hook(at: str) -> None:
                if at == stage:
                    out(f"K {at}")
                    os.kill(os.getpid(), signal.SIGKILL)
            log._compact_hook = hook
        out("R")
        while True:
            last = log.last_index()
            snap = log.snapshot_meta()
            r = rng.random()
            if r < 0.1 and log.durable_index() > (snap.index if snap else 0) + 20:
                idx = log.durable_index() - rng.randint(0, 10)
                log.save_snapshot(idx, 1, b"cfg", b"s")
                out(f"S {idx}")
            elif r < 0.2 and snap is not None:
                rnd += 1
                out(f"C {rnd}")
                log.compact(_live(snap.index, rnd))
                out(f"c {rnd}")
            elif r < 0.23 and snap is not None:
                live = _live(snap.index, rnd)
                log.release(live[0] if live else snap.index + 1)
            else:
                n = rng.randint(1, 12)
                log.append(entries(G, last + 1, last + 1 + n, 1))
            if log.last_index() - log.durable_index() > 100:
                m.sync()
    except BaseException as exc:
        out(f"E {exc!r}")
        os._exit(1)


class _Track:
    def __init__(self) -> None:
        self.durable = 0
        self.snap = 0
        self.rnd = 0  # compaction rounds started
        self.stage_kills = 0


def _run(path: Path, rng: random.Random, t: _Track, stage: str | None) -> None:
    rfd, wfd = os.pipe()
    seed = rng.getrandbits(32)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(rfd)
        _crash_child(path, wfd, seed, t.rnd, stage)
        os._exit(0)
    os.close(wfd)
    target = 20_000 if stage is not None else rng.randint(0, 30)
    reports = 0
    killed = False
    buf = b""
    try:
        while True:
            if not killed:
                ready, _, _ = select.select([rfd], [], [], 30)
                assert ready, "child made no progress for 30 s"
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                kind, _, arg = raw.decode().partition(" ")
                if kind == "E":
                    raise AssertionError(f"child failed: {arg}")
                if kind == "D":
                    t.durable = max(t.durable, int(arg))
                    reports += 1
                elif kind == "S":
                    t.snap = max(t.snap, int(arg))
                elif kind == "C":
                    t.rnd = int(arg)
                elif kind == "K":
                    t.stage_kills += 1
                if not killed and reports >= target:
                    os.kill(pid, signal.SIGKILL)
                    killed = True
    finally:
        if not killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, status = os.waitpid(pid, 0)
        os.close(rfd)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


def _verify(path: Path, t: _Track) -> None:
    with LogManager.open(path, CRASH_CFG) as m:
        log = m.open_group(G)
        snap = log.snapshot_meta()
        s = snap.index if snap else 0
        assert s >= t.snap  # save_snapshot() returned: durable
        last = log.last_entry_index()
        assert last >= t.durable
        live = set(_live(s, t.rnd))
        for i in range(log.first_index(), last + 1):
            try:
                got = log.entries(i, i + 1)
            except CompactedError:
                assert i < s and i not in live, f"entry {i} lost (snapshot {s}, round {t.rnd})"
                continue
            assert got == [Entry(i, 1, payload(G, i, 1))], f"entry {i} wrong"
        # the live entries below the snapshot that release did not reclaim
        for i in live:
            if i >= log.first_index():
                assert log.entries(i, i + 1)[0].data == payload(G, i, 1)
        t.durable = last
        t.snap = s
    assert not [n for n in os.listdir(_segdir(path)) if n.endswith(".tmp")]


@pytest.mark.parametrize("stage", STAGES)
def test_sigkill_at_each_step_of_compaction(tmp_path: Path, stage: str) -> None:
    rng = random.Random(1000 + STAGES.index(stage))
    t = _Track()
    for _ in range(3):
        _run(tmp_path, rng, t, stage)
        _verify(tmp_path, t)
    assert t.stage_kills == 3


@pytest.mark.slow
def test_sigkill_at_random_moments_of_compaction(tmp_path: Path) -> None:
    rng = random.Random(20261123)
    t = _Track()
    for _ in range(40):
        _run(tmp_path, rng, t, None)
        _verify(tmp_path, t)
    assert t.rnd > 20
