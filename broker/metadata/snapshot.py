"""Snapshot encoding of `MetadataState` (msgpack), for Raft snapshots.

Where it sits: the runtime asks the metadata Raft group for a snapshot,
calls `to_bytes(state)` and hands the bytes to storage; on install/recovery
`from_bytes` rebuilds the state (derived indexes and routing caches are
rebuilt, not stored). Round-trip invariant: ``from_bytes(to_bytes(s)) == s``.

Format: a msgpack map ``{"format": 1, "<table>": [record, ...], ...}`` where
a record is the list of its dataclass fields in declaration order, frozen
field tables are maps, tuples are arrays (decoded back to tuples).
"""
from __future__ import annotations

import decimal
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

import msgpack

from .commands import ExchangeDeclareOk, Ok, QueueDeclareOk, QueueDeleteOk, Reply
from .errors import MetadataError, MetadataInvariantError
from .state import (
    Binding,
    ExchangeRecord,
    MetadataState,
    Permission,
    PolicyRecord,
    QueueRecord,
    RuntimeParameter,
    TopicPermission,
    UserLimit,
    UserRecord,
    VhostLimit,
    VhostRecord,
)
from .types import FrozenTable

FORMAT = 1
EXT_DECIMAL = 1  # same ext code as broker.runtime.wire, so payloads agree


class SnapshotError(ValueError):
    """The bytes are not a metadata snapshot this code can read."""


def encode_value(v: Any) -> Any:
    """A frozen field value as msgpack-friendly data (tables -> maps, tuples -> arrays)."""
    if isinstance(v, FrozenTable):
        return {k: encode_value(x) for k, x in v.items}
    if isinstance(v, tuple):
        return [encode_value(x) for x in v]
    return v


def decode_value(v: Any) -> Any:
    """Inverse of `encode_value`."""
    if isinstance(v, dict):
        return FrozenTable(tuple(sorted(((k, decode_value(x)) for k, x in v.items()), key=lambda kv: kv[0])))
    if isinstance(v, list):
        return tuple(decode_value(x) for x in v)
    return v


def _rec(r: Any) -> list[Any]:
    return [encode_value(getattr(r, f.name)) for f in fields(r)]


def _unrec(cls: type, raw: list[Any]) -> Any:
    """A record from its field values; trailing fields added since the
    snapshot was written take their defaults."""
    fs = fields(cls)
    required = sum(1 for f in fs if f.default is MISSING and f.default_factory is MISSING)
    if not required <= len(raw) <= len(fs):
        raise SnapshotError(f"{cls.__name__}: expected {len(fs)} fields, got {len(raw)}")
    return cls(**{f.name: decode_value(x) for f, x in zip(fs, raw, strict=False)})


def _default_hook(obj: Any) -> Any:
    if isinstance(obj, decimal.Decimal):
        return msgpack.ExtType(EXT_DECIMAL, str(obj).encode())
    raise TypeError(f"cannot encode {type(obj).__name__} in a metadata snapshot")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == EXT_DECIMAL:
        return decimal.Decimal(data.decode())
    return msgpack.ExtType(code, data)


def to_bytes(state: MetadataState, default: Callable[[Any], Any] | None = None) -> bytes:
    """Encode `state`. Decimal field values are built in; pass `default` (a
    msgpack default hook, e.g. the runtime's for datetime values) for others."""
    doc = {
        "format": FORMAT,
        "last_applied": state.last_applied,
        "vhosts": [_rec(r) for r in state.vhosts.values()],
        "users": [_rec(r) for r in state.users.values()],
        "permissions": [_rec(r) for r in state.permissions.values()],
        "topic_permissions": [_rec(r) for r in state.topic_permissions.values()],
        "exchanges": [_rec(r) for r in state.exchanges.values()],
        "queues": [_rec(r) for r in state.queues.values()],
        "bindings": [_rec(b) for bucket in state.bindings.values() for b in bucket],
        "policies": [_rec(r) for r in state.policies.values()],
        "operator_policies": [_rec(r) for r in state.operator_policies.values()],
        "parameters": [_rec(r) for r in state.parameters.values()],
        "vhost_limits": [_rec(r) for r in state.vhost_limits.values()],
        "user_limits": [_rec(r) for r in state.user_limits.values()],
    }
    out: bytes = msgpack.packb(doc, use_bin_type=True, default=default or _default_hook)
    return out


