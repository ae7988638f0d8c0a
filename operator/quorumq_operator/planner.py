"""The planner: what to do, given what is wanted and what is there (pure).

Where it sits: handlers gather the observed state (broker management API,
StatefulSet, pods), call one `plan_*` function, and hand the returned actions
to `executor.execute`. Nothing here does I/O, reads a clock or keeps state:
time comes in as `now`, so every decision is a table test away
(tests/operator/test_planner.py).

Invariants the planner keeps:
- Membership only grows onto nodes that are running, not leaving and whose
  pod (when pods are known) is Ready; it never grows past the target size nor
  past the nodes that exist.
- A member is removed only when its node is gone for good (its pod ordinal is
  at or above the StatefulSet's replicas, the node is down and no pod exists
  for it), and only while another member remains. Additions come before
  removals in the returned list, so redundancy never dips first.
- A queue holding messages is never deleted unless forced.
- Leaders are rebalanced only after a disruption (a pod restarted, became
  unready, appeared) has been quiet for the debounce period, all pods are
  Ready, no membership change is pending, and the leaders are uneven.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .spec import PolicyDesired, QueueDesired

# ---------------------------------------------------------------- observed state


@dataclass(frozen=True, slots=True)
class NodeObs:
    """One broker node as the operator sees it."""

    name: str
    running: bool
    ordinal: int | None = None  # the pod ordinal, when the node name maps to the StatefulSet
    pod_ready: bool | None = None  # None: pods unknown (no StatefulSet reference)
    gone: bool = False  # left for good: ordinal >= replicas, not running, no pod
    members: int = 0  # quorum-queue members it holds (its load)

    @property
    def eligible(self) -> bool:
        """May receive a new member."""
        return self.running and not self.gone and self.pod_ready is not False


@dataclass(frozen=True, slots=True)
class QueueObs:
    """One queue as the management API reports it."""

    vhost: str
    name: str
    type: str = "quorum"
    members: tuple[str, ...] = ()
    online: tuple[str, ...] = ()
    leader: str | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict)
    messages: int | None = 0  # None: counts unknown (no leader reachable)
    messages_ready: int = 0
    messages_unacknowledged: int = 0
    consumers: int = 0
    message_bytes: int = 0
    policy: str | None = None
    operator_policy: str | None = None
    target: int | None = None  # target group size from argument or (operator) policy


@dataclass(frozen=True, slots=True)
class QueueObserved:
    queue: QueueObs | None
    nodes: tuple[NodeObs, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterObserved:
    """One broker StatefulSet and everything in its cluster, for `plan_cluster`."""

    nodes: tuple[NodeObs, ...]
    queues: tuple[QueueObs, ...]
    replicas: int
    pods_ready: int
    now: float
    disruption_at: float | None = None  # last pod restart/unready/appearance seen
    settled_at: float | None = None  # last time a disruption was settled
    debounce: float = 30.0
    default_target: int = 3


# ---------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class DeclareQueue:
    vhost: str
    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class DeleteQueue:
    vhost: str
    name: str
    if_empty: bool = True


@dataclass(frozen=True, slots=True)
class AddMember:
    vhost: str
    name: str
    node: str


@dataclass(frozen=True, slots=True)
class DeleteMember:
    vhost: str
    name: str
    node: str


@dataclass(frozen=True, slots=True)
class PutPolicy:
    vhost: str
    name: str
    operator: bool
    body: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class DeletePolicy:
    vhost: str
    name: str
    operator: bool


@dataclass(frozen=True, slots=True)
class ShrinkNode:
    """Remove every queue member on a node that is gone for good."""

    node: str


@dataclass(frozen=True, slots=True)
class Rebalance:
    """Spread queue leaders evenly over the running nodes."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """Nothing may be done safely: report why (status condition and Event)."""

    reason: str
    message: str


Action = (DeclareQueue | DeleteQueue | AddMember | DeleteMember | PutPolicy | DeletePolicy
          | ShrinkNode | Rebalance | Refuse)


# ---------------------------------------------------------------- membership


def capped_target(target: int, nodes: Iterable[NodeObs]) -> int:
    """The membership to keep: the target, but never more than the nodes that exist."""
    return min(target, sum(1 for n in nodes if not n.gone))


def membership_actions(vhost: str, name: str, members: Sequence[str], target: int,
                       nodes: Sequence[NodeObs], remove_gone: bool = True) -> list[Action]:
    by_name = {n.name: n for n in nodes}
    gone = [m for m in members if m in by_name and by_name[m].gone]
    live = [m for m in members if m not in gone]
    want = capped_target(target, nodes)
    candidates = sorted((n for n in nodes if n.eligible and n.name not in members),
                        key=lambda n: (n.members, n.name))
    out: list[Action] = [AddMember(vhost, name, n.name)
                         for n in candidates[:max(0, want - len(live))]]
    if remove_gone and gone:
        if live or out:
            out += [DeleteMember(vhost, name, m) for m in gone]
        else:
            out.append(Refuse("AllMembersGone",
                              f"every member of queue '{name}' is on a node that is gone "
                              f"({', '.join(gone)}): its messages cannot be recovered here"))
    return out


# ---------------------------------------------------------------- queues


def plan_queue(desired: QueueDesired, observed: QueueObserved) -> list[Action]:
    """Declare the queue when it is missing (also when it was deleted inside the
    broker), then keep its membership at the target size."""
    q = observed.queue
    if q is None:
        return [DeclareQueue(desired.vhost, desired.name, dict(desired.arguments))]
    if q.type != "quorum":
        return [Refuse("NotAQuorumQueue", f"queue '{q.name}' in vhost '{q.vhost}' exists as a "
                                          f"{q.type} queue; delete it to let the operator declare it")]
    out: list[Action] = []
    if dict(q.arguments) != dict(desired.arguments):
        out.append(Refuse("ArgumentsDiffer",
                          f"the queue exists with arguments {dict(q.arguments)} but the spec asks "
                          f"for {dict(desired.arguments)}; queue arguments cannot change after "
                          "declaration (use a Policy, or delete and recreate the queue)"))
    return out + membership_actions(desired.vhost, desired.name, q.members, desired.target_size,
                                     observed.nodes)


def plan_queue_delete(desired: QueueDesired, queue: QueueObs | None) -> list[Action]:
    """On deletion of the custom resource: honour deletionPolicy, never drop messages
    unless forced."""
    if desired.deletion_policy == "retain" or queue is None:
        return []
    if desired.force_delete:
        return [DeleteQueue(desired.vhost, desired.name, if_empty=False)]
    if queue.messages:
        return [Refuse("QueueNotEmpty",
                       f"queue '{queue.name}' in vhost '{queue.vhost}' still holds "
                       f"{queue.messages} messages; drain it, set deletionPolicy: retain, or "
                       f"annotate the resource quorumq.dev/force-delete=\"true\" to delete it")]
    return [DeleteQueue(desired.vhost, desired.name, if_empty=True)]


# ---------------------------------------------------------------- policies


def policy_body(desired: PolicyDesired) -> dict[str, Any]:
    return {"pattern": desired.pattern, "definition": dict(desired.definition),
            "priority": desired.priority, "apply-to": desired.apply_to}


def plan_policy(desired: PolicyDesired, observed: Mapping[str, Any] | None) -> list[Action]:
    body = policy_body(desired)
    if observed is not None and all(observed.get(k) == v for k, v in body.items()):
        return []
    return [PutPolicy(desired.vhost, desired.name, desired.operator_policy, body)]


def plan_policy_delete(desired: PolicyDesired, exists: bool) -> list[Action]:
    if desired.deletion_policy == "retain" or not exists:
        return []
    return [DeletePolicy(desired.vhost, desired.name, desired.operator_policy)]


def matched_queues(policy: PolicyDesired, queues: Iterable[QueueObs]) -> list[str]:
    """The queues the policy currently applies to (the broker picks one policy per
    queue: the highest priority match)."""
    return sorted(q.name for q in queues if q.vhost == policy.vhost
                  and (q.operator_policy if policy.operator_policy else q.policy) == policy.name)


# ---------------------------------------------------------------- the StatefulSet


@dataclass(frozen=True, slots=True)
class ClusterPlan:
    actions: list[Action]
    #: The current disruption (if any) is dealt with: the handler records `now`
    #: as its settled time so the next tick does not rebalance again.
    settled: bool = False


def leader_counts(queues: Iterable[QueueObs], nodes: Iterable[NodeObs]) -> dict[str, int]:
    running = {n.name: 0 for n in nodes if n.running and not n.gone}
    for q in queues:
        if q.type == "quorum" and q.leader in running:
            running[q.leader] += 1
    return running


def leaders_balanced(queues: Sequence[QueueObs], nodes: Sequence[NodeObs]) -> bool:
    """No running node leads more than ceil(queues / nodes) of the quorum queues
    (only nodes holding a member of a queue can lead it, so that bound is what
    a rebalance can reach)."""
    counts = leader_counts(queues, nodes)
    total = sum(counts.values())
    if not counts or total == 0:
        return True
    return max(counts.values()) <= -(-total // len(counts))


def plan_cluster(obs: ClusterObserved) -> ClusterPlan:
    """Follow the StatefulSet: drop members on nodes gone for good, grow queues
    below their target onto new pods, rebalance leaders after a disruption."""
    out: list[Action] = []
    for n in obs.nodes:
        if n.gone and any(n.name in q.members for q in obs.queues):
            out.append(ShrinkNode(n.name))
    for q in obs.queues:
        if q.type != "quorum":
            continue
        target = q.target if q.target is not None else obs.default_target
        out += [a for a in membership_actions(q.vhost, q.name, q.members, target, obs.nodes,
                                              remove_gone=False)]
    # Membership changes never hold back the rebalance (a queue that cannot grow must not
    # starve it); they run first, the rebalance last, in the same pass.
    pending = obs.disruption_at is not None and (obs.settled_at is None
                                                 or obs.disruption_at > obs.settled_at)
    if not pending or obs.now - (obs.disruption_at or 0.0) < obs.debounce:
        return ClusterPlan(out)
    stable = (obs.pods_ready >= obs.replicas
              and all(n.running for n in obs.nodes if not n.gone))
    if not stable:
        return ClusterPlan(out)
    quorum = [q for q in obs.queues if q.type == "quorum"]
    if leaders_balanced(quorum, obs.nodes):
        return ClusterPlan(out, settled=True)
    return ClusterPlan(out + [Rebalance()], settled=True)


# ---------------------------------------------------------------- status


def condition(ctype: str, ok: bool, reason: str, message: str, generation: int | None,
              now_iso: str, previous: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A Kubernetes condition; lastTransitionTime moves only when the status flips."""
    status = "True" if ok else "False"
    last = now_iso
    for c in previous:
        if c.get("type") == ctype and c.get("status") == status and c.get("lastTransitionTime"):
            last = str(c["lastTransitionTime"])
    out: dict[str, Any] = {"type": ctype, "status": status, "reason": reason,
                           "message": message, "lastTransitionTime": last}
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def queue_status(desired: QueueDesired, observed: QueueObserved, generation: int | None,
                 now_iso: str, previous: Sequence[Mapping[str, Any]] = (),
                 problem: Refuse | None = None) -> dict[str, Any]:
    """The QuorumQueue's status from what the broker reports after reconciling."""
    q = observed.queue
    status: dict[str, Any] = {"observedGeneration": generation}
    if q is None:
        ready = condition("Ready", False, "NotDeclared",
                          f"queue '{desired.name}' does not exist in vhost '{desired.vhost}'",
                          generation, now_iso, previous)
        status.update(conditions=[ready], leader=None, members=[], onlineMembers=[])
        return status
    quorum = len(q.members) // 2 + 1
    want = capped_target(desired.target_size, observed.nodes) if observed.nodes else len(q.members)
    live = [m for m in q.members if m not in {n.name for n in observed.nodes if n.gone}]
    if problem is not None:
        ready = condition("Ready", False, problem.reason, problem.message, generation, now_iso,
                          previous)
    elif len(q.online) < quorum:
        ready = condition("Ready", False, "NoQuorum",
                          f"{len(q.online)} of {len(q.members)} members online, "
                          f"{quorum} needed", generation, now_iso, previous)
    else:
        ready = condition("Ready", True, "Declared",
                          f"leader {q.leader}, {len(q.online)}/{len(q.members)} members online",
                          generation, now_iso, previous)
    synced = condition("MembershipSynced", len(live) >= want,
                       "AtTarget" if len(live) >= want else "BelowTarget",
                       f"{len(live)} live members, target {desired.target_size} "
                       f"(capped at {want} by the nodes that exist)", generation, now_iso, previous)
    status.update(
        conditions=[ready, synced], leader=q.leader, members=sorted(q.members),
        onlineMembers=sorted(q.online), messagesReady=q.messages_ready,
        messagesUnacknowledged=q.messages_unacknowledged, consumers=q.consumers,
        diskBytes=q.message_bytes)
    return status
