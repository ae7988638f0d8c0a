"""The audit over real data: a real 3-node cluster (tests/spark/scenario.py)
read both from its data directories and over the management API, checked
against the storage layer's own accounting (broker.storage.scan_node, the
nodes' manifests) and the files on disk; then a second run after growth,
with one node down and a queue deleted behind its back; a corrupted copy;
an empty input."""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.runtime.queues import QuorumQueue
from broker.storage import scan_node
from spark import audit
from tests.mgmt.conftest import MgmtCluster, wait_for
from tests.spark.scenario import CONFIG, Workload, storage_dir

pytestmark = pytest.mark.slow
T0 = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)


def manifest(c: MgmtCluster, i: int) -> dict[str, Any]:
    status, doc = c.apis[i].get(f"/api/nodes/{urllib.parse.quote(c.names[i], safe='')}/storage")
    assert status == 200, doc
    return doc


def files_of(doc: dict[str, Any]) -> Any:
    return sorted((g["group_id"], s["file"], s["bytes"], s["live_entries"])
                  for g in doc["groups"] for s in g["segments"]) + sorted(
        (w["file"], w["bytes"]) for w in doc["wal"])


def quiesce(c: MgmtCluster, nodes: list[int]) -> list[dict[str, Any]]:
    """Wait until no node's files change for longer than a member's idle
    snapshot delay (snapshots, releases, compactions and segment flushes run
    asynchronously after the last command; an idle member snapshots
    `QuorumQueue.snapshot_idle_s` after its last applied entry)."""
    last: dict[int, Any] = {}
    since = [time.monotonic()]

    def stable() -> bool:
        now = {i: files_of(manifest(c, i)) for i in nodes}
        if now != last:
            last.clear()
            last.update(now)
            since[0] = time.monotonic()
            return False
        return time.monotonic() - since[0] > QuorumQueue.snapshot_idle_s + 1.5
    wait_for(stable, timeout=60, what="storage to settle")
    return [manifest(c, i) for i in nodes]


def audit_args(c: MgmtCluster, out: Path, now: dt.datetime, *extra: str) -> Any:
    data = [a for i in range(3) for a in ("--data", f"{c.names[i]}={storage_dir(c, i)}")]
    api = ["--api", ",".join(a.base for a in c.apis)]
    return audit.parse_args([*data, *api, "--out", str(out), "--now", now.isoformat(), *extra])


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MgmtCluster, Workload]]:
    c = MgmtCluster(tmp_path_factory.mktemp("audit-cluster"), extra=CONFIG)
    c.start()
    w = Workload(c)
    try:
        w.phase1()
        yield c, w
    finally:
        w.close()
        c.kill_all()


def by(rows: list[dict[str, Any]], **kv: Any) -> list[dict[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in kv.items())]


