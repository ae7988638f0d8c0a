"""Commands, replies and effects of the metadata machine (all frozen data).

Where it sits: the runtime builds a command (after authorising the client with
`permissions` and validating quorum-queue x-arguments with
`broker.queue.parse_queue_arguments`), proposes it to the metadata Raft group,
and once committed every node calls `machine.apply(meta, command, state)`.
Everything non-deterministic (time, generated names, member placement,
salts, configuration flags that must agree across replicas) travels inside
the command or its `CommandMeta`, never read from the environment.

Effects tell the runtime what to do *outside* the state and are idempotent:
applying the same committed entry twice (e.g. after a restart replays the log)
produces effects that are safe to interpret twice.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

from .errors import InvalidCommand, MetadataError
from .state import Binding, ExchangeRecord, QueueRecord, UserRecord, VhostRecord
from .types import (
    NO_ARGUMENTS,
    ApplyTo,
    Arguments,
    DestinationKind,
    ExchangeName,
    FieldValue,
    NodeName,
    PolicyName,
    QueueName,
    QueueType,
    UserName,
    VhostName,
    freeze_table,
)

TableLike: TypeAlias = Mapping[str, FieldValue] | Arguments


def _freeze_field(obj: object, name: str) -> None:
    # Commands accept a plain dict for convenience and store the canonical
    # frozen form, so commands stay hashable and compare by value.
    object.__setattr__(obj, name, freeze_table(getattr(obj, name)))


@dataclass(frozen=True, slots=True)
class CommandMeta:
    """Per-entry metadata from the log: index and the leader's timestamp (ms)."""

    index: int
    timestamp_ms: int


