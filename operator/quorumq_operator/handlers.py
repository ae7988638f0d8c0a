"""kopf handlers: gather state, call the planner, execute, write status and Events.

Where it sits: the thin I/O shell around `planner` (pure) and `mgmt` (the
broker client). Handlers never decide anything themselves.

Resources:
- QuorumQueue (quorumq.dev/v1alpha1): reconciled on create/update/resume and
  by a drift timer every QQ_OPERATOR_RESYNC_SECONDS (default 10 s), so a queue
  deleted inside the broker is declared again within seconds. Deletion honours
  `deletionPolicy` and refuses to delete a queue holding messages unless the
  resource is annotated `quorumq.dev/force-delete: "true"`.
- Policy (quorumq.dev/v1alpha1): the same, against (operator) policies.
- StatefulSet carrying the annotation `quorumq.dev/credentials-secret` (the
  broker): a timer every QQ_OPERATOR_CLUSTER_INTERVAL_SECONDS (default 5 s)
  follows scale-up (grow), scale-down (shrink departed nodes) and restarts
  (debounced leader rebalance).

State comes from kopf indexes (Secrets with username/password, broker
StatefulSets, their pods), so handlers need no Kubernetes client of their own.

Errors: a broker that cannot be reached -> Ready=False/BrokerUnreachable and
`kopf.TemporaryError` (retried with backoff); a spec the broker cannot take
-> Ready=False/InvalidSpec and `kopf.PermanentError`. Nothing raises past kopf.
"""
from __future__ import annotations

import asyncio
import datetime
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from . import API_GROUP, API_VERSION, metrics
from . import planner as p
from .mgmt import BrokerRefused, BrokerUnreachable, Endpoint, MgmtClient, execute, queue_obs
from .spec import (
    BrokerRef,
    InvalidSpec,
    PolicyDesired,
    policy_desired,
    queue_desired,
)

QQ = (API_GROUP, API_VERSION, "quorumqueues")
POLICY = (API_GROUP, API_VERSION, "policies")

# StatefulSet annotations: the contract between the chart and the operator.
A_SECRET = f"{API_GROUP}/credentials-secret"  # marks a broker StatefulSet
A_HOST = f"{API_GROUP}/management-host"
A_SERVICE = f"{API_GROUP}/management-service"
A_PORT = f"{API_GROUP}/management-port"
A_SCHEME = f"{API_GROUP}/management-scheme"
A_NODE_TEMPLATE = f"{API_GROUP}/node-name-template"
A_DEBOUNCE = f"{API_GROUP}/rebalance-debounce-seconds"
A_TARGET = f"{API_GROUP}/default-target-group-size"
DEFAULT_NODE_TEMPLATE = "rabbit@{pod}.{serviceName}.{namespace}.svc.cluster.local"


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


RESYNC = _env_float("QQ_OPERATOR_RESYNC_SECONDS", 10.0)
CLUSTER_INTERVAL = _env_float("QQ_OPERATOR_CLUSTER_INTERVAL_SECONDS", 5.0)
RETRY_DELAY = _env_float("QQ_OPERATOR_RETRY_SECONDS", 5.0)


def _now_iso() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- start-up


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{API_GROUP}/finalizer"
    settings.posting.level = 20  # INFO and above become Events
    settings.watching.server_timeout = 60
    if os.environ.get("QQ_OPERATOR_NAMESPACES"):
        settings.scanning.disabled = True  # explicit namespaces: no namespace/CRD scanning
    if os.environ.get("QQ_OPERATOR_PEERING_PRIORITY"):
        settings.peering.priority = int(os.environ["QQ_OPERATOR_PEERING_PRIORITY"])
    port = int(os.environ.get("QQ_OPERATOR_METRICS_PORT", "0") or 0)
    if port:
        from prometheus_client import start_http_server

        start_http_server(port, registry=metrics.REGISTRY)
    memo.clients = {}


@kopf.on.cleanup()
async def close_clients(memo: kopf.Memo, **_: Any) -> None:
    for client in list(getattr(memo, "clients", {}).values()):
        await client.close()


# ---------------------------------------------------------------- indexes


