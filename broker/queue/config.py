"""Queue configuration: x-arguments validation and policy merging.

Pipeline position: the metadata store calls `parse_queue_arguments` when a
quorum queue is declared (and again whenever a policy or operator policy
changes) and replicates the resulting `QueueConfig` to the queue's Raft group
(at creation, then through `UpdateConfig`). Validation errors carry the exact
channel-close text RabbitMQ gives (406 PRECONDITION_FAILED).

Precedence, as RabbitMQ's quorum queues implement it (rabbit_quorum_queue
`gather_policy_config`): numeric limits (max-length, max-length-bytes,
message-ttl, expires) take the *lowest* of argument, policy and operator
policy; delivery-limit takes the lowest non-negative one (unlimited only if
all given are negative); overflow: the policy wins over the argument;
dead-letter-exchange / routing-key / strategy and leader locator: the argument
wins over the policy; single-active-consumer and group size are
declaration-only arguments.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .errors import QueueArgumentError

DEFAULT_DELIVERY_LIMIT = 20
MAX_EXPIRY_TIMER_MS = 315_360_000_000  # ten years: RabbitMQ's ?MAX_EXPIRY_TIMER
OVERFLOW_DROP_HEAD = "drop-head"
OVERFLOW_REJECT_PUBLISH = "reject-publish"
AT_MOST_ONCE = "at-most-once"
AT_LEAST_ONCE = "at-least-once"
_LOCATORS = {"client-local": "client-local", "balanced": "balanced",
             # 3.x names, mapped as 4.x maps them
             "random": "balanced", "least-leaders": "balanced"}
# x-arguments RabbitMQ knows but refuses for quorum queues
_UNSUPPORTED_BY_QQ = ("x-max-priority", "x-queue-mode", "x-queue-version", "x-max-age",
                      "x-stream-max-segment-size-bytes", "x-initial-cluster-size",
                      "x-stream-filter-size-bytes")


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """Effective configuration of one quorum queue (after policies).

    `delivery_limit=None` means unlimited (argument/policy -1).
    `dead_letter_strategy` is what was asked for; see `at_least_once` for
    what is in force (needs reject-publish and a dead-letter exchange).
    """

    name: str
    vhost: str = "/"
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = OVERFLOW_DROP_HEAD
    message_ttl_ms: int | None = None
    expires_ms: int | None = None
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    dead_letter_strategy: str = AT_MOST_ONCE
    delivery_limit: int | None = DEFAULT_DELIVERY_LIMIT
    single_active_consumer: bool = False
    initial_group_size: int | None = None
    target_group_size: int | None = None
    leader_locator: str | None = None
    # classic queues: a returned message goes back to its original position
    # (RabbitMQ's classic queues); quorum queues put it at the back or, with
    # a delivery limit, near the head
    requeue_in_place: bool = False

    @property
    def at_least_once(self) -> bool:
        """At-least-once dead lettering is in force (else at-most-once)."""
        return (self.dead_letter_strategy == AT_LEAST_ONCE
                and self.overflow == OVERFLOW_REJECT_PUBLISH
                and self.dead_letter_exchange is not None)

    @property
    def resource(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost}'"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QueueConfig:
        return cls(**data)


# ------------------------------------------------------------ type names


def amqp_type_name(value: object) -> str:
    """The AMQP 0-9-1 field-table type name RabbitMQ prints for a value."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, (str, bytes, bytearray)):
        return "longstr"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, (list, tuple)):
        return "array"
    if value is None:
        return "void"
    return type(value).__name__


class _Invalid(Exception):
    """Internal: the Erlang term RabbitMQ prints after 'invalid arg ...:'."""


def _as_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(f'"expected integer, got {amqp_type_name(value)}"')
    return value


def _non_neg_int(value: object) -> int:
    v = _as_int(value)
    if v < 0:
        raise _Invalid(f"{{value_negative,{v}}}")
    return v


def _positive_int(value: object) -> int:
    v = _non_neg_int(value)
    if v == 0:
        raise _Invalid("{value_zero,0}")
    return v