def from_bytes(
    data: bytes, ext_hook: Callable[[int, bytes], Any] | None = None
) -> MetadataState:
    """Decode a snapshot; `ext_hook` must match the `default` used to encode it."""
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=ext_hook or _ext_hook)
    except (msgpack.UnpackException, ValueError, TypeError) as e:
        raise SnapshotError(f"not a metadata snapshot: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SnapshotError("unknown metadata snapshot format")
    s = MetadataState(last_applied=int(doc["last_applied"]))
    for raw in doc["vhosts"]:
        v: VhostRecord = _unrec(VhostRecord, raw)
        s.vhosts[v.name] = v
    for raw in doc["users"]:
        u: UserRecord = _unrec(UserRecord, raw)
        s.users[u.name] = u
    for raw in doc["permissions"]:
        p: Permission = _unrec(Permission, raw)
        s.permissions[(p.user, p.vhost)] = p
    for raw in doc["topic_permissions"]:
        tp: TopicPermission = _unrec(TopicPermission, raw)
        s.topic_permissions[(tp.user, tp.vhost, tp.exchange)] = tp
    for raw in doc["exchanges"]:
        x: ExchangeRecord = _unrec(ExchangeRecord, raw)
        s.exchanges[(x.vhost, x.name)] = x
    for raw in doc["queues"]:
        q: QueueRecord = _unrec(QueueRecord, raw)
        s.queues[(q.vhost, q.name)] = q
    for raw in doc["bindings"]:
        b: Binding = _unrec(Binding, raw)
        s.bindings.setdefault((b.vhost, b.source), {})[b] = None
    for raw in doc["policies"]:
        pol: PolicyRecord = _unrec(PolicyRecord, raw)
        s.policies[(pol.vhost, pol.name)] = pol
    for raw in doc["operator_policies"]:
        op: PolicyRecord = _unrec(PolicyRecord, raw)
        s.operator_policies[(op.vhost, op.name)] = op
    for raw in doc["parameters"]:
        rp: RuntimeParameter = _unrec(RuntimeParameter, raw)
        s.parameters[(rp.vhost, rp.component, rp.name)] = rp
    # Snapshots written before limits existed have neither table.
    for raw in doc.get("vhost_limits", ()):
        vl: VhostLimit = _unrec(VhostLimit, raw)
        s.vhost_limits[(vl.vhost, vl.name)] = vl
    for raw in doc.get("user_limits", ()):
        ul: UserLimit = _unrec(UserLimit, raw)
        s.user_limits[(ul.user, ul.name)] = ul
    s.rebuild_indexes()
    try:
        s.check_invariants()
    except MetadataInvariantError as e:
        raise SnapshotError(f"inconsistent snapshot: {e}") from e
    return s


def reply_to_bytes(reply: Reply) -> bytes:
    """A machine's reply as bytes: the metadata leader sends it back with the
    index of a forwarded command's entry (the forwarder reads it when its
    replica received that entry inside a snapshot and computed none)."""
    doc: list[Any]
    if isinstance(reply, Ok):
        doc = ["ok"]
    elif isinstance(reply, ExchangeDeclareOk):
        doc = ["x", _rec(reply.record), reply.created]
    elif isinstance(reply, QueueDeclareOk):
        doc = ["q", _rec(reply.record), reply.created]
    elif isinstance(reply, QueueDeleteOk):
        doc = ["d", None if reply.record is None else _rec(reply.record)]
    elif isinstance(reply, MetadataError):
        doc = ["e", reply.code, reply.text]
    else:
        raise TypeError(f"not a metadata reply: {reply!r}")
    out: bytes = msgpack.packb(doc, use_bin_type=True, default=_default_hook)
    return out


def reply_from_bytes(data: bytes) -> Reply:
    """Inverse of `reply_to_bytes`; SnapshotError for anything else."""
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)
        kind = doc[0]
        if kind == "ok":
            return Ok()
        if kind == "x":
            return ExchangeDeclareOk(_unrec(ExchangeRecord, doc[1]), bool(doc[2]))
        if kind == "q":
            return QueueDeclareOk(_unrec(QueueRecord, doc[1]), bool(doc[2]))
        if kind == "d":
            return QueueDeleteOk(None if doc[1] is None else _unrec(QueueRecord, doc[1]))
        if kind == "e":
            return MetadataError(int(doc[1]), str(doc[2]))
    except (msgpack.UnpackException, ValueError, TypeError, IndexError, KeyError) as e:
        raise SnapshotError(f"not a metadata reply: {e}") from e
    raise SnapshotError(f"not a metadata reply: kind {kind!r}")
