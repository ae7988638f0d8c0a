"""Management API routes for definitions: vhosts, users, permissions, vhost
and user limits, exchanges, bindings, policies and operator policies. Writes
are metadata commands (`port.meta_execute`), refused with the metadata
machine's own texts.

Where it sits: one route family of the management API (`api` holds the
route table); sees the node only through `port.ManagementPort`.
"""
from __future__ import annotations

import os
from typing import Any

from aiohttp import web

import broker.metadata as md
import broker.mgmt.views as v

from .api_common import (
    ApiError,
    Ctx,
    check_regex,
    ctx,
    execute,
    json_body,
)


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
    await execute(c, md.AddVhost(md.VhostName(name), body.get("description", ""),
                                  _tags(body.get("tags", ())), dqt))
    return web.Response(status=204 if existed else 201)


async def delete_vhost(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    name = request.match_info["vhost"]
    if md.VhostName(name) not in c.port.metadata().vhosts:
        raise ApiError(404, f"no vhost '{name}'")
    await execute(c, md.DeleteVhost(md.VhostName(name)))
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
    await execute(c, md.AddUser(md.UserName(name), password_hash, algorithm, tags))
    return web.Response(status=204 if existing is not None else 201)


async def delete_user(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    name = request.match_info["user"]
    await execute(c, md.DeleteUser(md.UserName(name)))
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
    await execute(c, md.SetPermissions(user, vhost, body["configure"], body["write"], body["read"]))
    return web.Response(status=204 if existed else 201)


async def delete_permission(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    user, vhost = _permission_key(c, request)
    if (user, vhost) not in c.port.metadata().permissions:
        raise ApiError(404, f"no permissions for user '{user}' in vhost '{vhost}'")
    await execute(c, md.ClearPermissions(user, vhost))
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
    await execute(c, md.SetVhostLimit(md.VhostName(vhost), name, value))
    return web.Response(status=204)


async def delete_vhost_limit(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    c.need_vhost(vhost)
    await execute(c, md.ClearVhostLimit(md.VhostName(vhost), name))
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
    await execute(c, md.SetUserLimit(md.UserName(user), name, value))
    return web.Response(status=204)


async def delete_user_limit(request: web.Request) -> web.Response:
    c = ctx(request)
    c.need_admin()
    user, name = request.match_info["user"], request.match_info["name"]
    await execute(c, md.ClearUserLimit(md.UserName(user), name))
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
    await execute(c, cmd)
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
    await execute(c, cls(md.VhostName(vhost), md.PolicyName(name)))
    return web.Response(status=204)