# -- commands ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """Create vhost `/`, its default exchanges and the default user with full
    permissions on it, unless the state already has vhosts or users."""

    password_hash: str
    user: UserName = UserName("guest")
    vhost: VhostName = VhostName("/")
    tags: tuple[str, ...] = ("administrator",)


@dataclass(frozen=True, slots=True)
class AddVhost:
    """Create (or update description/tags/default type of) a vhost."""

    name: VhostName
    description: str = ""
    tags: tuple[str, ...] = ()
    default_queue_type: QueueType | None = None


@dataclass(frozen=True, slots=True)
class DeleteVhost:
    name: VhostName


@dataclass(frozen=True, slots=True)
class AddUser:
    """Create or replace a user. `password_hash` from `passwords.hash_password`."""

    name: UserName
    password_hash: str
    hashing_algorithm: str = "rabbit_password_hashing_sha256"
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeleteUser:
    name: UserName


@dataclass(frozen=True, slots=True)
class ChangePassword:
    name: UserName
    password_hash: str
    hashing_algorithm: str = "rabbit_password_hashing_sha256"


@dataclass(frozen=True, slots=True)
class SetUserTags:
    name: UserName
    tags: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SetPermissions:
    user: UserName
    vhost: VhostName
    configure: str
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class ClearPermissions:
    user: UserName
    vhost: VhostName


@dataclass(frozen=True, slots=True)
class SetTopicPermissions:
    user: UserName
    vhost: VhostName
    exchange: ExchangeName
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class ClearTopicPermissions:
    user: UserName
    vhost: VhostName
    exchange: ExchangeName


@dataclass(frozen=True, slots=True)
class DeclareExchange:
    vhost: VhostName
    name: ExchangeName
    type: str = "direct"  # validated by the machine: 503 on unknown types
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: TableLike = NO_ARGUMENTS
    passive: bool = False

    def __post_init__(self) -> None:
        _freeze_field(self, "arguments")


@dataclass(frozen=True, slots=True)
class DeleteExchange:
    vhost: VhostName
    name: ExchangeName
    if_unused: bool = False


@dataclass(frozen=True, slots=True)
class Bind:
    vhost: VhostName
    source: ExchangeName
    destination: str
    destination_kind: DestinationKind = "queue"
    routing_key: str = ""
    arguments: TableLike = NO_ARGUMENTS
    owner: str | None = None  # connection id; refused on others' exclusive queues

    def __post_init__(self) -> None:
        _freeze_field(self, "arguments")
        if self.destination_kind not in ("queue", "exchange"):
            raise InvalidCommand(f"bad destination kind {self.destination_kind!r}")


@dataclass(frozen=True, slots=True)
class Unbind:
    vhost: VhostName
    source: ExchangeName
    destination: str
    destination_kind: DestinationKind = "queue"
    routing_key: str = ""
    arguments: TableLike = NO_ARGUMENTS
    owner: str | None = None

    def __post_init__(self) -> None:
        _freeze_field(self, "arguments")
        if self.destination_kind not in ("queue", "exchange"):
            raise InvalidCommand(f"bad destination kind {self.destination_kind!r}")


@dataclass(frozen=True, slots=True)
class DeclareQueue:
    """queue.declare. The caller picked `members` (leader locator, group size,
    live nodes) and, for server-named queues, the ``amq.gen-`` name; it also
    validated queue-type specific x-arguments with broker.queue.

    `relaxed_checks` is `quorum_queue.property_equivalence.relaxed_checks_on_
    redeclaration` from the node configuration (must agree across nodes)."""

    vhost: VhostName
    name: QueueName
    durable: bool = True
    exclusive_owner: str | None = None
    auto_delete: bool = False
    arguments: TableLike = NO_ARGUMENTS
    passive: bool = False
    server_named: bool = False
    members: tuple[NodeName, ...] = ()
    leader: NodeName | None = None
    relaxed_checks: bool = False

    def __post_init__(self) -> None:
        _freeze_field(self, "arguments")
        if not self.passive and not self.members:
            raise InvalidCommand("a non-passive DeclareQueue needs at least one member node")
        if self.leader is not None and self.leader not in self.members:
            raise InvalidCommand(f"leader {self.leader!r} is not among members {self.members}")
        if len(set(self.members)) != len(self.members):
            raise InvalidCommand(f"duplicate members {self.members}")


@dataclass(frozen=True, slots=True)
class DeleteQueue:
    """queue.delete. `consumer_count`/`message_count` are what the queue leader
    reported when the runtime checked if-unused/if-empty (the metadata
    machine does not see messages); `owner` is the deleting connection."""

    vhost: VhostName
    name: QueueName
    if_unused: bool = False
    if_empty: bool = False
    consumer_count: int = 0
    message_count: int = 0
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteExclusiveQueues:
    """The connection `owner` closed: delete every exclusive queue it owned."""

    owner: str


@dataclass(frozen=True, slots=True)
class SetQueueMembers:
    """Record the queue's members as the Raft group's committed configuration
    at `config_index` reports them. A report of an earlier configuration than
    the recorded one changes nothing (reports race: two membership changes of
    one queue may finish in either order), nor does one about an earlier
    incarnation of the queue (`created_at` differs). A report at the
    recorded index replaces the list (one index is one configuration).
    `config_index` None (and `created_at` 0): written by an older broker,
    applied as it comes."""

    vhost: VhostName
    name: QueueName
    members: tuple[NodeName, ...]
    config_index: int | None = None
    created_at: int = 0

    def __post_init__(self) -> None:
        if not self.members or len(set(self.members)) != len(self.members):
            raise InvalidCommand(f"members must be non-empty and unique: {self.members}")


@dataclass(frozen=True, slots=True)
class SetQueueLeader:
    """The queue's Raft group elected `leader` in Raft term `term` (0: not
    known). A record of a later term is never overwritten by an earlier one
    (two leaders of successive terms may report in either order)."""

    vhost: VhostName
    name: QueueName
    leader: NodeName | None
    term: int = 0


@dataclass(frozen=True, slots=True)
class SetPolicy:
    vhost: VhostName
    name: PolicyName
    pattern: str
    definition: TableLike
    priority: int = 0
    apply_to: ApplyTo | str = "all"

    def __post_init__(self) -> None:
        _freeze_field(self, "definition")


@dataclass(frozen=True, slots=True)
class ClearPolicy:
    vhost: VhostName
    name: PolicyName


@dataclass(frozen=True, slots=True)
class SetOperatorPolicy:
    vhost: VhostName
    name: PolicyName
    pattern: str
    definition: TableLike
    priority: int = 0
    apply_to: ApplyTo | str = "queues"

    def __post_init__(self) -> None:
        _freeze_field(self, "definition")


@dataclass(frozen=True, slots=True)
class ClearOperatorPolicy:
    vhost: VhostName
    name: PolicyName


@dataclass(frozen=True, slots=True)
class SetParameter:
    """A runtime parameter (component/name/value), e.g. federation settings."""

    vhost: VhostName
    component: str
    name: str
    value: FieldValue


@dataclass(frozen=True, slots=True)
class ClearParameter:
    vhost: VhostName
    component: str
    name: str


@dataclass(frozen=True, slots=True)
class SetVhostLimit:
    """`rabbitmqctl set_vhost_limits`, one limit: `name` is max-connections or
    max-queues; `value` an integer, negative for no limit (checked by the
    machine with `limits.validate_limit`)."""

    vhost: VhostName
    name: str
    value: int


@dataclass(frozen=True, slots=True)
class ClearVhostLimit:
    """Remove one limit of a vhost (a missing one: nothing to do, as RabbitMQ)."""

    vhost: VhostName
    name: str


@dataclass(frozen=True, slots=True)
class SetUserLimit:
    """`rabbitmqctl set_user_limits`, one limit: max-connections or max-channels."""

    user: UserName
    name: str
    value: int


@dataclass(frozen=True, slots=True)
class ClearUserLimit:
    user: UserName
    name: str


Command: TypeAlias = (
    Bootstrap | AddVhost | DeleteVhost | AddUser | DeleteUser | ChangePassword | SetUserTags
    | SetPermissions | ClearPermissions | SetTopicPermissions | ClearTopicPermissions
    | DeclareExchange | DeleteExchange | Bind | Unbind | DeclareQueue | DeleteQueue
    | DeleteExclusiveQueues | SetQueueMembers | SetQueueLeader | SetPolicy | ClearPolicy
    | SetOperatorPolicy | ClearOperatorPolicy | SetParameter | ClearParameter
    | SetVhostLimit | ClearVhostLimit | SetUserLimit | ClearUserLimit
)


# -- replies -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ok:
    pass


@dataclass(frozen=True, slots=True)
class ExchangeDeclareOk:
    record: ExchangeRecord
    created: bool


@dataclass(frozen=True, slots=True)
class QueueDeclareOk:
    """`created` False for a redeclaration/passive declare; the AMQP layer asks
    the queue leader for message/consumer counts for declare-ok."""

    record: QueueRecord
    created: bool


@dataclass(frozen=True, slots=True)
class QueueDeleteOk:
    record: QueueRecord | None  # None: the queue did not exist (RabbitMQ replies ok)


Reply: TypeAlias = Ok | ExchangeDeclareOk | QueueDeclareOk | QueueDeleteOk | MetadataError


# -- effects (for the runtime) -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class VhostAdded:
    record: VhostRecord


@dataclass(frozen=True, slots=True)
class VhostDeleted:
    """Close connections on the vhost; its queues arrive as QueueDeleted too."""

    name: VhostName


@dataclass(frozen=True, slots=True)
class UserChanged:
    """Password/tags changed: the runtime may re-check open connections."""

    record: UserRecord


@dataclass(frozen=True, slots=True)
class UserDeleted:
    """Close the user's connections."""

    name: UserName


