"""`manifest.node_usage` / `manifest.group_usage` (the management API's
storage figures) against the files really on disk, while a LogManager writes."""
from __future__ import annotations

import os
import time
from pathlib import Path

from broker.storage.manifest import group_usage, node_usage

from .helpers import Durable, entries, manager


def _sum(root: Path, suffix: str) -> tuple[int, int]:
    """(files, bytes) under `root`; a file removed meanwhile (a WAL rolled
    over, a segment compacted) is left out."""
    sizes = []
    for p in root.rglob(f"*{suffix}"):
        if ".deleted" in str(p):
            continue  # a group deletion in progress: not counted
        try:
            sizes.append(os.stat(p).st_size)
        except FileNotFoundError:
            pass
    return len(sizes), sum(sizes)


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
            usage = node_usage(str(tmp_path))
            per_group = [group_usage(g.path) for g in groups]
            seg_files, seg_bytes = _sum(tmp_path / "groups", ".segment")
            wal = _sum(tmp_path / "wal", ".wal")
            # (every group's entries reach segments: the segment writer
            # flushes the groups one after the other)
            if (before == ((seg_files, seg_bytes), wal)
                    and all(u["segment_files"] > 0 for u in per_group)
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
