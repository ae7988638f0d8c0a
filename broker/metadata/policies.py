"""Policies and operator policies: validation, matching and effective values.

Where it sits: `machine` validates SetPolicy/SetOperatorPolicy with
`validate_policy` and reports queues whose effective policy changed; the
runtime pushes `effective_definition(state, queue)` into each queue's state
machine; `routing` reads an exchange's alternate exchange through
`exchange_alternate`; the management API shows `queue_policy` /
`queue_operator_policy` per queue.

Rules (RabbitMQ's, see docs/metadata.md):
- a policy matches an entity when its pattern regex *searches* (unanchored,
  like Erlang's re:run) the name and its apply-to covers the entity kind;
- the highest priority wins; ties go to the policy whose name sorts first
  (RabbitMQ keeps policies in key order and sorts stably by priority);
- client x-arguments win over the policy; the operator policy wins over both,
  except that for numeric limits the lower value wins (target-group-size:
  the higher value wins, it is a floor on redundancy).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import lru_cache

from .errors import PRECONDITION_FAILED, MetadataError, erl
from .state import ExchangeRecord, MetadataState, PolicyRecord, QueueRecord
from .types import APPLY_TO, Arguments, FieldValue, VhostName, lookup


def _int(v: FieldValue) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str(v: FieldValue) -> bool:
    return isinstance(v, str)


# key -> (valid?, description used in "X is not a valid <description>")
# Texts verified against RabbitMQ 3.10 except where noted in tests.
_VALIDATORS: dict[str, tuple[Callable[[FieldValue], bool], str]] = {
    "max-length": (lambda v: _int(v) and v >= 0, "maximum length"),
    "max-length-bytes": (lambda v: _int(v) and v >= 0, "maximum length in bytes"),
    "message-ttl": (lambda v: _int(v) and v >= 0, "message TTL"),
    "expires": (lambda v: _int(v) and v >= 1, "queue expiry"),
    "overflow": (
        lambda v: v in ("drop-head", "reject-publish", "reject-publish-dlx"),
        "overflow value",
    ),
    "dead-letter-exchange": (_str, "dead letter exchange name"),
    "dead-letter-routing-key": (_str, "dead letter routing key"),
    "dead-letter-strategy": (
        lambda v: v in ("at-most-once", "at-least-once"),
        "dead letter strategy",
    ),
    # RabbitMQ 4.x: -1 means unlimited (3.10 still refused it).
    "delivery-limit": (lambda v: _int(v) and v >= -1, "delivery limit"),
    "target-group-size": (lambda v: _int(v) and v >= 1, "target group size"),
    "queue-leader-locator": (
        lambda v: v in ("client-local", "balanced"),
        "queue leader locator value",
    ),
    "alternate-exchange": (_str, "alternate exchange name"),
    # RabbitMQ 3.12+/4.x (rabbit_policies): "<<\"5\">> is not a valid consumer timeout"
    "consumer-timeout": (lambda v: _int(v) and v >= 0, "consumer timeout"),
}
POLICY_KEYS: frozenset[str] = frozenset(_VALIDATORS)
# Keys an operator policy may set (RabbitMQ refuses the rest as unrecognised).
OPERATOR_POLICY_KEYS: frozenset[str] = frozenset(
    {"expires", "message-ttl", "max-length", "max-length-bytes", "delivery-limit",
     "target-group-size"}
)
# How an operator policy value combines with the client/policy value.
_MERGE: dict[str, Callable[[int, int], int]] = {
    "expires": min,
    "message-ttl": min,
    "max-length": min,
    "max-length-bytes": min,
    "target-group-size": max,
}
# Queue keys a policy can set (exchanges only take alternate-exchange).
QUEUE_POLICY_KEYS: frozenset[str] = POLICY_KEYS - {"alternate-exchange"}


def _merge_delivery_limit(val: int, op: int) -> int:
    # -1 is "unlimited": the operator's finite limit caps it.
    if val < 0:
        return op
    if op < 0:
        return val
    return min(val, op)


_MERGE["delivery-limit"] = _merge_delivery_limit


def _invalid(text: str) -> MetadataError:
    return MetadataError(PRECONDITION_FAILED, text)


@lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def validate_definition(definition: Arguments, operator: bool = False) -> MetadataError | None:
    if not definition:
        return _invalid("no policy provided")
    allowed = OPERATOR_POLICY_KEYS if operator else POLICY_KEYS
    unknown = [(k, v) for k, v in definition if k not in allowed]
    if unknown:
        terms = ",".join("{" + erl(k) + "," + erl(v) + "}" for k, v in unknown)
        return _invalid(f"[{terms}] are not recognised policy settings")
    for key, value in definition:
        ok, what = _VALIDATORS[key]
        if not ok(value):
            return _invalid(f"{erl(value)} is not a valid {what}")
    return None


def validate_policy(
    pattern: str, apply_to: str, priority: int, definition: Arguments, operator: bool = False
) -> MetadataError | None:
    """None if the policy is acceptable, else the refusal RabbitMQ would give."""
    if not definition:
        return _invalid("no policy provided")
    try:
        compile_pattern(pattern)
    except re.error as e:
        return _invalid(f"pattern should be regular expression but is invalid: {e}")
    if apply_to not in APPLY_TO:
        return _invalid(
            f"apply-to '{apply_to}' unrecognised; should be 'queues', 'classic_queues', "
            "'quorum_queues', 'exchanges' or 'all'"
        )
    if not _int(priority):
        return _invalid(f"{erl(priority)} is not a valid priority")
    return validate_definition(definition, operator)


# -- matching ----------------------------------------------------------------------


def applies_to(policy: PolicyRecord, kind: str, queue_type: str | None = None) -> bool:
    a = policy.apply_to
    if kind == "exchange":
        return a in ("exchanges", "all")
    if a in ("queues", "all"):
        return True
    return (a == "classic_queues" and queue_type == "classic") or (
        a == "quorum_queues" and queue_type == "quorum"
    )


def matches(policy: PolicyRecord, name: str, kind: str, queue_type: str | None = None) -> bool:
    return applies_to(policy, kind, queue_type) and (
        compile_pattern(policy.pattern).search(name) is not None
    )


def select(
    policies: Iterable[PolicyRecord], name: str, kind: str, queue_type: str | None = None
) -> PolicyRecord | None:
    """Highest priority matching policy; ties to the lexicographically first name."""
    best: PolicyRecord | None = None
    for p in policies:
        if not matches(p, name, kind, queue_type):
            continue
        if best is None or (-p.priority, p.name) < (-best.priority, best.name):
            best = p
    return best


def _in_vhost(
    table: dict[tuple[VhostName, str], PolicyRecord], vhost: VhostName
) -> Iterable[PolicyRecord]:
    return (p for (v, _), p in table.items() if v == vhost)


def queue_policy(state: MetadataState, q: QueueRecord) -> PolicyRecord | None:
    return select(_in_vhost(state.policies, q.vhost), q.name, "queue", q.type)  # type: ignore[arg-type]


def queue_operator_policy(state: MetadataState, q: QueueRecord) -> PolicyRecord | None:
    return select(_in_vhost(state.operator_policies, q.vhost), q.name, "queue", q.type)  # type: ignore[arg-type]


def applying(state: MetadataState, q: QueueRecord) -> tuple[PolicyRecord | None, PolicyRecord | None]:
    """The policy and operator policy that apply to a queue: what the
    runtime parses its configuration from, so a change of either is a
    `PolicyChanged` (machine.py, and diff.py for a snapshot jumped over)."""
    return queue_policy(state, q), queue_operator_policy(state, q)


def exchange_policy(state: MetadataState, x: ExchangeRecord) -> PolicyRecord | None:
    return select(_in_vhost(state.policies, x.vhost), x.name, "exchange")  # type: ignore[arg-type]


def exchange_alternate(state: MetadataState, x: ExchangeRecord) -> str | None:
    """The alternate exchange: the exchange's argument wins over a policy."""
    ae = x.alternate_exchange
    if ae is not None:
        return ae
    p = exchange_policy(state, x)
    if p is not None:
        v = lookup(p.definition, "alternate-exchange")
        if isinstance(v, str):
            return v
    return None


