"""Snapshot and restore of the queue state (msgpack).

Pipeline position: the runtime snapshots the machine when it gets a
`ReleaseCursor` effect (storage writes the bytes atomically and deletes log
segments below the smallest live index) and restores it on restart or on
InstallSnapshot. `restore(snapshot(s))` is equal to `s` (see `to_plain`) and
behaves identically for every future command: every field that influences
behaviour, including round-robin positions, the priority counter, dictionary
orders and the release-cursor counter, is serialised.

Versions: 2 names messages by key (types.msg_key: raft index and position in
a batch entry); 1 named them by raft index, and is read by turning every
index into the key of position 0 (`from_plain`), which is what a log of
entries of one enqueue each gives under version 2.
"""
from __future__ import annotations

from collections import deque
from typing import Any

import msgpack

from .commands import CreditMode
from .config import QueueConfig
from .errors import SnapshotError
from .fifo import RecordFifo
from .machine import EXP_SHIFT, IDX_MASK, SIZE_BITS, SIZE_MASK, Consumer, QueueState
from .types import KEY_POS_BITS, ChannelRef, ConsumerId

SNAPSHOT_VERSION = 2


_U64 = (1 << 64) - 1


def _enc(rec: int) -> int | list[int]:
    """msgpack ints stop at 64 bits; records with an expiry are wider (the
    expiry, a wall-clock time in ms, sits above bit 96): 64-bit limbs, most
    significant first."""
    if rec <= _U64:
        return rec
    limbs = []
    while rec:
        limbs.append(rec & _U64)
        rec >>= 64
    return limbs[::-1]


def _dec(v: int | list[int]) -> int:
    if isinstance(v, int):
        return v
    out = 0
    for limb in v:
        out = (out << 64) | limb
    return out


def _cid(c: ConsumerId) -> list[str]:
    return [c.channel, c.tag]


def _uncid(v: list[str]) -> ConsumerId:
    return ConsumerId(ChannelRef(v[0]), v[1])


def to_plain(st: QueueState) -> dict[str, Any]:
    """A plain (msgpack/JSON-able) description of the whole state; two states
    behave identically iff their plain forms are equal."""
    return {
        "v": SNAPSHOT_VERSION,
        "config": st.config.to_dict(),
        "lo": [_enc(r) for r in st.lo],
        "hi": [_enc(r) for r in st.hi],
        "returns": [_enc(r) for r in st.returns],
        "prio_counter": st.prio_counter,
        "extra": [[k, v[0], v[1]] for k, v in st.extra.items()],
        "ttl_seen": st.ttl_seen,
        "out_of_order": sorted(st.out_of_order),
        "ready_bytes": st.ready_bytes,
        "consumers": [
            [_cid(c.cid), c.priority, c.mode.value, c.prefetch, c.credit,
             [[m, _enc(r)] for m, r in c.checked.items()], c.next_msg_id, c.status, c.in_service]
            for c in st.consumers.values()
        ],
        "service": [[p, [_cid(x) for x in dq]] for p, dq in st.service.items()],
        "service_prios": list(st.service_prios),
        "sac_active": _cid(st.sac_active) if st.sac_active is not None else None,
        "sac_waiting": [_cid(x) for x in st.sac_waiting],
        "publishers": [[p, s] for p, s in st.publishers.items()],
        "rejected": [[p, [list(iv) for iv in ivs]] for p, ivs in st.rejected.items()],
        "msg_id_base": st.msg_id_base,
        "blocked": st.blocked,
        "dlx_pending": [[_enc(r), code, dc] for r, code, dc in st.dlx_pending],
        "dlx_checked": [[i, _enc(r), code, dc] for i, (r, code, dc) in st.dlx_checked.items()],
        "dlx_bytes": st.dlx_bytes,
        "dlx_prefetch": st.dlx_prefetch,
        "dlx_attached": st.dlx_attached,
        "dlx_next_id": st.dlx_next_id,
        "last_active": st.last_active,
        "timer_at": st.timer_at,
        "since_cursor": st.since_cursor,
        "deleted": st.deleted,
        "enqueued_total": st.enqueued_total,
        "dead_lettered_total": st.dead_lettered_total,
    }


def _rekey_rec(rec: int) -> int:
    """A version-1 record (raft index) as a version-2 record (key at position 0)."""
    index = (rec >> SIZE_BITS) & IDX_MASK
    return ((rec >> EXP_SHIFT) << EXP_SHIFT) | ((index << KEY_POS_BITS) << SIZE_BITS) | (rec & SIZE_MASK)


