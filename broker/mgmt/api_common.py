"""What every route family of the management API shares: the refusal
(`ApiError`), the authenticated user of a request (`Ctx`), request-body and
query checks, and the few reads several families make through the port
(queue records, counts, message stats, metadata commands).

Where it sits: imported by `api` (middleware, route table, application) and
by the route families `api_nodes`, `api_admin` and `api_queues`; sees the
node only through `port.ManagementPort`.
"""
from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

import broker.metadata as md
import broker.mgmt.views as v

from .port import (
    ManagementPort,
    MembershipRefused,
    QueueCounts,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")

MGMT_TAGS = frozenset({"administrator", "monitoring", "policymaker", "management"})
PORT_KEY = web.AppKey("port", ManagementPort)


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


def public(handler: Handler) -> Handler:
    """Mark a handler as needing no authentication."""
    handler.public = True  # type: ignore[attr-defined]
    return handler


async def execute(c: Ctx, cmd: md.Command) -> md.Reply | None:
    """A metadata command; its refusal becomes an ApiError."""
    reply = await c.port.meta_execute(cmd)
    if isinstance(reply, md.MetadataError):
        raise md_error(reply)
    return reply


def queue_record(c: Ctx, vhost: str, name: str) -> md.QueueRecord:
    c.need_vhost(vhost)
    record = c.port.metadata().queues.get((md.VhostName(vhost), md.QueueName(name)))
    if record is None:
        raise ApiError(404, f"no queue '{name}' in vhost '{vhost}'")
    return record


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