def merge(
    args: Arguments, policy: PolicyRecord | None, operator: PolicyRecord | None
) -> dict[str, FieldValue]:
    """The effective queue settings keyed by policy key (``max-length``, ...):
    client ``x-`` argument over policy, then the operator policy on top."""
    out: dict[str, FieldValue] = {}
    if policy is not None:
        for k, v in policy.definition:
            if k in QUEUE_POLICY_KEYS:
                out[k] = v
    for k, v in args:
        if k.startswith("x-") and k[2:] in QUEUE_POLICY_KEYS:
            out[k[2:]] = v
    target = lookup(args, "x-quorum-target-group-size")
    if target is not None:
        out["target-group-size"] = target
    if operator is not None:
        for k, op in operator.definition:
            cur = out.get(k)
            fn = _MERGE.get(k)
            if cur is None or fn is None or not _int(cur) or not _int(op):
                out[k] = op
            else:
                out[k] = fn(cur, op)
    return out


def effective_definition(state: MetadataState, q: QueueRecord) -> dict[str, FieldValue]:
    return merge(q.arguments, queue_policy(state, q), queue_operator_policy(state, q))


def queue_policy_view(state: MetadataState, q: QueueRecord) -> tuple[str | None, str | None]:
    """(policy name, operator policy name) as the management API shows them."""
    p, op = queue_policy(state, q), queue_operator_policy(state, q)
    return (p.name if p else None, op.name if op else None)
