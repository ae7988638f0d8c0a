"""The metadata state machine: ``apply(meta, command, state) -> (state, reply, effects)``.

Where it sits: committed entries of the metadata Raft group are applied here
on every node, in log order. `apply` is deterministic: time, names, members
and salts come from the command or `meta`. It takes ownership of `state` and
mutates it in place (the metadata state is large; copying it per command
would make binding-heavy workloads quadratic) and returns it.

One handler per command type, chosen from `_HANDLERS`. A handler either
returns a `MetadataError` reply and leaves the state untouched, or changes
the state and returns the effects of the change. Errors are checked in the
order RabbitMQ checks them, so the first refusal matches RabbitMQ's.

Why one file of this size: one `apply` over one state (vhosts, users,
permissions, exchanges, bindings, queues, policies, parameters, limits); each
command is a small handler of the same state, in one place so the replicated
behaviour is read in one file.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import broker.metadata.limits as limits
import broker.metadata.policies as policies

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
from .errors import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    InvalidCommand,
    MetadataError,
    default_exchange_refused,
    erl,
    no_vhost,
    not_found,
    plain,
    rs,
    type_class,
    typed,
)
from .passwords import HASHING_ALGORITHMS
from .state import (
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
    default_exchange_records,
)
from .types import (
    EXCHANGE_TYPES,
    QUEUE_TYPES,
    Arguments,
    ExchangeName,
    FieldValue,
    PolicyName,
    QueueName,
    QueueType,
    UserName,
    VhostName,
    freeze_value,
    has_key,
    lookup,
    with_key,
)

Effects = list[Effect]
Result = tuple[Reply, Effects]
C = TypeVar("C")

# Queue arguments compared on redeclaration, in RabbitMQ's order
# (rabbit_amqqueue:declare_args/0 plus the quorum-queue keys of 4.x).
EQUIVALENCE_ARGS: tuple[str, ...] = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-dead-letter-strategy",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-single-active-consumer",
    "x-queue-type",
    "x-quorum-initial-group-size",
    "x-queue-leader-locator",
    "x-delivery-limit",
    "x-queue-version",
    "x-quorum-target-group-size",
)
EXCHANGE_EQUIVALENCE_ARGS: tuple[str, ...] = ("alternate-exchange",)
X_MATCH_VALUES = ("all", "any", "all-with-x", "any-with-x")


def apply(
    meta: CommandMeta, command: Command, state: MetadataState
) -> tuple[MetadataState, Reply, Effects]:
    """Apply one committed command. Raises InvalidCommand for unknown command types."""
    handler = _HANDLERS.get(type(command))
    if handler is None:
        raise InvalidCommand(f"unknown metadata command {type(command).__name__}")
    reply, effects = handler(meta, command, state)
    state.last_applied = max(state.last_applied, meta.index)
    return state, reply, effects


# -- vhosts ------------------------------------------------------------------------


def _bootstrap(meta: CommandMeta, cmd: Bootstrap, state: MetadataState) -> Result:
    if state.vhosts or state.users:
        return Ok(), []  # already initialised: bootstrap is a no-op
    effects: Effects = []
    reply, effects = _add_vhost(meta, AddVhost(cmd.vhost), state)
    user = UserRecord(cmd.user, cmd.password_hash, tags=cmd.tags)
    state.users[cmd.user] = user
    state.permissions[(cmd.user, cmd.vhost)] = Permission(cmd.user, cmd.vhost, ".*", ".*", ".*")
    effects += [UserChanged(user), PermissionsChanged(cmd.user, cmd.vhost)]
    return reply, effects


def _add_vhost(meta: CommandMeta, cmd: AddVhost, state: MetadataState) -> Result:
    if cmd.default_queue_type is not None and cmd.default_queue_type not in QUEUE_TYPES:
        return MetadataError(
            PRECONDITION_FAILED, f"unsupported default queue type '{cmd.default_queue_type}'"
        ), []
    record = VhostRecord(cmd.name, cmd.description, tuple(cmd.tags), cmd.default_queue_type)
    existed = cmd.name in state.vhosts
    state.vhosts[cmd.name] = record
    effects: Effects = [VhostAdded(record)]
    if not existed:
        for x in default_exchange_records(cmd.name):
            state.exchanges[(x.vhost, x.name)] = x
            effects.append(ExchangeDeclared(x))
    return Ok(), effects


def _delete_vhost(meta: CommandMeta, cmd: DeleteVhost, state: MetadataState) -> Result:
    if cmd.name not in state.vhosts:
        return no_vhost(cmd.name), []
    effects: Effects = []
    for key in [k for k in state.queues if k[0] == cmd.name]:
        effects += _remove_queue(state, state.queues[key])
    for xkey in [k for k in state.exchanges if k[0] == cmd.name]:
        if xkey in state.exchanges:  # may have gone already as an auto-delete cascade
            effects += _remove_exchange(state, state.exchanges[xkey])
    v = cmd.name
    for pk in [k for k in state.permissions if k[1] == v]:
        del state.permissions[pk]
    for tk in [k for k in state.topic_permissions if k[1] == v]:
        del state.topic_permissions[tk]
    for table in (state.policies, state.operator_policies):
        for polk in [k for k in table if k[0] == v]:
            del table[polk]
    for park in [k for k in state.parameters if k[0] == v]:
        del state.parameters[park]
    for lk in [k for k in state.vhost_limits if k[0] == v]:
        del state.vhost_limits[lk]
    del state.vhosts[cmd.name]
    state.routing_cache.clear()
    effects.append(VhostDeleted(cmd.name))
    return Ok(), effects


# -- users and permissions ---------------------------------------------------------


def _check_algorithm(algorithm: str) -> MetadataError | None:
    if algorithm not in HASHING_ALGORITHMS:
        return MetadataError(PRECONDITION_FAILED, f"unknown password hashing algorithm '{algorithm}'")
    return None


def _add_user(meta: CommandMeta, cmd: AddUser, state: MetadataState) -> Result:
    err = _check_algorithm(cmd.hashing_algorithm)
    if err:
        return err, []
    record = UserRecord(cmd.name, cmd.password_hash, cmd.hashing_algorithm, tuple(cmd.tags))
    state.users[cmd.name] = record
    return Ok(), [UserChanged(record)]


def _no_user(name: str) -> MetadataError:
    return MetadataError(NOT_FOUND, f"no user '{name}'")


def _delete_user(meta: CommandMeta, cmd: DeleteUser, state: MetadataState) -> Result:
    if cmd.name not in state.users:
        return _no_user(cmd.name), []
    del state.users[cmd.name]
    for k in [k for k in state.permissions if k[0] == cmd.name]:
        del state.permissions[k]
    for tk in [k for k in state.topic_permissions if k[0] == cmd.name]:
        del state.topic_permissions[tk]
    for lk in [k for k in state.user_limits if k[0] == cmd.name]:
        del state.user_limits[lk]
    return Ok(), [UserDeleted(cmd.name)]


def _change_password(meta: CommandMeta, cmd: ChangePassword, state: MetadataState) -> Result:
    user = state.users.get(cmd.name)
    if user is None:
        return _no_user(cmd.name), []
    err = _check_algorithm(cmd.hashing_algorithm)
    if err:
        return err, []
    record = UserRecord(user.name, cmd.password_hash, cmd.hashing_algorithm, user.tags)
    state.users[cmd.name] = record
    return Ok(), [UserChanged(record)]


def _set_user_tags(meta: CommandMeta, cmd: SetUserTags, state: MetadataState) -> Result:
    user = state.users.get(cmd.name)
    if user is None:
        return _no_user(cmd.name), []
    record = UserRecord(user.name, user.password_hash, user.hashing_algorithm, tuple(cmd.tags))
    state.users[cmd.name] = record
    return Ok(), [UserChanged(record)]


def _check_user_vhost(state: MetadataState, user: UserName, vhost: VhostName) -> MetadataError | None:
    if user not in state.users:
        return _no_user(user)
    if vhost not in state.vhosts:
        return no_vhost(vhost)
    return None


def _check_regexes(*patterns: str) -> MetadataError | None:
    for p in patterns:
        try:
            re.compile(p)
        except re.error as e:
            return MetadataError(PRECONDITION_FAILED, f"invalid regular expression '{p}': {e}")
    return None


def _set_permissions(meta: CommandMeta, cmd: SetPermissions, state: MetadataState) -> Result:
    err = _check_user_vhost(state, cmd.user, cmd.vhost) or _check_regexes(
        cmd.configure, cmd.write, cmd.read
    )
    if err:
        return err, []
    state.permissions[(cmd.user, cmd.vhost)] = Permission(
        cmd.user, cmd.vhost, cmd.configure, cmd.write, cmd.read
    )
    return Ok(), [PermissionsChanged(cmd.user, cmd.vhost)]


def _clear_permissions(meta: CommandMeta, cmd: ClearPermissions, state: MetadataState) -> Result:
    err = _check_user_vhost(state, cmd.user, cmd.vhost)
    if err:
        return err, []
    if state.permissions.pop((cmd.user, cmd.vhost), None) is None:
        return Ok(), []
    return Ok(), [PermissionsChanged(cmd.user, cmd.vhost)]


def _set_topic_permissions(
    meta: CommandMeta, cmd: SetTopicPermissions, state: MetadataState
) -> Result:
    err = _check_user_vhost(state, cmd.user, cmd.vhost) or _check_regexes(cmd.write, cmd.read)
    if err:
        return err, []
    state.topic_permissions[(cmd.user, cmd.vhost, cmd.exchange)] = TopicPermission(
        cmd.user, cmd.vhost, cmd.exchange, cmd.write, cmd.read
    )
    return Ok(), [PermissionsChanged(cmd.user, cmd.vhost)]


def _clear_topic_permissions(
    meta: CommandMeta, cmd: ClearTopicPermissions, state: MetadataState
) -> Result:
    if state.topic_permissions.pop((cmd.user, cmd.vhost, cmd.exchange), None) is None:
        return Ok(), []
    return Ok(), [PermissionsChanged(cmd.user, cmd.vhost)]


# -- exchanges ---------------------------------------------------------------------


def _assert_args_equivalence(
    orig: Arguments, new: Arguments, keys: tuple[str, ...], what: str,
    ignore: frozenset[str] = frozenset(),
    absent_equals: dict[str, FieldValue] | None = None,
) -> MetadataError | None:
    """rabbit_misc:assert_args_equivalence/4 over `keys`, with RabbitMQ's texts."""
    for key in keys:
        if key in ignore:
            continue
        o_has, n_has = has_key(orig, key), has_key(new, key)
        o, n = lookup(orig, key), lookup(new, key)
        if absent_equals and key in absent_equals:
            dflt = absent_equals[key]
            if not o_has and n_has and n == dflt and type_class(n) == type_class(dflt):
                continue
            if o_has and not n_has and o == dflt and type_class(o) == type_class(dflt):
                continue
        if not o_has and not n_has:
            continue
        if o_has and n_has:
            if type_class(o) == type_class(n) and o == n:
                continue
            return MetadataError(
                PRECONDITION_FAILED,
                f"inequivalent arg '{key}' for {what}: received '{plain(n)}' "
                f"but current is '{plain(o)}'",
            )
        return MetadataError(
            PRECONDITION_FAILED,
            f"inequivalent arg '{key}' for {what}: received {typed(n, n_has)} "
            f"but current is {typed(o, o_has)}",
        )
    return None


