"""The management HTTP API (aiohttp), on RabbitMQ's paths and JSON shapes where they exist.

Where it sits: the outermost I/O shell next to the AMQP listener. `make_app(port)`
builds the aiohttp application over a node's management port
(`port.ManagementPort`: this package never imports `broker.runtime`);
`Node.start()` serves it on `management.tcp.port`. Reads come from the
node's local metadata replica and queue processes through the port's views
(`views`); writes go through the same paths as AMQP (the port's
`declare_queue`, `meta_execute`) and the membership operations through
the port's membership part.

Errors: every refusal is a JSON body ``{"error": ..., "reason": ...}`` with a
4xx status (RabbitMQ's shape): 400 malformed or impossible requests, 401 bad
or missing credentials, 403 a user without the needed tag or vhost access,
404 unknown objects, 405 wrong method, 409 resource locked, 501 operations
this node cannot serve, 503 health checks that fail.

Access (RabbitMQ's user tags): any of administrator, monitoring,
policymaker, management may use the API. administrator/monitoring see every
vhost; the others see vhosts they have permissions in. Declaring/deleting
queues needs administrator, or configure permission on the queue; policies
need administrator or policymaker; users, permissions, vhost changes,
operator policies and membership operations need administrator.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import time
from bisect import bisect_left, bisect_right
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from broker import metadata as md
from broker import queue as qm
from broker.common import discovery
from broker.storage.manifest import node_manifest

from . import views as v
from .openapi import openapi_document
from .port import (
    LiveAccounting,
    ManagementPort,
    MembershipRefused,
    NodeResources,
    PeerUnreachable,
    Progress,
    QueueCommandFailed,
    QueueCounts,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")

MGMT_TAGS = frozenset({"administrator", "monitoring", "policymaker", "management"})
PORT_KEY = web.AppKey("port", ManagementPort)
log = logging.getLogger("broker.mgmt.api")


class ApiError(Exception):
    """A refused request; becomes ``{"error", "reason"}`` with `status`."""

    def __init__(self, status: int, reason: str, error: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.error = error or {
            400: "bad_request", 401: "not_authorized", 403: "access_refused",
            404: "not_found", 405: "method_not_allowed", 409: "conflict",
            501: "not_implemented", 503: "unavailable",
        }.get(status, "error")


def error_response(status: int, error: str, reason: str) -> web.Response:
    resp = web.json_response({"error": error, "reason": reason}, status=status)
    if status == 401:
        resp.headers["WWW-Authenticate"] = 'Basic realm="RabbitMQ Management"'
    return resp


_MD_STATUS = {403: 403, 404: 404, 405: 409, 406: 400}


def md_error(err: md.MetadataError) -> ApiError:
    """A metadata refusal as HTTP: 404->404, 403->403, 405 (locked)->409, others 400."""
    return ApiError(_MD_STATUS.get(err.code, 400), err.text)


# ---------------------------------------------------------------- request helpers
class Ctx:
    """The authenticated user of one request."""

    def __init__(self, port: ManagementPort, user: md.UserRecord | None) -> None:
        self.port = port
        self.user = user
        self.tags = frozenset(user.tags) if user else frozenset({"administrator"})

    @property
    def name(self) -> str:
        return self.user.name if self.user else ""

    @property
    def admin(self) -> bool:
        return "administrator" in self.tags

    def sees_all(self) -> bool:
        return bool(self.tags & {"administrator", "monitoring"})

    def can_see(self, vhost: str) -> bool:
        if self.sees_all():
            return True
        return (md.UserName(self.name), md.VhostName(vhost)) in self.port.metadata().permissions

    def need_admin(self) -> None:
        if not self.admin:
            raise ApiError(403, f"user '{self.name}' is not an administrator")

    def need_vhost(self, vhost: str) -> None:
        if md.VhostName(vhost) not in self.port.metadata().vhosts:
            raise ApiError(404, f"no vhost '{vhost}'")
        if not self.can_see(vhost):
            raise ApiError(403, f"access to vhost '{vhost}' refused for user '{self.name}'")

    def need_configure(self, vhost: str, queue: str) -> None:
        self.need_vhost(vhost)
        if self.admin:
            return
        if "monitoring" in self.tags and not (self.tags & {"management", "policymaker"}):
            raise ApiError(403, f"user '{self.name}' is a monitoring user")
        err = md.check(self.port.metadata(), self.name, vhost, "configure", md.Resource.queue(queue))
        if err is not None:
            raise ApiError(403, err.text)

    def need_policymaker(self, vhost: str) -> None:
        self.need_vhost(vhost)
        if not (self.tags & {"administrator", "policymaker"}):
            raise ApiError(403, f"user '{self.name}' is not a policymaker")


def ctx(request: web.Request) -> Ctx:
    c: Ctx = request["ctx"]
    return c


async def json_body(request: web.Request, allowed: dict[str, type | tuple[type, ...]],
                    required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The request's JSON object, checked: unknown keys, wrong types and missing
    required keys are 400s naming the key."""
    raw = await request.read()
    if not raw.strip():
        body: Any = {}
    else:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"malformed JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for key, value in body.items():
        if key not in allowed:
            raise ApiError(400, f"unknown key '{key}' (allowed: {', '.join(sorted(allowed))})")
        want = allowed[key]
        wants = want if isinstance(want, tuple) else (want,)
        ok = isinstance(value, wants) and not (isinstance(value, bool) and bool not in wants)
        if not ok:
            names = " or ".join(t.__name__ for t in wants)
            raise ApiError(400, f"'{key}' must be {names}, got {type(value).__name__}")
    for key in required:
        if key not in body:
            raise ApiError(400, f"'{key}' is required")
    return body


def query_flag(request: web.Request, name: str) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return False
    if raw.lower() in ("true", "1", "yes", ""):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise ApiError(400, f"query parameter '{name}' must be true or false, got {raw!r}")