@dataclass(frozen=True, slots=True)
class PermissionsChanged:
    user: UserName
    vhost: VhostName


@dataclass(frozen=True, slots=True)
class ExchangeDeclared:
    record: ExchangeRecord


@dataclass(frozen=True, slots=True)
class ExchangeDeleted:
    vhost: VhostName
    name: ExchangeName


@dataclass(frozen=True, slots=True)
class BindingAdded:
    binding: Binding


@dataclass(frozen=True, slots=True)
class BindingRemoved:
    binding: Binding


@dataclass(frozen=True, slots=True)
class QueueDeclared:
    """Start the queue: for quorum, a Raft group on `record.members`; for
    classic, a local queue on `record.members[0]`. Idempotent per (vhost, name,
    created_at)."""

    record: QueueRecord


@dataclass(frozen=True, slots=True)
class QueueDeleted:
    """Stop and delete the queue's members (and its data) on every member node."""

    record: QueueRecord


@dataclass(frozen=True, slots=True)
class MembersChanged:
    """Reconcile the queue's Raft membership from `old` to `new`."""

    vhost: VhostName
    name: QueueName
    old: tuple[NodeName, ...]
    new: tuple[NodeName, ...]


@dataclass(frozen=True, slots=True)
class LeaderChanged:
    vhost: VhostName
    name: QueueName
    leader: NodeName | None


@dataclass(frozen=True, slots=True)
class PolicyChanged:
    """Queues whose effective (operator) policy changed: push the new
    `policies.effective_definition` to each queue's state machine."""

    queues: tuple[tuple[VhostName, QueueName], ...]


Effect: TypeAlias = (
    VhostAdded | VhostDeleted | UserChanged | UserDeleted | PermissionsChanged
    | ExchangeDeclared | ExchangeDeleted | BindingAdded | BindingRemoved | QueueDeclared
    | QueueDeleted | MembersChanged | LeaderChanged | PolicyChanged
)