def _field(name: str, what: str, received: bool, current: bool) -> MetadataError:
    r, c = ("true" if received else "false"), ("true" if current else "false")
    return MetadataError(
        PRECONDITION_FAILED, f"inequivalent arg '{name}' for {what}: received '{r}' but current is '{c}'"
    )


def _declare_exchange(meta: CommandMeta, cmd: DeclareExchange, state: MetadataState) -> Result:
    if cmd.vhost not in state.vhosts:
        return no_vhost(cmd.vhost), []
    if cmd.name == "" and not cmd.passive:
        return default_exchange_refused(), []
    if not cmd.passive and cmd.type not in EXCHANGE_TYPES:
        return MetadataError(COMMAND_INVALID, f"invalid exchange type '{cmd.type}'"), []
    existing = state.exchanges.get((cmd.vhost, cmd.name))
    what = rs("exchange", cmd.name, cmd.vhost)
    if cmd.passive:
        if existing is None:
            return not_found("exchange", cmd.name, cmd.vhost), []
        return ExchangeDeclareOk(existing, created=False), []
    if existing is not None:
        if existing.type != cmd.type:
            return MetadataError(
                PRECONDITION_FAILED,
                f"inequivalent arg 'type' for {what}: received '{cmd.type}' "
                f"but current is '{existing.type}'",
            ), []
        for name, rcv, cur in (
            ("durable", cmd.durable, existing.durable),
            ("auto_delete", cmd.auto_delete, existing.auto_delete),
            ("internal", cmd.internal, existing.internal),
        ):
            if rcv != cur:
                return _field(name, what, rcv, cur), []
        err = _assert_args_equivalence(
            existing.arguments, cmd.arguments, EXCHANGE_EQUIVALENCE_ARGS, what  # type: ignore[arg-type]
        )
        if err:
            return err, []
        return ExchangeDeclareOk(existing, created=False), []
    if cmd.name.startswith("amq."):
        return MetadataError(
            ACCESS_REFUSED, f"exchange name '{cmd.name}' contains reserved prefix 'amq.*'"
        ), []
    record = ExchangeRecord(
        cmd.vhost, cmd.name, cmd.type, cmd.durable, cmd.auto_delete, cmd.internal,  # type: ignore[arg-type]
        cmd.arguments,  # type: ignore[arg-type]
    )
    state.exchanges[(cmd.vhost, cmd.name)] = record
    state.routing_cache.pop((cmd.vhost, cmd.name), None)
    return ExchangeDeclareOk(record, created=True), [ExchangeDeclared(record)]