def upgrade_plain(d: dict[str, Any]) -> dict[str, Any]:
    """A version-1 plain state in version 2's terms (raft index -> key of
    position 0); a version-2 one as it is."""
    if d.get("v") != 1:
        return d
    r = _rekey_rec
    k = KEY_POS_BITS
    d = dict(d)
    d["v"] = 2
    for f in ("lo", "hi", "returns"):
        d[f] = [_enc(r(_dec(x))) for x in d[f]]
    d["extra"] = [[i << k, a, b] for i, a, b in d["extra"]]
    d["out_of_order"] = [i << k for i in d["out_of_order"]]
    d["consumers"] = [[*c[:5], [[m, _enc(r(_dec(x)))] for m, x in c[5]], *c[6:]] for c in d["consumers"]]
    d["dlx_pending"] = [[_enc(r(_dec(x))), code, dc] for x, code, dc in d["dlx_pending"]]
    d["dlx_checked"] = [[i, _enc(r(_dec(x))), code, dc] for i, x, code, dc in d["dlx_checked"]]
    return d


def is_version_1(data: bytes) -> bool:
    """Whether snapshot bytes name messages by raft index (version 1): the
    runtime's own records kept beside them (bodies, transient messages) are
    keyed the same way and need the same upgrade."""
    try:
        plain = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # any decoding problem is a bad snapshot
        raise SnapshotError(f"corrupt queue snapshot: {exc}") from exc
    return isinstance(plain, dict) and plain.get("v") == 1


def from_plain(d: dict[str, Any]) -> QueueState:
    """Inverse of `to_plain` (a version-1 form is upgraded first)."""
    d = upgrade_plain(d)
    if d.get("v") != SNAPSHOT_VERSION:
        raise SnapshotError(f"unsupported queue snapshot version {d.get('v')!r}")
    st = QueueState(QueueConfig.from_dict(d["config"]), d["last_active"])
    st.lo = RecordFifo(_dec(r) for r in d["lo"])
    st.hi = RecordFifo(_dec(r) for r in d["hi"])
    st.returns = deque(_dec(r) for r in d["returns"])
    st.prio_counter = d["prio_counter"]
    st.extra = {k: (a, b) for k, a, b in d["extra"]}
    st.ttl_seen = d["ttl_seen"]
    st.out_of_order = set(d["out_of_order"])
    st.ready_bytes = d["ready_bytes"]
    for cid, prio, mode, prefetch, credit, checked, next_id, status, in_service in d["consumers"]:
        c = Consumer(_uncid(cid), prio, CreditMode(mode), prefetch, status)
        c.credit = credit
        c.checked = {m: _dec(r) for m, r in checked}
        c.next_msg_id = next_id
        c.in_service = in_service
        st.consumers[c.cid] = c
    st.service = {p: deque(_uncid(x) for x in ids) for p, ids in d["service"]}
    st.service_prios = list(d["service_prios"])
    st.sac_active = _uncid(d["sac_active"]) if d["sac_active"] is not None else None
    st.sac_waiting = [_uncid(x) for x in d["sac_waiting"]]
    st.publishers = {ChannelRef(p): s for p, s in d["publishers"]}
    st.rejected = {ChannelRef(p): [[lo, hi] for lo, hi in ivs] for p, ivs in d.get("rejected", [])}
    st.msg_id_base = d.get("msg_id_base", 0)
    st.blocked = d["blocked"]
    st.dlx_pending = deque((_dec(r), code, dc) for r, code, dc in d["dlx_pending"])
    st.dlx_checked = {i: (_dec(r), code, dc) for i, r, code, dc in d["dlx_checked"]}
    st.dlx_bytes = d["dlx_bytes"]
    st.dlx_prefetch = d["dlx_prefetch"]
    st.dlx_attached = d["dlx_attached"]
    st.dlx_next_id = d["dlx_next_id"]
    st.timer_at = d["timer_at"]
    st.since_cursor = d["since_cursor"]
    st.deleted = d["deleted"]
    st.enqueued_total = d["enqueued_total"]
    st.dead_lettered_total = d["dead_lettered_total"]
    return st


def snapshot(st: QueueState) -> bytes:
    """Serialise the state to bytes."""
    data: bytes = msgpack.packb(to_plain(st), use_bin_type=True)
    return data


def restore(data: bytes) -> QueueState:
    """Rebuild a state from `snapshot` bytes; SnapshotError if they are bad."""
    try:
        plain = msgpack.unpackb(data, raw=False, strict_map_key=False)
        if not isinstance(plain, dict):
            raise SnapshotError("queue snapshot is not a map")
        return from_plain(plain)
    except SnapshotError:
        raise
    except Exception as exc:  # any decoding/shape problem is a bad snapshot
        raise SnapshotError(f"corrupt queue snapshot: {exc}") from exc
