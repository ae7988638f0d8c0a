"""The management HTTP API (aiohttp), on RabbitMQ's paths and JSON shapes where they exist.

Where it sits: the outermost I/O shell next to the AMQP listener. `make_app(port)`
builds the aiohttp application over a node's management port
(`port.ManagementPort`: this package never imports `broker.runtime`);
`Node.start()` serves it on `management.tcp.port`. Reads come from the
node's local metadata replica and queue processes through the port's views
(`views`); writes go through the same paths as AMQP (the port's
`declare_queue`, `meta_execute`) and the membership operations through
the port's membership part. This module holds the middleware
(authentication, errors, query checks), the route table and the web UI's
files; the handlers live by route family in `api_nodes` (overview, nodes,
health, connections), `api_admin` (vhosts, users, permissions, limits,
exchanges, bindings, policies) and `api_queues` (queues, messages,
quorum-queue operations), over the shared helpers of `api_common`.

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

import logging
from pathlib import Path

from aiohttp import web

import broker.metadata as md

from .api_admin import (
    delete_permission,
    delete_policy,
    delete_user,
    delete_user_limit,
    delete_vhost,
    delete_vhost_limit,
    get_permission,
    get_policy,
    get_user,
    get_vhost,
    list_bindings,
    list_exchanges,
    list_permissions,
    list_policies,
    list_user_limits,
    list_users,
    list_vhost_limits,
    list_vhosts,
    put_permission,
    put_policy,
    put_user,
    put_user_limit,
    put_vhost,
    put_vhost_limit,
)
from .api_common import MGMT_TAGS, PORT_KEY, ApiError, Ctx, Handler, error_response, public
from .api_nodes import (
    connection_channels,
    delete_connection,
    get_channel,
    get_connection,
    get_node,
    health_alarms,
    health_local_alarms,
    health_quorum_critical,
    health_raft_groups,
    list_channels,
    list_connections,
    list_consumers,
    list_nodes,
    liveness,
    node_storage,
    overview,
    readiness,
    whoami,
)
from .api_queues import (
    add_member,
    delete_member,
    delete_queue,
    drain,
    forget_node,
    get_messages,
    get_queue,
    grow,
    hand_off_leaders,
    list_queues,
    publish_message,
    purge_queue,
    put_queue,
    queue_storage,
    quorum_status,
    rebalance,
    shrink,
    transfer_leader,
)
from .openapi import openapi_document
from .port import ManagementPort

log = logging.getLogger("broker.mgmt.api")


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


async def get_openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


# ---------------------------------------------------------------- the application
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
    ("GET", "/api/health/live", public(liveness)),
    ("GET", "/api/health/ready", public(readiness)),
    ("GET", "/api/openapi.json", public(get_openapi)),
]


# ---------------------------------------------------------------- the web UI
UI_DIR = Path(__file__).resolve().parent / "ui"
_UI_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css",
             ".svg": "image/svg+xml", ".png": "image/png"}


@public
async def ui_root(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/ui/")


@public
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