def _delete_exchange(meta: CommandMeta, cmd: DeleteExchange, state: MetadataState) -> Result:
    if cmd.name == "":
        return default_exchange_refused(), []
    if cmd.name.startswith("amq."):
        return MetadataError(
            ACCESS_REFUSED,
            f"deletion of system exchange '{cmd.name}' in vhost '{cmd.vhost}' not allowed",
        ), []
    x = state.exchanges.get((cmd.vhost, cmd.name))
    if x is None:
        return Ok(), []  # RabbitMQ: deleting a missing exchange succeeds
    if cmd.if_unused and state.bindings.get((cmd.vhost, cmd.name)):
        return MetadataError(PRECONDITION_FAILED, f"{rs('exchange', cmd.name, cmd.vhost)} in use"), []
    return Ok(), _remove_exchange(state, x)


def _remove_exchange(state: MetadataState, x: ExchangeRecord) -> Effects:
    """Delete `x` and every binding from or to it, cascading auto-delete."""
    effects: Effects = []
    del state.exchanges[(x.vhost, x.name)]
    state.routing_cache.pop((x.vhost, x.name), None)
    effects.append(ExchangeDeleted(x.vhost, x.name))
    for b in state.bindings_from(x.vhost, x.name):
        state.remove_binding(b)
        effects.append(BindingRemoved(b))
    effects += _remove_bindings_to(state, x.vhost, "exchange", x.name)
    return effects


