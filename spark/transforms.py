"""The audit's arithmetic: pure `DataFrame -> DataFrame` functions, no I/O.

Where it sits: `spark.io` reads files and manifests into the input frames
below (schemas as DDL strings); `spark.audit` chains these transforms and
hands the results back to `spark.io` / `spark.report` for writing.

Segment states (one per segment file, mutually exclusive):

- `void`: no entry of the file survives the log's composition (overwritten
  or reset); the node deletes it once it is the oldest file. Reclaimable.
- `reclaimable`: wholly covered by the snapshot and below the smallest live
  index (or the queue holds no live message): the next `release` deletes it.
- `pinned`: wholly covered by the snapshot but at or after the oldest live
  entry: kept only because live messages (usually a few) sit in it or before
  it. The member row says which entry and what holds it.
- `active`: holds entries after the snapshot index: the Raft log proper.
- `covered`: covered by the snapshot, but the queue's live entries are
  unknown (data directory read without its node's management API).
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

SEGMENTS = ("node string, source string, group_dir string, group_id string, file string, "
            "seq long, first_index long, last_index long, entries long, max_entries long, "
            "reset boolean, bytes long, data_bytes long, log_first long, log_last long, "
            "live_entries long, bytes_read long")
GROUPS = ("node string, source string, group_dir string, group_id string, vhost string, "
          "queue string, corrupt string, snapshot_index long, snapshot_term long, "
          "snapshot_bytes long, live_messages long, smallest_live_index long, "
          "oldest_live_timestamp_ms long, oldest_live_holder string")
WAL_FILES = ("node string, source string, file string, seq long, bytes long, records long, "
             "torn boolean, bytes_read long")
WAL_GROUPS = ("node string, file string, group_id string, records long, bytes long, "
              "entries long, first_index long, last_index long")
NODES = ("node string, source string, reachable boolean, error string, data_dir string, "
         "total_bytes long, free_bytes long")
CLUSTER_GROUPS = "group_id string, vhost string, queue string, members array<string>, leader string"
DELETING = "node string, dir string, bytes long"
PROBLEMS = "node string, kind string, path string, error string"
HISTORY_QUEUES = "vhost string, queue string, bytes long, run_ts_ms long, run_date string"
HISTORY_NODES = "node string, bytes long, run_ts_ms long, run_date string"

META_GROUP = "__metadata__"
GIB = 1 << 30


def _sum(c: str) -> Column:
    return F.coalesce(F.sum(c), F.lit(0)).cast("long")


# ---------------------------------------------------------------- merging sources
def merge_segments(disk: DataFrame, api: DataFrame) -> DataFrame:
    """Segment rows from data directories win over the same node's manifest
    rows (they are what is on disk now); live-entry counts, which only the
    node knows, are taken from its manifest for the same file."""
    live = api.select("node", "group_id", "file", F.col("live_entries").alias("_api_live"))
    from_disk = (disk.join(live, ["node", "group_id", "file"], "left")
                 .withColumn("live_entries", F.coalesce("live_entries", "_api_live"))
                 .drop("_api_live"))
    api_only = api.join(disk.select("node").distinct(), "node", "left_anti")
    return from_disk.unionByName(api_only)


def merge_groups(disk: DataFrame, api: DataFrame) -> DataFrame:
    """Group rows: files' facts (snapshot, corruption) from disk where read,
    the queue machine's live accounting from the node's manifest."""
    acc_cols = ["vhost", "queue", "live_messages", "smallest_live_index",
                "oldest_live_timestamp_ms", "oldest_live_holder"]
    acc = api.select("node", "group_id", *[F.col(c).alias("_a_" + c) for c in acc_cols])
    from_disk = disk.join(acc, ["node", "group_id"], "left")
    for c in acc_cols:
        from_disk = from_disk.withColumn(c, F.coalesce(c, "_a_" + c)).drop("_a_" + c)
    api_only = api.join(disk.select("node").distinct(), "node", "left_anti")
    return from_disk.unionByName(api_only)


# ---------------------------------------------------------------- per segment
def classify_segments(segments: DataFrame, groups: DataFrame) -> DataFrame:
    """Each segment with its group's snapshot/live facts, its `state` (see the
    module docstring) and its bytes split into reclaimable/pinned/active/covered."""
    g = groups.select("node", "group_id", "snapshot_index", "smallest_live_index",
                      "live_messages")
    s = segments.join(g, ["node", "group_id"], "left")
    covered = F.col("snapshot_index").isNotNull() & (F.col("log_last") <= F.col("snapshot_index"))
    state = (F.when(F.col("log_first").isNull(), "void")
             .when(~covered, "active")
             .when(F.col("live_messages").isNull(), "covered")
             .when(F.col("smallest_live_index").isNull()
                   | (F.col("log_last") < F.col("smallest_live_index")), "reclaimable")
             .otherwise("pinned"))
    s = s.withColumn("state", state)
    for name, states in (("reclaimable_bytes", ["void", "reclaimable"]),
                         ("pinned_bytes", ["pinned"]), ("active_bytes", ["active"]),
                         ("covered_bytes", ["covered"])):
        s = s.withColumn(name, F.when(F.col("state").isin(states), F.col("bytes"))
                         .otherwise(F.lit(0)).cast("long"))
    return s.withColumn(
        "log_entries", F.when(F.col("log_first").isNull(), F.lit(0))
        .otherwise(F.col("log_last") - F.col("log_first") + 1).cast("long"))


# ---------------------------------------------------------------- per member
def member_usage(classified: DataFrame, groups: DataFrame, wal_groups: DataFrame,
                 cluster_groups: DataFrame, now_ms: int, metadata_known: bool) -> DataFrame:
    """One row per (node, group): bytes by state, entries, live entries, WAL
    bytes, the oldest live entry (index, age, holder) and, when the cluster
    metadata is known, whether the directory is an orphan (its queue was
    deleted, or this node is no longer one of its members)."""
    seg = classified.groupBy("node", "group_id").agg(
        F.count(F.lit(1)).alias("segments"), _sum("bytes").alias("segment_bytes"),
        _sum("entries").alias("entries"), _sum("log_entries").alias("log_entries"),
        F.sum("live_entries").cast("long").alias("live_entries"),
        _sum("reclaimable_bytes").alias("reclaimable_bytes"),
        _sum("pinned_bytes").alias("pinned_bytes"), _sum("active_bytes").alias("active_bytes"),
        _sum("covered_bytes").alias("covered_bytes"),
        F.sum(F.when(F.col("state") == "pinned", F.col("live_entries"))).cast("long")
        .alias("pinned_live_entries"),
        _sum("bytes_read").alias("bytes_read"))
    wal = wal_groups.groupBy("node", "group_id").agg(_sum("bytes").alias("wal_bytes"),
                                                     _sum("entries").alias("wal_entries"))
    cg = cluster_groups.select("group_id", F.col("vhost").alias("_cg_vhost"),
                               F.col("queue").alias("_cg_queue"), "members")
    m = (groups.join(seg, ["node", "group_id"], "left").join(wal, ["node", "group_id"], "left")
         .join(cg, "group_id", "left"))
    parsed = F.regexp_extract("group_id", r"^(.*)/(.*)/(\d+)$", 0) != ""
    m = (m.withColumn("vhost", F.coalesce("vhost", "_cg_vhost", F.when(
            parsed, F.regexp_extract("group_id", r"^(.*)/(.*)/(\d+)$", 1))))
         .withColumn("queue", F.coalesce("queue", "_cg_queue", F.when(
            F.col("group_id") == META_GROUP, F.lit("(cluster metadata)")).when(
            parsed, F.regexp_extract("group_id", r"^(.*)/(.*)/(\d+)$", 2)).otherwise(
            F.col("group_id"))))
         .drop("_cg_vhost", "_cg_queue"))
    for c in ("segments", "segment_bytes", "entries", "log_entries", "reclaimable_bytes",
              "pinned_bytes", "active_bytes", "covered_bytes", "bytes_read", "wal_bytes",
              "wal_entries", "snapshot_bytes"):
        m = m.withColumn(c, F.coalesce(c, F.lit(0)).cast("long"))
    # a member with no segment file left (an idle queue released its whole log)
    # holds no live entry on disk, when the node's accounting is known
    m = m.withColumn("live_entries", F.when(
        F.col("live_entries").isNull() & F.col("live_messages").isNotNull()
        & (F.col("segments") == 0), F.lit(0)).otherwise(F.col("live_entries")).cast("long"))
    orphan = (F.when(F.lit(not metadata_known) | (F.col("group_id") == META_GROUP), F.lit(None))
              .when(F.col("members").isNull(), F.lit("queue deleted"))
              .when(~F.array_contains("members", F.col("node")), F.lit("member removed")))
    return (m.withColumn("orphan_reason", orphan.cast("string"))
            .withColumn("orphan_bytes", F.when(F.col("orphan_reason").isNotNull(),
                                               F.col("segment_bytes") + F.col("snapshot_bytes"))
                        .otherwise(F.lit(0)).cast("long"))
            .withColumn("bytes", (F.col("segment_bytes") + F.col("snapshot_bytes")).cast("long"))
            .withColumn("oldest_live_index", F.col("smallest_live_index"))
            .withColumn("oldest_live_age_s", F.when(
                F.col("oldest_live_timestamp_ms").isNotNull(),
                (F.lit(now_ms) - F.col("oldest_live_timestamp_ms")) / 1000.0))
            .drop("members"))


# ---------------------------------------------------------------- per queue and node
def queue_usage(members: DataFrame, nodes: DataFrame) -> DataFrame:
    """One row per queue (orphans included, flagged): totals over its members,
    the oldest live entry over all members and the least free space among the
    nodes holding it (for days-until-full)."""
    free = nodes.select("node", "free_bytes")
    m = members.join(free, "node", "left")
    oldest = Window.partitionBy("vhost", "queue").orderBy(
        F.col("oldest_live_age_s").desc_nulls_last())
    m = m.withColumn("_rank", F.row_number().over(oldest))
    holder = F.first(F.when(F.col("_rank") == 1, F.col("oldest_live_holder")), ignorenulls=True)
    return m.groupBy("vhost", "queue").agg(
        F.countDistinct("node").alias("members_on_disk"),
        F.concat_ws(",", F.sort_array(F.collect_set("node"))).alias("nodes"),
        _sum("bytes").alias("bytes"), _sum("segments").alias("segments"),
        _sum("entries").alias("entries"), F.sum("live_entries").cast("long").alias("live_entries"),
        F.max("live_messages").cast("long").alias("live_messages"),
        _sum("reclaimable_bytes").alias("reclaimable_bytes"),
        _sum("pinned_bytes").alias("pinned_bytes"), _sum("active_bytes").alias("active_bytes"),
        _sum("covered_bytes").alias("covered_bytes"), _sum("wal_bytes").alias("wal_bytes"),
        _sum("orphan_bytes").alias("orphan_bytes"),
        F.min("oldest_live_index").alias("oldest_live_index"),
        F.max("oldest_live_age_s").alias("oldest_live_age_s"),
        holder.alias("oldest_live_holder"),
        F.min("free_bytes").cast("long").alias("min_free_bytes"))


def node_usage(members: DataFrame, wal_files: DataFrame, deleting: DataFrame,
               nodes: DataFrame) -> DataFrame:
    """One row per node: segment, snapshot, WAL and orphan bytes, the volume."""
    m = members.groupBy("node").agg(
        F.countDistinct("group_id").alias("groups"), _sum("segments").alias("segments"),
        _sum("segment_bytes").alias("segment_bytes"), _sum("snapshot_bytes").alias("snapshot_bytes"),
        _sum("reclaimable_bytes").alias("reclaimable_bytes"),
        _sum("pinned_bytes").alias("pinned_bytes"), _sum("active_bytes").alias("active_bytes"),
        _sum("covered_bytes").alias("covered_bytes"), _sum("orphan_bytes").alias("orphan_bytes"),
        F.sum(F.when(F.col("orphan_reason").isNotNull(), 1).otherwise(0)).cast("long")
        .alias("orphan_groups"), _sum("bytes_read").alias("segment_bytes_read"))
    w = wal_files.groupBy("node").agg(F.count(F.lit(1)).alias("wal_files"),
                                      _sum("bytes").alias("wal_bytes"))
    d = deleting.groupBy("node").agg(_sum("bytes").alias("deleting_bytes"))
    out = (nodes.select("node", "reachable", "error", "total_bytes", "free_bytes")
           .join(m, "node", "full").join(w, "node", "left").join(d, "node", "left"))
    for c in ("groups", "segments", "segment_bytes", "snapshot_bytes", "reclaimable_bytes",
              "pinned_bytes", "active_bytes", "covered_bytes", "orphan_bytes", "orphan_groups",
              "segment_bytes_read", "wal_files", "wal_bytes", "deleting_bytes"):
        out = out.withColumn(c, F.coalesce(c, F.lit(0)).cast("long"))
    return out.withColumn("bytes", (F.col("segment_bytes") + F.col("snapshot_bytes")
                                    + F.col("wal_bytes") + F.col("deleting_bytes")).cast("long"))


# ---------------------------------------------------------------- growth
def with_growth(current: DataFrame, history: DataFrame, keys: list[str], now_ms: int,
                free_col: str) -> DataFrame:
    """Compare `bytes` with the most recent earlier run in `history` (rows of
    keys, bytes, run_ts_ms): growth in bytes, rate per hour, and days until
    `free_col` is used up at that rate (null when not growing). For a queue
    the rate is spread over its members, each on its own volume."""
    prev = history.where(F.col("run_ts_ms") < now_ms)
    latest = Window.partitionBy(*keys).orderBy(F.col("run_ts_ms").desc())
    prev = (prev.withColumn("_r", F.row_number().over(latest)).where("_r = 1")
            .select(*keys, F.col("bytes").alias("prev_bytes"),
                    F.col("run_ts_ms").alias("prev_run_ts_ms")))
    out = current.join(prev, keys, "left")
    hours = (F.lit(now_ms) - F.col("prev_run_ts_ms")) / 3_600_000.0
    out = (out.withColumn("growth_bytes", (F.col("bytes") - F.col("prev_bytes")).cast("long"))
           .withColumn("growth_bytes_per_hour", F.col("growth_bytes") / hours))
    per_volume = F.col("growth_bytes_per_hour")
    if "members_on_disk" in current.columns:
        per_volume = per_volume / F.greatest(F.col("members_on_disk"), F.lit(1))
    return out.withColumn("days_to_full", F.when(
        (per_volume > 0) & F.col(free_col).isNotNull(), F.col(free_col) / (per_volume * 24.0)))


def history_rows(current: DataFrame, keys: list[str], now_ms: int, run_date: str) -> DataFrame:
    return current.select(*keys, "bytes", F.lit(now_ms).cast("long").alias("run_ts_ms"),
                          F.lit(run_date).alias("run_date"))


def offenders(queues: DataFrame) -> DataFrame:
    """Queues ordered worst first: pinned, then reclaimable+orphan, then size."""
    return queues.orderBy(F.col("pinned_bytes").desc(),
                          (F.col("reclaimable_bytes") + F.col("orphan_bytes")).desc(),
                          F.col("bytes").desc(), "vhost", "queue")


__all__ = [
    "CLUSTER_GROUPS", "DELETING", "GROUPS", "HISTORY_NODES", "HISTORY_QUEUES", "NODES",
    "PROBLEMS", "SEGMENTS", "WAL_FILES", "WAL_GROUPS", "classify_segments", "history_rows",
    "member_usage", "merge_groups", "merge_segments", "node_usage", "offenders", "queue_usage",
    "with_growth",
]
