"""`LogManager.disk_usage` / `GroupLog.disk_usage` (the management API's
storage figures) against the files really on disk."""
from __future__ import annotations

import os
import time
from pathlib import Path

from .helpers import Durable, entries, manager


def _sum(root: Path, suffix: str) -> tuple[int, int]:
    files = [p for p in root.rglob(f"*{suffix}") if ".deleted" not in str(p)]
    return len(files), sum(os.stat(p).st_size for p in files)


def test_disk_usage_counts_the_files_on_disk(tmp_path: Path) -> None:
    durable = Durable()
    with manager(tmp_path, durable=durable) as m:
        groups = [m.open_group(f"g{i}") for i in range(2)]
        for k, g in enumerate(groups):
            g.append(entries(g.group_id, 1, 41 + 10 * k, 1))
            assert durable.wait_index(g.group_id, 40 + 10 * k)
        m.sync()
        # the segment writer flushes in the background (the tiny WAL rolled
        # over many times): compare once the files on disk stop changing
        deadline = time.monotonic() + 10
        while True:
            before = _sum(tmp_path / "groups", ".segment"), _sum(tmp_path / "wal", ".wal")
            usage = m.disk_usage()
            per_group = [g.disk_usage() for g in groups]  # files written, then installed
            seg_files, seg_bytes = _sum(tmp_path / "groups", ".segment")
            wal = _sum(tmp_path / "wal", ".wal")
            if (before == ((seg_files, seg_bytes), wal) and seg_files > 0
                    and sum(u["segment_files"] for u in per_group) == seg_files) \
                    or time.monotonic() > deadline:
                break
        assert seg_files > 0  # the tiny configuration flushed segments
        assert (usage["segment_files"], usage["segment_bytes"]) == (seg_files, seg_bytes)
        assert usage["wal_bytes"] == wal[1] > 0
        assert usage["snapshot_bytes"] == 0
        assert sum(u["segment_files"] for u in per_group) == seg_files
        assert sum(u["segment_bytes"] for u in per_group) == seg_bytes
        assert per_group[1]["segment_bytes"] > per_group[0]["segment_bytes"]  # more entries