def _remove_bindings_to(state: MetadataState, vhost: VhostName, kind: str, name: str) -> Effects:
    effects: Effects = []
    sources: dict[ExchangeName, None] = {}
    for b in state.bindings_to(vhost, kind, name):  # type: ignore[arg-type]
        state.remove_binding(b)
        effects.append(BindingRemoved(b))
        sources[b.source] = None
    for src in sources:
        effects += _maybe_auto_delete(state, vhost, src)
    return effects


def _maybe_auto_delete(state: MetadataState, vhost: VhostName, source: ExchangeName) -> Effects:
    """An auto-delete exchange goes when its last binding (as source) goes."""
    x = state.exchanges.get((vhost, source))
    if x is None or not x.auto_delete or state.bindings.get((vhost, source)):
        return []
    return _remove_exchange(state, x)


# -- bindings ----------------------------------------------------------------------


def _binding_of(cmd: Bind | Unbind) -> Binding:
    return Binding(
        cmd.vhost, cmd.source, cmd.destination, cmd.destination_kind, cmd.routing_key,
        cmd.arguments,  # type: ignore[arg-type]
    )


def _x_match_error(state: MetadataState, cmd: Bind) -> MetadataError | None:
    src = state.exchanges.get((cmd.vhost, cmd.source))
    if src is None or src.type != "headers":
        return None
    args: Arguments = cmd.arguments  # type: ignore[assignment]
    if not has_key(args, "x-match"):
        return None
    v = lookup(args, "x-match")
    if v in X_MATCH_VALUES:
        return None
    return MetadataError(
        PRECONDITION_FAILED,
        f"Invalid x-match field value {erl(v)}; expected all, any, all-with-x, or any-with-x",
    )


