"""One chaos run: start a cluster in namespaces, run clients and the nemesis,
heal, drain every node, check the history, write the results.

Results of a run go to `<out>/<run id>/`: `history.jsonl` (every operation),
`summary.json` (the checker's result and the run's parameters), `nodes/*.log`
(each broker's log). The brokers' data directories are deleted when the run
is valid and kept (path in the summary) when it is not.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .amqp import AmqpError, Client
from .checker import check
from .nemesis import Nemesis, http, parse_kinds, q
from .netns import ChaosCluster
from .workers import History, Values, Worker

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("plain", "ttl-amo", "ttl-alo")


@dataclass
class RunConfig:
    nodes: int = 3
    seed: int = 1
    duration: float = 60.0
    nemesis: str = "all"
    variant: str = "plain"  # plain | ttl-amo (TTL, at-most-once DLX) | ttl-alo (at-least-once DLX)
    publishers: int = 4
    consumers: int = 2
    getters: int = 1
    rate: float = 20.0  # operations per second per worker
    ttl_ms: int = 8000
    fault_s: tuple[float, float] = (3.0, 8.0)
    quiet_s: tuple[float, float] = (2.0, 5.0)
    membership_s: tuple[float, float] = (1.0, 4.0)
    drain_timeout: float = 150.0
    # the disk alarm below 8 MB free (RabbitMQ's default 50 MB would leave the
    # disk-full node's 64 MiB tmpfs in alarm almost from the start)
    broker_config: str = ("raft.snapshot_interval = 500\n"
                          "raft.wal_max_size_bytes = 1048576\n"
                          "raft.segment_max_entries = 256\n"
                          "disk_free_limit.absolute = 8MB\n")
    keep_data: bool = False
    queue: str = "chaos"
    dlq: str = "chaos-dlq"
    extra: dict[str, Any] = field(default_factory=dict)

    def replay_command(self, out: str) -> str:
        return (f"sudo .venv/bin/python -m tests.chaos.run --nodes {self.nodes} --seed {self.seed} "
                f"--duration {self.duration:g} --nemesis {self.nemesis} --variant {self.variant} "
                f"--publishers {self.publishers} --consumers {self.consumers} "
                f"--getters {self.getters} --rate {self.rate:g} --runs 1 --out {out}")


def git_commit() -> str:
    """The commit the brokers run (QQ_CHAOS_COMMIT when running from an
    exported tree, e.g. `git archive`)."""
    if os.environ.get("QQ_CHAOS_COMMIT"):
        return os.environ["QQ_CHAOS_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "broker"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty(broker)" if dirty else "")
    except OSError:
        return "unknown"


def queue_args(cfg: RunConfig) -> dict[str, Any]:
    # No delivery limit: past it a message is dropped by design (RabbitMQ 4.x
    # poison-message handling), which a total-queue checker cannot tell from a
    # loss. Consumers failing through partitions and kills would reach it.
    args: dict[str, Any] = {"x-queue-type": "quorum", "x-delivery-limit": -1}
    if cfg.variant in ("ttl-amo", "ttl-alo"):
        args.update({"x-message-ttl": cfg.ttl_ms, "x-dead-letter-exchange": "",
                     "x-dead-letter-routing-key": cfg.dlq})
    if cfg.variant == "ttl-alo":
        args.update({"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
    return args


def _declare(cluster: ChaosCluster, cfg: RunConfig, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            c = Client(cluster.nodes[0].host, cluster.nodes[0].port)
            try:
                if cfg.variant != "plain":
                    c.declare(cfg.dlq, {"x-queue-type": "quorum"})
                c.declare(cfg.queue, queue_args(cfg))
            finally:
                c.close()
            return
        except (AmqpError, TimeoutError, OSError) as exc:
            last = exc
            time.sleep(0.5)
    raise RuntimeError(f"could not declare the queues: {last!r}")


def _counts(cluster: ChaosCluster, queue: str) -> dict[str, Any] | None:
    """The queue's counts (messages = ready + unacknowledged) as its leader
    reports them (a follower's replica may lag), else as any live node knows
    them, or None."""
    names = cluster.names()
    fallback = None
    for i in cluster.alive():
        st, body = http("GET", f"{cluster.mgmt_url(i)}/api/queues/%2F/{q(queue)}", timeout=10.0)
        if st == 200 and isinstance(body, dict) and body.get("counts_known"):
            out = {k: body.get(k) for k in ("messages", "messages_ready", "messages_unacknowledged",
                                            "consumers", "leader", "members", "online")}
            out["asked"] = i
            if body.get("leader") == names[i]:
                return out
            fallback = fallback or out
    return fallback


def member_views(cluster: ChaosCluster, queue: str) -> dict[str, Any]:
    """The queue's member list as every live node's metadata has it, and the
    Raft configuration as its leader reports it. They must agree once the
    cluster is healed: a list naming fewer nodes than the configuration made
    a voter delete its replica (the seed-7102 loss)."""
    out: dict[str, Any] = {"metadata": {}, "raft": None}
    names = cluster.names()
    for i in cluster.alive():
        st, body = http("GET", f"{cluster.mgmt_url(i)}/api/queues/%2F/{q(queue)}", timeout=10.0)
        if st == 200 and isinstance(body, dict):
            out["metadata"][names[i]] = sorted(body.get("members") or [])
        if out["raft"] is None:
            st, body = http("GET", f"{cluster.mgmt_url(i)}/api/queues/%2F/{q(queue)}/quorum-status",
                            timeout=10.0)
            if st == 200 and isinstance(body, list):
                out["raft"] = sorted(m["node"] for m in body)
    lists = {tuple(v) for v in out["metadata"].values()}
    out["agree"] = out["raft"] is not None and lists == {tuple(out["raft"])}
    return out


def drain(cluster: ChaosCluster, history: History, queue: str, kind: str,
          timeout: float, stall_s: float = 40.0, process: str = "drain") -> dict[str, Any]:
    """Consume from every node in turn until a whole round gets nothing and
    the queue reports no messages. Gives up at the deadline, or when nothing
    was received for `stall_s` seconds while the queue still reports messages
    (they are stuck: reported as such, and counted as lost if confirmed)."""
    deadline = time.monotonic() + timeout
    rounds = got_total = 0
    errors: list[str] = []
    counts: dict[str, Any] | None = None
    last_got = time.monotonic()
    while time.monotonic() < deadline:
        rounds += 1
        got = 0
        for i in range(cluster.n):
            if time.monotonic() > deadline:
                break
            try:
                c = Client(cluster.nodes[i].host, cluster.nodes[i].port)
            except (AmqpError, TimeoutError, OSError) as exc:
                errors.append(f"round {rounds} node {i}: {exc!r}"[:200])
                continue
            try:
                c.consume(queue, 200)
                while time.monotonic() < deadline:
                    d = c.next_delivery(2.0)
                    if d is None:
                        break
                    try:
                        v: Any = int(d.body)
                    except ValueError:
                        v = d.body.decode(errors="replace")
                    history.add(process=process, type="ok", f="dequeue", value=v, node=i,
                                queue=kind, redelivered=d.redelivered)
                    c.ack(d.tag)
                    got += 1
            except (AmqpError, TimeoutError, OSError) as exc:
                errors.append(f"round {rounds} node {i}: {exc!r}"[:200])
            finally:
                c.close()
        got_total += got
        if got:
            last_got = time.monotonic()
        counts = _counts(cluster, queue)
        if got == 0 and counts is not None and counts.get("messages") == 0:
            break
        if time.monotonic() - last_got > stall_s:
            errors.append(f"stalled: nothing received for {stall_s:.0f}s; counts {counts}")
            break
    complete = counts is not None and counts.get("messages") == 0
    history.add(process=process, type="info", f="drain-end", value=queue, counts=counts,
                complete=complete)
    return {"queue": queue, "rounds": rounds, "received": got_total, "final_counts": counts,
            "complete": complete, "errors": errors[-20:]}


def node_errors(cluster: ChaosCluster, limit: int = 50) -> list[str]:
    """ERROR lines of the brokers' logs (first `limit`), as `n<i>: <line>`."""
    out: list[str] = []
    for i, nd in enumerate(cluster.nodes):
        try:
            text = nd.log_path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if " ERROR " in line and len(out) < limit:
                out.append(f"n{i}: {line[:300]}")
    return out


def wait_for_leader(nem: Nemesis, timeout: float) -> float | None:
    t0 = time.monotonic()
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        leader, _ = nem.leader()
        if leader is not None:
            return time.monotonic() - t0
        time.sleep(0.5)
    return None


def run_once(cfg: RunConfig, out: Path) -> dict[str, Any]:
    """Run one schedule; return the summary (also written to summary.json)."""
    if os.geteuid() != 0:
        raise PermissionError("the chaos suite needs root (network namespaces)")
    if cfg.variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}")
    kinds = parse_kinds(cfg.nemesis)
    run_id = f"n{cfg.nodes}-s{cfg.seed}-{cfg.variant}-{time.strftime('%Y%m%dT%H%M%S')}"
    rundir = out / run_id
    rundir.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix=f"qxchaos-{os.getpid()}-{run_id}-"))
    cluster = ChaosCluster(data, cfg.nodes, extra_config=cfg.broker_config,
                           tmpfs_node=cfg.seed % cfg.nodes if "disk-full" in kinds else None)
    history = History()
    values = Values()
    summary: dict[str, Any] = {"run": run_id, "commit": git_commit(), "config": asdict(cfg),
                               "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    stop = threading.Event()
    workers: list[Worker] = []
    nem: Nemesis | None = None
    t_start = time.monotonic()
    try:
        cluster.start()
        _declare(cluster, cfg)
        endpoints = [(nd.host, nd.port) for nd in cluster.nodes]
        roles = (["publisher"] * cfg.publishers + ["consumer"] * cfg.consumers
                 + ["getter"] * cfg.getters)
        workers = [Worker(w, role, endpoints, cfg.queue, history, values, cfg.seed, stop,
                          rate=cfg.rate) for w, role in enumerate(roles)]
        history.add(process="runner", type="info", f="clients-start", value=len(workers))
        for w in workers:
            w.start()
        nem = Nemesis(cluster, cfg.queue, history, cfg.seed, kinds, fault_s=cfg.fault_s,
                      quiet_s=cfg.quiet_s, membership_s=cfg.membership_s)
        nem.start()
        stop.wait(cfg.duration)
        nem.stop()
        history.add(process="runner", type="info", f="nemesis-stopped", value=None)
        try:
            cluster.heal_all()
        except Exception as exc:  # noqa: BLE001 - a node that cannot restart is a finding
            summary["heal_error"] = repr(exc)[:2000]
        history.add(process="runner", type="info", f="healed", value=None)
        summary["leader_after_heal_s"] = wait_for_leader(nem, 90.0)
        stop.set()
        for w in workers:
            w.join(30.0)
        history.add(process="runner", type="info", f="clients-stopped", value=None)
        queues = [(cfg.queue, "main")] + ([(cfg.dlq, "dlq")] if cfg.variant != "plain" else [])
        summary["drain"] = [drain(cluster, history, qn, kind, cfg.drain_timeout)
                            for qn, kind in queues]
        if not all(d["complete"] for d in summary["drain"]):
            # Messages left checked out to consumers that no longer exist are
            # stuck, not gone: a full restart returns them (channels carry a
            # per-start incarnation). Drain again, and report them apart.
            history.add(process="runner", type="info", f="restart-all-for-stuck", value=None)
            for nd in cluster.nodes:
                nd.stop()
            try:
                cluster.heal_all()
            except Exception as exc:  # noqa: BLE001
                summary["restart_error"] = repr(exc)[:2000]
            summary["leader_after_restart_s"] = wait_for_leader(nem, 90.0)
            summary["drain_after_restart"] = [
                drain(cluster, history, qn, kind, cfg.drain_timeout, process="drain-after-restart")
                for qn, kind in queues]
        end_t = history.now()
        history.add(process="runner", type="info", f="drained", value=None)
        ttl_s = cfg.ttl_ms / 1000 if cfg.variant == "ttl-amo" else None
        result = check(history.events, ttl_s=ttl_s, end_t=end_t)
        summary.update(result)
        summary["ops"] = sum(1 for e in history.events if e.get("type") == "invoke"
                             or (e.get("f") == "dequeue"))
        summary["nemesis_ops"] = sum(1 for e in history.events
                                     if e.get("process") == "nemesis" and e.get("phase") == "start")
        summary["nemesis_errors"] = nem.errors
        summary["membership_ops"] = nem.membership_ops
        summary["worker_errors"] = {w.process: dict(w.errors) for w in workers}
        summary["worker_crashes"] = [f"{w.process}: {w.crashed!r}" for w in workers if w.crashed]
        summary["drain_complete"] = all(d["complete"] for d in summary["drain"])
        final = summary.get("drain_after_restart", summary["drain"])
        summary["drain_complete_after_restart"] = all(d["complete"] for d in final)
        summary["members"] = {qn: member_views(cluster, qn) for qn, _ in queues}
        summary["members_agree"] = all(v["agree"] for v in summary["members"].values())
        summary["node_errors"] = node_errors(cluster)
        summary["groups_stopped"] = sum("stopped by an unexpected error" in x
                                        for x in summary["node_errors"])
        # valid = the checker's verdict; healthy = every queue drained (a full
        # restart allowed) and no Raft group stopped on a broken invariant
        # and the metadata's member lists equal to the Raft configuration
        summary["healthy"] = (summary["drain_complete_after_restart"] and not summary["groups_stopped"]
                              and summary["members_agree"])
        # confirmed values that only a full restart brought back: stuck, not lost
        only_after: dict[Any, bool] = {}
        for e in history.events:
            if e.get("f") == "dequeue" and e.get("type") == "ok":
                late = e.get("process") == "drain-after-restart"
                only_after[e["value"]] = only_after.get(e["value"], True) and late
        summary["stuck_until_restart"] = sorted((v for v, late in only_after.items() if late),
                                                key=str)[:1000]
        summary["stuck_until_restart_count"] = sum(only_after.values())
    except BaseException as exc:
        summary["valid"] = False
        summary["error"] = repr(exc)
        raise
    finally:
        stop.set()
        if nem is not None:
            nem.stop_event.set()
        summary["elapsed_s"] = round(time.monotonic() - t_start, 1)
        try:
            cluster.teardown()
        finally:
            history.write(rundir / "history.jsonl")
            (rundir / "nodes").mkdir(exist_ok=True)
            for nd in cluster.nodes:
                if nd.log_path.exists():
                    shutil.copy(nd.log_path, rundir / "nodes" / nd.log_path.name)
            if summary.get("valid") and not cfg.keep_data:
                shutil.rmtree(data, ignore_errors=True)
            else:
                summary["data_dir"] = str(data)
            summary["replay"] = cfg.replay_command(str(out))
            summary["results"] = str(rundir)
            (rundir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def one_line(s: dict[str, Any]) -> str:
    cfg = s.get("config", {})
    return (f"{'VALID  ' if s.get('valid') else 'INVALID'} "
            f"{'healthy' if s.get('healthy') else 'UNHEALTHY'} nodes={cfg.get('nodes')} "
            f"seed={cfg.get('seed')} variant={cfg.get('variant')} ops={s.get('ops')} "
            f"confirmed={s.get('confirmed')} unknown={s.get('unknown')} "
            f"lost={s.get('lost_count')} unexpected={s.get('unexpected_count')} "
            f"dup={s.get('duplicated_count')} recovered={s.get('recovered_count')} "
            f"stuck_until_restart={s.get('stuck_until_restart_count')} "
            f"max_no_confirm_after_leader_cut={s.get('max_no_confirm_after_leader_cut_s')}s "
            f"longest_gap={s.get('longest_confirm_gap_s')}s nemesis_ops={s.get('nemesis_ops')} "
            f"drain_complete={s.get('drain_complete')} groups_stopped={s.get('groups_stopped')} "
            f"members_agree={s.get('members_agree')} elapsed={s.get('elapsed_s')}s")
