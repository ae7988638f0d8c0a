"""The offline inspector (for the Spark audit) reads headers/indexes only and
computes the same live ranges the LogManager serves."""
from __future__ import annotations

from pathlib import Path

from broker.storage import LogManager, StorageConfig, scan_node

from .helpers import entries, read_all


def test_scan_node_live_ranges_match_what_the_log_serves(tmp_path: Path) -> None:
    cfg = StorageConfig(wal_max_size_bytes=1024, segment_max_entries=4,
                        stagger_first_roll_over=False)
    with LogManager.open(tmp_path, cfg) as m:
        a, b = m.open_group("%2F/a"), m.open_group("b")
        a.append(entries("a", 1, 30, 1))
        b.append(entries("b", 1, 10, 1))
        m.sync()
        assert m.wait_flushed(10)
        a.append(entries("a", 12, 16, 2))  # overwrite reaching into segments
        a.save_snapshot(8, 1, b"c", b"s")
    LogManager.open(tmp_path, cfg).close()  # a restart flushes the WAL into segments
    groups = {g.group_id: g for g in scan_node(str(tmp_path))}
    assert set(groups) == {"%2F/a", "b"}
    ga = groups["%2F/a"]
    assert (ga.snapshot_index, ga.snapshot_term, ga.corrupt) == (8, 1, None)
    assert all(s.max_count == 4 and 1 <= s.count <= 4 for s in ga.segments)
    assert all(s.file_bytes == 16 + 4 * 32 + s.data_bytes for s in ga.segments)
    live = sorted(s.live for s in ga.segments if s.live is not None)
    covered = [i for lo, hi in live for i in range(lo, hi + 1)]
    with LogManager.open(tmp_path, cfg) as m:
        log = m.open_group("%2F/a")
        served = read_all(log)
        assert served == entries("a", 1, 12, 1) + entries("a", 12, 16, 2)
        assert covered == [e.index for e in served]
        # after a release the inspector sees fewer files
        log.release(6)
    after = {g.group_id: g for g in scan_node(str(tmp_path))}["%2F/a"]
    assert len(after.segments) < len(ga.segments)
    assert min(s.live[0] for s in after.segments if s.live) > 1
