"""JSON views of the node's live state, shaped as RabbitMQ's management API shapes them.

Where it sits: between the node's management port (`port.ManagementPort`)
and the HTTP handlers in `api` and the collector in `metrics`. Everything
here is synchronous and reads the port's views (the local metadata replica,
counts, alarms); nothing here changes the node.
"""
from __future__ import annotations

import base64
import decimal
import math
from collections.abc import Iterable
from typing import Any

import broker.metadata as md

from .port import ManagementPort, NodeResources, QueueCounts

#: The management API version string we claim (tools read it for feature checks).
MANAGEMENT_VERSION = "3.13.0"
PRODUCT_NAME = "quorumq"


def jsonable(value: Any) -> Any:
    """A field-table value as JSON: bytes become text (or base64 when not
    UTF-8), decimals and non-finite floats become strings, tuples become lists."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


def table(args: Any) -> dict[str, Any]:
    out = jsonable(md.thaw_table(args))
    assert isinstance(out, dict)
    return out


# ---------------------------------------------------------------- cluster
def online(port: ManagementPort, members: Iterable[str]) -> list[str]:
    return [m for m in members if port.is_running(m)]


def node_view(port: ManagementPort, name: str, resources: NodeResources | None = None
              ) -> dict[str, Any]:
    """A cluster node as RabbitMQ's /api/nodes shows it; `resources` is the
    node's own answer (disk, memory, alarms) when it gave one."""
    state = port.metadata()
    members = sum(1 for r in state.queues.values() if r.type == "quorum" and name in r.members)
    leaders = sum(1 for r in state.queues.values() if r.type == "quorum" and r.leader == name)
    return {
        "name": name,
        "type": "disc",
        "running": port.is_running(name),
        "partitions": [],
        "being_drained": False,
        "metadata_leader": port.node_status().metadata_leader == name,
        "quorum_queue_members": members,
        "quorum_queue_leaders": leaders,
        **_resources_view(port, name, resources),
    }


def _resources_view(port: ManagementPort, name: str, res: NodeResources | None
                    ) -> dict[str, Any]:
    """RabbitMQ's node fields for resources and alarms. Alarm flags come from
    this node's picture of the cluster (runtime/alarms.py) even when the node
    itself did not answer; the numbers only from the node."""
    held = port.alarm_status().held_by(name, port.node_name)
    r = res or NodeResources(name)
    return {
        "mem_alarm": "memory" in held,
        "disk_free_alarm": "disk" in held,
        "mem_used": r.mem_used,
        "mem_limit": r.mem_limit,
        "disk_free": r.disk_free,
        "disk_free_limit": r.disk_free_limit,
        # the node's storage (not RabbitMQ fields): WAL, segments, snapshots
        "wal_bytes": r.wal_bytes,
        "segment_files": r.segment_files,
        "segment_bytes": r.segment_bytes,
        "snapshot_bytes": r.snapshot_bytes,
    }


# ---------------------------------------------------------------- queues
def queue_view(port: ManagementPort, record: md.QueueRecord, counts: QueueCounts | None,
               message_stats: dict[str, Any] | None = None) -> dict[str, Any]:
    state = port.metadata()
    pol = md.queue_policy(state, record)
    opol = md.queue_operator_policy(state, record)
    leader = port.queue_leader(record)
    members = [str(m) for m in record.members]
    c = counts or QueueCounts()
    out: dict[str, Any] = {
        "name": record.name,
        "vhost": record.vhost,
        "type": record.type,
        "durable": record.durable,
        "auto_delete": record.auto_delete,
        "exclusive": record.exclusive_owner is not None,
        "arguments": table(record.arguments),
        "node": leader,
        "leader": leader,
        "members": members,
        "online": online(port, members),
        "state": record.status,
        "policy": pol.name if pol else None,
        "operator_policy": opol.name if opol else None,
        "effective_policy_definition": jsonable(md.effective_definition(state, record)),
        "messages": c.messages,
        "messages_ready": c.messages_ready,
        "messages_unacknowledged": c.messages_unacknowledged,
        "consumers": c.consumers,
        "message_bytes_ready": c.message_bytes_ready,
        "message_bytes_unacknowledged": c.message_bytes_unacknowledged,
        "counts_known": counts is not None,
    }
    if record.type == "quorum" and counts is not None and c.delivery_limit is not None:
        out["delivery_limit"] = c.delivery_limit
    # every node's channels' counts added up (api.queue_stats)
    out["message_stats"] = message_stats if message_stats is not None else empty_message_stats()
    if record.type == "quorum":
        # at-least-once dead letters waiting for the targets' confirms (4.x names)
        out["messages_dlx"] = c.messages_dlx
        out["message_bytes_dlx"] = c.message_bytes_dlx
    return out