def _expiry(value: object, allow_zero: bool) -> int:
    v = _non_neg_int(value) if allow_zero else _positive_int(value)
    if v > MAX_EXPIRY_TIMER_MS:
        raise _Invalid(f"{{value_too_large,{v}}}")
    return v


def _string(value: object) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if not isinstance(value, str):
        raise _Invalid(f"{{unacceptable_type,{amqp_type_name(value)}}}")
    return value


def _overflow(value: object) -> str:
    v = _string(value)
    # reject-publish-dlx is valid for classic queues only (feature matrix)
    if v not in (OVERFLOW_DROP_HEAD, OVERFLOW_REJECT_PUBLISH):
        raise _Invalid("invalid_overflow")
    return v


def _strategy(value: object) -> str:
    v = _string(value)
    if v not in (AT_MOST_ONCE, AT_LEAST_ONCE):
        raise _Invalid("invalid_dlx_strategy")
    return v


def _locator(value: object) -> str:
    v = _string(value)
    if v not in _LOCATORS:
        raise _Invalid("invalid_queue_locator_arg")
    return _LOCATORS[v]


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"{{unacceptable_type,{amqp_type_name(value)}}}")
    return value


# x-argument -> (policy key or None, validator); in RabbitMQ's checking order.
_ARGS: list[tuple[str, str | None, Callable[[object], Any]]] = [
    ("x-expires", "expires", lambda v: _expiry(v, allow_zero=False)),
    ("x-message-ttl", "message-ttl", lambda v: _expiry(v, allow_zero=True)),
    ("x-dead-letter-exchange", "dead-letter-exchange", _string),
    ("x-dead-letter-routing-key", "dead-letter-routing-key", _string),
    ("x-dead-letter-strategy", "dead-letter-strategy", _strategy),
    ("x-max-length", "max-length", _non_neg_int),
    ("x-max-length-bytes", "max-length-bytes", _non_neg_int),
    ("x-max-in-memory-length", None, _non_neg_int),
    ("x-max-in-memory-bytes", None, _non_neg_int),
    ("x-overflow", "overflow", _overflow),
    ("x-single-active-consumer", None, _bool),
    ("x-quorum-initial-group-size", None, _positive_int),
    ("x-quorum-target-group-size", "target-group-size", _positive_int),
    ("x-delivery-limit", "delivery-limit", _as_int),
    ("x-queue-leader-locator", "queue-leader-locator", _locator),
    # RabbitMQ 3.12+/4.x; enforced by the AMQP channel (see consumer_timeout_ms)
    ("x-consumer-timeout", "consumer-timeout", _non_neg_int),
]
_OPERATOR_KEYS = {"expires", "message-ttl", "max-length", "max-length-bytes", "delivery-limit",
                  "overflow", "target-group-size"}


def _fail(resource: str, key: str, term: str) -> QueueArgumentError:
    return QueueArgumentError(f"PRECONDITION_FAILED - invalid arg '{key}' for {resource}: {term}")