def check_regex(value: str, what: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ApiError(400, f"{what}: invalid regular expression {value!r}: {exc}") from None
    return value


async def call_membership(aw: Awaitable[T]) -> T:
    """Await a membership operation; its refusals (MembershipRefused) become ApiErrors."""
    try:
        return await aw
    except MembershipRefused as exc:
        raise ApiError(exc.code if 400 <= exc.code < 600 else 400, exc.text) from None


def known_node(port: ManagementPort, name: str) -> str:
    if name not in port.cluster_nodes():
        raise ApiError(404, f"no node '{name}' in the cluster")
    return name


# ---------------------------------------------------------------- middleware
@web.middleware
async def errors_and_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    port = request.app[PORT_KEY]
    try:
        match = request.match_info
        if match.http_exception is not None:  # unknown path or method: no auth needed to say so
            raise match.http_exception
        if not getattr(match.route.handler, "public", False):
            request["ctx"] = authenticate(request, port)
        check_query(request, match.route.handler)
        return await handler(request)
    except ApiError as exc:
        resp = error_response(exc.status, exc.error, exc.reason)
        if exc.status == 401 and request.headers.get("X-Requested-With") == "XMLHttpRequest":
            # the web UI asks: it shows its own login form, not the browser's dialog
            del resp.headers["WWW-Authenticate"]
        return resp
    except web.HTTPException as exc:
        if exc.status >= 400:
            resp = error_response(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason)
            if "Allow" in exc.headers:
                resp.headers["Allow"] = exc.headers["Allow"]
            return resp
        raise
    except Exception as exc:  # a bug: still a JSON answer, and a log line with the trace
        log.exception("management API: %s %s failed", request.method, request.path)
        return error_response(500, "internal_error", f"{type(exc).__name__}: {exc}")


#: Query parameters RabbitMQ's management clients send for display purposes
#: (paging, sorting, column selection, rate windows); accepted and ignored.
IGNORED_QUERY = frozenset({
    "columns", "disable_stats", "enable_queue_totals", "sort", "sort_reverse", "page",
    "page_size", "pagination", "use_regex", "lengths_age", "lengths_incr", "msg_rates_age",
    "msg_rates_incr", "data_rates_age", "data_rates_incr"})
#: Query parameters each handler understands (by handler name); any other is a 400.
QUERY_PARAMS: dict[str, frozenset[str]] = {
    "delete_queue": frozenset({"if-empty", "if-unused"}),
    "delete_member": frozenset({"force"}),
    "grow": frozenset({"progress"}), "shrink": frozenset({"progress"}),
    "rebalance": frozenset({"progress"}), "drain": frozenset({"progress"}),
    "hand_off_leaders": frozenset({"progress"}),
    "health_quorum_critical": frozenset({"node"}),
}


def check_query(request: web.Request, handler: object) -> None:
    allowed = QUERY_PARAMS.get(getattr(handler, "__name__", ""), frozenset())
    for key in request.query:
        if key not in allowed and key not in IGNORED_QUERY:
            raise ApiError(400, f"unknown query parameter '{key}'")


def authenticate(request: web.Request, port: ManagementPort) -> Ctx:
    header = request.headers.get("Authorization", "")
    if not header.startswith("Basic "):
        raise ApiError(401, "authentication required (HTTP basic)")
    import base64
    import binascii

    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise ApiError(401, "malformed Authorization header") from None
    username, sep, password = decoded.partition(":")
    if not sep:
        raise ApiError(401, "malformed Authorization header")
    peer = request.remote or ""
    user = md.authenticate(port.metadata(), username, password, peer,
                           port.config["loopback_users"])
    if isinstance(user, md.MetadataError):
        raise ApiError(401, "Login failed")
    if not set(user.tags) & MGMT_TAGS:
        raise ApiError(403, f"user '{username}' has no management tag "
                            "(administrator, monitoring, policymaker, management)")
    return Ctx(port, user)


# ---------------------------------------------------------------- overview, nodes
async def whoami(request: web.Request) -> web.Response:
    """RabbitMQ's `GET /api/whoami`: the authenticated user and its tags."""
    c = ctx(request)
    return web.json_response({"name": c.name, "tags": sorted(c.tags)})


async def overview(request: web.Request) -> web.Response:
    c = ctx(request)
    port = c.port
    state = port.metadata()
    totals = {"messages": 0, "messages_ready": 0, "messages_unacknowledged": 0}
    consumers = 0
    for r in state.queues.values():
        if not c.can_see(r.vhost):
            continue
        counts = port.local_counts(r.vhost, r.name)
        if counts is None:
            continue
        totals["messages"] += counts.messages
        totals["messages_ready"] += counts.messages_ready
        totals["messages_unacknowledged"] += counts.messages_unacknowledged
        consumers += counts.consumers
    cluster = await port.cluster_totals()
    visible_q = sum(1 for r in state.queues.values() if c.can_see(r.vhost))
    visible_x = sum(1 for (vh, _) in state.exchanges if c.can_see(vh))
    return web.json_response({
        "management_version": v.MANAGEMENT_VERSION,
        "rabbitmq_version": v.MANAGEMENT_VERSION,
        "product_name": v.PRODUCT_NAME,
        "cluster_name": min(port.cluster_nodes()),
        "node": port.node_name,
        "object_totals": {"queues": visible_q, "exchanges": visible_x, "consumers": consumers,
                          "connections": sum(t.connections for t in cluster),
                          "channels": sum(t.channels for t in cluster)},
        "queue_totals": totals,
        "message_stats": v.sum_message_stats(t.message_stats for t in cluster),
        "listeners": [{"node": port.node_name, "protocol": "amqp",
                       "port": port.node_status().amqp_port}],
    })


async def _node_resources(port: ManagementPort) -> dict[str, NodeResources]:
    """Each reachable node's own disk/memory numbers and alarms, by name."""
    return {r.node: r for r in await port.cluster_resources()}


async def list_nodes(request: web.Request) -> web.Response:
    port = ctx(request).port
    res = await _node_resources(port)
    return web.json_response([v.node_view(port, n, res.get(n)) for n in port.cluster_nodes()])


async def get_node(request: web.Request) -> web.Response:
    port = ctx(request).port
    name = known_node(port, request.match_info["node"])
    return web.json_response(v.node_view(port, name, (await _node_resources(port)).get(name)))


def _storage_manifest(data_dir: str, accounting: dict[str, LiveAccounting]) -> dict[str, Any]:
    """The node's storage files (stats and headers: run on a worker thread)
    and, per group and segment, how many entries hold live messages."""
    doc = node_manifest(data_dir)
    for g in doc["groups"]:
        acc = accounting.get(g["group_id"])
        g["vhost"] = acc.vhost if acc is not None else None
        g["queue"] = acc.queue if acc is not None else None
        if acc is None:
            g.update(live_messages=None, smallest_live_index=None,
                     oldest_live_timestamp_ms=None, oldest_live_holder=None)
            for s in g["segments"]:
                s["live_entries"] = None
            continue
        live = acc.live_indexes
        g.update(live_messages=len(live), smallest_live_index=live[0] if live else None,
                 oldest_live_timestamp_ms=acc.oldest_live_timestamp_ms,
                 oldest_live_holder=acc.oldest_live_holder)
        for s in g["segments"]:
            s["live_entries"] = 0 if s["log_first"] is None else (
                bisect_right(live, s["log_last"]) - bisect_left(live, s["log_first"]))
    return doc


async def node_storage(request: web.Request) -> web.Response:
    """`GET /api/nodes/{node}/storage`: the storage manifest (for the Spark audit)."""
    c = ctx(request)
    if not c.sees_all():
        raise ApiError(403, f"user '{c.name}' is neither administrator nor monitoring")
    port = c.port
    name = known_node(port, request.match_info["node"])
    if name != port.node_name:
        raise ApiError(501, f"node '{name}' serves its own storage manifest: ask its "
                            "management API")
    state = port.metadata()
    cluster_groups = [
        {"group_id": port.group_id(r), "vhost": r.vhost, "queue": r.name,
         "members": sorted(r.members), "leader": port.queue_leader(r)}
        for r in state.queues.values() if r.type == "quorum"]
    accounting = port.live_accounting()  # on the event loop, where the states change
    doc = await asyncio.get_running_loop().run_in_executor(
        None, _storage_manifest, port.data_dir(), accounting)
    doc.update(node=port.node_name, generated_at_ms=int(time.time() * 1000),
               cluster_groups=cluster_groups)
    return web.json_response(doc)


# ---------------------------------------------------------------- vhosts, users, permissions
async def list_vhosts(request: web.Request) -> web.Response:
    c = ctx(request)
    return web.json_response([v.vhost_view(r, c.port) for r in c.port.metadata().vhosts.values()
                              if c.can_see(r.name)])


async def get_vhost(request: web.Request) -> web.Response:
    c = ctx(request)
    name = request.match_info["vhost"]
    c.need_vhost(name)
    return web.json_response(v.vhost_view(c.port.metadata().vhosts[md.VhostName(name)], c.port))


async def list_users(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    state = c.port.metadata()
    return web.json_response([v.user_view(u, state) for u in state.users.values()])


async def list_permissions(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    return web.json_response([v.permission_view(p) for p in c.port.metadata().permissions.values()])


VHOST_KEYS: dict[str, type | tuple[type, ...]] = {
    "description": str, "tags": (str, list), "default_queue_type": str, "tracing": bool}
USER_KEYS: dict[str, type | tuple[type, ...]] = {
    "password": str, "password_hash": str, "hashing_algorithm": str, "tags": (str, list)}
PERMISSION_KEYS: dict[str, type | tuple[type, ...]] = {"configure": str, "write": str, "read": str}


def _tags(value: Any) -> tuple[str, ...]:
    """RabbitMQ takes tags as "a,b" or as a list of strings."""
    items = value.split(",") if isinstance(value, str) else value
    if not all(isinstance(t, str) for t in items):
        raise ApiError(400, "'tags' must be a comma-separated string or a list of strings")
    return tuple(t.strip() for t in items if t.strip())


async def _execute(c: Ctx, cmd: md.Command) -> md.Reply | None:
    reply = await c.port.meta_execute(cmd)
    if isinstance(reply, md.MetadataError):
        raise md_error(reply)
    return reply


async def put_vhost(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    name = request.match_info["vhost"]
    body = await json_body(request, VHOST_KEYS)
    if not name:
        raise ApiError(400, "vhost names must not be empty")
    dqt = body.get("default_queue_type")
    if dqt is not None and dqt not in ("classic", "quorum"):
        raise ApiError(400, f"unsupported default queue type '{dqt}'")
    existed = md.VhostName(name) in c.port.metadata().vhosts
    await _execute(c, md.AddVhost(md.VhostName(name), body.get("description", ""),
                                  _tags(body.get("tags", ())), dqt))
    return web.Response(status=204 if existed else 201)


async def delete_vhost(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    name = request.match_info["vhost"]
    if md.VhostName(name) not in c.port.metadata().vhosts:
        raise ApiError(404, f"no vhost '{name}'")
    await _execute(c, md.DeleteVhost(md.VhostName(name)))
    return web.Response(status=204)


async def get_user(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    name = request.match_info["user"]
    user = c.port.metadata().users.get(md.UserName(name))
    if user is None:
        raise ApiError(404, f"no user '{name}'")
    return web.json_response(v.user_view(user, c.port.metadata()))


async def put_user(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    name = request.match_info["user"]
    body = await json_body(request, USER_KEYS)
    if not name:
        raise ApiError(400, "user names must not be empty")
    if "password" in body and "password_hash" in body:
        raise ApiError(400, "give either 'password' or 'password_hash', not both")
    algorithm = body.get("hashing_algorithm", "rabbit_password_hashing_sha256")
    existing = c.port.metadata().users.get(md.UserName(name))
    if "password" in body:
        try:
            password_hash = md.hash_password(body["password"], os.urandom(4), algorithm)
        except md.InvalidCommand as exc:
            raise ApiError(400, str(exc)) from None
    elif "password_hash" in body:
        password_hash = body["password_hash"]
    elif existing is not None:
        password_hash, algorithm = existing.password_hash, existing.hashing_algorithm
    else:
        password_hash = ""  # password login disabled, as RabbitMQ does without one
    tags = _tags(body["tags"]) if "tags" in body else (existing.tags if existing else ())
    await _execute(c, md.AddUser(md.UserName(name), password_hash, algorithm, tags))
    return web.Response(status=204 if existing is not None else 201)


async def delete_user(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    name = request.match_info["user"]
    await _execute(c, md.DeleteUser(md.UserName(name)))
    return web.Response(status=204)


def _permission_key(c: Ctx, request: web.Request) -> tuple[md.UserName, md.VhostName]:
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    if md.VhostName(vhost) not in c.port.metadata().vhosts:
        raise ApiError(404, f"no vhost '{vhost}'")
    if md.UserName(user) not in c.port.metadata().users:
        raise ApiError(404, f"no user '{user}'")
    return md.UserName(user), md.VhostName(vhost)


async def get_permission(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    key = _permission_key(c, request)
    perm = c.port.metadata().permissions.get(key)
    if perm is None:
        raise ApiError(404, f"no permissions for user '{key[0]}' in vhost '{key[1]}'")
    return web.json_response(v.permission_view(perm))


async def put_permission(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    user, vhost = _permission_key(c, request)
    body = await json_body(request, PERMISSION_KEYS, required=("configure", "write", "read"))
    for key in ("configure", "write", "read"):
        check_regex(body[key], key)
    existed = (user, vhost) in c.port.metadata().permissions
    await _execute(c, md.SetPermissions(user, vhost, body["configure"], body["write"], body["read"]))
    return web.Response(status=204 if existed else 201)


async def delete_permission(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    user, vhost = _permission_key(c, request)
    if (user, vhost) not in c.port.metadata().permissions:
        raise ApiError(404, f"no permissions for user '{user}' in vhost '{vhost}'")
    await _execute(c, md.ClearPermissions(user, vhost))
    return web.Response(status=204)


# ---------------------------------------------------------------- vhost and user limits
# RabbitMQ's /api/vhost-limits and /api/user-limits: lists of {"vhost"|"user",
# "value": {limit: n}} (only those with limits), PUT {"value": n} -> 204,
# DELETE -> 204 whether or not the limit was set. Values are checked by the
# metadata machine (md.validate_limit), with RabbitMQ's texts, as 400s.
LIMIT_KEYS: dict[str, type | tuple[type, ...]] = {
    "value": (int, float, str, bool, list, dict, type(None))}


async def list_vhost_limits(request: web.Request) -> web.Response:
    c = ctx(request)
    state = c.port.metadata()
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        c.need_vhost(vhost)
    out = []
    for name in state.vhosts:
        if (vhost is None or name == vhost) and c.can_see(name):
            limits = v.vhost_limits(state, name)
            if limits:
                out.append({"vhost": name, "value": limits})
    return web.json_response(out)


async def _limit_value(request: web.Request, kind: str, name: str) -> int:
    body = await json_body(request, LIMIT_KEYS, required=("value",))
    err = md.validate_limit(kind, name, body["value"])
    if err is not None:
        raise ApiError(400, err.text)
    value: int = body["value"]
    return value


async def put_vhost_limit(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    c.need_vhost(vhost)
    value = await _limit_value(request, "vhost", name)
    await _execute(c, md.SetVhostLimit(md.VhostName(vhost), name, value))
    return web.Response(status=204)


async def delete_vhost_limit(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    c.need_vhost(vhost)
    await _execute(c, md.ClearVhostLimit(md.VhostName(vhost), name))
    return web.Response(status=204)


async def list_user_limits(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    state = c.port.metadata()
    user = request.match_info.get("user")
    if user is not None and md.UserName(user) not in state.users:
        raise ApiError(404, f"no user '{user}'")
    out = []
    for name in state.users:
        if user is None or name == user:
            limits = v.user_limits(state, name)
            if limits:
                out.append({"user": name, "value": limits})
    return web.json_response(out)


async def put_user_limit(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    user, name = request.match_info["user"], request.match_info["name"]
    if md.UserName(user) not in c.port.metadata().users:
        raise ApiError(404, f"no user '{user}'")
    value = await _limit_value(request, "user", name)
    await _execute(c, md.SetUserLimit(md.UserName(user), name, value))
    return web.Response(status=204)


async def delete_user_limit(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    user, name = request.match_info["user"], request.match_info["name"]
    await _execute(c, md.ClearUserLimit(md.UserName(user), name))
    return web.Response(status=204)


# ---------------------------------------------------------------- exchanges, bindings
async def list_exchanges(request: web.Request) -> web.Response:
    c = ctx(request)
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        c.need_vhost(vhost)
    return web.json_response([
        v.exchange_view(r) for (vh, _), r in c.port.metadata().exchanges.items()
        if (vhost is None or vh == vhost) and c.can_see(vh)])


async def list_bindings(request: web.Request) -> web.Response:
    c = ctx(request)
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        c.need_vhost(vhost)
    out: list[dict[str, Any]] = []
    for (vh, _), bucket in c.port.metadata().bindings.items():
        if (vhost is None or vh == vhost) and c.can_see(vh):
            out.extend(v.binding_view(b) for b in bucket)
    return web.json_response(out)


# ---------------------------------------------------------------- queues
async def counts_for(port: ManagementPort, record: md.QueueRecord) -> QueueCounts | None:
    counts = port.local_counts(record.vhost, record.name)
    if counts is not None:
        return counts
    try:
        return await asyncio.wait_for(port.remote_counts(record.vhost, record.name), 5)
    except Exception:  # noqa: BLE001 - an unreachable leader: counts unknown
        return None


StatsKey = tuple[str, str, int]


async def queue_stats(port: ManagementPort, only: tuple[str, str] | None = None
                      ) -> dict[StatsKey, dict[str, Any]]:
    """Per-queue message_stats of the whole cluster (every node counts what
    its own channels did), by (vhost, name, created_at)."""
    parts: dict[StatsKey, list[dict[str, Any] | None]] = {}
    for part in await port.cluster_queue_stats(only):
        parts.setdefault((part.vhost, part.name, part.created_at), []).append(part.message_stats)
    return {k: v.sum_message_stats(p) for k, p in parts.items()}


async def list_queues(request: web.Request) -> web.Response:
    c = ctx(request)
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        c.need_vhost(vhost)
    records = [r for (vh, _), r in sorted(c.port.metadata().queues.items())
               if (vhost is None or vh == vhost) and c.can_see(vh)]
    counts = await asyncio.gather(*(counts_for(c.port, r) for r in records))
    stats = await queue_stats(c.port)
    return web.json_response([v.queue_view(c.port, r, n, stats.get((r.vhost, r.name, r.created_at)))
                              for r, n in zip(records, counts, strict=True)])


def queue_record(c: Ctx, vhost: str, name: str) -> md.QueueRecord:
    c.need_vhost(vhost)
    record = c.port.metadata().queues.get((md.VhostName(vhost), md.QueueName(name)))
    if record is None:
        raise ApiError(404, f"no queue '{name}' in vhost '{vhost}'")
    return record


async def get_queue(request: web.Request) -> web.Response:
    c = ctx(request)
    record = queue_record(c, request.match_info["vhost"], request.match_info["name"])
    stats = await queue_stats(c.port, (record.vhost, record.name))
    return web.json_response(v.queue_view(c.port, record, await counts_for(c.port, record),
                                          stats.get((record.vhost, record.name, record.created_at))))


QUEUE_PUT_KEYS: dict[str, type | tuple[type, ...]] = {
    "durable": bool, "auto_delete": bool, "arguments": dict, "node": str, "type": str}


async def put_queue(request: web.Request) -> web.Response:
    c = ctx(request)
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    c.need_configure(vhost, name)
    body = await json_body(request, QUEUE_PUT_KEYS)
    if not name or len(name.encode()) > 255:
        raise ApiError(400, "queue names are 1 to 255 bytes long")
    if name.startswith("amq."):
        raise ApiError(403, f"queue name '{name}' contains reserved prefix 'amq.*'")
    arguments = dict(body.get("arguments", {}))
    if "type" in body:
        if body["type"] not in ("quorum", "classic"):
            raise ApiError(400, f"unsupported queue type '{body['type']}'")
        arguments.setdefault("x-queue-type", body["type"])
    if "node" in body:
        known_node(c.port, body["node"])
    reply = await c.port.declare_queue(
        vhost, name, durable=body.get("durable", True),
        auto_delete=body.get("auto_delete", False), arguments=arguments)
    if isinstance(reply, md.MetadataError):
        raise md_error(reply)
    created = reply.created if isinstance(reply, md.QueueDeclareOk) else True
    return web.Response(status=201 if created else 204)


async def delete_queue(request: web.Request) -> web.Response:
    c = ctx(request)
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    c.need_configure(vhost, name)
    record = queue_record(c, vhost, name)
    if_empty, if_unused = query_flag(request, "if-empty"), query_flag(request, "if-unused")
    if (if_empty or if_unused) and c.port.local_counts(vhost, name) is None:
        # No replica here to check the condition against: use the leader's counts.
        counts = await counts_for(c.port, record)
        if counts is None:
            raise ApiError(503, f"queue '{name}' in vhost '{vhost}': counts unavailable")
        if if_empty and counts.messages:
            raise ApiError(400, f"queue '{name}' in vhost '{vhost}' is not empty")
        if if_unused and counts.consumers:
            raise ApiError(400, f"queue '{name}' in vhost '{vhost}' in use")
    reply = await c.port.delete_queue(vhost, name, if_unused, if_empty)
    if isinstance(reply, md.MetadataError):
        raise md_error(reply)
    if isinstance(reply, md.QueueDeleteOk) and reply.record is None:
        raise ApiError(404, f"no queue '{name}' in vhost '{vhost}'")
    return web.Response(status=204)


async def purge_queue(request: web.Request) -> web.Response:
    c = ctx(request)
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    queue_record(c, vhost, name)
    if not c.admin:
        err = md.check(c.port.metadata(), c.name, vhost, "read", md.Resource.queue(name))
        if err is not None:
            raise ApiError(403, err.text)
    q = c.port.local_queue(vhost, name)
    if q is None:
        raise ApiError(404, f"no queue '{name}' in vhost '{vhost}'")
    try:
        await q.command(qm.Purge())
    except QueueCommandFailed as exc:
        raise ApiError(503 if exc.code == 404 else 400, exc.text) from None
    return web.Response(status=204)


# ---------------------------------------------------------------- policies
POLICY_KEYS: dict[str, type | tuple[type, ...]] = {
    "pattern": str, "definition": dict, "priority": int, "apply-to": str}


def _policies_of(request: web.Request) -> tuple[bool, str]:
    operator = request.path.startswith("/api/operator-policies")
    return operator, "operator policy" if operator else "policy"


async def list_policies(request: web.Request) -> web.Response:
    c = ctx(request)
    operator, _ = _policies_of(request)
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        c.need_vhost(vhost)
    if operator:
        c.need_admin()
    source = c.port.metadata().operator_policies if operator else c.port.metadata().policies
    return web.json_response([v.policy_view(p) for (vh, _), p in sorted(source.items())
                              if (vhost is None or vh == vhost) and c.can_see(vh)])


async def get_policy(request: web.Request) -> web.Response:
    c = ctx(request)
    operator, what = _policies_of(request)
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    c.need_vhost(vhost)
    if operator:
        c.need_admin()
    source = c.port.metadata().operator_policies if operator else c.port.metadata().policies
    p = source.get((md.VhostName(vhost), md.PolicyName(name)))
    if p is None:
        raise ApiError(404, f"no {what} '{name}' in vhost '{vhost}'")
    return web.json_response(v.policy_view(p))


async def put_policy(request: web.Request) -> web.Response:
    c = ctx(request)
    operator, _ = _policies_of(request)
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    if operator:
        c.need_vhost(vhost)
        c.need_admin()
    else:
        c.need_policymaker(vhost)
    body = await json_body(request, POLICY_KEYS, required=("pattern", "definition"))
    check_regex(body["pattern"], "pattern")
    source = c.port.metadata().operator_policies if operator else c.port.metadata().policies
    existed = (md.VhostName(vhost), md.PolicyName(name)) in source
    cls = md.SetOperatorPolicy if operator else md.SetPolicy
    cmd = cls(md.VhostName(vhost), md.PolicyName(name), body["pattern"],
              md.freeze_table(body["definition"]), body.get("priority", 0),
              body.get("apply-to", "queues" if operator else "all"))
    await _execute(c, cmd)
    return web.Response(status=204 if existed else 201)


async def delete_policy(request: web.Request) -> web.Response:
    c = ctx(request)
    operator, what = _policies_of(request)
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    if operator:
        c.need_vhost(vhost)
        c.need_admin()
    else:
        c.need_policymaker(vhost)
    source = c.port.metadata().operator_policies if operator else c.port.metadata().policies
    if (md.VhostName(vhost), md.PolicyName(name)) not in source:
        raise ApiError(404, f"no {what} '{name}' in vhost '{vhost}'")
    cls = md.ClearOperatorPolicy if operator else md.ClearPolicy
    await _execute(c, cls(md.VhostName(vhost), md.PolicyName(name)))
    return web.Response(status=204)


# ---------------------------------------------------------------- health
async def health_alarms(request: web.Request) -> web.Response:
    """RabbitMQ's: 503 while a resource alarm is in effect on any node."""
    alarms = list(ctx(request).port.alarm_status().in_effect)
    if alarms:
        return web.json_response({"status": "failed",
                                  "reason": "There are alarms in effect in the cluster",
                                  "alarms": alarms}, status=503)
    return web.json_response({"status": "ok"})


async def health_local_alarms(request: web.Request) -> web.Response:
    """RabbitMQ's: 503 while a resource alarm is in effect on this node."""
    port = ctx(request).port
    alarms = [a for a in port.alarm_status().in_effect if a["node"] == port.node_name]
    if alarms:
        return web.json_response({"status": "failed",
                                  "reason": "There are alarms in effect on the node",
                                  "alarms": alarms}, status=503)
    return web.json_response({"status": "ok"})


async def health_quorum_critical(request: web.Request) -> web.Response:
    port = ctx(request).port
    name = request.query.get("node", port.node_name)
    known_node(port, name)
    if not port.node_status().clustered:
        return web.json_response({"status": "ok", "reason": "single node cluster"})
    critical = port.quorum_critical(name)
    if critical:
        return web.json_response({
            "status": "failed",
            "reason": "There are quorum queues that would lose their quorum if the target "
                      "node is shut down",
            "queues": [{"name": q, "vhost": vh, "readable_name": f"queue '{q}' in vhost '{vh}'"}
                       for vh, q in critical]}, status=503)
    return web.json_response({"status": "ok"})


async def health_raft_groups(request: web.Request) -> web.Response:
    """503 when a Raft group on this node stopped (a broken invariant or a
    storage failure) or a queue member could not start: that member serves
    nothing until the node's data is repaired or the member is replaced."""
    stopped = ctx(request).port.stopped_members()
    if stopped:
        return web.json_response({
            "status": "failed", "reason": "Raft groups on this node are stopped",
            "groups": [{"group": g, "reason": r} for g, r in sorted(stopped.items())]}, status=503)
    return web.json_response({"status": "ok"})


async def liveness(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readiness(request: web.Request) -> web.Response:
    status = request.app[PORT_KEY].node_status()
    problems = []
    if status.metadata_leader is None:
        problems.append("the metadata store has no leader")
    elif status.clustered and not status.metadata_voter:
        problems.append("this node is not (yet) a voting member of the cluster")
    if not status.amqp_port:
        problems.append("the AMQP listener is not up")
    if problems:
        return web.json_response({"status": "failed", "reason": "; ".join(problems)}, status=503)
    return web.json_response({"status": "ok"})


async def get_openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


# ---------------------------------------------------------------- quorum-queue operations
def _quorum_queue(request: web.Request, admin: bool = True) -> tuple[Ctx, str, str]:
    """The context and (vhost, name) of a membership request on a quorum
    queue: authorised, the queue exists and is a quorum queue."""
    c = ctx(request)
    if admin:
        c.need_admin()
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    if queue_record(c, vhost, name).type != "quorum":
        raise ApiError(400, f"queue '{name}' in vhost '{vhost}' is not a quorum queue")
    return c, vhost, name


async def _node_in_body(c: Ctx, request: web.Request) -> str:
    body = await json_body(request, {"node": str}, required=("node",))
    return known_node(c.port, body["node"])


async def quorum_status(request: web.Request) -> web.Response:
    c, vhost, name = _quorum_queue(request, admin=False)
    result = await call_membership(c.port.quorum_status(vhost, name))
    return web.json_response([dataclasses.asdict(m) for m in result])


async def queue_storage(request: web.Request) -> web.Response:
    """`GET /api/queues/{vhost}/{name}/storage`: every reachable member's
    segment files and bytes and snapshot bytes, by node."""
    c, vhost, name = _quorum_queue(request, admin=False)
    answers = await c.port.queue_storage(vhost, name)
    return web.json_response(sorted(answers, key=lambda a: str(a["node"])))


async def add_member(request: web.Request) -> web.Response:
    c, vhost, name = _quorum_queue(request)
    node = await _node_in_body(c, request)
    await call_membership(c.port.add_member(vhost, name, node))
    return web.Response(status=204)


async def delete_member(request: web.Request) -> web.Response:
    c, vhost, name = _quorum_queue(request)
    target = known_node(c.port, request.match_info["node"])
    force = query_flag(request, "force")
    await call_membership(c.port.delete_member(vhost, name, target, force=force))
    return web.Response(status=204)


async def transfer_leader(request: web.Request) -> web.Response:
    """Move the queue's leadership to the member on `node` (Raft leadership
    transfer; answered once the new leader is known)."""
    c, vhost, name = _quorum_queue(request)
    node = await _node_in_body(c, request)
    await call_membership(c.port.transfer_leader(vhost, name, node))
    return web.Response(status=204)


LongRun = Callable[[Progress], Awaitable[list[dict[str, Any]]]]


async def _long_operation(request: web.Request, run: LongRun) -> web.StreamResponse:
    """Run a long membership operation. With ``?progress=true`` the response is
    NDJSON streamed as the operation goes: ``{"progress": {...}}`` lines, then
    one ``{"result": [...]}`` or ``{"error": ..., "reason": ...}`` line (the
    status is already 200 by then). Otherwise a plain JSON list of results."""
    if not query_flag(request, "progress"):
        return web.json_response(v.jsonable(await call_membership(run(None))))
    resp = web.StreamResponse(status=200, headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def progress(item: dict[str, Any]) -> None:
        queue.put_nowait({"progress": v.jsonable(item)})

    task = asyncio.ensure_future(call_membership(run(progress)))
    while True:
        getter = asyncio.ensure_future(queue.get())
        done, _ = await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            await resp.write(json.dumps(getter.result()).encode() + b"\n")
            continue
        getter.cancel()
        while not queue.empty():
            await resp.write(json.dumps(queue.get_nowait()).encode() + b"\n")
        break
    try:
        line: dict[str, Any] = {"result": v.jsonable(task.result())}
    except ApiError as exc:
        line = {"error": exc.error, "reason": exc.reason, "status": exc.status}
    await resp.write(json.dumps(line).encode() + b"\n")
    await resp.write_eof()
    return resp


PATTERN_KEYS: dict[str, type | tuple[type, ...]] = {"vhost_pattern": str, "queue_pattern": str}


async def grow(request: web.Request) -> web.StreamResponse:
    c = ctx(request)
    c.need_admin()
    body = await json_body(request, {"node": str, "strategy": str, **PATTERN_KEYS},
                           required=("node",))
    known_node(c.port, body["node"])
    strategy = body.get("strategy", "all")
    if strategy not in ("all", "even"):
        raise ApiError(400, f"strategy must be 'all' or 'even', got {strategy!r}")
    vp = check_regex(body.get("vhost_pattern", ".*"), "vhost_pattern")
    qp = check_regex(body.get("queue_pattern", ".*"), "queue_pattern")
    port = c.port
    return await _long_operation(request, lambda progress: port.grow(
        body["node"], strategy, vhost_pattern=vp, queue_pattern=qp, progress=progress))


async def shrink(request: web.Request) -> web.StreamResponse:
    c = ctx(request)
    c.need_admin()
    body = await json_body(request, {"node": str, "errors_only": bool}, required=("node",))
    known_node(c.port, body["node"])
    port = c.port
    return await _long_operation(request, lambda progress: port.shrink(
        body["node"], errors_only=body.get("errors_only", False), progress=progress))


async def rebalance(request: web.Request) -> web.StreamResponse:
    c = ctx(request)
    c.need_admin()
    body = await json_body(request, PATTERN_KEYS)
    vp = check_regex(body.get("vhost_pattern", ".*"), "vhost_pattern")
    qp = check_regex(body.get("queue_pattern", ".*"), "queue_pattern")
    port = c.port
    return await _long_operation(request, lambda progress: port.rebalance(
        vhost_pattern=vp, queue_pattern=qp, progress=progress))


async def drain(request: web.Request) -> web.StreamResponse:
    """Move every member and leadership off the node. With
    `{"desired_replicas": N}` (a StatefulSet scale-down, `qqctl drain
    --if-leaving`), the pods with ordinals at or above N are leaving too and
    receive nothing: pods that stop together never drain onto each other."""
    c = ctx(request)
    c.need_admin()
    target = known_node(c.port, request.match_info["node"])
    body = await json_body(request, {"desired_replicas": int})
    exclude: set[str] = set()
    if "desired_replicas" in body:
        if body["desired_replicas"] < 0:
            raise ApiError(400, "'desired_replicas' must be 0 or more")
        if c.port.config["cluster.discovery"] != "statefulset":
            raise ApiError(400, "'desired_replicas' needs cluster.discovery = statefulset "
                                "(this node cannot tell the pods' ordinals)")
        names = c.port.cluster_nodes()
        exclude = {n for n, k in discovery.ordinals(c.port.config.values, os.environ, names).items()
                   if k >= body["desired_replicas"]}
    port = c.port
    return await _long_operation(request, lambda progress: port.drain(
        target, exclude, progress=progress))


async def hand_off_leaders(request: web.Request) -> web.StreamResponse:
    """Move the node's quorum-queue leaderships (and, on that node itself, its
    metadata leadership) to other online members: a pod about to restart."""
    c = ctx(request)
    c.need_admin()
    target = known_node(c.port, request.match_info["node"])
    await json_body(request, {})
    port = c.port
    return await _long_operation(request, lambda progress: port.hand_off_leaders(
        target, progress=progress))


async def forget_node(request: web.Request) -> web.Response:
    """`DELETE /api/nodes/{node}`: a drained node leaves the cluster for good
    (removed from the metadata group). Only the metadata leader does it; others
    answer 409 naming the leader."""
    c = ctx(request)
    c.need_admin()
    target = known_node(c.port, request.match_info["node"])
    await call_membership(c.port.forget_node(target))
    return web.Response(status=204)


# ---------------------------------------------------------------- connections, channels, consumers
def _find(items: list[dict[str, Any]], name: str, what: str) -> dict[str, Any]:
    for item in items:
        if item["name"] == name:
            return item
    raise ApiError(404, f"no {what} '{name}'", error="Object Not Found")


def _in_vhost(c: Ctx, request: web.Request, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    vhost = request.match_info.get("vhost")
    if vhost is None:
        return items
    c.need_vhost(vhost)
    return [i for i in items if i["vhost"] == vhost]


async def _connections(c: Ctx) -> list[dict[str, Any]]:
    """The whole cluster's connections (every reachable node's), as RabbitMQ lists them."""
    return v.visible(await c.port.cluster_list("connections"), c.name, c.sees_all())


async def _channels(c: Ctx) -> list[dict[str, Any]]:
    return v.visible(await c.port.cluster_list("channels"), c.name, c.sees_all())


async def list_connections(request: web.Request) -> web.Response:
    c = ctx(request)
    return web.json_response(_in_vhost(c, request, await _connections(c)))


async def get_connection(request: web.Request) -> web.Response:
    c = ctx(request)
    return web.json_response(_find(await _connections(c), request.match_info["name"], "connection"))


async def delete_connection(request: web.Request) -> web.Response:
    """Close a connection on whichever node holds it: 320 CONNECTION_FORCED
    with RabbitMQ's reason (the X-Reason header, else 'Closed via management
    plugin')."""
    c = ctx(request)
    name = request.match_info["name"]
    info = _find(await _connections(c), name, "connection")
    if not c.admin and info.get("user") != c.name:
        raise ApiError(403, f"user '{c.name}' may not close connection '{name}'")
    reason = request.headers.get("X-Reason", "Closed via management plugin")
    try:
        await c.port.close_connection(info.get("node"), name, reason)
    except PeerUnreachable as exc:
        raise ApiError(503, f"could not reach node '{info['node']}' to close '{name}': {exc.text}",
                       error="Service Unavailable") from None
    return web.Response(status=204)


async def connection_channels(request: web.Request) -> web.Response:
    c = ctx(request)
    name = request.match_info["name"]
    _find(await _connections(c), name, "connection")
    return web.json_response([ch for ch in await _channels(c)
                              if ch["connection_details"]["name"] == name])


async def list_channels(request: web.Request) -> web.Response:
    c = ctx(request)
    return web.json_response(_in_vhost(c, request, await _channels(c)))


async def get_channel(request: web.Request) -> web.Response:
    c = ctx(request)
    return web.json_response(_find(await _channels(c), request.match_info["name"], "channel"))


async def list_consumers(request: web.Request) -> web.Response:
    c = ctx(request)
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        c.need_vhost(vhost)
    return web.json_response([x for x in await c.port.cluster_list("consumers")
                              if (vhost is None or x["queue"]["vhost"] == vhost)
                              and c.can_see(x["queue"]["vhost"])])


# ---------------------------------------------------------------- get / publish
GET_KEYS: dict[str, type | tuple[type, ...]] = {
    "count": (int, str), "ackmode": str, "encoding": str, "truncate": (int, str),
    "requeue": bool, "vhost": str, "name": str}
ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")
_PROP_NAMES = {"content_type": "content_type", "content_encoding": "content_encoding",
               "headers": "headers", "delivery_mode": "delivery_mode", "priority": "priority",
               "correlation_id": "correlation_id", "reply_to": "reply_to",
               "expiration": "expiration", "message_id": "message_id", "timestamp": "timestamp",
               "type": "message_type", "user_id": "user_id", "app_id": "app_id",
               "cluster_id": "cluster_id"}


def _int_param(body: dict[str, Any], key: str, default: int | None = None) -> int:
    raw: Any = body.get(key, default)
    try:
        value = int(raw)  # RabbitMQ's UI sends numbers as strings
    except (TypeError, ValueError):
        raise ApiError(400, f"'{key}' must be an integer, got {raw!r}") from None
    if value < 0:
        raise ApiError(400, f"'{key}' must not be negative")
    return value


def _properties_view(raw: bytes, delivery_count: int, quorum: bool) -> dict[str, Any]:
    from broker.amqp import codec as acodec

    props = acodec.decode_properties(raw)
    out: dict[str, Any] = {}
    for name, attr in _PROP_NAMES.items():
        value = getattr(props, attr, None)
        if value is None:
            continue
        if name == "timestamp" and hasattr(value, "timestamp"):
            value = int(value.timestamp())
        out[name] = v.jsonable(value)
    if quorum and delivery_count:
        out.setdefault("headers", {})["x-delivery-count"] = delivery_count
    return out


def _read_permission(c: Ctx, vhost: str, name: str) -> None:
    if not c.admin:
        err = md.check(c.port.metadata(), c.name, vhost, "read", md.Resource.queue(name))
        if err is not None:
            raise ApiError(403, err.text)


_GET_SEQ = [0]


async def get_messages(request: web.Request) -> web.Response:
    """POST /api/queues/{vhost}/{name}/get as RabbitMQ: get up to `count`
    messages, then acknowledge (ack_requeue_false), requeue (*_requeue_true) or
    reject without requeue (reject_requeue_false: dead-lettered)."""
    from broker.queue.types import DEQUEUE_TAG, ChannelRef, ConsumerId

    c = ctx(request)
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    record = queue_record(c, vhost, name)
    _read_permission(c, vhost, name)
    body = await json_body(request, GET_KEYS, required=("count", "ackmode", "encoding"))
    count = _int_param(body, "count")
    truncate = _int_param(body, "truncate") if "truncate" in body else None
    ackmode, encoding = body["ackmode"], body["encoding"]
    if ackmode not in ACKMODES:
        raise ApiError(400, f"unknown ackmode '{ackmode}' (one of {', '.join(ACKMODES)})")
    if encoding not in ("auto", "base64"):
        raise ApiError(400, f"unknown encoding '{encoding}' (auto or base64)")
    port = c.port
    q = port.local_queue(vhost, name)
    if q is None:
        raise ApiError(404, f"no queue '{name}' in vhost '{vhost}'")
    _GET_SEQ[0] += 1
    ref = ChannelRef(f"{port.incarnation}/mgmt-get/{_GET_SEQ[0]}")
    no_ack = ackmode == "ack_requeue_false"
    taken: list[qm.MsgId] = []
    out: list[dict[str, Any]] = []
    # The ref counts as an open channel until its settle is applied: the
    # leader's housekeeping must not return what the get holds.
    port.borrow_channel(ref)
    try:
        for _ in range(count):
            try:
                reply = await q.command(qm.Dequeue(ref, no_ack))
            except QueueCommandFailed as exc:  # no leader, a stopped group: say so
                raise ApiError(503, f"queue '{name}' in vhost '{vhost}': {exc.text}") from None
            if isinstance(reply, qm.DequeueRefused):
                raise ApiError(400, reply.reply_text)
            if not isinstance(reply, qm.Dequeued):
                break
            if not no_ack:
                taken.append(reply.msg_id)
            msg = q.message(reply.raft_index)
            payload = msg.body
            size = len(payload)
            if truncate is not None:
                payload = payload[:truncate]
            text, enc = None, "base64"
            if encoding == "auto":
                try:
                    text, enc = payload.decode("utf-8"), "string"
                except UnicodeDecodeError:
                    pass
            if text is None:
                import base64

                text = base64.b64encode(payload).decode("ascii")
            out.append({"payload_bytes": size, "redelivered": reply.redelivered,
                        "exchange": msg.exchange, "routing_key": msg.routing_key,
                        "message_count": reply.messages_ready,
                        "properties": _properties_view(msg.properties, reply.delivery_count,
                                                       record.type == "quorum"),
                        "payload": text, "payload_encoding": enc})
    finally:
        if taken:
            cid = ConsumerId(ref, DEQUEUE_TAG)
            ids = tuple(taken)
            settle: qm.Command
            if ackmode == "reject_requeue_false":
                settle = qm.Discard(cid, ids)
            elif ackmode.endswith("requeue_true"):
                settle = qm.Return(cid, ids)
            else:
                settle = qm.Settle(cid, ids)
            q.command_reliable(settle, lambda: port.give_back_channel(ref))
        else:
            port.give_back_channel(ref)
    return web.json_response(out)


PUBLISH_KEYS: dict[str, type | tuple[type, ...]] = {
    "properties": dict, "routing_key": str, "payload": str, "payload_encoding": str,
    "vhost": str, "name": str, "delivery_mode": (str, int), "headers": dict, "props": dict}


def _encode_properties(props: dict[str, Any]) -> tuple[bytes, int | None, int | None, Any]:
    from pamqp import commands as pc

    from broker.amqp import codec as acodec

    kwargs: dict[str, Any] = {}
    for key, value in props.items():
        attr = _PROP_NAMES.get(key)
        if attr is None:
            raise ApiError(400, f"unknown property '{key}'")
        if key in ("delivery_mode", "priority", "timestamp"):
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise ApiError(400, f"property '{key}' must be an integer")
            try:
                value = int(value)
            except ValueError:
                raise ApiError(400, f"property '{key}' must be an integer") from None
            if not 0 <= value <= (255 if key != "timestamp" else 2**63 - 1):
                raise ApiError(400, f"property '{key}' is out of range")
            if key == "timestamp":
                import datetime

                value = datetime.datetime.fromtimestamp(value, datetime.UTC)
        elif key == "headers":
            if not isinstance(value, dict):
                raise ApiError(400, "property 'headers' must be an object")
        elif not isinstance(value, str) or len(value.encode()) > 255:
            raise ApiError(400, f"property '{key}' must be a short string")
        kwargs[attr] = value
    expiration = None
    if "expiration" in kwargs:
        text = kwargs["expiration"]
        if not re.fullmatch(r"[0-9]+", text):
            raise ApiError(400, f"invalid expiration '{text}'")
        expiration = int(text)
    try:
        raw = acodec.encode_properties(pc.Basic.Properties(**kwargs))
    except Exception as exc:  # pamqp's own checks
        raise ApiError(400, f"invalid properties: {exc}") from None
    return raw, kwargs.get("priority"), expiration, kwargs.get("headers")


async def publish_message(request: web.Request) -> web.Response:
    """POST /api/exchanges/{vhost}/{name}/publish as RabbitMQ: {"routed": bool}.
    The message is enqueued (committed) in every routed queue before the reply."""
    import base64
    import binascii

    c = ctx(request)
    vhost, xname = request.match_info["vhost"], request.match_info["name"]
    c.need_vhost(vhost)
    body = await json_body(request, PUBLISH_KEYS,
                           required=("properties", "routing_key", "payload", "payload_encoding"))
    exchange = "" if xname == "amq.default" else xname
    if (md.VhostName(vhost), md.ExchangeName(exchange)) not in c.port.metadata().exchanges \
            and exchange:
        # RabbitMQ 3.10 answers 400 here (its publish fails with not_found)
        raise ApiError(400, f"no exchange '{xname}' in vhost '{vhost}'", error="not_found")
    if not c.admin:
        err = md.check(c.port.metadata(), c.name, vhost, "write",
                       md.Resource("exchange", xname or "amq.default"))
        if err is not None:
            raise ApiError(403, err.text)
    enc = body["payload_encoding"]
    if enc == "string":
        payload = body["payload"].encode("utf-8")
    elif enc == "base64":
        try:
            payload = base64.b64decode(body["payload"], validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "payload is not valid base64") from None
    else:
        raise ApiError(400, f"unknown payload_encoding '{enc}' (string or base64)")
    props_raw, priority, expiration, headers = _encode_properties(body["properties"])
    rk = body["routing_key"]
    routed = md.route(c.port.metadata(), md.VhostName(vhost), exchange, rk, headers)
    if isinstance(routed, md.MetadataError):
        raise md_error(routed)
    queues = [q for q in (c.port.local_queue(vhost, n) for n in routed) if q is not None]
    try:
        futures = [q.enqueue(props_raw, payload, exchange, rk, priority, expiration)
                   for q in queues]
    except QueueCommandFailed as exc:  # a stopped group
        raise ApiError(503, f"publish not enqueued: {exc.text}") from None
    if futures:
        results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 60)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise ApiError(503, f"publish not enqueued: {failed[0]}")
    return web.json_response({"routed": bool(queues)})


# ---------------------------------------------------------------- the application
def _public(handler: Handler) -> Handler:
    handler.public = True  # type: ignore[attr-defined]
    return handler


ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", "/api/overview", overview),
    ("GET", "/api/whoami", whoami),
    ("GET", "/api/nodes", list_nodes),
    ("GET", "/api/nodes/{node}", get_node),
    ("DELETE", "/api/nodes/{node}", forget_node),
    ("POST", "/api/nodes/{node}/drain", drain),
    ("POST", "/api/nodes/{node}/hand-off-leaders", hand_off_leaders),
    ("GET", "/api/nodes/{node}/storage", node_storage),
    ("GET", "/api/vhosts", list_vhosts),
    ("GET", "/api/vhosts/{vhost}", get_vhost),
    ("PUT", "/api/vhosts/{vhost}", put_vhost),
    ("DELETE", "/api/vhosts/{vhost}", delete_vhost),
    ("GET", "/api/users", list_users),
    ("GET", "/api/users/{user}", get_user),
    ("PUT", "/api/users/{user}", put_user),
    ("DELETE", "/api/users/{user}", delete_user),
    ("GET", "/api/permissions", list_permissions),
    ("GET", "/api/permissions/{vhost}/{user}", get_permission),
    ("PUT", "/api/permissions/{vhost}/{user}", put_permission),
    ("DELETE", "/api/permissions/{vhost}/{user}", delete_permission),
    ("GET", "/api/vhost-limits", list_vhost_limits),
    ("GET", "/api/vhost-limits/{vhost}", list_vhost_limits),
    ("PUT", "/api/vhost-limits/{vhost}/{name}", put_vhost_limit),
    ("DELETE", "/api/vhost-limits/{vhost}/{name}", delete_vhost_limit),
    ("GET", "/api/user-limits", list_user_limits),
    ("GET", "/api/user-limits/{user}", list_user_limits),
    ("PUT", "/api/user-limits/{user}/{name}", put_user_limit),
    ("DELETE", "/api/user-limits/{user}/{name}", delete_user_limit),
    ("GET", "/api/exchanges", list_exchanges),
    ("GET", "/api/exchanges/{vhost}", list_exchanges),
    ("POST", "/api/exchanges/{vhost}/{name}/publish", publish_message),
    ("GET", "/api/connections", list_connections),
    ("GET", "/api/connections/{name}", get_connection),
    ("DELETE", "/api/connections/{name}", delete_connection),
    ("GET", "/api/connections/{name}/channels", connection_channels),
    ("GET", "/api/channels", list_channels),
    ("GET", "/api/vhosts/{vhost}/connections", list_connections),
    ("GET", "/api/vhosts/{vhost}/channels", list_channels),
    ("GET", "/api/channels/{name}", get_channel),
    ("GET", "/api/consumers", list_consumers),
    ("GET", "/api/consumers/{vhost}", list_consumers),
    ("GET", "/api/bindings", list_bindings),
    ("GET", "/api/bindings/{vhost}", list_bindings),
    ("GET", "/api/queues", list_queues),
    ("GET", "/api/queues/{vhost}", list_queues),
    ("GET", "/api/queues/{vhost}/{name}", get_queue),
    ("PUT", "/api/queues/{vhost}/{name}", put_queue),
    ("DELETE", "/api/queues/{vhost}/{name}", delete_queue),
    ("DELETE", "/api/queues/{vhost}/{name}/contents", purge_queue),
    ("POST", "/api/queues/{vhost}/{name}/get", get_messages),
    ("GET", "/api/queues/{vhost}/{name}/quorum-status", quorum_status),
    ("GET", "/api/queues/{vhost}/{name}/storage", queue_storage),
    ("POST", "/api/queues/{vhost}/{name}/members", add_member),
    ("DELETE", "/api/queues/{vhost}/{name}/members/{node}", delete_member),
    ("POST", "/api/queues/{vhost}/{name}/leader", transfer_leader),
    ("POST", "/api/quorum-queues/grow", grow),
    ("POST", "/api/quorum-queues/shrink", shrink),
    ("POST", "/api/quorum-queues/rebalance", rebalance),
    ("GET", "/api/policies", list_policies),
    ("GET", "/api/policies/{vhost}", list_policies),
    ("GET", "/api/policies/{vhost}/{name}", get_policy),
    ("PUT", "/api/policies/{vhost}/{name}", put_policy),
    ("DELETE", "/api/policies/{vhost}/{name}", delete_policy),
    ("GET", "/api/operator-policies", list_policies),
    ("GET", "/api/operator-policies/{vhost}", list_policies),
    ("GET", "/api/operator-policies/{vhost}/{name}", get_policy),
    ("PUT", "/api/operator-policies/{vhost}/{name}", put_policy),
    ("DELETE", "/api/operator-policies/{vhost}/{name}", delete_policy),
    ("GET", "/api/health/checks/alarms", health_alarms),
    ("GET", "/api/health/checks/local-alarms", health_local_alarms),
    ("GET", "/api/health/checks/node-is-quorum-critical", health_quorum_critical),
    ("GET", "/api/health/checks/raft-groups", health_raft_groups),
    ("GET", "/api/health/live", _public(liveness)),
    ("GET", "/api/health/ready", _public(readiness)),
    ("GET", "/api/openapi.json", _public(get_openapi)),
]


# ---------------------------------------------------------------- the web UI
UI_DIR = Path(__file__).resolve().parent / "ui"
_UI_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css",
             ".svg": "image/svg+xml", ".png": "image/png"}


@_public
async def ui_root(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/ui/")


@_public
async def ui_file(request: web.Request) -> web.StreamResponse:
    """The UI's static files (broker/mgmt/ui/, committed, no build step): the
    login page needs no authentication; every API call it makes does."""
    name = request.match_info.get("file") or "index.html"
    path = (UI_DIR / name).resolve()
    if path.parent != UI_DIR or not path.is_file() or path.suffix not in _UI_TYPES:
        raise ApiError(404, f"no UI file '{name}'", error="Object Not Found")
    return web.Response(body=path.read_bytes(), content_type=_UI_TYPES[path.suffix],
                        headers={"Cache-Control": "no-cache"})


def make_app(port: ManagementPort) -> web.Application:
    """The management application over a started node's port: the API
    (ROUTES, documented in openapi.py) and the web UI under /ui/."""
    app = web.Application(middlewares=[errors_and_auth], client_max_size=1 << 20)
    app[PORT_KEY] = port
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
    app.router.add_route("GET", "/", ui_root)
    app.router.add_route("GET", "/ui/", ui_file)
    app.router.add_route("GET", "/ui/{file}", ui_file)
    return app