@kopf.index("", "v1", "secrets")
def credentials(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
    """Secrets holding `username` and `password` (data, or stringData as written)."""
    import base64

    data = dict(body.get("data") or {})
    plain = dict(body.get("stringData") or {})
    out = {}
    for key in ("username", "password"):
        if key in plain:
            out[key] = str(plain[key])
        elif key in data:
            try:
                out[key] = base64.b64decode(data[key]).decode()
            except ValueError:
                return None
    if len(out) != 2:
        return None
    return {(namespace, name): (out["username"], out["password"])}


@kopf.index("apps", "v1", "statefulsets", annotations={A_SECRET: kopf.PRESENT})
def brokers(namespace: str, name: str, spec: kopf.Spec, meta: kopf.Meta,
            **_: Any) -> dict[Any, Any]:
    return {(namespace, name): {"replicas": int(spec.get("replicas", 1)),
                                "serviceName": spec.get("serviceName", name),
                                "annotations": dict(meta.get("annotations") or {})}}


@kopf.index("", "v1", "pods")
def broker_pods(namespace: str, name: str, body: kopf.Body, meta: kopf.Meta,
                **_: Any) -> dict[Any, Any] | None:
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("kind") == "StatefulSet"]
    if not owners:
        return None
    conditions = (body.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    deleting = bool(meta.get("deletionTimestamp"))
    return {(namespace, owners[0]["name"]): (name, meta.get("uid") or "", ready and not deleting)}


# ---------------------------------------------------------------- resolving a broker


@dataclass(frozen=True, slots=True)
class Target:
    endpoint: Endpoint
    namespace: str
    stateful_set: str | None = None
    replicas: int | None = None
    node_template: str = DEFAULT_NODE_TEMPLATE
    service_name: str = ""
    debounce: float = 30.0
    default_target: int = 3


class NotResolved(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _one(index: kopf.Index[Any, Any], key: Any) -> Any:
    for value in index.get(key, []):
        return value
    return None


def resolve(ref: BrokerRef, namespace: str, brokers: kopf.Index[Any, Any],
            credentials: kopf.Index[Any, Any]) -> Target:
    sts: Mapping[str, Any] = {}
    ann: Mapping[str, str] = {}
    if ref.stateful_set:
        sts = _one(brokers, (namespace, ref.stateful_set)) or {}
        if not sts:
            raise NotResolved("StatefulSetNotFound",
                              f"no broker StatefulSet '{ref.stateful_set}' in namespace "
                              f"'{namespace}' (it needs the annotation {A_SECRET})")
        ann = sts["annotations"]
    if ref.host:
        host = ref.host
    elif ref.service:
        host = f"{ref.service}.{namespace}.svc"
    elif ann.get(A_HOST):
        host = ann[A_HOST]
    else:
        host = f"{ann.get(A_SERVICE) or sts.get('serviceName')}.{namespace}.svc"
    try:
        port = int(ref.port or ann.get(A_PORT) or 15672)
        debounce = float(ann.get(A_DEBOUNCE, 30))
        default_target = int(ann.get(A_TARGET, 3))
    except ValueError as exc:
        raise NotResolved("InvalidBrokerAnnotations", f"StatefulSet annotations: {exc}") from None
    scheme = ref.scheme or ann.get(A_SCHEME) or "http"
    secret = ref.secret_name or ann.get(A_SECRET)
    if not secret:
        raise NotResolved("NoCredentials", "spec.broker.secretName is not set and no StatefulSet "
                                           "gives one")
    creds = _one(credentials, (namespace, secret))
    if creds is None:
        raise NotResolved("SecretNotFound", f"Secret '{secret}' in namespace '{namespace}' does "
                                            "not exist or lacks username/password")
    return Target(Endpoint(f"{scheme}://{host}:{port}", creds[0], creds[1]), namespace,
                  ref.stateful_set, sts.get("replicas"), ann.get(A_NODE_TEMPLATE) or
                  DEFAULT_NODE_TEMPLATE, sts.get("serviceName", ""), debounce, default_target)


def client_for(memo: kopf.Memo, target: Target) -> MgmtClient:
    clients: dict[Endpoint, MgmtClient] = memo.setdefault("clients", {})
    if target.endpoint not in clients:
        clients[target.endpoint] = MgmtClient(target.endpoint)
    return clients[target.endpoint]


def ordinal_pattern(target: Target) -> re.Pattern[str] | None:
    """A regex matching broker node names of the StatefulSet's pods, capturing the ordinal."""
    if not target.stateful_set:
        return None
    text = re.escape(target.node_template)
    for key, value in (("namespace", target.namespace), ("serviceName", target.service_name),
                       ("statefulSet", target.stateful_set)):
        text = text.replace(re.escape("{" + key + "}"), re.escape(value))
    text = text.replace(re.escape("{pod}"), re.escape(target.stateful_set) + r"-(?P<ordinal>\d+)")
    text = text.replace(re.escape("{ordinal}"), r"(?P<ordinal>\d+)")
    try:
        return re.compile(text + "$")
    except re.error:  # the same group twice: take the first
        return re.compile(text.replace("(?P<ordinal>", "(", 1) + "$")


async def observe_nodes(client: MgmtClient, target: Target,
                        pods: kopf.Index[Any, Any] | None,
                        members: Iterable[str] = ()) -> tuple[p.NodeObs, ...]:
    """The broker's nodes, mapped to pods. `members`: queue members the caller saw; a
    member on a node the broker no longer lists (it left the cluster, e.g. two pods
    drained at once and one member change lost the race) is reported as a node too,
    down, and gone for good when its pod is gone above the replicas, so its members
    are removed like any other departed node's."""
    views = list(await client.nodes())
    listed = {str(v["name"]) for v in views}
    unlisted: dict[str, int] = {}
    for name in members:
        if name not in listed:
            unlisted[name] = unlisted.get(name, 0) + 1
    views += [{"name": name, "running": False, "quorum_queue_members": count,
               "unlisted": True} for name, count in unlisted.items()]
    pattern = ordinal_pattern(target)
    by_ordinal: dict[int, tuple[str, str, bool]] = {}
    if pattern is not None and pods is not None:
        for pod_name, uid, ready in pods.get((target.namespace, target.stateful_set), []):
            tail = pod_name.rpartition("-")[2]
            if tail.isdigit():
                by_ordinal[int(tail)] = (pod_name, uid, ready)
    out = []
    for v in views:
        name = str(v["name"])
        running = bool(v.get("running"))
        ordinal = None
        pod_ready: bool | None = None
        gone = False
        m = pattern.match(name) if pattern is not None else None
        if m is None and v.get("unlisted"):
            continue  # not a pod of this StatefulSet: nothing is known about it
        if m is not None:
            ordinal = int(m.group("ordinal")) if "ordinal" in m.groupdict() else int(m.group(1))
            pod = by_ordinal.get(ordinal)
            pod_ready = pod[2] if pod is not None else False
            replicas = target.replicas if target.replicas is not None else ordinal + 1
            gone = ordinal >= replicas and not running and pod is None
        out.append(p.NodeObs(name, running, ordinal, pod_ready, gone,
                             int(v.get("quorum_queue_members", 0))))
    return tuple(out)


# ---------------------------------------------------------------- shared helpers


def _lock(client: MgmtClient) -> asyncio.Lock:
    """One change at a time per broker: the QuorumQueue/Policy handlers, their timers and
    the StatefulSet's timer never run concurrent membership changes on a queue."""
    if client.lock is None:
        client.lock = asyncio.Lock()
    return client.lock


def _ready_reason(status: Mapping[str, Any]) -> str | None:
    for c in status.get("conditions") or []:
        if c.get("type") == "Ready":
            return str(c.get("reason"))
    return None


def _not_ready(patch: kopf.Patch, status: Mapping[str, Any], body: kopf.Body, reason: str,
               message: str, generation: int | None, warn: bool = True) -> None:
    """Ready=False with why; a Warning Event when the reason is new."""
    previous = status.get("conditions") or []
    patch.status["conditions"] = [p.condition("Ready", False, reason, message, generation,
                                              _now_iso(), previous)]
    patch.status["observedGeneration"] = generation
    if warn and _ready_reason(status) != reason:
        kopf.warn(body, reason=reason, message=message)


def _kind_of(body: kopf.Body) -> str:
    return str(body.get("kind", "object"))


async def _guarded(kind: str, body: kopf.Body, status: Mapping[str, Any], patch: kopf.Patch,
                   generation: int | None, work: Any) -> None:
    """Run one reconciliation; turn its failures into conditions and kopf errors."""
    started = time.monotonic()
    try:
        await work
    except InvalidSpec as exc:
        metrics.RECONCILES.labels(kind, "permanent").inc()
        _not_ready(patch, status, body, "InvalidSpec", str(exc), generation)
        raise kopf.PermanentError(str(exc)) from None
    except NotResolved as exc:
        metrics.RECONCILES.labels(kind, "temporary").inc()
        _not_ready(patch, status, body, exc.reason, exc.message, generation)
        raise kopf.TemporaryError(exc.message, delay=RETRY_DELAY) from None
    except BrokerUnreachable as exc:
        metrics.RECONCILES.labels(kind, "temporary").inc()
        metrics.BROKER_UNREACHABLE.inc()
        _not_ready(patch, status, body, "BrokerUnreachable", str(exc), generation)
        raise kopf.TemporaryError(f"broker unreachable: {exc}", delay=RETRY_DELAY) from None
    except BrokerRefused as exc:
        metrics.RECONCILES.labels(kind, "temporary").inc()
        _not_ready(patch, status, body, "BrokerRefused", str(exc), generation)
        raise kopf.TemporaryError(str(exc), delay=max(RETRY_DELAY, RESYNC)) from None
    else:
        metrics.RECONCILES.labels(kind, "ok").inc()
    finally:
        metrics.RECONCILE_SECONDS.labels(kind).observe(time.monotonic() - started)


def _record(body: kopf.Body, outcomes: list[Any]) -> p.Refuse | None:
    """Events for what changed; the first refusal (if any) for the status."""
    refusal = None
    for o in outcomes:
        name = type(o.action).__name__
        if isinstance(o.action, p.Refuse):
            refusal = refusal or o.action
            metrics.ACTIONS.labels(name, "refused").inc()
            continue
        metrics.ACTIONS.labels(name, "changed" if o.changed else "noop").inc()
        if o.changed:
            kopf.info(body, reason=name, message=o.message)
    return refusal


# ---------------------------------------------------------------- QuorumQueue


async def _reconcile_queue(body: kopf.Body, status: Mapping[str, Any], patch: kopf.Patch,
                           memo: kopf.Memo, generation: int | None,
                           brokers: kopf.Index[Any, Any], credentials: kopf.Index[Any, Any],
                           broker_pods: kopf.Index[Any, Any]) -> None:
    desired = queue_desired(body)
    target = resolve(desired.broker, desired.namespace, brokers, credentials)
    client = client_for(memo, target)
    async with _lock(client):
        view = await client.queue(desired.vhost, desired.name)
        nodes = await observe_nodes(client, target, broker_pods,
                                    (view or {}).get("members") or ())
        observed = p.QueueObserved(queue_obs(view) if view else None, nodes)
        actions = p.plan_queue(desired, observed)
        try:
            outcomes = await execute(client, actions)
        except BrokerRefused as exc:
            if exc.status == 400 and "inequivalent" not in exc.reason and actions and \
                    isinstance(actions[0], p.DeclareQueue):
                raise InvalidSpec(f"the broker refused the declaration: {exc.reason}") from None
            raise
        refusal = _record(body, outcomes)
        if refusal is not None and _ready_reason(status) != refusal.reason:
            kopf.warn(body, reason=refusal.reason, message=refusal.message)
        if any(o.changed for o in outcomes):
            view = await client.queue(desired.vhost, desired.name)
            observed = p.QueueObserved(queue_obs(view) if view else None, nodes)
    st = p.queue_status(desired, observed, generation, _now_iso(),
                        status.get("conditions") or [], refusal)
    patch.status.update(st)
    ready = st["conditions"][0]["status"] == "True"
    metrics.QUEUES_READY.labels(desired.namespace, str(body["metadata"]["name"])).set(
        1 if ready else 0)


@kopf.on.resume(*QQ)
@kopf.on.create(*QQ)
@kopf.on.update(*QQ, field="spec")
async def queue_changed(body: kopf.Body, status: kopf.Status, patch: kopf.Patch, memo: kopf.Memo,
                        meta: kopf.Meta, brokers: kopf.Index[Any, Any],
                        credentials: kopf.Index[Any, Any], broker_pods: kopf.Index[Any, Any],
                        **_: Any) -> None:
    await _guarded("QuorumQueue", body, status, patch, meta.get("generation"),
                   _reconcile_queue(body, status, patch, memo, meta.get("generation"),
                                    brokers, credentials, broker_pods))


@kopf.timer(*QQ, interval=RESYNC, initial_delay=RESYNC)
async def queue_drift(body: kopf.Body, status: kopf.Status, patch: kopf.Patch, memo: kopf.Memo,
                      meta: kopf.Meta, brokers: kopf.Index[Any, Any],
                      credentials: kopf.Index[Any, Any], broker_pods: kopf.Index[Any, Any],
                      **_: Any) -> None:
    if meta.get("deletionTimestamp"):
        return
    await _guarded("QuorumQueue", body, status, patch, meta.get("generation"),
                   _reconcile_queue(body, status, patch, memo, meta.get("generation"),
                                    brokers, credentials, broker_pods))


@kopf.on.delete(*QQ)
async def queue_deleted(body: kopf.Body, status: kopf.Status, patch: kopf.Patch, memo: kopf.Memo,
                        meta: kopf.Meta, brokers: kopf.Index[Any, Any],
                        credentials: kopf.Index[Any, Any], logger: Any, **_: Any) -> None:
    try:
        desired = queue_desired(body)
    except InvalidSpec:
        return  # never declared: nothing to clean up
    if desired.deletion_policy == "retain":
        kopf.info(body, reason="Retained", message=f"queue '{desired.name}' kept in the broker "
                                                   "(deletionPolicy: retain)")
        return
    generation = meta.get("generation")

    async def work() -> None:
        target = resolve(desired.broker, desired.namespace, brokers, credentials)
        client = client_for(memo, target)
        async with _lock(client):
            view = await client.queue(desired.vhost, desired.name)
            actions = p.plan_queue_delete(desired, queue_obs(view) if view else None)
            for a in actions:
                if isinstance(a, p.Refuse):
                    _not_ready(patch, status, body, a.reason, a.message, generation)
                    raise kopf.TemporaryError(a.message, delay=RESYNC)
            try:
                _record(body, await execute(client, actions))
            except BrokerRefused as exc:
                if "not empty" in exc.reason:
                    msg = (f"queue '{desired.name}' received messages while being deleted; "
                           f"annotate quorumq.dev/force-delete=\"true\" to delete it anyway")
                    _not_ready(patch, status, body, "QueueNotEmpty", msg, generation)
                    raise kopf.TemporaryError(msg, delay=RESYNC) from None
                raise

    await _guarded("QuorumQueue", body, status, patch, generation, work())


# ---------------------------------------------------------------- Policy


async def _reconcile_policy(body: kopf.Body, status: Mapping[str, Any], patch: kopf.Patch,
                            memo: kopf.Memo, generation: int | None,
                            brokers: kopf.Index[Any, Any],
                            credentials: kopf.Index[Any, Any]) -> None:
    desired: PolicyDesired = policy_desired(body)
    target = resolve(desired.broker, desired.namespace, brokers, credentials)
    client = client_for(memo, target)
    async with _lock(client):
        current = await client.policy(desired.vhost, desired.name, desired.operator_policy)
        try:
            outcomes = await execute(client, p.plan_policy(desired, current))
        except BrokerRefused as exc:
            if exc.status == 400:
                raise InvalidSpec(f"the broker refused the policy: {exc.reason}") from None
            raise
        _record(body, outcomes)
        queues = [queue_obs(v) for v in await client.queues(desired.vhost)]
    matched = p.matched_queues(desired, queues)
    previous = status.get("conditions") or []
    kind = "operator policy" if desired.operator_policy else "policy"
    patch.status.update({
        "observedGeneration": generation,
        "conditions": [p.condition("Ready", True, "Applied",
                                   f"{kind} '{desired.name}' set in vhost '{desired.vhost}', "
                                   f"applies to {len(matched)} queues", generation,
                                   _now_iso(), previous)],
        "matchedQueues": matched,
        "matchedQueueCount": len(matched),
    })


@kopf.on.resume(*POLICY)
@kopf.on.create(*POLICY)
@kopf.on.update(*POLICY, field="spec")
async def policy_changed(body: kopf.Body, status: kopf.Status, patch: kopf.Patch,
                         memo: kopf.Memo, meta: kopf.Meta, brokers: kopf.Index[Any, Any],
                         credentials: kopf.Index[Any, Any], **_: Any) -> None:
    await _guarded("Policy", body, status, patch, meta.get("generation"),
                   _reconcile_policy(body, status, patch, memo, meta.get("generation"),
                                     brokers, credentials))


@kopf.timer(*POLICY, interval=RESYNC, initial_delay=RESYNC)
async def policy_drift(body: kopf.Body, status: kopf.Status, patch: kopf.Patch,
                       memo: kopf.Memo, meta: kopf.Meta, brokers: kopf.Index[Any, Any],
                       credentials: kopf.Index[Any, Any], **_: Any) -> None:
    if meta.get("deletionTimestamp"):
        return
    await _guarded("Policy", body, status, patch, meta.get("generation"),
                   _reconcile_policy(body, status, patch, memo, meta.get("generation"),
                                     brokers, credentials))


@kopf.on.delete(*POLICY)
async def policy_deleted(body: kopf.Body, status: kopf.Status, patch: kopf.Patch,
                         memo: kopf.Memo, meta: kopf.Meta, brokers: kopf.Index[Any, Any],
                         credentials: kopf.Index[Any, Any], **_: Any) -> None:
    try:
        desired = policy_desired(body)
    except InvalidSpec:
        return
    if desired.deletion_policy == "retain":
        return

    async def work() -> None:
        target = resolve(desired.broker, desired.namespace, brokers, credentials)
        client = client_for(memo, target)
        async with _lock(client):
            exists = await client.policy(desired.vhost, desired.name,
                                         desired.operator_policy) is not None
            _record(body, await execute(client, p.plan_policy_delete(desired, exists)))

    await _guarded("Policy", body, status, patch, meta.get("generation"), work())


# ---------------------------------------------------------------- the broker StatefulSet


def _track_disruption(memo: kopf.Memo, pods: list[tuple[str, str, bool]], now: float) -> None:
    """A pod that is new, replaced (new uid) or not Ready is a disruption; the
    operator's own start counts as one (leaders may be uneven already)."""
    seen: dict[str, tuple[str, bool]] | None = memo.get("pods_seen")
    current = {name: (uid, ready) for name, uid, ready in pods}
    if seen is None:
        memo.disruption_at = now
    else:
        changed = any(seen.get(name, ("", False))[0] != uid for name, (uid, _) in current.items())
        if changed or not all(ready for _, ready in current.values()):
            memo.disruption_at = now
    memo.pods_seen = current


@kopf.timer("apps", "v1", "statefulsets", interval=CLUSTER_INTERVAL,
            annotations={A_SECRET: kopf.PRESENT})
async def broker_cluster(body: kopf.Body, name: str, namespace: str, spec: kopf.Spec,
                         memo: kopf.Memo, brokers: kopf.Index[Any, Any],
                         credentials: kopf.Index[Any, Any], broker_pods: kopf.Index[Any, Any],
                         logger: Any, **_: Any) -> None:
    try:
        target = resolve(BrokerRef(stateful_set=name), namespace, brokers, credentials)
    except NotResolved as exc:
        raise kopf.TemporaryError(exc.message, delay=RETRY_DELAY) from None
    client = client_for(memo, target)
    now = time.monotonic()
    pods = list(broker_pods.get((namespace, name), []))
    _track_disruption(memo, pods, now)
    try:
        async with _lock(client):
            queues = tuple(queue_obs(v) for v in await client.queues())
            nodes = await observe_nodes(client, target, broker_pods,
                                        [m for q in queues for m in q.members])
            plan = p.plan_cluster(p.ClusterObserved(
                nodes=nodes, queues=queues, replicas=int(spec.get("replicas", 1)),
                pods_ready=sum(1 for _, _, ready in pods if ready), now=now,
                disruption_at=memo.get("disruption_at"), settled_at=memo.get("settled_at"),
                debounce=target.debounce, default_target=target.default_target))
            logger.debug("pods %s, disruption at %s, settled at %s (now %s): plan %s", pods,
                         memo.get("disruption_at"), memo.get("settled_at"), now, plan)
            outcomes = []
            for action in plan.actions:  # one failed queue must not stop the others
                try:
                    outcomes += await execute(client, [action])
                except BrokerRefused as exc:
                    metrics.ACTIONS.labels(type(action).__name__, "failed").inc()
                    logger.warning("%s failed: %s", action, exc)
            _record(body, outcomes)
            if plan.settled:
                memo.settled_at = now
    except BrokerUnreachable as exc:
        metrics.BROKER_UNREACHABLE.inc()
        raise kopf.TemporaryError(f"broker unreachable: {exc}", delay=RETRY_DELAY) from None
