"""JSON views of the node's live state, shaped as RabbitMQ's management API shapes them.

Where it sits: between the node (the asyncio shell in `broker.runtime`, passed
in duck-typed: this package never imports the runtime) and the HTTP handlers
in `api` and the collector in `metrics`. Everything here is synchronous and
reads `node.meta.state` (the local metadata replica) and the local queue
processes; nothing here mutates the node.
"""
from __future__ import annotations

import base64
import decimal
import math
from collections.abc import Iterable
from typing import Any

from broker import metadata as md

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
def cluster_nodes(node: Any) -> list[str]:
    if node.cluster is None:
        return [node.node_name]
    return list(node.cluster.members)


def is_running(node: Any, name: str) -> bool:
    if name == node.node_name:
        return True
    return node.cluster is not None and bool(node.cluster.transport.is_connected(name))


def online(node: Any, members: Iterable[str]) -> list[str]:
    return [m for m in members if is_running(node, m)]


def node_view(node: Any, name: str, resources: dict[str, Any] | None = None) -> dict[str, Any]:
    """A cluster node as RabbitMQ's /api/nodes shows it; `resources` is the
    node's own answer (disk, memory, alarms) when it gave one."""
    state = node.meta.state
    members = sum(1 for r in state.queues.values() if r.type == "quorum" and name in r.members)
    leaders = sum(1 for r in state.queues.values() if r.type == "quorum" and r.leader == name)
    return {
        "name": name,
        "type": "disc",
        "running": is_running(node, name),
        "partitions": [],
        "being_drained": False,
        "metadata_leader": node.meta.group.leader == name,
        "quorum_queue_members": members,
        "quorum_queue_leaders": leaders,
        **_resources_view(node, name, resources),
    }


def _resources_view(node: Any, name: str, res: dict[str, Any] | None) -> dict[str, Any]:
    """RabbitMQ's node fields for resources and alarms. Alarm flags come from
    this node's picture of the cluster (runtime/alarms.py) even when the node
    itself did not answer; the numbers only from the node."""
    alarms = node.alarms
    held = set(alarms.local) if name == node.node_name else set(alarms.remote.get(name, ()))
    res = res or {}
    return {
        "mem_alarm": "memory" in held,
        "disk_free_alarm": "disk" in held,
        "mem_used": res.get("mem_used"),
        "mem_limit": res.get("mem_limit"),
        "disk_free": res.get("disk_free"),
        "disk_free_limit": res.get("disk_free_limit"),
        # the node's storage (not RabbitMQ fields): WAL, segments, snapshots
        "wal_bytes": res.get("wal_bytes"),
        "segment_files": res.get("segment_files"),
        "segment_bytes": res.get("segment_bytes"),
        "snapshot_bytes": res.get("snapshot_bytes"),
    }


# ---------------------------------------------------------------- queues
def queue_leader(node: Any, record: md.QueueRecord) -> str | None:
    q = node.queues.get((record.vhost, record.name))
    group = getattr(q, "group", None)
    if group is not None and group.leader is not None:
        return str(group.leader)
    return record.leader


def local_counts(node: Any, record: md.QueueRecord) -> dict[str, Any] | None:
    """Message/consumer counts from a local replica, None when this node holds none."""
    q = node.queues.get((record.vhost, record.name))
    if q is None or q.kind == "quorum" and getattr(q, "group", None) is None:
        return None  # no replica here (a RemoteQueue proxy)
    ov: dict[str, Any] = q.overview()
    return ov


def queue_view(node: Any, record: md.QueueRecord, counts: dict[str, Any] | None,
               message_stats: dict[str, Any] | None = None) -> dict[str, Any]:
    state = node.meta.state
    pol = md.queue_policy(state, record)
    opol = md.queue_operator_policy(state, record)
    leader = queue_leader(node, record)
    members = [str(m) for m in record.members]
    c = counts or {}
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
        "online": online(node, members),
        "state": record.status,
        "policy": pol.name if pol else None,
        "operator_policy": opol.name if opol else None,
        "effective_policy_definition": jsonable(md.effective_definition(state, record)),
        "messages": int(c.get("messages", 0)),
        "messages_ready": int(c.get("messages_ready", 0)),
        "messages_unacknowledged": int(c.get("messages_unacknowledged", 0)),
        "consumers": int(c.get("consumers", 0)),
        "message_bytes_ready": int(c.get("message_bytes_ready", 0)),
        "message_bytes_unacknowledged": int(c.get("message_bytes_unacknowledged", 0)),
        "counts_known": counts is not None,
    }
    if record.type == "quorum" and counts is not None and c.get("delivery_limit") is not None:
        out["delivery_limit"] = c["delivery_limit"]
    # every node's channels' counts added up (api.queue_stats)
    out["message_stats"] = message_stats if message_stats is not None else empty_message_stats()
    if record.type == "quorum":
        # at-least-once dead letters waiting for the targets' confirms (4.x names)
        out["messages_dlx"] = int(c.get("messages_dlx", 0))
        out["message_bytes_dlx"] = int(c.get("message_bytes_dlx", 0))
    return out


# ---------------------------------------------------------------- other objects
def vhost_view(r: md.VhostRecord, node: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": r.name, "description": r.description, "tags": list(r.tags),
        "default_queue_type": r.default_queue_type or "classic", "tracing": False,
        "metadata": {"description": r.description, "tags": list(r.tags)}}
    if node is not None:
        out["cluster_state"] = {n: "running" if is_running(node, n) else "stopped"
                                for n in cluster_nodes(node)}
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


def quorum_critical(node: Any, name: str) -> list[tuple[str, str]]:
    """Quorum queues that would lose their quorum if `name` went down now:
    those with `name` as a member whose online members number exactly a bare
    majority (RabbitMQ's rabbit_quorum_queue:list_with_minimum_quorum/0)."""
    out: list[tuple[str, str]] = []
    for r in node.meta.state.queues.values():
        if r.type != "quorum" or name not in r.members or len(r.members) < 2:
            continue
        up = len(online(node, r.members))
        if up - 1 < len(r.members) // 2 + 1:
            out.append((str(r.vhost), str(r.name)))
    return sorted(out)


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


def sum_message_stats(parts: list[dict[str, Any] | None]) -> dict[str, Any]:
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


def node_message_stats(node: Any) -> dict[str, Any]:
    stats = getattr(node, "msg_stats", None)
    return stats.totals.message_stats() if stats is not None else empty_message_stats()
