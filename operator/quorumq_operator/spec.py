"""Custom resource specs -> what the broker should hold (pure).

Where it sits: the first step of every handler. `queue_desired(cr)` and
`policy_desired(cr)` turn a QuorumQueue / Policy object (a plain dict, as
the API returns it) into frozen dataclasses the planner compares with the
broker's state. They raise `InvalidSpec` for anything the CRD schema cannot
express (the API server has already enforced types, enums and the CEL
rules; these checks repeat the important ones so a spec written around the
schema -- kmock does not validate, nor does a cluster with validation off --
still fails with a clear message instead of a broker 400).

Field names map to RabbitMQ's x-arguments / policy keys; `ARGUMENT_KEYS`
and `POLICY_KEYS` are the single tables.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The annotation that lets a QuorumQueue's deletion delete a queue that still holds messages.
FORCE_DELETE_ANNOTATION = "quorumq.dev/force-delete"
#: Broker default for a queue's initial group size (quorum_queue.initial_cluster_size).
DEFAULT_GROUP_SIZE = 3

# spec.arguments key -> (x-argument, python type); every argument is fixed at declaration
# (the broker compares all of them on re-declaration: broker/metadata/machine.py EQUIVALENCE_ARGS).
ARGUMENT_KEYS: dict[str, tuple[str, type]] = {
    "deliveryLimit": ("x-delivery-limit", int),
    "maxLength": ("x-max-length", int),
    "maxLengthBytes": ("x-max-length-bytes", int),
    "overflow": ("x-overflow", str),
    "messageTtl": ("x-message-ttl", int),
    "expires": ("x-expires", int),
    "deadLetterExchange": ("x-dead-letter-exchange", str),
    "deadLetterRoutingKey": ("x-dead-letter-routing-key", str),
    "deadLetterStrategy": ("x-dead-letter-strategy", str),
    "singleActiveConsumer": ("x-single-active-consumer", bool),
    "initialGroupSize": ("x-quorum-initial-group-size", int),
    "targetGroupSize": ("x-quorum-target-group-size", int),
    "leaderLocator": ("x-queue-leader-locator", str),
}
QUEUE_OVERFLOW = ("drop-head", "reject-publish")  # reject-publish-dlx: classic queues only
POLICY_OVERFLOW = ("drop-head", "reject-publish", "reject-publish-dlx")
DL_STRATEGIES = ("at-most-once", "at-least-once")
LOCATORS = ("client-local", "balanced")
APPLY_TO = ("queues", "classic_queues", "quorum_queues", "streams", "exchanges", "all")
DELETION_POLICIES = ("delete", "retain")

# Policy definition key -> python type (the broker's keys: broker/metadata/policies.py).
POLICY_KEYS: dict[str, type] = {
    "max-length": int, "max-length-bytes": int, "overflow": str, "message-ttl": int,
    "expires": int, "delivery-limit": int, "dead-letter-exchange": str,
    "dead-letter-routing-key": str, "dead-letter-strategy": str, "target-group-size": int,
    "queue-leader-locator": str, "alternate-exchange": str,
}
#: Keys an operator policy may carry (broker/metadata/policies.py OPERATOR_POLICY_KEYS).
OPERATOR_POLICY_KEYS = frozenset({"expires", "message-ttl", "max-length", "max-length-bytes",
                                  "delivery-limit", "target-group-size"})
_ENUMS: dict[str, tuple[str, ...]] = {
    "overflow": POLICY_OVERFLOW, "dead-letter-strategy": DL_STRATEGIES,
    "queue-leader-locator": LOCATORS,
}


class InvalidSpec(ValueError):
    """The custom resource asks for something the broker cannot do (the user's fault)."""


@dataclass(frozen=True, slots=True)
class BrokerRef:
    """Where a resource's broker is: a StatefulSet (its annotations give the rest)
    and/or an explicit management endpoint and credentials Secret."""

    stateful_set: str | None = None
    service: str | None = None
    host: str | None = None
    port: int | None = None
    scheme: str | None = None
    secret_name: str | None = None


@dataclass(frozen=True, slots=True)
class QueueDesired:
    namespace: str
    vhost: str
    name: str
    arguments: Mapping[str, Any]  # x-arguments, x-queue-type included
    target_size: int  # membership the operator keeps (capped by the nodes that exist)
    deletion_policy: str
    broker: BrokerRef
    force_delete: bool = False


@dataclass(frozen=True, slots=True)
class PolicyDesired:
    namespace: str
    vhost: str
    name: str
    pattern: str
    apply_to: str
    priority: int
    definition: Mapping[str, Any] = field(default_factory=dict)
    operator_policy: bool = False
    deletion_policy: str = "delete"
    broker: BrokerRef = field(default_factory=BrokerRef)


def _typed(value: Any, want: type, where: str) -> Any:
    ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
    if not ok:
        raise InvalidSpec(f"{where} must be {want.__name__}, got {type(value).__name__}")
    return value


def _name_and_vhost(obj: Mapping[str, Any]) -> tuple[str, str, str, Mapping[str, Any]]:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = spec.get("name") or meta.get("name") or ""
    vhost = spec.get("vhost", "/")
    _typed(name, str, "spec.name")
    _typed(vhost, str, "spec.vhost")
    if not name or len(name.encode()) > 255:
        raise InvalidSpec("the name is 1 to 255 bytes long")
    if name.startswith("amq."):
        raise InvalidSpec(f"name '{name}' uses the reserved prefix 'amq.'")
    if not vhost:
        raise InvalidSpec("spec.vhost must not be empty")
    return str(meta.get("namespace") or "default"), vhost, name, spec


def broker_ref(spec: Mapping[str, Any]) -> BrokerRef:
    ref = spec.get("broker") or {}
    if not isinstance(ref, Mapping):
        raise InvalidSpec("spec.broker must be an object")
    out = BrokerRef(stateful_set=ref.get("statefulSet"), service=ref.get("service"),
                    host=ref.get("host"), port=ref.get("port"), scheme=ref.get("scheme"),
                    secret_name=ref.get("secretName"))
    if out.service and out.host:
        raise InvalidSpec("spec.broker: give service or host, not both")
    if not (out.stateful_set or out.service or out.host):
        raise InvalidSpec("spec.broker needs statefulSet, service or host")
    if out.port is not None and not (isinstance(out.port, int) and 0 < out.port < 65536):
        raise InvalidSpec("spec.broker.port must be 1..65535")
    if out.scheme not in (None, "http", "https"):
        raise InvalidSpec("spec.broker.scheme must be http or https")
    return out


def queue_desired(obj: Mapping[str, Any]) -> QueueDesired:
    namespace, vhost, name, spec = _name_and_vhost(obj)
    raw = spec.get("arguments") or {}
    if not isinstance(raw, Mapping):
        raise InvalidSpec("spec.arguments must be an object")
    args: dict[str, Any] = {"x-queue-type": "quorum"}
    for key, value in raw.items():
        if key not in ARGUMENT_KEYS:
            raise InvalidSpec(f"spec.arguments.{key} is not a known argument "
                              f"(known: {', '.join(sorted(ARGUMENT_KEYS))})")
        xkey, want = ARGUMENT_KEYS[key]
        args[xkey] = _typed(value, want, f"spec.arguments.{key}")
    for key in ("maxLength", "maxLengthBytes", "messageTtl"):
        if raw.get(key, 0) < 0:
            raise InvalidSpec(f"spec.arguments.{key} must not be negative")
    for key in ("expires", "initialGroupSize", "targetGroupSize"):
        if key in raw and raw[key] < 1:
            raise InvalidSpec(f"spec.arguments.{key} must be at least 1")
    enums = {"overflow": QUEUE_OVERFLOW, "deadLetterStrategy": DL_STRATEGIES,
             "leaderLocator": LOCATORS}
    for key, allowed in enums.items():
        if key in raw and raw[key] not in allowed:
            raise InvalidSpec(f"spec.arguments.{key} must be one of {', '.join(allowed)}"
                              + (" (reject-publish-dlx is for classic queues only)"
                                 if raw[key] == "reject-publish-dlx" else ""))
    if "deadLetterRoutingKey" in raw and "deadLetterExchange" not in raw:
        raise InvalidSpec("spec.arguments.deadLetterRoutingKey needs deadLetterExchange")
    target = raw.get("targetGroupSize") or raw.get("initialGroupSize") or DEFAULT_GROUP_SIZE
    deletion = spec.get("deletionPolicy", "delete")
    if deletion not in DELETION_POLICIES:
        raise InvalidSpec("spec.deletionPolicy must be delete or retain")
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    force = str(annotations.get(FORCE_DELETE_ANNOTATION, "")).lower() == "true"
    return QueueDesired(namespace, vhost, name, args, int(target), deletion, broker_ref(spec), force)


def policy_desired(obj: Mapping[str, Any]) -> PolicyDesired:
    namespace, vhost, name, spec = _name_and_vhost(obj)
    pattern = spec.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise InvalidSpec("spec.pattern is required (a regular expression)")
    apply_to = spec.get("applyTo", "all")
    if apply_to not in APPLY_TO:
        raise InvalidSpec(f"spec.applyTo must be one of {', '.join(APPLY_TO)}")
    priority = _typed(spec.get("priority", 0), int, "spec.priority")
    operator = bool(spec.get("operatorPolicy", False))
    raw = spec.get("definition") or {}
    if not isinstance(raw, Mapping) or not raw:
        raise InvalidSpec("spec.definition must set at least one key")
    definition: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in POLICY_KEYS:
            raise InvalidSpec(f"spec.definition.{key} is not a known policy key")
        definition[key] = _typed(value, POLICY_KEYS[key], f"spec.definition.{key}")
        if key in _ENUMS and value not in _ENUMS[key]:
            raise InvalidSpec(f"spec.definition.{key} must be one of {', '.join(_ENUMS[key])}")
    if operator:
        extra = sorted(set(definition) - OPERATOR_POLICY_KEYS)
        if extra:
            raise InvalidSpec(f"operator policies cannot set {', '.join(extra)} "
                              f"(allowed: {', '.join(sorted(OPERATOR_POLICY_KEYS))})")
        if apply_to not in ("queues", "classic_queues", "quorum_queues", "streams"):
            raise InvalidSpec("operator policies apply to queues only")
    deletion = spec.get("deletionPolicy", "delete")
    if deletion not in DELETION_POLICIES:
        raise InvalidSpec("spec.deletionPolicy must be delete or retain")
    return PolicyDesired(namespace, vhost, name, pattern, apply_to, priority, definition,
                         operator, deletion, broker_ref(spec))
