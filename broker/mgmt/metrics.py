"""Prometheus metrics: a per-node registry whose collector reads live state at scrape time.

Where it sits: beside the management API in the I/O shell. `NodeCollector(port)`
is registered in a `CollectorRegistry` of its own (never the global one, so
several nodes can live in one process, as in tests); `metrics_app(registry)` serves
it on `prometheus.tcp.port` at `/metrics` (rabbitmq_prometheus's path).

Names follow rabbitmq_prometheus where it has them (per-object queue metrics
as in its `/metrics/per-object` endpoint, labels `vhost`, `queue`); ours are
prefixed `qq_`. Queue message counts are reported by the node holding the
queue's leader (so summing over nodes does not double count); Raft metrics
are reported by every node for each member it holds.

`rabbitmq_raft_entry_commit_latency_seconds` is sampled: a light task looks at
each local group every SAMPLE_INTERVAL_S and, when the applied index moved,
records now minus the leader's timestamp of the last applied entry. It is an
upper bound that includes up to one sampling interval of staleness.

`qq_event_loop_lag_seconds` comes from the same task: how late each of its
wake-ups ran (a wake-up falls inside a stall of the event loop with a
probability of about the stall's length over SAMPLE_INTERVAL_S, so long
stalls are all seen and short ones in proportion). `qq_wal_sync_duration_seconds`
is the WAL writer's write + fdatasync time per batch (etcd's
`wal_fsync_duration_seconds`).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

import broker.mgmt.views as v
from broker.common.histogram import Histogram

from .port import ManagementPort

SAMPLE_INTERVAL_S = 0.2  # cost: one pass over the awake local groups per interval
FULL_EVERY = 25  # and over all of them (quiet ones too) every 5 s
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class GroupSampler:
    """Per-group commit latency estimates and leader-change counts, sampled
    every SAMPLE_INTERVAL_S (see the module docstring)."""

    def __init__(self, port: ManagementPort) -> None:
        self.port = port
        self.latency: dict[tuple[str, str], float] = {}
        self.leader_changes: dict[tuple[str, str], int] = {}
        self._leaders: dict[tuple[str, str], str] = {}
        self._seen: dict[tuple[str, str], int] = {}
        self._passes = 0
        self._task: asyncio.Task[None] | None = None
        #: wake-ups by how late they ran
        self.lag = Histogram(LAG_BUCKETS)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def sample(self) -> None:
        """One pass over the awake local groups (a quiet group's figures do
        not move); every FULL_EVERY passes over all of them, dropping the
        figures of members that are gone."""
        now_ms = time.time() * 1000
        self._passes += 1
        full = self._passes % FULL_EVERY == 0
        live = set()
        for m in self.port.member_samples(include_quiet=full):
            key = (m.vhost, m.name)
            live.add(key)
            applied = m.applied_index
            if self._seen.get(key) != applied:
                self._seen[key] = applied
                if m.last_applied_ms:
                    self.latency[key] = max(0.0, (now_ms - m.last_applied_ms) / 1000)
            lead = m.leader
            if lead is not None and self._leaders.get(key) != lead:
                if key in self._leaders:
                    self.leader_changes[key] = self.leader_changes.get(key, 0) + 1
                self._leaders[key] = lead
            self.leader_changes.setdefault(key, 0)
        for key in list(self._seen) if full else ():
            if key not in live:
                for d in (self._seen, self.latency, self._leaders, self.leader_changes):
                    d.pop(key, None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + SAMPLE_INTERVAL_S
            await asyncio.sleep(SAMPLE_INTERVAL_S)
            self.lag.observe(max(0.0, loop.time() - due))
            self.sample()


def histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    """A Prometheus histogram (cumulative buckets) of a `Histogram`."""
    buckets = []
    acc = 0
    for bound, n in zip((*map(repr, h.bounds), "+Inf"), list(h.counts), strict=True):
        acc += n
        buckets.append((bound, acc))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h.total)


class NodeCollector(Collector):
    """Reads the node's live state at every scrape."""

    def __init__(self, port: ManagementPort, sampler: GroupSampler | None = None) -> None:
        self.port = port
        self.sampler = sampler

    def collect(self) -> Iterator[Metric]:
        port = self.port
        ql = ["vhost", "queue"]

        def g(name: str, doc: str, labels: list[str] = ql) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        def c(name: str, doc: str, labels: list[str] = ql) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=labels)

        ready = g("rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers")
        unacked = g("rabbitmq_queue_messages_unacked",
                    "Messages delivered to consumers but not yet acknowledged")
        total = g("rabbitmq_queue_messages", "Sum of ready and unacknowledged messages")
        ready_b = g("rabbitmq_queue_messages_ready_bytes", "Size in bytes of ready messages")
        unacked_b = g("rabbitmq_queue_messages_unacked_bytes",
                      "Size in bytes of all unacknowledged messages")
        consumers = g("rabbitmq_queue_consumers", "Consumers on a queue")
        term = c("rabbitmq_raft_term", "Current Raft term number")
        commit = g("rabbitmq_raft_log_commit_index", "Raft log commit index")
        applied = g("rabbitmq_raft_log_last_applied_index", "Raft log last applied index")
        written = g("rabbitmq_raft_log_last_written_index", "Raft log last written index")
        snap = g("rabbitmq_raft_log_snapshot_index", "Raft log snapshot index")
        latency = g("rabbitmq_raft_entry_commit_latency_seconds",
                    "Time from a log entry's proposal to its application here (sampled)")
        is_leader = g("qq_raft_is_leader", "1 when this node's member leads the queue")
        quiet = g("qq_raft_quiet", "1 when this node's member is quiet: idle, not ticking "
                  "(no heartbeats; docs/OPERATIONS.md, Scale)")
        members = g("qq_queue_members", "Members of the quorum queue")
        online = g("qq_queue_members_online", "Members of the quorum queue on running nodes")
        dlx = g("qq_queue_messages_dlx",
                "At-least-once dead letters waiting for their targets' confirms")
        dlx_b = g("qq_queue_messages_dlx_bytes",
                  "Bytes of at-least-once dead letters waiting for their targets' confirms")
        seg_bytes = g("qq_segment_bytes", "Bytes in this member's segment files")
        seg_files = g("qq_segment_files", "Segment files of this member")
        leader_changes = c("qq_raft_leader_changes",
                           "Leader changes this node's member has seen since the metrics started")
        sampler = self.sampler
        if sampler is not None:
            sampler.sample()

        local = {(m.vhost, m.name): m for m in port.raft_members()}
        for (vh, name), record in list(port.metadata().queues.items()):
            labels = [str(vh), str(name)]
            member = local.get((vh, name))
            ov = port.leader_counts(vh, name)
            if ov is not None:  # led here (or a classic queue here)
                ready.add_metric(labels, ov.messages_ready)
                unacked.add_metric(labels, ov.messages_unacknowledged)
                total.add_metric(labels, ov.messages)
                ready_b.add_metric(labels, ov.message_bytes_ready)
                unacked_b.add_metric(labels, ov.message_bytes_unacknowledged)
                consumers.add_metric(labels, ov.consumers)
                if member is not None:
                    dlx.add_metric(labels, ov.messages_dlx)
                    dlx_b.add_metric(labels, ov.message_bytes_dlx)
            if member is None:
                continue
            term.add_metric(labels, member.term)
            commit.add_metric(labels, member.commit_index)
            applied.add_metric(labels, member.applied_index)
            written.add_metric(labels, member.last_index)
            snap.add_metric(labels, member.snapshot_index)
            is_leader.add_metric(labels, 1 if member.is_leader else 0)
            quiet.add_metric(labels, 1 if member.quiet else 0)
            members.add_metric(labels, len(record.members))
            online.add_metric(labels, len(v.online(port, record.members)))
            if sampler is not None and (vh, name) in sampler.latency:
                latency.add_metric(labels, sampler.latency[(vh, name)])
            usage = port.segment_usage(vh, name)
            seg_bytes.add_metric(labels, usage.bytes)
            seg_files.add_metric(labels, usage.files)
            if sampler is not None:
                leader_changes.add_metric(labels, sampler.leader_changes.get((vh, name), 0))
        yield from (ready, unacked, total, ready_b, unacked_b, consumers, dlx, dlx_b, term, commit, applied,
                    written, snap, latency, is_leader, quiet, members, online, seg_bytes, seg_files,
                    leader_changes)

        yield from self._node_metrics()

    def _node_metrics(self) -> Iterator[Metric]:
        port = self.port
        stats = port.wal_stats()
        for key, doc in (("bytes", "Bytes written to the write-ahead log"),
                         ("fsyncs", "fsync/fdatasync calls on the write-ahead log"),
                         ("batches", "Write-ahead log batches written"),
                         ("records", "Records written to the write-ahead log"),
                         ("write_errors", "Failed write-ahead log writes"),
                         ("rollovers", "Write-ahead log roll-overs"),
                         ("flushes", "Write-ahead log flushes into segment files")):
            wal = CounterMetricFamily(f"qq_wal_{key}", doc, labels=[])
            wal.add_metric([], stats.get(key, 0))
            yield wal
        sync = port.wal_sync_histogram()
        if sync is not None:
            yield histogram("qq_wal_sync_duration_seconds",
                            "Write-ahead log batch write + fdatasync time", sync)
        if self.sampler is not None:
            yield histogram("qq_event_loop_lag_seconds",
                            "How late the node's periodic sampler woke up (event-loop stalls)",
                            self.sampler.lag)
        nodes = port.cluster_nodes()
        status = port.node_status()
        up = GaugeMetricFamily("qq_cluster_nodes_running", "Cluster nodes this node sees running",
                               labels=[])
        up.add_metric([], len(v.online(port, nodes)))
        yield up
        size = GaugeMetricFamily("qq_cluster_nodes", "Cluster nodes", labels=[])
        size.add_metric([], len(nodes))
        yield size
        meta = GaugeMetricFamily("qq_metadata_is_leader",
                                 "1 when this node leads the metadata group", labels=[])
        meta.add_metric([], 1 if status.metadata_is_leader else 0)
        yield meta
        alarms = port.alarm_status()
        for name, doc, flag in (
                ("rabbitmq_alarms_free_disk_space_watermark",
                 "is 1 if free disk space watermark alarm is in effect", "disk" in alarms.local),
                ("rabbitmq_alarms_memory_used_watermark",
                 "is 1 if VM memory watermark alarm is in effect", "memory" in alarms.local)):
            um = UnknownMetricFamily(name, doc, labels=[])  # untyped, as rabbitmq_prometheus
            um.add_metric([], 1.0 if flag else 0.0)
            yield um
        for name, doc, value in (
                ("rabbitmq_disk_space_available_bytes", "Disk space available in bytes",
                 alarms.disk_free or 0),
                ("rabbitmq_disk_space_available_limit_bytes",
                 "Free disk space low watermark in bytes", alarms.disk_limit),
                ("rabbitmq_process_resident_memory_bytes", "Memory used in bytes", alarms.mem_used),
                ("rabbitmq_resident_memory_limit_bytes", "Memory high watermark in bytes",
                 alarms.mem_limit)):
            m = GaugeMetricFamily(name, doc, labels=[])
            m.add_metric([], float(value))
            yield m
        stopped = GaugeMetricFamily("qq_raft_groups_stopped",
                                    "Raft groups on this node stopped by a broken invariant or a "
                                    "storage failure (see /api/health/checks/raft-groups)", labels=[])
        stopped.add_metric([], len(port.stopped_members()))
        yield stopped
        mt = GaugeMetricFamily("qq_metadata_raft_commit_index", "Metadata group commit index",
                               labels=[])
        mt.add_metric([], status.metadata_commit_index)
        yield mt
        # untyped, as rabbitmq_prometheus exposes it
        info = UnknownMetricFamily("rabbitmq_identity_info", "Node identity",
                                   labels=["rabbitmq_node", "rabbitmq_cluster"])
        info.add_metric([port.node_name, min(nodes)], 1)
        yield info


def make_registry(port: ManagementPort, sampler: GroupSampler | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(port, sampler))
    return registry


def metrics_app(registry: CollectorRegistry) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics/per-object", metrics)
    return app
