"""Cluster metadata state machine (vhosts, users, exchanges, bindings, queues, policies), pure.

Pipeline position: replicated by the metadata Raft group. The runtime
authorises a client request (`permissions`), proposes a command
(`commands`), and every node applies committed commands with
``machine.apply(meta, command, state) -> (state, reply, effects)``. Publishes
are routed against the local replica with `routing.route`. Policies
(`policies`) give each queue its effective settings. `snapshot` serialises
the state for Raft snapshots. See docs/metadata.md.
"""
from .commands import (
    AddUser,
    AddVhost,
    Bind,
    BindingAdded,
    BindingRemoved,
    Bootstrap,
    ChangePassword,
    ClearOperatorPolicy,
    ClearParameter,
    ClearPermissions,
    ClearPolicy,
    ClearTopicPermissions,
    ClearUserLimit,
    ClearVhostLimit,
    Command,
    CommandMeta,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteExclusiveQueues,
    DeleteQueue,
    DeleteUser,
    DeleteVhost,
    Effect,
    ExchangeDeclared,
    ExchangeDeclareOk,
    ExchangeDeleted,
    LeaderChanged,
    MembersChanged,
    Ok,
    PermissionsChanged,
    PolicyChanged,
    QueueDeclared,
    QueueDeclareOk,
    QueueDeleted,
    QueueDeleteOk,
    Reply,
    SetOperatorPolicy,
    SetParameter,
    SetPermissions,
    SetPolicy,
    SetQueueLeader,
    SetQueueMembers,
    SetTopicPermissions,
    SetUserLimit,
    SetUserTags,
    SetVhostLimit,
    Unbind,
    UserChanged,
    UserDeleted,
    VhostAdded,
    VhostDeleted,
)
from .diff import effects_between
from .errors import InvalidCommand, MetadataError, MetadataInvariantError
from .limits import (
    MAX_CHANNELS,
    MAX_CONNECTIONS,
    MAX_QUEUES,
    channel_refused,
    connection_limits_in_force,
    connection_refused,
    user_limit,
    validate_limit,
    vhost_limit,
)
from .machine import apply, initial_state, new_state
from .passwords import check_password, hash_password
from .permissions import (
    Resource,
    authenticate,
    check,
    check_loopback,
    check_topic,
    check_vhost_access,
    is_loopback,
)
from .policies import (
    effective_definition,
    exchange_alternate,
    queue_operator_policy,
    queue_policy,
    validate_policy,
)
from .routing import route
from .snapshot import SnapshotError, from_bytes, reply_from_bytes, reply_to_bytes, to_bytes
from .state import (
    USER_LIMIT_NAMES,
    VHOST_LIMIT_NAMES,
    Binding,
    ExchangeRecord,
    MetadataState,
    Permission,
    PolicyRecord,
    QueueRecord,
    RuntimeParameter,
    TopicPermission,
    UserLimit,
    UserRecord,
    VhostLimit,
    VhostRecord,
)
from .types import (
    Arguments,
    ExchangeName,
    FrozenTable,
    NodeName,
    PolicyName,
    QueueName,
    UserName,
    VhostName,
    freeze_table,
    thaw_table,
)

__all__ = [
    "AddUser", "AddVhost", "Arguments", "Bind", "Binding", "BindingAdded", "BindingRemoved",
    "Bootstrap", "ChangePassword", "ClearOperatorPolicy", "ClearParameter", "ClearPermissions",
    "ClearPolicy", "ClearTopicPermissions", "Command", "CommandMeta", "DeclareExchange",
    "DeclareQueue", "DeleteExchange", "DeleteExclusiveQueues", "DeleteQueue", "DeleteUser",
    "DeleteVhost", "Effect", "ExchangeDeclareOk", "ExchangeDeclared", "ExchangeDeleted",
    "ExchangeName", "ExchangeRecord", "FrozenTable", "InvalidCommand", "LeaderChanged",
    "MembersChanged", "MetadataError", "MetadataInvariantError", "MetadataState", "NodeName",
    "Ok", "Permission", "PermissionsChanged", "PolicyChanged", "PolicyName", "PolicyRecord",
    "QueueDeclareOk", "QueueDeclared", "QueueDeleteOk", "QueueDeleted", "QueueName",
    "QueueRecord", "Reply", "Resource", "RuntimeParameter", "SetOperatorPolicy", "SetParameter",
    "SetPermissions", "SetPolicy", "SetQueueLeader", "SetQueueMembers", "SetTopicPermissions",
    "SetUserTags", "SnapshotError", "TopicPermission", "Unbind", "UserChanged", "UserDeleted",
    "UserName", "UserRecord", "VhostAdded", "VhostDeleted", "VhostName", "VhostRecord", "apply",
    "authenticate", "check", "check_loopback", "check_password", "check_topic",
    "check_vhost_access", "effective_definition", "effects_between", "exchange_alternate", "freeze_table",
    "from_bytes", "hash_password", "initial_state", "is_loopback", "new_state",
    "queue_operator_policy", "queue_policy", "reply_from_bytes", "reply_to_bytes", "route", "thaw_table", "to_bytes",
    "validate_policy",
    "ClearUserLimit", "ClearVhostLimit", "MAX_CHANNELS", "MAX_CONNECTIONS", "MAX_QUEUES",
    "SetUserLimit", "SetVhostLimit", "USER_LIMIT_NAMES", "UserLimit", "VHOST_LIMIT_NAMES",
    "VhostLimit", "channel_refused", "connection_limits_in_force", "connection_refused",
    "user_limit", "validate_limit", "vhost_limit",
]