def _locked(q: QueueRecord) -> MetadataError:
    return MetadataError(
        RESOURCE_LOCKED,
        f"cannot obtain exclusive access to locked {rs('queue', q.name, q.vhost)}. It could be "
        "originally declared on another connection or the exclusive property value does not "
        "match that of the original declaration.",
    )


def _bind(meta: CommandMeta, cmd: Bind, state: MetadataState) -> Result:
    if cmd.vhost not in state.vhosts:
        return no_vhost(cmd.vhost), []
    if cmd.source == "" or (cmd.destination_kind == "exchange" and cmd.destination == ""):
        return default_exchange_refused(), []
    if (cmd.vhost, cmd.source) not in state.exchanges:
        return not_found("exchange", cmd.source, cmd.vhost), []
    if cmd.destination_kind == "queue":
        q = state.queues.get((cmd.vhost, QueueName(cmd.destination)))
        if q is None:
            return not_found("queue", cmd.destination, cmd.vhost), []
        if q.exclusive_owner is not None and q.exclusive_owner != cmd.owner:
            return _locked(q), []
    elif (cmd.vhost, ExchangeName(cmd.destination)) not in state.exchanges:
        return not_found("exchange", cmd.destination, cmd.vhost), []
    err = _x_match_error(state, cmd)
    if err:
        return err, []
    b = _binding_of(cmd)
    if not state.add_binding(b):
        return Ok(), []
    return Ok(), [BindingAdded(b)]


def _unbind(meta: CommandMeta, cmd: Unbind, state: MetadataState) -> Result:
    if cmd.source == "" or (cmd.destination_kind == "exchange" and cmd.destination == ""):
        return default_exchange_refused(), []
    b = _binding_of(cmd)
    if not state.remove_binding(b):
        return Ok(), []  # RabbitMQ: unbinding a missing binding succeeds
    return Ok(), [BindingRemoved(b), *_maybe_auto_delete(state, cmd.vhost, cmd.source)]


# -- queues ------------------------------------------------------------------------


def _queue_type_error(cmd: DeclareQueue, qtype: FieldValue) -> MetadataError:
    return MetadataError(
        PRECONDITION_FAILED,
        f"invalid arg 'x-queue-type' for {rs('queue', cmd.name, cmd.vhost)}: "
        f"\"unsupported queue type '{plain(qtype)}'\"",
    )


def _declare_queue(meta: CommandMeta, cmd: DeclareQueue, state: MetadataState) -> Result:
    vhost = state.vhosts.get(cmd.vhost)
    if vhost is None:
        return no_vhost(cmd.vhost), []
    args: Arguments = cmd.arguments  # type: ignore[assignment]
    what = rs("queue", cmd.name, cmd.vhost)
    existing = state.queues.get((cmd.vhost, cmd.name))
    if cmd.passive:
        if existing is None:
            return not_found("queue", cmd.name, cmd.vhost), []
        if existing.exclusive_owner is not None and existing.exclusive_owner != cmd.exclusive_owner:
            return _locked(existing), []
        return QueueDeclareOk(existing, created=False), []
    if cmd.name.startswith("amq.") and not cmd.server_named:
        return MetadataError(
            ACCESS_REFUSED, f"queue name '{cmd.name}' contains reserved prefix 'amq.*'"
        ), []
    # Default queue type of the vhost applies to durable, shared declarations only
    # (exclusive/transient/auto-delete queues stay classic, as in RabbitMQ 3.12+).
    if (
        not has_key(args, "x-queue-type")
        and vhost.default_queue_type is not None
        and cmd.durable and not cmd.auto_delete and cmd.exclusive_owner is None
        and not cmd.server_named
    ):
        args = with_key(args, "x-queue-type", vhost.default_queue_type)
    qtype_v = lookup(args, "x-queue-type") if has_key(args, "x-queue-type") else "classic"
    if isinstance(qtype_v, bytes):
        qtype_v = qtype_v.decode("utf-8", "replace")
    if qtype_v not in QUEUE_TYPES:
        return _queue_type_error(cmd, qtype_v), []
    qtype: QueueType = qtype_v  # type: ignore[assignment]
    if existing is not None:
        err = _queue_equivalence(existing, cmd, args, what)
        if err:
            return err, []
        return QueueDeclareOk(existing, created=False), []
    # RabbitMQ enforces max-queues for new queues only, before their properties.
    err = limits.queue_limit_refused(state, cmd.vhost, cmd.name)
    if err:
        return err, []
    if qtype == "quorum":
        err = _quorum_properties(cmd, what)
        if err:
            return err, []
    leader = cmd.leader if cmd.leader is not None else cmd.members[0]
    record = QueueRecord(
        vhost=cmd.vhost, name=cmd.name, type=qtype, durable=cmd.durable,
        auto_delete=cmd.auto_delete, exclusive_owner=cmd.exclusive_owner, arguments=args,
        members=tuple(cmd.members), leader=leader, created_at=meta.timestamp_ms,
        server_named=cmd.server_named,
    )
    state.queues[(cmd.vhost, cmd.name)] = record
    return QueueDeclareOk(record, created=True), [QueueDeclared(record)]


