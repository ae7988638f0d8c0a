"""The replicated cluster metadata: records and the `MetadataState` container.

Where it sits: `machine.apply` is the only writer; `routing`, `permissions`
and `policies` read it; `snapshot` serialises it. One Raft group over the
broker nodes replicates the commands, so every node holds an identical state.

Records are frozen; the container's dicts are mutated in place by `apply`
(which takes ownership of the state it is given). Secondary indexes and the
routing cache are derived data: they are excluded from equality and snapshots
and rebuilt on load.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import MetadataInvariantError
from .types import (
    NO_ARGUMENTS,
    ApplyTo,
    Arguments,
    DestinationKind,
    ExchangeName,
    ExchangeType,
    FieldValue,
    NodeName,
    PolicyName,
    QueueName,
    QueueStatus,
    QueueType,
    UserName,
    VhostName,
    lookup,
)

DEFAULT_VHOST = VhostName("/")
DEFAULT_USER = UserName("guest")
DEFAULT_PASSWORD = "guest"
DEFAULT_HASHING = "rabbit_password_hashing_sha256"

# The exchanges every vhost is created with (name, type), as RabbitMQ does.
# Invariant: none of these can be declared away or deleted by clients.
DEFAULT_EXCHANGES: tuple[tuple[str, ExchangeType], ...] = (
    ("", "direct"),
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)


@dataclass(frozen=True, slots=True)
class VhostRecord:
    name: VhostName
    description: str = ""
    tags: tuple[str, ...] = ()
    # None: no default set, undeclared queues are classic without an
    # x-queue-type argument (RabbitMQ's behaviour before default types existed).
    default_queue_type: QueueType | None = None


@dataclass(frozen=True, slots=True)
class UserRecord:
    name: UserName
    password_hash: str  # base64(salt + digest); "" means password login disabled
    hashing_algorithm: str = DEFAULT_HASHING
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Permission:
    user: UserName
    vhost: VhostName
    configure: str
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class TopicPermission:
    user: UserName
    vhost: VhostName
    exchange: ExchangeName
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class ExchangeRecord:
    vhost: VhostName
    name: ExchangeName
    type: ExchangeType
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: Arguments = NO_ARGUMENTS

    @property
    def alternate_exchange(self) -> str | None:
        ae = lookup(self.arguments, "alternate-exchange")
        if isinstance(ae, bytes):
            return ae.decode("utf-8", "replace")
        return ae if isinstance(ae, str) else None


@dataclass(frozen=True, slots=True)
class Binding:
    """source --routing_key/arguments--> destination. Invariant: source and
    destination exist in `vhost` while the binding is in the state."""

    vhost: VhostName
    source: ExchangeName
    destination: str
    destination_kind: DestinationKind
    routing_key: str = ""
    arguments: Arguments = NO_ARGUMENTS


@dataclass(frozen=True, slots=True)
class QueueRecord:
    vhost: VhostName
    name: QueueName
    type: QueueType
    durable: bool
    auto_delete: bool
    exclusive_owner: str | None  # connection id owning an exclusive queue
    arguments: Arguments
    members: tuple[NodeName, ...]  # quorum: Raft members; classic: the one hosting node
    leader: NodeName | None
    created_at: int  # ms, leader's timestamp of the declaring log entry
    status: QueueStatus = "running"
    server_named: bool = False
    leader_term: int = 0  # Raft term in which `leader` was elected (0: not known)
    # Raft index of the committed configuration `members` was read from (0:
    # the members it was declared with, or written by an older broker).
    members_index: int = 0


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    vhost: VhostName
    name: PolicyName
    pattern: str
    apply_to: ApplyTo
    priority: int
    definition: Arguments


@dataclass(frozen=True, slots=True)
class RuntimeParameter:
    vhost: VhostName
    component: str
    name: str
    value: FieldValue


# The limits RabbitMQ knows (`rabbitmqctl set_vhost_limits` / `set_user_limits`).
VHOST_LIMIT_NAMES: tuple[str, ...] = ("max-connections", "max-queues")
USER_LIMIT_NAMES: tuple[str, ...] = ("max-connections", "max-channels")


@dataclass(frozen=True, slots=True)
class VhostLimit:
    """One limit of a vhost (`name` in VHOST_LIMIT_NAMES). A negative value
    means no limit; 0 allows none (RabbitMQ's rules)."""

    vhost: VhostName
    name: str
    value: int


@dataclass(frozen=True, slots=True)
class UserLimit:
    """One limit of a user (`name` in USER_LIMIT_NAMES); values as VhostLimit."""

    user: UserName
    name: str
    value: int


ExchangeKey = tuple[VhostName, ExchangeName]
QueueKey = tuple[VhostName, QueueName]
DestKey = tuple[VhostName, DestinationKind, str]


@dataclass(slots=True)
class MetadataState:
    vhosts: dict[VhostName, VhostRecord] = field(default_factory=dict)
    users: dict[UserName, UserRecord] = field(default_factory=dict)
    permissions: dict[tuple[UserName, VhostName], Permission] = field(default_factory=dict)
    topic_permissions: dict[tuple[UserName, VhostName, ExchangeName], TopicPermission] = field(
        default_factory=dict
    )
    exchanges: dict[ExchangeKey, ExchangeRecord] = field(default_factory=dict)
    queues: dict[QueueKey, QueueRecord] = field(default_factory=dict)
    # Bindings by source exchange; the inner dict is used as an ordered set.
    bindings: dict[ExchangeKey, dict[Binding, None]] = field(default_factory=dict)
    policies: dict[tuple[VhostName, PolicyName], PolicyRecord] = field(default_factory=dict)
    operator_policies: dict[tuple[VhostName, PolicyName], PolicyRecord] = field(
        default_factory=dict
    )
    parameters: dict[tuple[VhostName, str, str], RuntimeParameter] = field(default_factory=dict)
    # Invariant: a limit's vhost (user) exists; deleting it deletes its limits.
    vhost_limits: dict[tuple[VhostName, str], VhostLimit] = field(default_factory=dict)
    user_limits: dict[tuple[UserName, str], UserLimit] = field(default_factory=dict)
    # Raft index of the last applied command (0 for a fresh state).
    last_applied: int = 0

    # -- derived, not replicated ---------------------------------------------------
    # Bindings by destination. Invariant: exactly the bindings of `bindings`, re-keyed.
    by_destination: dict[DestKey, dict[Binding, None]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # Compiled routing tables (see routing.py). Invariant: an entry is dropped
    # whenever its exchange, its bindings or any policy changes.
    routing_cache: dict[ExchangeKey, Any] = field(default_factory=dict, compare=False, repr=False)

    # -- binding index maintenance (the only way bindings change) ------------------
    def add_binding(self, b: Binding) -> bool:
        src = (b.vhost, b.source)
        bucket = self.bindings.setdefault(src, {})
        if b in bucket:
            return False
        bucket[b] = None
        self.by_destination.setdefault((b.vhost, b.destination_kind, b.destination), {})[b] = None
        self.routing_cache.pop(src, None)
        return True

    def remove_binding(self, b: Binding) -> bool:
        src = (b.vhost, b.source)
        bucket = self.bindings.get(src)
        if bucket is None or b not in bucket:
            return False
        del bucket[b]
        if not bucket:
            del self.bindings[src]
        dkey = (b.vhost, b.destination_kind, b.destination)
        dbucket = self.by_destination.get(dkey)
        if dbucket is None or b not in dbucket:
            raise MetadataInvariantError(f"binding {b} missing from destination index")
        del dbucket[b]
        if not dbucket:
            del self.by_destination[dkey]
        self.routing_cache.pop(src, None)
        return True

    def bindings_from(self, vhost: VhostName, source: ExchangeName) -> list[Binding]:
        return list(self.bindings.get((vhost, source), ()))

    def bindings_to(self, vhost: VhostName, kind: DestinationKind, name: str) -> list[Binding]:
        return list(self.by_destination.get((vhost, kind, name), ()))

    def rebuild_indexes(self) -> None:
        self.by_destination = {}
        for bucket in self.bindings.values():
            for b in bucket:
                self.by_destination.setdefault((b.vhost, b.destination_kind, b.destination), {})[
                    b
                ] = None
        self.routing_cache = {}

    def check_invariants(self) -> None:
        """Raise MetadataInvariantError if references dangle (used by tests)."""
        for (vhost, source), bucket in self.bindings.items():
            if (vhost, source) not in self.exchanges:
                raise MetadataInvariantError(f"bindings from missing exchange {source!r}")
            for b in bucket:
                if b.destination_kind == "queue":
                    ok = (vhost, QueueName(b.destination)) in self.queues
                else:
                    ok = (vhost, ExchangeName(b.destination)) in self.exchanges
                if not ok:
                    raise MetadataInvariantError(f"binding to missing destination {b}")
        n = sum(len(v) for v in self.bindings.values())
        m = sum(len(v) for v in self.by_destination.values())
        if n != m:
            raise MetadataInvariantError(f"binding indexes disagree: {n} != {m}")
        for vhost, _ in list(self.exchanges) + list(self.queues):
            if vhost not in self.vhosts:
                raise MetadataInvariantError(f"entity in missing vhost {vhost!r}")
        for user, vhost in self.permissions:
            if user not in self.users or vhost not in self.vhosts:
                raise MetadataInvariantError(f"permission for missing {user!r}/{vhost!r}")
        for vhost, _ in self.vhost_limits:
            if vhost not in self.vhosts:
                raise MetadataInvariantError(f"limit of missing vhost {vhost!r}")
        for user, _ in self.user_limits:
            if user not in self.users:
                raise MetadataInvariantError(f"limit of missing user {user!r}")
        for q in self.queues.values():
            if q.leader is not None and q.leader not in q.members:
                raise MetadataInvariantError(f"leader of {q.name!r} is not a member")


def default_exchange_records(vhost: VhostName) -> list[ExchangeRecord]:
    return [ExchangeRecord(vhost, ExchangeName(n), t, durable=True) for n, t in DEFAULT_EXCHANGES]


def is_system_exchange(name: str) -> bool:
    return name == "" or name.startswith("amq.")
