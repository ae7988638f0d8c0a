"""Crash tests: a forked child appends (with overwrites, hard states,
snapshots, snapshot installs that restart the log, releases, roll-overs) and reports every durability callback down a
pipe; the parent SIGKILLs it at a random moment (during recovery, or after a
random number of durable reports), recovers the directory, and checks:

- every entry reported durable (and not overwritten since) is present, intact;
- nothing that was never written appears (content is a function of
  group/index/term, so any invented or corrupt entry fails the check);
- recovered hard state and snapshot are ones that were written, and the
  snapshot is at least the last one whose save_snapshot() returned.

Real files, real fdatasync, seeded randomness. 200 kills per run.
"""
from __future__ import annotations

import os
import random
import select
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.storage import Entry, HardState, LogManager, StorageConfig

from .helpers import payload

GROUPS = ["q1", "%2F/q2", "q3"]
CFG = StorageConfig(wal_max_size_bytes=8 * 1024, segment_max_entries=32)
KILLS = 200


def _child(path: Path, wfd: int, seed: int) -> None:  # pragma: no cover - runs in the child
    rng = random.Random(seed)

    def out(line: str) -> None:
        os.write(wfd, (line + "\n").encode())

    def on_durable(g: str, i: int, t: int) -> None:
        out(f"D {g} {i} {t}")

    try:
        m = LogManager.open(path, CFG, on_durable=on_durable, rng=rng)
        logs = {g: m.open_group(g) for g in GROUPS}
        term = {}
        for g, log in logs.items():
            # term(last) is defined for the last entry and for a snapshot at
            # last (an installed snapshot leaves no entry at or below it)
            t = log.term(log.last_index()) if log.last_index() >= max(1, log.first_index() - 1) else 0
            term[g] = max(1, t, log.hard_state().term)
        out("R")
        while True:
            g = rng.choice(GROUPS)
            log = logs[g]
            last, first = log.last_index(), log.first_index()
            snap = log.snapshot_meta()
            snap_index = snap.index if snap else 0
            r = rng.random()
            if r < 0.08 and last >= first and last > snap_index:
                f = max(first, snap_index + 1, last - rng.randint(0, 6))
                term[g] += 1
                n = rng.randint(1, 4)
                out(f"A {g} {f} {n} {term[g]}")
                log.append([Entry(i, term[g], payload(g, i, term[g])) for i in range(f, f + n)])
            elif r < 0.14:
                vote = rng.choice(["-", "n1", "n2"])
                commit = rng.randint(0, 100)
                out(f"H {g} {term[g]} {vote} {commit}")
                log.set_hard_state(HardState(term[g], None if vote == "-" else vote, commit))
            elif r < 0.20 and log.durable_index() > snap_index and log.durable_index() >= first:
                idx = rng.randint(max(first, snap_index + 1), log.durable_index())
                t = log.term(idx)
                out(f"S {g} {idx} {t}")
                log.save_snapshot(idx, t, b"cfg", f"state-{g}-{idx}-{t}".encode())
                out(f"s {g} {idx} {t}")
            elif r < 0.22:
                # a follower installs a snapshot past its log: the next append restarts it
                idx = max(last, snap_index) + rng.randint(1, 5)
                term[g] += 1
                out(f"I {g} {idx} {term[g]}")
                log.save_snapshot(idx, term[g], b"cfg", f"state-{g}-{idx}-{term[g]}".encode())
                out(f"s {g} {idx} {term[g]}")
            elif r < 0.28 and snap is not None:
                live = rng.randint(max(1, snap_index - 20), last + 1)
                out(f"L {g} {min(live, snap_index + 1)}")
                log.release(live)
            else:
                n = rng.randint(1, 8)
                out(f"A {g} {last + 1} {n} {term[g]}")
                log.append([Entry(i, term[g], payload(g, i, term[g]))
                            for i in range(last + 1, last + 1 + n)])
            if log.last_index() - log.durable_index() > 200:
                m.sync()
    except BaseException as exc:
        out(f"E {exc!r}")
        os._exit(1)


@dataclass
class GroupTrack:
    intended: dict[int, int] = field(default_factory=dict)  # index -> term of the current log
    durable_upto: int = 0
    written: set[tuple[int, int]] = field(default_factory=set)
    hard_states: set[HardState] = field(default_factory=lambda: {HardState()})
    snapshots: set[tuple[int, int]] = field(default_factory=set)
    snapshot_done: int = 0
    release_bound: int = 0