def _quorum_properties(cmd: DeclareQueue, what: str) -> MetadataError | None:
    # Order as rabbit_quorum_queue:declare/2 checks them (verified).
    if cmd.server_named:
        return MetadataError(
            PRECONDITION_FAILED, "Cannot declare a server-named queue for type rabbit_quorum_queue"
        )
    for bad, prop in (
        (cmd.auto_delete, "auto-delete"),
        (cmd.exclusive_owner is not None, "exclusive-owner"),
        (not cmd.durable, "non-durable"),
    ):
        if bad:
            return MetadataError(PRECONDITION_FAILED, f"invalid property '{prop}' for {what}")
    return None


def _queue_equivalence(
    q: QueueRecord, cmd: DeclareQueue, args: Arguments, what: str
) -> MetadataError | None:
    if q.durable != cmd.durable:
        return _field("durable", what, cmd.durable, q.durable)
    if q.auto_delete != cmd.auto_delete:
        return _field("auto_delete", what, cmd.auto_delete, q.auto_delete)
    # Strict exclusivity check: the owner must match exactly (None == shared).
    if q.exclusive_owner != cmd.exclusive_owner:
        return _locked(q)
    ignore = frozenset({"x-queue-type"}) if cmd.relaxed_checks else frozenset()
    return _assert_args_equivalence(
        q.arguments, args, EQUIVALENCE_ARGS, what, ignore,
        absent_equals={"x-queue-type": "classic"},
    )


def _delete_queue(meta: CommandMeta, cmd: DeleteQueue, state: MetadataState) -> Result:
    q = state.queues.get((cmd.vhost, cmd.name))
    if q is None:
        return QueueDeleteOk(None), []  # RabbitMQ: deleting a missing queue succeeds
    if q.exclusive_owner is not None and q.exclusive_owner != cmd.owner:
        return _locked(q), []
    what = rs("queue", cmd.name, cmd.vhost)
    if cmd.if_unused and cmd.consumer_count > 0:
        return MetadataError(PRECONDITION_FAILED, f"{what} in use"), []
    if cmd.if_empty and cmd.message_count > 0:
        return MetadataError(PRECONDITION_FAILED, f"{what} not empty"), []
    return QueueDeleteOk(q), _remove_queue(state, q)


def _remove_queue(state: MetadataState, q: QueueRecord) -> Effects:
    del state.queues[(q.vhost, q.name)]
    return [QueueDeleted(q), *_remove_bindings_to(state, q.vhost, "queue", q.name)]


def _delete_exclusive(meta: CommandMeta, cmd: DeleteExclusiveQueues, state: MetadataState) -> Result:
    effects: Effects = []
    for q in [q for q in state.queues.values() if q.exclusive_owner == cmd.owner]:
        effects += _remove_queue(state, q)
    return Ok(), effects


def _replace_queue(state: MetadataState, q: QueueRecord, **changes: Any) -> QueueRecord:
    fields = {f: getattr(q, f) for f in QueueRecord.__dataclass_fields__}
    fields.update(changes)
    new = QueueRecord(**fields)
    state.queues[(q.vhost, q.name)] = new
    return new


