"""An aiohttp client for the broker's management API, and the action executor.

Where it sits: the only place the operator talks to a broker. Paths and
shapes are the broker's (broker/mgmt/api.py, RabbitMQ's where they exist).
Errors say whose fault they are: `BrokerUnreachable` (connection refused,
timeouts, 5xx: retry later) and `BrokerRefused` (a 4xx: the request itself
is wrong, retrying it unchanged will not help).

`execute(client, actions)` interprets the planner's actions in order and
idempotently: "already a member", "not a member" and "no such object" on a
delete count as done, so running the same plan twice is harmless.
"""
from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from . import planner as p


class BrokerError(Exception):
    pass


class BrokerUnreachable(BrokerError):
    """The management API could not be reached or failed on its side (retry)."""


class BrokerRefused(BrokerError):
    """A 4xx answer: the request is wrong for the broker's current state."""

    def __init__(self, status: int, reason: str, method: str = "", path: str = "") -> None:
        super().__init__(f"{method} {path}: {status} {reason}")
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str  # scheme://host:port
    username: str
    password: str


def q(part: str) -> str:
    return quote(part, safe="")


class MgmtClient:
    """One broker's management API. Cheap to create; `close()` when done."""

    def __init__(self, endpoint: Endpoint, timeout: float = 10.0,
                 long_timeout: float = 120.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.long_timeout = long_timeout  # membership changes wait for promotion
        token = base64.b64encode(f"{endpoint.username}:{endpoint.password}".encode()).decode()
        self._headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
        self._session: aiohttp.ClientSession | None = None
        self.lock: asyncio.Lock | None = None  # set by the handlers: one change at a time

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, method: str, path: str, body: Any = None, long: bool = False,
                   ok_statuses: Sequence[int] = ()) -> tuple[int, Any]:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers)
        url = self.endpoint.url.rstrip("/") + path
        timeout = aiohttp.ClientTimeout(total=self.long_timeout if long else self.timeout)
        data = json.dumps(body).encode() if body is not None else None
        try:
            async with self._session.request(method, aiohttp.client.URL(url, encoded=True),
                                             data=data, timeout=timeout) as resp:
                text = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise BrokerUnreachable(f"{method} {self.endpoint.url}{path}: "
                                    f"{type(exc).__name__}: {exc}") from None
        try:
            payload = json.loads(text) if text else None
        except ValueError:
            payload = text.decode(errors="replace")
        if status < 400 or status in ok_statuses:
            return status, payload
        reason = payload.get("reason", "") if isinstance(payload, dict) else str(payload)
        if status >= 500:
            raise BrokerUnreachable(f"{method} {path}: {status} {reason}")
        raise BrokerRefused(status, reason, method, path)

    # ------------------------------------------------------------ reads
    async def nodes(self) -> list[dict[str, Any]]:
        _, out = await self.call("GET", "/api/nodes")
        return list(out or [])

    async def queue(self, vhost: str, name: str) -> dict[str, Any] | None:
        status, out = await self.call("GET", f"/api/queues/{q(vhost)}/{q(name)}",
                                      ok_statuses=(404,))
        return None if status == 404 else dict(out)

    async def queues(self, vhost: str | None = None) -> list[dict[str, Any]]:
        path = "/api/queues" if vhost is None else f"/api/queues/{q(vhost)}"
        _, out = await self.call("GET", path)
        return list(out or [])

    async def policy(self, vhost: str, name: str, operator: bool) -> dict[str, Any] | None:
        kind = "operator-policies" if operator else "policies"
        status, out = await self.call("GET", f"/api/{kind}/{q(vhost)}/{q(name)}",
                                      ok_statuses=(404,))
        return None if status == 404 else dict(out)

    # ------------------------------------------------------------ writes (idempotent)
    async def declare_queue(self, vhost: str, name: str, arguments: dict[str, Any]) -> None:
        await self.call("PUT", f"/api/queues/{q(vhost)}/{q(name)}",
                        {"durable": True, "auto_delete": False, "arguments": arguments})

    async def delete_queue(self, vhost: str, name: str, if_empty: bool) -> None:
        suffix = "?if-empty=true" if if_empty else ""
        await self.call("DELETE", f"/api/queues/{q(vhost)}/{q(name)}{suffix}", ok_statuses=(404,))

    async def add_member(self, vhost: str, name: str, node: str) -> bool:
        """True when added, False when it already was a member."""
        try:
            await self.call("POST", f"/api/queues/{q(vhost)}/{q(name)}/members", {"node": node},
                            long=True)
        except BrokerRefused as exc:
            if exc.status == 400 and "already a member" in exc.reason:
                return False
            raise
        return True

    async def delete_member(self, vhost: str, name: str, node: str) -> bool:
        status, _ = await self.call("DELETE", f"/api/queues/{q(vhost)}/{q(name)}/members/{q(node)}",
                                    long=True, ok_statuses=(404,))
        return status != 404

    async def shrink(self, node: str) -> list[dict[str, Any]]:
        _, out = await self.call("POST", "/api/quorum-queues/shrink", {"node": node}, long=True)
        return list(out or [])

    async def rebalance(self) -> list[dict[str, Any]]:
        _, out = await self.call("POST", "/api/quorum-queues/rebalance", {}, long=True)
        return list(out or [])

    async def put_policy(self, vhost: str, name: str, operator: bool, body: dict[str, Any]) -> None:
        kind = "operator-policies" if operator else "policies"
        await self.call("PUT", f"/api/{kind}/{q(vhost)}/{q(name)}", body)

    async def delete_policy(self, vhost: str, name: str, operator: bool) -> None:
        kind = "operator-policies" if operator else "policies"
        await self.call("DELETE", f"/api/{kind}/{q(vhost)}/{q(name)}", ok_statuses=(404,))


