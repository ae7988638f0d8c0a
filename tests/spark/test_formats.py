"""The audit's file decoding against files written by the real storage layer
(broker.storage.LogManager), and against the storage layer's own offline
accounting (broker.storage.scan_node). No Spark here."""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from broker.storage import Entry, HardState, LogManager, StorageConfig, scan_node
from broker.storage.errors import CorruptSegmentError
from spark import formats as fm
from spark import io as sio


def write_node(root: Path, seed: int = 3) -> None:
    """Three groups, overwrites and a snapshot, across many WAL roll-overs."""
    rng = random.Random(seed)
    mgr = LogManager.open(root, StorageConfig(wal_max_size_bytes=8192, segment_max_entries=8,
                                         sync_method="none"), rng=random.Random(seed))
    logs = [mgr.open_group(f"/q{i}/1") for i in range(3)]
    for n in range(1, 121):
        for log in logs:
            log.append([Entry(n, 1, rng.randbytes(rng.randint(10, 300)))])
    logs[0].append([Entry(100, 2, b"overwrite")])  # truncates 100..120
    logs[1].save_snapshot(90, 1, b"cfg", b"state")
    for log in logs:
        log.set_hard_state(HardState(2, None, 90))
    mgr.sync()
    mgr.wait_flushed()
    mgr.close()


def test_segment_headers_match_the_storage_layer(tmp_path: Path) -> None:
    write_node(tmp_path)
    roots = sio.discover(str(tmp_path))
    assert [r.uri for r in roots] == [str(tmp_path)]
    listing = sio.list_root(roots[0])
    rows = [r for t in listing.tasks for r in sio.parse_task(t)]
    segs = {(r["group_id"], r["file"]): r for r in rows if r["kind"] == "segment"}
    expected = {(g.group_id, os.path.basename(s.path)): (g, s) for g in scan_node(str(tmp_path))
                for s in g.segments}
    assert segs.keys() == expected.keys() and len(segs) > 20
    for key, r in segs.items():
        g, s = expected[key]
        assert (r["seq"], r["first_index"], r["last_index"], r["entries"], r["max_entries"],
                r["reset"], r["data_bytes"]) == (s.seq, s.first, s.last, s.count, s.max_count,
                                                 s.reset, s.data_bytes)
        assert r["bytes"] == os.stat(s.path).st_size == s.file_bytes
        assert (r["log_first"], r["log_last"]) == (s.live if s.live else (None, None))
        # headers and used index slots only, never the entries
        assert r["bytes_read"] == 16 + 32 * s.count < r["bytes"]
    snaps = [r for r in rows if r["kind"] == "snapshot"]
    assert [(r["group_id"], r["index"]) for r in snaps] == [("/q1/1", 90)]


def test_wal_walk_counts_every_record(tmp_path: Path) -> None:
    write_node(tmp_path)
    (wal,) = (tmp_path / "wal").iterdir()
    r = fm.LocalReader(str(wal))
    w = fm.read_wal(r, wal.name)
    assert not w.torn and w.end == wal.stat().st_size == w.bytes
    assert sum(a[1] for a in w.groups.values()) == w.bytes - 16
    assert set(w.groups) == {"/q0/1", "/q1/1", "/q2/1"}
    # Torn tail: a half record at the end is reported, the rest still counted.
    with open(wal, "ab") as f:
        f.write(b"\x00" * 20)
    w2 = fm.read_wal(fm.LocalReader(str(wal)), wal.name)
    assert w2.torn and w2.records == w.records


def test_corrupt_and_vanished_files_are_reported_per_file(tmp_path: Path) -> None:
    write_node(tmp_path)
    segs = sorted((tmp_path / "groups").glob("*/segments/*.segment"))
    bad_header, truncated = segs[0], segs[5]
    data = bytearray(bad_header.read_bytes())
    data[3] ^= 0xFF
    bad_header.write_bytes(bytes(data))
    os.truncate(truncated, 40)
    with pytest.raises(CorruptSegmentError):
        fm.read_segment(fm.LocalReader(str(bad_header)), bad_header.name)
    listing = sio.list_root(sio.discover(str(tmp_path))[0])
    gone = segs[9]
    gone.unlink()  # deleted by a running node after the listing: silently skipped
    rows = [r for t in listing.tasks for r in sio.parse_task(t)]
    problems = {r["path"]: r["error"] for r in rows if r["kind"] == "problem"}
    assert set(problems) == {str(bad_header), str(truncated)}
    assert "magic" in problems[str(bad_header)]
    assert sum(1 for r in rows if r["kind"] == "segment") == len(segs) - 3


def test_discovery_of_make_run_layout(tmp_path: Path) -> None:
    for n in ("rabbit-1", "rabbit-2"):
        write_node(tmp_path / n / "raft")
    (tmp_path / "rabbit-1.log").write_text("x")
    roots = sio.discover(str(tmp_path))
    assert [(r.node, r.uri) for r in roots] == [
        ("rabbit-1", str(tmp_path / "rabbit-1" / "raft")),
        ("rabbit-2", str(tmp_path / "rabbit-2" / "raft"))]
    named = sio.discover(f"rabbit-1@h={tmp_path / 'rabbit-1'}")
    assert [r.node for r in named] == ["rabbit-1@h"]
    sio.resolve_node_names(roots, {"rabbit-1@127.0.0.1", "rabbit-2@127.0.0.1"})
    assert [r.node for r in roots] == ["rabbit-1@127.0.0.1", "rabbit-2@127.0.0.1"]