def _set_members(meta: CommandMeta, cmd: SetQueueMembers, state: MetadataState) -> Result:
    q = state.queues.get((cmd.vhost, cmd.name))
    if q is None:
        return not_found("queue", cmd.name, cmd.vhost), []
    if q.type == "classic" and len(cmd.members) != 1:
        return MetadataError(
            PRECONDITION_FAILED, f"{rs('queue', cmd.name, cmd.vhost)} is not a quorum queue"
        ), []
    if cmd.created_at and cmd.created_at != q.created_at:
        return Ok(), []  # about an earlier queue of that name
    if cmd.config_index is not None and cmd.config_index < q.members_index:
        return Ok(), []  # an earlier configuration than the recorded one
    leader = q.leader if q.leader in cmd.members else None
    effects: Effects = []
    if tuple(cmd.members) != q.members:
        effects.append(MembersChanged(q.vhost, q.name, q.members, tuple(cmd.members)))
    if leader != q.leader:
        effects.append(LeaderChanged(q.vhost, q.name, leader))
    _replace_queue(state, q, members=tuple(cmd.members), leader=leader,
                   members_index=max(cmd.config_index or 0, q.members_index))
    return Ok(), effects


def _set_leader(meta: CommandMeta, cmd: SetQueueLeader, state: MetadataState) -> Result:
    q = state.queues.get((cmd.vhost, cmd.name))
    if q is None:
        return not_found("queue", cmd.name, cmd.vhost), []
    if cmd.leader is not None and cmd.leader not in q.members:
        return MetadataError(
            PRECONDITION_FAILED,
            f"node '{cmd.leader}' is not a member of {rs('queue', cmd.name, cmd.vhost)}",
        ), []
    if cmd.term and cmd.term < q.leader_term:
        return Ok(), []  # a report of an earlier election arriving late
    term = max(cmd.term, q.leader_term)
    if cmd.leader == q.leader:
        if term != q.leader_term:
            _replace_queue(state, q, leader_term=term)
        return Ok(), []
    _replace_queue(state, q, leader=cmd.leader, leader_term=term)
    return Ok(), [LeaderChanged(q.vhost, q.name, cmd.leader)]


# -- policies and parameters -------------------------------------------------------


def _policy_snapshot(state: MetadataState, vhost: VhostName) -> dict[QueueName, tuple[Any, ...]]:
    out: dict[QueueName, tuple[Any, ...]] = {}
    for (v, name), q in state.queues.items():
        if v == vhost:
            out[name] = policies.applying(state, q)
    return out


def _changing_policies(
    state: MetadataState, vhost: VhostName, change: Callable[[], None]
) -> Effects:
    before = _policy_snapshot(state, vhost)
    change()
    after = _policy_snapshot(state, vhost)
    state.routing_cache.clear()  # alternate exchanges may come from policies
    affected = tuple((vhost, n) for n in after if after[n] != before.get(n))
    return [PolicyChanged(affected)] if affected else []


def _set_policy_in(
    table: dict[tuple[VhostName, PolicyName], PolicyRecord],
    cmd: SetPolicy | SetOperatorPolicy,
    state: MetadataState,
    operator: bool,
) -> Result:
    if cmd.vhost not in state.vhosts:
        return no_vhost(cmd.vhost), []
    definition: Arguments = cmd.definition  # type: ignore[assignment]
    err = policies.validate_policy(cmd.pattern, cmd.apply_to, cmd.priority, definition, operator)
    if err:
        return err, []
    record = PolicyRecord(
        cmd.vhost, cmd.name, cmd.pattern, cmd.apply_to, cmd.priority, definition  # type: ignore[arg-type]
    )

    def change() -> None:
        table[(cmd.vhost, cmd.name)] = record

    return Ok(), _changing_policies(state, cmd.vhost, change)


def _clear_policy_in(
    table: dict[tuple[VhostName, PolicyName], PolicyRecord],
    vhost: VhostName,
    name: PolicyName,
    state: MetadataState,
) -> Result:
    if (vhost, name) not in table:
        return MetadataError(NOT_FOUND, "Parameter does not exist"), []
    return Ok(), _changing_policies(state, vhost, lambda: table.__delitem__((vhost, name)))


def _set_policy(meta: CommandMeta, cmd: SetPolicy, state: MetadataState) -> Result:
    return _set_policy_in(state.policies, cmd, state, operator=False)


def _clear_policy(meta: CommandMeta, cmd: ClearPolicy, state: MetadataState) -> Result:
    return _clear_policy_in(state.policies, cmd.vhost, cmd.name, state)


def _set_operator_policy(meta: CommandMeta, cmd: SetOperatorPolicy, state: MetadataState) -> Result:
    return _set_policy_in(state.operator_policies, cmd, state, operator=True)


