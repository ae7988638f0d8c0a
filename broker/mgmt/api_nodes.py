"""Management API routes about the nodes: overview, whoami, nodes and their
storage manifest, health checks, and the cluster's connections, channels and
consumers (asked of every node through the port's cluster calls).

Where it sits: one route family of the management API (`api` holds the
route table); sees the node only through `port.ManagementPort`.
"""
from __future__ import annotations

import asyncio
import time
from bisect import bisect_left, bisect_right
from typing import Any

from aiohttp import web

import broker.mgmt.views as v
from broker.storage.manifest import node_manifest

from .api_common import (
    PORT_KEY,
    ApiError,
    Ctx,
    ctx,
    known_node,
)
from .port import (
    LiveAccounting,
    ManagementPort,
    NodeResources,
    PeerUnreachable,
)


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
            g.update(live_messages=None, live_log_entries=None, smallest_live_index=None,
                     oldest_live_timestamp_ms=None, oldest_live_holder=None)
            for s in g["segments"]:
                s["live_entries"] = None
            continue
        live = acc.live_indexes
        g.update(live_messages=acc.live_messages, live_log_entries=len(live),
                 smallest_live_index=live[0] if live else None,
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
    nothing until the node's data is repaired or the member is replaced. (A
    queue member stopped by a failed write starts again by itself once the
    disk is out of alarm: docs/OPERATIONS.md.)"""
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