def _check_args(args: dict[str, Any], resource: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, _pkey, check in _ARGS:
        if key not in args:
            continue
        value = args[key]
        if key == "x-dead-letter-exchange" and not isinstance(value, (str, bytes, bytearray)):
            raise QueueArgumentError(
                f"PRECONDITION_FAILED - invalid type '{amqp_type_name(value)}' for arg "
                f"'{key}' in {resource}")
        try:
            out[key] = check(value)
        except _Invalid as exc:
            raise _fail(resource, key, str(exc)) from None
    if "x-dead-letter-routing-key" in out and "x-dead-letter-exchange" not in out:
        raise _fail(resource, "x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
    for key in _UNSUPPORTED_BY_QQ:
        if key in args:
            raise QueueArgumentError(
                f"PRECONDITION_FAILED - invalid arg '{key}' for {resource} "
                "of queue type rabbit_quorum_queue")
    return out


def _check_policy(policy: dict[str, Any], resource: str, allowed: set[str] | None,
                  label: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _key, pkey, check in _ARGS:
        if pkey is None or pkey not in policy:
            continue
        if allowed is not None and pkey not in allowed:
            continue
        try:
            out[pkey] = check(policy[pkey])
        except _Invalid as exc:
            raise QueueArgumentError(
                f"PRECONDITION_FAILED - invalid {label} value for '{pkey}' "
                f"applied to {resource}: {exc}") from None
    return out


def _min_opt(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _max_opt(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _delivery_limit(*values: int | None) -> int | None:
    """Lowest non-negative of argument/policy/operator policy; unlimited (None)
    only when every one given is negative; 20 when none is given
    (rabbit_quorum_queue, unit_quorum_queue_SUITE ra_machine_conf_delivery_limit)."""
    present = [v for v in values if v is not None]
    if not present:
        return DEFAULT_DELIVERY_LIMIT
    limits = [v for v in present if v >= 0]
    return min(limits) if limits else None


def parse_queue_arguments(args: object, queue: str, vhost: str,
                          policy: dict[str, Any] | None = None,
                          operator_policy: dict[str, Any] | None = None) -> QueueConfig:
    """Validate a quorum queue's x-arguments and merge the (operator) policy.

    `policy`/`operator_policy` are policy *definitions* (keys without the
    ``x-`` prefix, e.g. ``{"max-length": 10}``). Raises `QueueArgumentError`
    with RabbitMQ's reply text for any invalid argument.
    """
    if not isinstance(args, dict):
        raise QueueArgumentError(f"PRECONDITION_FAILED - invalid arguments for queue "
                                 f"'{queue}' in vhost '{vhost}': not a table")
    resource = f"queue '{queue}' in vhost '{vhost}'"
    a = _check_args(args, resource)
    p = _check_policy(policy or {}, resource, None, "policy")
    o = _check_policy(operator_policy or {}, resource, _OPERATOR_KEYS, "operator policy")

    def num(arg_key: str, pkey: str) -> int | None:
        return _min_opt(a.get(arg_key), p.get(pkey), o.get(pkey))

    def arg_first(arg_key: str, pkey: str) -> Any:
        return a[arg_key] if arg_key in a else p.get(pkey)

    overflow = o.get("overflow", p.get("overflow", a.get("x-overflow", OVERFLOW_DROP_HEAD)))
    dlx = arg_first("x-dead-letter-exchange", "dead-letter-exchange")
    return QueueConfig(
        name=queue,
        vhost=vhost,
        max_length=num("x-max-length", "max-length"),
        max_length_bytes=num("x-max-length-bytes", "max-length-bytes"),
        overflow=overflow,
        message_ttl_ms=num("x-message-ttl", "message-ttl"),
        expires_ms=num("x-expires", "expires"),
        dead_letter_exchange=dlx,
        dead_letter_routing_key=arg_first("x-dead-letter-routing-key", "dead-letter-routing-key"),
        dead_letter_strategy=arg_first("x-dead-letter-strategy", "dead-letter-strategy")
        or AT_MOST_ONCE,
        delivery_limit=_delivery_limit(a.get("x-delivery-limit"), p.get("delivery-limit"),
                                       o.get("delivery-limit")),
        single_active_consumer=a.get("x-single-active-consumer", False),
        initial_group_size=a.get("x-quorum-initial-group-size"),
        target_group_size=_max_opt(a.get("x-quorum-target-group-size"),
                                   p.get("target-group-size"), o.get("target-group-size")),
        leader_locator=arg_first("x-queue-leader-locator", "queue-leader-locator"),
    )


def _timeout_value(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def consumer_timeout_ms(consume_args: dict[str, Any] | None, queue_args: dict[str, Any] | None,
                        policy: dict[str, Any] | None, default: int) -> int:
    """The delivery acknowledgement timeout of one consumer (or basic.get), ms.

    RabbitMQ 4.x's precedence (rabbit_channel get_consumer_timeout): the
    consumer's own ``x-consumer-timeout`` argument, else the lower of the
    queue's ``x-consumer-timeout`` argument and its policy's
    ``consumer-timeout``, else the node's ``consumer_timeout``. Values that are
    not non-negative integers are ignored here (declarations refuse them).
    """
    own = _timeout_value((consume_args or {}).get("x-consumer-timeout"))
    if own is not None:
        return own
    per_queue = _min_opt(_timeout_value((queue_args or {}).get("x-consumer-timeout")),
                         _timeout_value((policy or {}).get("consumer-timeout")))
    return default if per_queue is None else per_queue