def _clear_operator_policy(
    meta: CommandMeta, cmd: ClearOperatorPolicy, state: MetadataState
) -> Result:
    return _clear_policy_in(state.operator_policies, cmd.vhost, cmd.name, state)


def _set_parameter(meta: CommandMeta, cmd: SetParameter, state: MetadataState) -> Result:
    if cmd.vhost not in state.vhosts:
        return no_vhost(cmd.vhost), []
    state.parameters[(cmd.vhost, cmd.component, cmd.name)] = RuntimeParameter(
        cmd.vhost, cmd.component, cmd.name, freeze_value(cmd.value)
    )
    return Ok(), []


def _clear_parameter(meta: CommandMeta, cmd: ClearParameter, state: MetadataState) -> Result:
    if state.parameters.pop((cmd.vhost, cmd.component, cmd.name), None) is None:
        return MetadataError(NOT_FOUND, "Parameter does not exist"), []
    return Ok(), []


# -- limits ------------------------------------------------------------------------


def _set_vhost_limit(meta: CommandMeta, cmd: SetVhostLimit, state: MetadataState) -> Result:
    if cmd.vhost not in state.vhosts:
        return no_vhost(cmd.vhost), []
    err = limits.validate_limit("vhost", cmd.name, cmd.value)
    if err:
        return err, []
    state.vhost_limits[(cmd.vhost, cmd.name)] = VhostLimit(cmd.vhost, cmd.name, cmd.value)
    return Ok(), []


def _clear_vhost_limit(meta: CommandMeta, cmd: ClearVhostLimit, state: MetadataState) -> Result:
    if cmd.vhost not in state.vhosts:
        return no_vhost(cmd.vhost), []
    state.vhost_limits.pop((cmd.vhost, cmd.name), None)
    return Ok(), []


def _set_user_limit(meta: CommandMeta, cmd: SetUserLimit, state: MetadataState) -> Result:
    if cmd.user not in state.users:
        return _no_user(cmd.user), []
    err = limits.validate_limit("user", cmd.name, cmd.value)
    if err:
        return err, []
    state.user_limits[(cmd.user, cmd.name)] = UserLimit(cmd.user, cmd.name, cmd.value)
    return Ok(), []


def _clear_user_limit(meta: CommandMeta, cmd: ClearUserLimit, state: MetadataState) -> Result:
    if cmd.user not in state.users:
        return _no_user(cmd.user), []
    state.user_limits.pop((cmd.user, cmd.name), None)
    return Ok(), []


_HANDLERS: dict[type, Callable[[CommandMeta, Any, MetadataState], Result]] = {
    Bootstrap: _bootstrap,
    AddVhost: _add_vhost,
    DeleteVhost: _delete_vhost,
    AddUser: _add_user,
    DeleteUser: _delete_user,
    ChangePassword: _change_password,
    SetUserTags: _set_user_tags,
    SetPermissions: _set_permissions,
    ClearPermissions: _clear_permissions,
    SetTopicPermissions: _set_topic_permissions,
    ClearTopicPermissions: _clear_topic_permissions,
    DeclareExchange: _declare_exchange,
    DeleteExchange: _delete_exchange,
    Bind: _bind,
    Unbind: _unbind,
    DeclareQueue: _declare_queue,
    DeleteQueue: _delete_queue,
    DeleteExclusiveQueues: _delete_exclusive,
    SetQueueMembers: _set_members,
    SetQueueLeader: _set_leader,
    SetPolicy: _set_policy,
    ClearPolicy: _clear_policy,
    SetOperatorPolicy: _set_operator_policy,
    ClearOperatorPolicy: _clear_operator_policy,
    SetParameter: _set_parameter,
    ClearParameter: _clear_parameter,
    SetVhostLimit: _set_vhost_limit,
    ClearVhostLimit: _clear_vhost_limit,
    SetUserLimit: _set_user_limit,
    ClearUserLimit: _clear_user_limit,
}


def new_state() -> MetadataState:
    """An empty state (no vhosts, no users): apply `Bootstrap` to initialise it."""
    return MetadataState()


def initial_state(password_hash: str) -> MetadataState:
    """A fresh node's state: vhost `/`, its default exchanges and user `guest`
    (administrator, full permissions on `/`) with `password_hash` (compute it
    with ``hash_password("guest", salt)``)."""
    state = MetadataState()
    apply(CommandMeta(0, 0), Bootstrap(password_hash), state)
    return state
