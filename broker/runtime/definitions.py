"""Definitions import at boot: RabbitMQ's `load_definitions` file.

Where it sits: `Node.start()` calls `load_definitions_file()` once, after the
metadata store is ready and before the AMQP listener opens, when the
configuration names a file and this node's metadata replica was fresh (an
empty log and no snapshot: the cluster is being created now). The JSON file
is RabbitMQ's export format (`rabbitmqctl export_definitions`, the management
UI's "Export definitions"); `parse_definitions` (pure) turns it into an
ordered `Plan` of metadata commands and queue declarations, which the node
executes through the metadata store like any client declaration.

Rule for the default user and vhost (RabbitMQ: "Will not seed default virtual
host and user: have definitions to load"): with a definitions file, exactly
what the file lists exists. Our metadata store always seeds `default_user` /
`default_vhost` when it creates a cluster, so the plan removes them again
unless the file lists them: the default user is deleted (or, if listed, its
permissions on the default vhost are cleared unless the file grants them),
and the default vhost is deleted when the file lists other vhosts but not it
(a file without any vhost keeps it, so a node can always tell a bootstrapped
metadata replica from an empty one). Nothing is reachable in between: the
listener only opens after the plan ran. Unlike RabbitMQ (which re-imports on
every boot unless `definitions.skip_if_unchanged`), the file is applied once,
when the cluster is created; later changes go through the management API.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import broker.metadata as md

if TYPE_CHECKING:
    from broker.common.config import Config

    from .declarations import Declarations

log = logging.getLogger("broker.definitions")

DEFAULT_HASHING = "rabbit_password_hashing_sha256"


class DefinitionsError(ValueError):
    """The definitions file is unreadable or invalid; the message says where."""


@dataclass(frozen=True, slots=True)
class QueueDefinition:
    vhost: str
    name: str
    durable: bool
    auto_delete: bool
    arguments: Mapping[str, Any]


@dataclass(slots=True)
class Plan:
    """Ordered work: `commands` first (vhosts, users, permissions, policies,
    exchanges), then `queues`, then `bindings` (they need the queues)."""

    commands: list[md.Command] = field(default_factory=list)
    queues: list[QueueDefinition] = field(default_factory=list)
    bindings: list[md.Bind] = field(default_factory=list)
    cleanup: list[md.Command] = field(default_factory=list)  # default user/vhost removal, last


class DefinitionsHost(Protocol):
    """What loading the definitions file needs of the node."""

    @property
    def config(self) -> Config: ...
    @property
    def declarations(self) -> Declarations: ...
    async def meta_execute(self, cmd: md.Command) -> md.Reply | None: ...


# The document is decoded JSON: its values are Any until these helpers check them.
def _req(item: Mapping[str, Any], key: str, where: str, kind: type = str) -> Any:
    if key not in item:
        raise DefinitionsError(f"{where}: missing '{key}'")
    value = item[key]
    if not isinstance(value, kind):
        raise DefinitionsError(f"{where}: '{key}' must be a {kind.__name__}, got {value!r}")
    return value


def _opt(item: Mapping[str, Any], key: str, where: str, kind: type, default: Any) -> Any:
    value = item.get(key, default)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise DefinitionsError(f"{where}: '{key}' must be a {kind.__name__}, got {value!r}")
    return value


def _items(doc: Mapping[str, Any], key: str) -> list[tuple[str, Mapping[str, Any]]]:
    items = doc.get(key) or []
    if not isinstance(items, list):
        raise DefinitionsError(f"'{key}' must be a list")
    out: list[tuple[str, Mapping[str, Any]]] = []
    for i, item in enumerate(items):
        where = f"{key}[{i}]"
        if not isinstance(item, dict):
            raise DefinitionsError(f"{where}: must be an object")
        out.append((where, item))
    return out


def _tags(value: Any, where: str) -> tuple[str, ...]:
    # RabbitMQ exports tags as a list (3.9+) or a comma-separated string (older).
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(t.strip() for t in value.split(",") if t.strip())
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return tuple(value)
    raise DefinitionsError(f"{where}: 'tags' must be a list of strings or a string")


def _limits(value: Any, kind: str, where: str) -> list[tuple[str, int]]:
    """Limits as RabbitMQ exports them: users[].limits, a vhost-limits
    parameter's value, vhosts[].limits: an object {name: integer}; empty as
    {} or [] (RabbitMQ writes [] for a vhost whose limits were all cleared)."""
    if value is None or value == []:
        return []
    if not isinstance(value, dict):
        raise DefinitionsError(f"{where}: 'limits' must be an object, got {value!r}")
    for name, n in value.items():
        err = md.validate_limit(kind, name, n)
        if err is not None:
            raise DefinitionsError(f"{where}: {err.text}")
    return list(value.items())


def parse_definitions(doc: Any, salt: Callable[[], bytes], default_user: str = "guest",
                      default_vhost: str = "/") -> Plan:
    """Validate a decoded definitions document and plan its import (pure but for
    `salt()`, which supplies 4 random bytes per cleartext password)."""
    if not isinstance(doc, dict):
        raise DefinitionsError("the definitions document must be a JSON object")
    plan = Plan()
    vhosts: set[str] = set()
    for where, v in _items(doc, "vhosts"):
        name = _req(v, "name", where)
        meta = _opt(v, "metadata", where, dict, {})
        description = _opt(v, "description", where, str, meta.get("description") or "")
        tags = _tags(v.get("tags", meta.get("tags")), where)
        dqt = v.get("default_queue_type", meta.get("default_queue_type"))
        if dqt is not None and dqt not in ("classic", "quorum", "stream"):
            raise DefinitionsError(f"{where}: unsupported default_queue_type {dqt!r}")
        vhosts.add(name)
        plan.commands.append(md.AddVhost(md.VhostName(name), description, tags, dqt))
        for limit, value in _limits(v.get("limits"), "vhost", where):
            plan.commands.append(md.SetVhostLimit(md.VhostName(name), limit, value))
    users: set[str] = set()
    for where, u in _items(doc, "users"):
        name = _req(u, "name", where)
        algorithm = _opt(u, "hashing_algorithm", where, str,
                         doc.get("hashing_algorithm") or DEFAULT_HASHING)
        if "password" in u and u["password"] is not None:
            password = _req(u, "password", where)
            try:
                password_hash = md.hash_password(password, salt(), algorithm)
            except md.InvalidCommand as exc:
                raise DefinitionsError(f"{where}: {exc}") from None
        else:
            password_hash = _opt(u, "password_hash", where, str, "")
        users.add(name)
        plan.commands.append(md.AddUser(md.UserName(name), password_hash, algorithm,
                                        _tags(u.get("tags"), where)))
        for limit, value in _limits(u.get("limits"), "user", where):
            plan.commands.append(md.SetUserLimit(md.UserName(name), limit, value))
    granted: set[tuple[str, str]] = set()
    for where, p in _items(doc, "permissions"):
        user, vhost = _req(p, "user", where), _req(p, "vhost", where)
        granted.add((user, vhost))
        plan.commands.append(md.SetPermissions(
            md.UserName(user), md.VhostName(vhost), _req(p, "configure", where),
            _req(p, "write", where), _req(p, "read", where)))
    for where, p in _items(doc, "topic_permissions"):
        plan.commands.append(md.SetTopicPermissions(
            md.UserName(_req(p, "user", where)), md.VhostName(_req(p, "vhost", where)),
            md.ExchangeName(_req(p, "exchange", where)), _req(p, "write", where),
            _req(p, "read", where)))
    # RabbitMQ 3.10 exports vhost limits as the runtime parameter
    # {"component": "vhost-limits", "name": "limits", "vhost": v, "value": {...}}
    # (value [] once every limit was cleared); other parameters are not imported.
    for where, p in _items(doc, "parameters"):
        if p.get("component") == "vhost-limits":
            vhost = _req(p, "vhost", where)
            for limit, value in _limits(p.get("value"), "vhost", where):
                plan.commands.append(md.SetVhostLimit(md.VhostName(vhost), limit, value))
    for where, p in _items(doc, "policies"):
        plan.commands.append(md.SetPolicy(
            md.VhostName(_req(p, "vhost", where)), md.PolicyName(_req(p, "name", where)),
            _req(p, "pattern", where), _req(p, "definition", where, dict),
            _opt(p, "priority", where, int, 0), _opt(p, "apply-to", where, str, "all")))
    for where, x in _items(doc, "exchanges"):
        plan.commands.append(md.DeclareExchange(
            md.VhostName(_req(x, "vhost", where)), md.ExchangeName(_req(x, "name", where)),
            _req(x, "type", where), _opt(x, "durable", where, bool, True),
            _opt(x, "auto_delete", where, bool, False), _opt(x, "internal", where, bool, False),
            md.freeze_table(_opt(x, "arguments", where, dict, {}))))
    for where, q in _items(doc, "queues"):
        plan.queues.append(QueueDefinition(
            _req(q, "vhost", where), _req(q, "name", where), _opt(q, "durable", where, bool, True),
            _opt(q, "auto_delete", where, bool, False), dict(_opt(q, "arguments", where, dict, {}))))
    for where, b in _items(doc, "bindings"):
        kind = _opt(b, "destination_type", where, str, "queue")
        if kind not in ("queue", "exchange"):
            raise DefinitionsError(f"{where}: destination_type must be queue or exchange")
        plan.bindings.append(md.Bind(
            md.VhostName(_req(b, "vhost", where)), md.ExchangeName(_req(b, "source", where)),
            _req(b, "destination", where), kind, _opt(b, "routing_key", where, str, ""),
            md.freeze_table(_opt(b, "arguments", where, dict, {}))))
    # The default user/vhost seeded at cluster creation (see the module docstring).
    if default_user not in users:
        plan.cleanup.append(md.DeleteUser(md.UserName(default_user)))
    elif (default_user, default_vhost) not in granted:
        plan.cleanup.append(md.ClearPermissions(md.UserName(default_user), md.VhostName(default_vhost)))
    if vhosts and default_vhost not in vhosts:
        plan.cleanup.append(md.DeleteVhost(md.VhostName(default_vhost)))
    return plan


def read_definitions(path: str) -> Any:  # JSON-decoded: parse_definitions checks its shape
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise DefinitionsError(f"cannot read definitions file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise DefinitionsError(f"definitions file {path} is not valid JSON: {exc}") from None


async def load_definitions_file(node: DefinitionsHost, path: str) -> None:
    """Apply the definitions file at `path` through the metadata store; any
    refused command stops the boot with a DefinitionsError naming it."""
    plan = parse_definitions(read_definitions(path), lambda: os.urandom(4),
                             node.config["default_user"], node.config["default_vhost"])

    def check(reply: md.Reply | None, what: str) -> None:
        if isinstance(reply, md.MetadataError):
            raise DefinitionsError(f"definitions file {path}: {what} refused: {reply.text}")

    for cmd in plan.commands:
        check(await node.meta_execute(cmd), type(cmd).__name__)
    for q in plan.queues:
        what = f"queue '{q.name}' in vhost '{q.vhost}'"
        reply = await node.declarations.declare_queue(
            q.vhost, q.name, durable=q.durable, exclusive_owner=None, auto_delete=q.auto_delete,
            arguments=dict(q.arguments), passive=False, server_named=False)
        check(reply, what)  # invalid quorum-queue arguments are refused like the rest
    for b in plan.bindings:
        check(await node.meta_execute(b), f"binding of '{b.destination}' to '{b.source}'")
    for cmd in plan.cleanup:
        reply = await node.meta_execute(cmd)
        if isinstance(reply, md.MetadataError):
            log.debug("definitions cleanup %s: %s", cmd, reply.text)
    log.info("imported definitions from %s: %d vhosts/users/permissions/policies/exchanges, "
             "%d queues, %d bindings", path, len(plan.commands), len(plan.queues), len(plan.bindings))
