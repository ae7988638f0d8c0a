"""Per-vhost and per-user limits: RabbitMQ's `max-connections` and `max-queues`
of a vhost, `max-connections` and `max-channels` of a user.

Where it sits: the limits are metadata records (`state.vhost_limits`,
`state.user_limits`) set by the `SetVhostLimit`/`SetUserLimit` commands and
replicated with everything else. The machine enforces `max-queues` itself
(`queue_limit_refused`, when a queue is created: the queue records are the
cluster-wide count). Connections and channels are not in the metadata: the
runtime counts them (cluster-wide) and asks `connection_refused` /
`channel_refused` whether the next one is allowed.

Rules (RabbitMQ 3.10, verified with pika): a negative value means no limit;
0 allows none; a connection or channel is refused when the count already
open is at or above the limit. Texts are RabbitMQ's.
"""
from __future__ import annotations

from .errors import NOT_ALLOWED, PRECONDITION_FAILED, MetadataError, erl
from .state import USER_LIMIT_NAMES, VHOST_LIMIT_NAMES, MetadataState
from .types import FieldValue, UserName, VhostName

MAX_CONNECTIONS = "max-connections"
MAX_QUEUES = "max-queues"
MAX_CHANNELS = "max-channels"
_INT64 = 1 << 63


def validate_limit(kind: str, name: str, value: object) -> MetadataError | None:
    """A refusal for a limit RabbitMQ would not accept (`kind` "vhost" or
    "user"), with its validation text; None when it is acceptable."""
    names = VHOST_LIMIT_NAMES if kind == "vhost" else USER_LIMIT_NAMES
    where = "limits" if kind == "vhost" else "user-limits"
    shown: FieldValue = value if isinstance(value, (str, int, float, bool)) or value is None \
        else repr(value)
    if name not in names:
        return MetadataError(
            PRECONDITION_FAILED, f"Unrecognised terms [{{{erl(name)},{erl(shown)}}}] in {where}")
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT64 <= value < _INT64:
        return MetadataError(PRECONDITION_FAILED, f"{name} should be a number, actually was {erl(shown)}")
    return None


def vhost_limit(state: MetadataState, vhost: str, name: str) -> int | None:
    """The vhost's limit `name`, or None when there is none (unset or negative)."""
    rec = state.vhost_limits.get((VhostName(vhost), name))
    return rec.value if rec is not None and rec.value >= 0 else None


def user_limit(state: MetadataState, user: str, name: str) -> int | None:
    """The user's limit `name`, or None when there is none (unset or negative)."""
    rec = state.user_limits.get((UserName(user), name))
    return rec.value if rec is not None and rec.value >= 0 else None


def connection_limits_in_force(state: MetadataState) -> bool:
    """True when some connection or channel limit is set (the runtime counts
    connections across the cluster only then)."""
    return any(r.value >= 0 and r.name == MAX_CONNECTIONS for r in state.vhost_limits.values()) \
        or any(r.value >= 0 for r in state.user_limits.values())


def connection_refused(state: MetadataState, vhost: str, user: str, vhost_connections: int,
                       user_connections: int) -> MetadataError | None:
    """connection.open of `user` on `vhost` with that many connections already
    open on the vhost and of the user (cluster-wide). RabbitMQ checks the
    vhost's limit first, then the user's, then access."""
    limit = vhost_limit(state, vhost, MAX_CONNECTIONS)
    if limit is not None and vhost_connections >= limit:
        return MetadataError(
            NOT_ALLOWED,
            f"access to vhost '{vhost}' refused for user '{user}': connection limit ({limit}) is reached")
    limit = user_limit(state, user, MAX_CONNECTIONS)
    if limit is not None and user_connections >= limit:
        return MetadataError(
            NOT_ALLOWED, f"connection refused for user '{user}': user connection limit ({limit}) is reached")
    return None


def channel_refused(state: MetadataState, user: str, channels: int) -> MetadataError | None:
    """channel.open of `user` with that many channels already open (cluster-wide):
    RabbitMQ closes the connection with 530."""
    limit = user_limit(state, user, MAX_CHANNELS)
    if limit is not None and channels >= limit:
        return MetadataError(
            NOT_ALLOWED, f"number of channels opened for user '{user}' has reached the maximum "
            f"allowed user limit of ({limit})")
    return None


def queue_limit_refused(state: MetadataState, vhost: VhostName, queue: str) -> MetadataError | None:
    """Declaring a new queue `queue` in `vhost`: refused when the vhost already
    has `max-queues` queues (every type, exclusive ones too, cluster-wide)."""
    limit = vhost_limit(state, vhost, MAX_QUEUES)
    if limit is None:
        return None
    count = sum(1 for v, _ in state.queues if v == vhost)
    if count >= limit:
        return MetadataError(
            PRECONDITION_FAILED,
            f"cannot declare queue '{queue}': queue limit in vhost '{vhost}' ({limit}) is reached")
    return None