def test_audit_figures_match_storage_and_disk_then_growth(spark: Any, scenario: Any,
                                                          tmp_path: Path) -> None:
    c, w = scenario
    docs = quiesce(c, [0, 1, 2])
    out = tmp_path / "out"
    code, s = audit.run(spark, audit_args(c, out, T0, "--fail-on", "pinned_bytes>1KiB"))
    assert not s["empty"] and s["problems"] == []

    # Every segment file on disk is audited with the storage layer's figures.
    for i in range(3):
        node = c.names[i]
        on_disk = {g.group_id: g for g in scan_node(str(storage_dir(c, i)))}
        members = {m["group_id"]: m for m in by(s["members"], node=node)}
        assert set(members) == set(on_disk)
        for gid, g in on_disk.items():
            m = members[gid]
            assert m["segments"] == len(g.segments)
            assert m["segment_bytes"] == sum(os.stat(x.path).st_size for x in g.segments)
            assert m["entries"] == sum(x.count for x in g.segments)
            assert m["log_entries"] == sum(x.live[1] - x.live[0] + 1 for x in g.segments if x.live)
            assert m["snapshot_index"] == g.snapshot_index
        n = by(s["nodes"], node=node)[0]
        wal = list((storage_dir(c, i) / "wal").iterdir())
        assert n["wal_bytes"] == sum(p.stat().st_size for p in wal)
        assert n["segment_bytes"] == sum(os.stat(x.path).st_size for g in on_disk.values()
                                         for x in g.segments)
        # Live entries and the pinned/reclaimable split follow the node's own accounting.
        doc = docs[i]
        for g in doc["groups"]:
            m = members[g["group_id"]]
            assert m["live_messages"] == g["live_messages"]
            if g["live_messages"] is None:
                continue
            assert m["live_entries"] == sum(x["live_entries"] for x in g["segments"])
            snap, sli = g["snapshot_index"], g["smallest_live_index"]
            covered = [x for x in g["segments"] if x["log_first"] is not None and snap is not None
                       and x["log_last"] <= snap]
            pinned = [x for x in covered if sli is not None and x["log_last"] >= sli]
            reclaim = [x for x in covered if x not in pinned] + [
                x for x in g["segments"] if x["log_first"] is None]
            assert m["pinned_bytes"] == sum(x["bytes"] for x in pinned)
            assert m["reclaimable_bytes"] == sum(x["bytes"] for x in reclaim)

    orders = by(s["queues"], queue="orders")[0]
    assert orders["live_messages"] == 10 and orders["pinned_bytes"] > 0
    assert "stuck-consumer" in orders["oldest_live_holder"]
    assert orders["oldest_live_age_s"] is not None
    # worst offenders first (which queue that is depends on how far compaction
    # shrank the pinned logs of `orders` and `dlx-src`)
    worst = [(q["pinned_bytes"], q["reclaimable_bytes"] + q["orphan_bytes"], q["bytes"])
             for q in s["queues"]]
    assert worst == sorted(worst, reverse=True)
    dlx = by(s["queues"], queue="dlx-src")[0]
    assert dlx["live_messages"] == 30 and "dead-lettered" in dlx["oldest_live_holder"]
    assert by(s["queues"], queue="churn")[0]["pinned_bytes"] == 0
    assert by(s["queues"], queue="churn")[0]["live_messages"] == 0
    shrunk = by(s["queues"], queue="shrunk")[0]
    assert shrunk["members_on_disk"] == 2 and c.names[1] not in shrunk["nodes"]
    assert all(m["orphan_reason"] is None for m in s["members"])
    assert code == 1 and any("pinned_bytes>1KiB" in b and "orders" in b for b in s["breaches"])
    # Outputs: Parquet frames, JSON, a self-contained HTML report.
    assert {"segments", "members", "queues", "nodes", "problems"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "report.json").read_text())["totals"]["segments"] > 50
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3 and "<script" not in html
    segs = spark.read.parquet(str(out / "segments"))
    assert segs.where("state = 'pinned'").count() > 0

    # The Kubernetes jobs (CronJob, ScheduledSparkApplication) share no volume:
    # they read each node's storage manifest over the API only. Same figures.
    code_api, s_api = audit.run(spark, audit.parse_args(
        ["--api", ",".join(a.base for a in c.apis), "--out", str(tmp_path / "out-api"),
         "--now", T0.isoformat(), "--no-html"]))
    assert s_api["problems"] == [] and not s_api["empty"]
    keys = ("node", "group_id", "queue", "segments", "segment_bytes", "live_entries",
            "live_messages", "snapshot_index", "pinned_bytes", "reclaimable_bytes")

    def member_rows(summary: dict[str, Any]) -> list[tuple[Any, ...]]:
        return sorted((tuple(m.get(k) for k in keys) for m in summary["members"]), key=str)
    assert member_rows(s_api) == member_rows(s)
    assert [q["queue"] for q in s_api["queues"]] == [q["queue"] for q in s["queues"]]

    # Second run, an hour later: rabbit-3 is down, `gone` was deleted while it
    # was, `orders` grew.
    w.phase2()
    quiesce(c, [0, 1])
    code2, s2 = audit.run(spark, audit_args(c, out, T0 + dt.timedelta(hours=1)))
    assert code2 == 0
    assert [p["kind"] for p in s2["problems"]] == ["unreachable_node"]
    assert s2["problems"][0]["path"] == c.apis[2].base
    orphans = [m for m in s2["members"] if m["orphan_reason"]]
    assert [(m["node"], m["queue"], m["orphan_reason"]) for m in orphans] == [
        (c.names[2], "gone", "queue deleted")]
    gone_dir = storage_dir(c, 2) / "groups"
    assert orphans[0]["orphan_bytes"] == sum(
        p.stat().st_size for p in gone_dir.glob(f"{orphans[0]['group_dir']}/*/*"))
    o2 = by(s2["queues"], queue="orders")[0]
    assert o2["prev_bytes"] == orders["bytes"] and o2["growth_bytes"] == o2["bytes"] - orders["bytes"] > 0
    assert o2["growth_bytes_per_hour"] == pytest.approx(o2["growth_bytes"])
    assert o2["days_to_full"] == pytest.approx(
        o2["min_free_bytes"] / (o2["growth_bytes_per_hour"] / o2["members_on_disk"] * 24))
    assert o2["live_messages"] == 210
    hist = spark.read.parquet(str(out / "history" / "nodes"))
    assert {str(r.run_date) for r in hist.select("run_date").distinct().collect()} == {"2030-01-01"}
    assert hist.count() == len(s["nodes"]) + len(s2["nodes"])

    # A corrupted copy of rabbit-3's directory: per-file problems, the rest audited.
    copy = tmp_path / "copy"
    shutil.copytree(storage_dir(c, 2), copy)
    segs3 = sorted(copy.glob("groups/*/segments/*.segment"))
    bad = segs3[len(segs3) // 2]
    raw = bytearray(bad.read_bytes())
    raw[12] ^= 0x01  # header checksum
    bad.write_bytes(bytes(raw))
    wal = next((copy / "wal").iterdir())
    wal.write_bytes(b"NOPE" + wal.read_bytes()[4:])
    code3, s3 = audit.run(spark, audit.parse_args(
        ["--data", f"n3={copy}", "--out", str(tmp_path / "out3"), "--no-html"]))
    assert code3 == 0
    assert sorted((p["kind"], p["path"]) for p in s3["problems"]) == sorted(
        [("unreadable_segment", str(bad)), ("unreadable_wal", str(wal))])
    assert sum(m["segments"] for m in s3["members"]) == len(segs3) - 1


def test_empty_input_says_so(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, s = audit.run(spark, audit.parse_args(
        ["--data", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]))
    assert code == 0 and s["empty"]
    from spark.report import console
    assert "no broker data found" in console(s)