def _apply(tracks: dict[str, GroupTrack], line: str) -> None:
    parts = line.split()
    kind = parts[0]
    if kind == "E":
        raise AssertionError(f"child failed: {line}")
    if kind == "R":
        return
    t = tracks[parts[1]]
    if kind == "A":
        f, n, term = int(parts[2]), int(parts[3]), int(parts[4])
        for i in [i for i in t.intended if i >= f]:
            del t.intended[i]
        t.durable_upto = min(t.durable_upto, f - 1)
        for i in range(f, f + n):
            t.intended[i] = term
            t.written.add((i, term))
    elif kind == "D":
        i, term = int(parts[2]), int(parts[3])
        if t.intended.get(i) == term:
            t.durable_upto = max(t.durable_upto, i)
    elif kind == "H":
        vote = None if parts[3] == "-" else parts[3]
        t.hard_states.add(HardState(int(parts[2]), vote, int(parts[4])))
    elif kind == "S":
        t.snapshots.add((int(parts[2]), int(parts[3])))
    elif kind == "I":  # snapshot install: entries up to it need not survive any more
        t.snapshots.add((int(parts[2]), int(parts[3])))
        t.release_bound = max(t.release_bound, int(parts[2]) + 1)
    elif kind == "s":
        t.snapshot_done = max(t.snapshot_done, int(parts[2]))
    elif kind == "L":
        t.release_bound = max(t.release_bound, int(parts[2]))


def _run_child_and_kill(path: Path, rng: random.Random, tracks: dict[str, GroupTrack]) -> int:
    rfd, wfd = os.pipe()
    seed = rng.getrandbits(32)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(rfd)
        _child(path, wfd, seed)
        os._exit(0)
    os.close(wfd)
    # random moment: right away (mid-recovery), or after a random number of durable reports
    target = -1 if rng.random() < 0.1 else rng.randint(0, 15)
    reports = 0
    buf = b""
    killed = False
    try:
        if target < 0:
            os.kill(pid, signal.SIGKILL)
            killed = True
        while True:
            if not killed:
                ready, _, _ = select.select([rfd], [], [], 30)
                assert ready, "child made no progress for 30 s"
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            buf += chunk
            *lines, rest = buf.split(b"\n")
            buf = rest
            for raw in lines:
                line = raw.decode()
                _apply(tracks, line)
                if line.startswith("D"):
                    reports += 1
                if not killed and reports >= target and (line.startswith("D") or target == 0):
                    os.kill(pid, signal.SIGKILL)
                    killed = True
    finally:
        if not killed:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(rfd)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"child exited by itself: {status}"
    )
    return reports


def _verify(path: Path, tracks: dict[str, GroupTrack]) -> None:
    with LogManager.open(path, CFG) as m:
        for g in GROUPS:
            t = tracks[g]
            log = m.open_group(g)
            first, last = log.first_index(), log.last_index()
            snap = log.snapshot_meta()
            log_last = log.last_entry_index()
            got = log.entries(first, log_last + 1) if log_last >= first else []
            prev_term = 0
            for e in got:
                assert (e.index, e.term) in t.written, f"{g}: entry {e.index}/{e.term} never written"
                assert e.data == payload(g, e.index, e.term), f"{g}: entry {e.index} corrupt"
                assert e.term >= prev_term
                prev_term = e.term
            recovered = {e.index: e.term for e in got}
            for i in range(max(1, t.release_bound), t.durable_upto + 1):
                assert recovered.get(i) == t.intended[i], (
                    f"{g}: durable entry {i} (term {t.intended[i]}) lost: got {recovered.get(i)}"
                )
            assert log.hard_state() in t.hard_states
            if t.snapshot_done:
                assert snap is not None and snap.index >= t.snapshot_done
            if snap is not None:
                assert (snap.index, snap.term) in t.snapshots
                full = log.latest_snapshot()
                assert full is not None
                assert full.data == f"state-{g}-{snap.index}-{snap.term}".encode()
            assert last >= (snap.index if snap else 0)
            # the next incarnation starts from exactly what was recovered
            t.intended = dict(recovered)
            t.durable_upto = max(recovered, default=0)


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing_durable(tmp_path: Path) -> None:
    rng = random.Random(20261122)
    tracks = {g: GroupTrack() for g in GROUPS}
    total_reports = 0
    for _ in range(KILLS):
        total_reports += _run_child_and_kill(tmp_path, rng, tracks)
        _verify(tmp_path, tracks)
    # the loop really exercised durability, roll-over and segments
    assert total_reports > KILLS
    assert any(os.listdir(tmp_path / "groups" / d / "segments") for d in os.listdir(tmp_path / "groups"))
