"""Continuous membership reconciliation (CMR) of quorum queues, as RabbitMQ 4.x does it.

Where it sits: a background task of each node, started with the management
services when `quorum_queue.continuous_membership_reconciliation.enabled` is
true. Every node reconciles the quorum queues whose leader it holds: a queue
with fewer members than its target group size grows onto online nodes that
hold no member of it (least loaded first); with `auto_remove`, members on
nodes that are no longer cluster members are removed. The decisions are the
pure function `plan()`; the changes go through the management port's
membership operations (the same as the API's add/delete member).

Target group size: the queue's `x-quorum-target-group-size` argument, else
the `target-group-size` policy key, raised by an operator policy's value
(`broker.metadata.effective_definition`), else
`continuous_membership_reconciliation.target_group_size`.

When: every `interval` ms, and `trigger_interval` ms after a trigger event
(the cluster's node list or a policy changed). Node or member failures are
not triggers (RabbitMQ's rule: a failed node is expected to come back).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import broker.metadata as md
import broker.mgmt.views as v

from .port import ManagementPort, PortError

log = logging.getLogger("broker.mgmt.reconcile")


@dataclass(frozen=True, slots=True)
class QueueMembers:
    vhost: str
    name: str
    members: tuple[str, ...]
    target: int


@dataclass(frozen=True, slots=True)
class AddMember:
    vhost: str
    name: str
    node: str


@dataclass(frozen=True, slots=True)
class RemoveMember:
    vhost: str
    name: str
    node: str


Action = AddMember | RemoveMember


def plan(queues: Sequence[QueueMembers], cluster_nodes: Iterable[str], online: Iterable[str],
         auto_remove: bool, load: dict[str, int] | None = None) -> list[Action]:
    """The membership changes that bring `queues` to their targets.

    Invariants: never removes a queue's last member; only adds members on
    online cluster nodes that hold none of that queue; never shrinks a queue
    that is above its target (CMR only grows, except auto-removal of members
    on departed nodes). `load` (members per node over all queues) breaks ties
    towards the least loaded node, then by name; it is updated as members are
    planned so consecutive queues spread out."""
    cluster = set(cluster_nodes)
    up = sorted(set(online) & cluster)
    if load is None:
        load = {}
        for q in queues:
            for m in q.members:
                load[m] = load.get(m, 0) + 1
    else:
        load = dict(load)
    actions: list[Action] = []
    for q in sorted(queues, key=lambda q: (q.vhost, q.name)):
        members = list(q.members)
        if auto_remove:
            for m in [m for m in members if m not in cluster]:
                if len(members) > 1:
                    actions.append(RemoveMember(q.vhost, q.name, m))
                    members.remove(m)
                    load[m] = load.get(m, 1) - 1
        missing = q.target - len(members)
        if missing <= 0:
            continue
        candidates = sorted((n for n in up if n not in members), key=lambda n: (load.get(n, 0), n))
        for n in candidates[:missing]:
            actions.append(AddMember(q.vhost, q.name, n))
            load[n] = load.get(n, 0) + 1
    return actions


def target_size(state: md.MetadataState, record: md.QueueRecord, default: int) -> int:
    value = md.effective_definition(state, record).get("target-group-size")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return default


class Reconciler:
    """The node's CMR task. `runs` counts completed reconciliations and
    `last_actions` holds what the last one did (for logs and tests)."""

    def __init__(self, port: ManagementPort, interval_s: float, trigger_s: float, target: int,
                 auto_remove: bool) -> None:
        self.port = port
        self.interval_s = interval_s
        self.trigger_s = trigger_s
        self.target = target
        self.auto_remove = auto_remove
        self.runs = 0
        self.last_actions: list[tuple[Action, str]] = []
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_config(cls, port: ManagementPort) -> Reconciler:
        key = "quorum_queue.continuous_membership_reconciliation."
        cfg = port.config
        return cls(port, cfg[key + "interval"] / 1000, cfg[key + "trigger_interval"] / 1000,
                   cfg[key + "target_group_size"], cfg[key + "auto_remove"])

    def start(self) -> Reconciler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def _fingerprint(self) -> tuple[tuple[str, ...], frozenset[md.PolicyRecord],
                                    frozenset[md.PolicyRecord]]:
        state = self.port.metadata()
        return (tuple(self.port.cluster_nodes()), frozenset(state.policies.values()),
                frozenset(state.operator_policies.values()))

    async def _run(self) -> None:
        last = self._fingerprint()
        next_run = time.monotonic() + self.interval_s
        triggered_at: float | None = None
        tick = max(0.05, min(1.0, self.trigger_s, self.interval_s))
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            fp = self._fingerprint()
            if fp != last:
                last, triggered_at = fp, now + self.trigger_s
            if now >= next_run or (triggered_at is not None and now >= triggered_at):
                try:
                    await self.reconcile()
                except Exception:  # noqa: BLE001 - keep reconciling on the next round
                    log.exception("membership reconciliation failed")
                next_run, triggered_at = time.monotonic() + self.interval_s, None

    def _led_here(self) -> list[md.QueueRecord]:
        led = {(m.vhost, m.name) for m in self.port.raft_members() if m.is_leader}
        return [r for r in self.port.metadata().queues.values()
                if r.type == "quorum" and (r.vhost, r.name) in led]

    async def reconcile(self) -> list[tuple[Action, str]]:
        """One round over the queues led here; returns (action, "ok" or reason)."""
        port = self.port
        state = port.metadata()
        load: dict[str, int] = {}
        for r in state.queues.values():
            if r.type == "quorum":
                for m in r.members:
                    load[m] = load.get(m, 0) + 1
        queues = [QueueMembers(r.vhost, r.name, tuple(r.members),
                               target_size(state, r, self.target)) for r in self._led_here()]
        nodes = port.cluster_nodes()
        actions = plan(queues, nodes, v.online(port, nodes), self.auto_remove, load)
        done: list[tuple[Action, str]] = []
        for a in actions:
            try:
                if isinstance(a, AddMember):
                    await port.add_member(a.vhost, a.name, a.node)
                else:
                    await port.delete_member(a.vhost, a.name, a.node)
                outcome = "ok"
                log.info("reconciliation: %s", a)
            except Exception as exc:  # noqa: BLE001 - one queue's failure does not stop the rest
                outcome = exc.text if isinstance(exc, PortError) else str(exc)
                log.warning("reconciliation: %s failed: %s", a, outcome)
            done.append((a, outcome))
        self.last_actions = done
        self.runs += 1
        return done