# ---------------------------------------------------------------- other objects
def vhost_view(r: md.VhostRecord, port: ManagementPort | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": r.name, "description": r.description, "tags": list(r.tags),
        "default_queue_type": r.default_queue_type or "classic", "tracing": False,
        "metadata": {"description": r.description, "tags": list(r.tags)}}
    if port is not None:
        out["cluster_state"] = {n: "running" if port.is_running(n) else "stopped"
                                for n in port.cluster_nodes()}
    return out


def user_view(r: md.UserRecord, state: md.MetadataState | None = None) -> dict[str, Any]:
    return {"name": r.name, "password_hash": r.password_hash,
            "hashing_algorithm": r.hashing_algorithm, "tags": list(r.tags),
            "limits": user_limits(state, r.name) if state is not None else {}}


def vhost_limits(state: md.MetadataState, vhost: str) -> dict[str, int]:
    """A vhost's limits as RabbitMQ shows them: {"max-queues": 5, ...}."""
    return {name: lim.value for (vh, name), lim in state.vhost_limits.items() if vh == vhost}


def user_limits(state: md.MetadataState, user: str) -> dict[str, int]:
    return {name: lim.value for (u, name), lim in state.user_limits.items() if u == user}


def permission_view(p: md.Permission) -> dict[str, Any]:
    return {"user": p.user, "vhost": p.vhost, "configure": p.configure,
            "write": p.write, "read": p.read}


def exchange_view(r: md.ExchangeRecord) -> dict[str, Any]:
    return {"name": r.name, "vhost": r.vhost, "type": r.type, "durable": r.durable,
            "auto_delete": r.auto_delete, "internal": r.internal,
            "arguments": table(r.arguments)}


def binding_view(b: md.Binding) -> dict[str, Any]:
    return {"source": b.source, "vhost": b.vhost, "destination": b.destination,
            "destination_type": b.destination_kind, "routing_key": b.routing_key,
            "arguments": table(b.arguments),
            "properties_key": b.routing_key or "~"}


def policy_view(p: md.PolicyRecord) -> dict[str, Any]:
    return {"vhost": p.vhost, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
            "definition": table(p.definition), "priority": p.priority}


# ---------------------------------------------------------------- connections, channels, rates
def _visible(info: dict[str, Any], user: str, sees_all: bool) -> bool:
    return sees_all or info.get("user") == user


def visible(items: list[dict[str, Any]], user: str, sees_all: bool) -> list[dict[str, Any]]:
    """Connections or channels the user may see (all for monitoring and
    administrator tags, else their own), by name."""
    return sorted((i for i in items if _visible(i, user, sees_all)), key=lambda i: i["name"])


def empty_message_stats() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in ("publish", "confirm", "return_unroutable", "deliver", "deliver_no_ack", "get",
              "get_no_ack", "ack", "redeliver", "deliver_get"):
        out[f] = 0
        out[f"{f}_details"] = {"rate": 0.0}
    return out


def sum_message_stats(parts: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    """Several nodes' message_stats added up (counts and rates), as
    RabbitMQ's overview shows the cluster's."""
    out = empty_message_stats()
    for part in parts:
        for key, val in (part or {}).items():
            if isinstance(val, dict):
                out.setdefault(key, {"rate": 0.0})["rate"] += float(val.get("rate", 0.0))
            elif isinstance(val, (int, float)) and not isinstance(val, bool):
                out[key] = out.get(key, 0) + val
    return out