# ---------------------------------------------------------------- observation helpers


def queue_obs(view: dict[str, Any]) -> p.QueueObs:
    """A management API queue view as the planner's `QueueObs`."""
    args = dict(view.get("arguments") or {})
    eff = view.get("effective_policy_definition") or {}
    target = args.get("x-quorum-target-group-size", eff.get("target-group-size"))
    return p.QueueObs(
        vhost=view["vhost"], name=view["name"], type=view.get("type", "quorum"),
        members=tuple(view.get("members") or ()), online=tuple(view.get("online") or ()),
        leader=view.get("leader"), arguments=args,
        messages=int(view.get("messages", 0)) if view.get("counts_known", True) else None,
        messages_ready=int(view.get("messages_ready", 0)),
        messages_unacknowledged=int(view.get("messages_unacknowledged", 0)),
        consumers=int(view.get("consumers", 0)),
        message_bytes=int(view.get("message_bytes_ready", 0))
        + int(view.get("message_bytes_unacknowledged", 0)),
        policy=view.get("policy"), operator_policy=view.get("operator_policy"),
        target=int(target) if isinstance(target, int) else None)


# ---------------------------------------------------------------- the executor


@dataclass(frozen=True, slots=True)
class Outcome:
    action: p.Action
    changed: bool
    message: str


async def execute_one(client: MgmtClient, action: p.Action) -> Outcome:
    match action:
        case p.DeclareQueue(vhost, name, arguments):
            await client.declare_queue(vhost, name, dict(arguments))
            return Outcome(action, True, f"declared queue '{name}' in vhost '{vhost}'")
        case p.DeleteQueue(vhost, name, if_empty):
            await client.delete_queue(vhost, name, if_empty)
            return Outcome(action, True, f"deleted queue '{name}' in vhost '{vhost}'")
        case p.AddMember(vhost, name, node):
            added = await client.add_member(vhost, name, node)
            return Outcome(action, added, f"added a member of queue '{name}' on {node}")
        case p.DeleteMember(vhost, name, node):
            removed = await client.delete_member(vhost, name, node)
            return Outcome(action, removed, f"removed the member of queue '{name}' on departed "
                                            f"node {node}")
        case p.PutPolicy(vhost, name, operator, body):
            await client.put_policy(vhost, name, operator, dict(body))
            kind = "operator policy" if operator else "policy"
            return Outcome(action, True, f"set {kind} '{name}' in vhost '{vhost}'")
        case p.DeletePolicy(vhost, name, operator):
            await client.delete_policy(vhost, name, operator)
            kind = "operator policy" if operator else "policy"
            return Outcome(action, True, f"deleted {kind} '{name}' in vhost '{vhost}'")
        case p.ShrinkNode(node):
            results = await client.shrink(node)
            bad = [r for r in results if r.get("result") != "ok"]
            return Outcome(action, bool(results), f"removed departed node {node} from "
                                                  f"{len(results) - len(bad)} queues"
                                                  + (f" ({len(bad)} failed)" if bad else ""))
        case p.Rebalance():
            results = await client.rebalance()
            return Outcome(action, True, f"rebalanced leaders over {len(results)} queues")
        case p.Refuse(reason, message):
            return Outcome(action, False, f"{reason}: {message}")
    raise TypeError(f"unknown action {action!r}")


async def execute(client: MgmtClient, actions: Sequence[p.Action]) -> list[Outcome]:
    """Run the actions in order; the first failure stops the rest (the next
    reconcile plans again from what is then there)."""
    out = []
    for action in actions:
        out.append(await execute_one(client, action))
        await asyncio.sleep(0)
    return out
