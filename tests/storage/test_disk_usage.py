"""`manifest.node_usage` / `manifest.group_usage` (the management API's
storage figures) against the files really on disk, while a LogManager writes."""
from __future__ import annotations

import os
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
        # a third group fills more than one whole (tiny, 4 KiB) WAL after them,
        # so every entry of g0 and g1 is in a WAL file before the current one,
        # which wait_flushed waits to see written into segments
        filler = m.open_group("filler")
        filler.append(entries("filler", 1, 301, 1))
        assert durable.wait_index("filler", 300)
        m.sync()
        assert m.wait_flushed(10)
        groups.append(filler)
        usage = node_usage(str(tmp_path))
        per_group = [group_usage(g.path) for g in groups]
        seg_files, seg_bytes = _sum(tmp_path / "groups", ".segment")
        wal = _sum(tmp_path / "wal", ".wal")
        assert seg_files > 0  # the tiny configuration flushed segments
        assert (usage["segment_files"], usage["segment_bytes"]) == (seg_files, seg_bytes)
        assert usage["wal_bytes"] == wal[1] > 0
        assert usage["snapshot_bytes"] == 0
        assert sum(u["segment_files"] for u in per_group) == seg_files
        assert sum(u["segment_bytes"] for u in per_group) == seg_bytes
        assert per_group[1]["segment_bytes"] > per_group[0]["segment_bytes"]  # more entries
