"""Management API routes for queues: list, show, declare, delete, purge; get
and publish messages (RabbitMQ's /get and /publish); and the quorum-queue
operations (quorum status, members, leader transfer, grow, shrink,
rebalance, drain, hand-off, forget a node), whose refusals are the port's
`MembershipRefused` with their HTTP status.

Where it sits: one route family of the management API (`api` holds the
route table); sees the node only through `port.ManagementPort`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

import broker.common.discovery as discovery
import broker.metadata as md
import broker.mgmt.views as v
import broker.queue as qm

from .api_common import (
    ApiError,
    Ctx,
    call_membership,
    check_regex,
    counts_for,
    ctx,
    json_body,
    known_node,
    md_error,
    query_flag,
    queue_record,
    queue_stats,
)
from .port import (
    Progress,
    QueueCommandFailed,
)


# ---------------------------------------------------------------- queues
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
    import broker.amqp.codec as acodec

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
            msg = q.message(reply.key)
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

    import broker.amqp.codec as acodec

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
