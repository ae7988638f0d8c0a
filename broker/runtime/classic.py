"""Durable classic queues: node-local, not replicated, persistent messages
survive a restart (as in RabbitMQ); transient messages do not.

Where it sits: a `QueueProcess` like the others (runtime/queues.py), used by
the node for a classic queue declared durable, not exclusive and not
auto-delete. Instead of a Raft group it keeps a node-local log in the node's
storage (group id `classic:<vhost>/<name>/<created_at>`, see
docs/STORAGE.md), with the quorum queues' entry format: each entry is
msgpack `[timestamp_ms, payload]`, the payloads of runtime/queues.py
(`runtime/wire.py`), term always 1.

Every command that changes the queue is appended to that log and applied to
the queue machine, in log order, once the WAL's group commit reports it
durable (`on_durable`); the caller's future resolves then, so a publisher
confirm means the entry is fsynced. A restart replays the log through the
machine (deterministic: time comes from each entry's timestamp), from the
latest snapshot on.

Transient messages (delivery mode other than 2) are logged like persistent
ones: later settles name msg ids the machine assigned at checkout, so
replay must see exactly the same messages to give the same ids. What makes
them go on restart is recovery: after the replay, the channels of this
node's earlier life are down (their messages return), and every ready
transient message is dropped; the result is written as a snapshot before
the queue serves anything, so the next replay starts from it.

Write errors (a full disk): storage drops the non-durable entries of the
failed batch; their commands were never applied, so the queue's state is
exactly its durable log. A publish among them is answered REJECTED (nack:
never confirmed); other commands fail (reliable settles are re-sent). Later
commands are written again once space returns.
"""
from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque
from typing import Any

import msgpack

import broker.queue as qm
import broker.queue.effects as qe
import broker.runtime.wire as wire
import broker.storage as st
from broker.common.packing import packb
from broker.queue.machine import SIZE_MASK, rec_key
from broker.queue.snapshot import is_version_1
from broker.queue.types import (
    DEQUEUE_TAG,
    KEY_POS_BITS,
    ChannelRef,
    Meta,
    MsgId,
    key_index,
    key_pos,
    msg_key,
)

from .errors import QueueGone
from .queues import Host, Message, QueueProcess, live_keys

log = logging.getLogger("broker.classic")

#: The fixed term of every entry of a classic queue's log (no elections).
TERM = 1
#: How often dead channels' consumers are removed (seconds).
REAP_INTERVAL_S = 2.0
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def group_id(vhost: str, name: str, created_at: int) -> str:
    """The storage group of a durable classic queue (docs/STORAGE.md)."""
    return f"classic:{vhost}/{name}/{created_at}"


def is_persistent(props_raw: bytes) -> bool:
    """delivery_mode == 2 in raw AMQP basic properties (flags + values)?
    Only the fields before delivery_mode are skipped; malformed input is
    transient."""
    try:
        flags = _U16.unpack_from(props_raw, 0)[0]
        if not flags & 0x1000:
            return False
        pos = 2
        if flags & 0x8000:
            pos += 1 + props_raw[pos]
        if flags & 0x4000:
            pos += 1 + props_raw[pos]
        if flags & 0x2000:
            pos += 4 + _U32.unpack_from(props_raw, pos)[0]
        return props_raw[pos] == 2
    except (struct.error, IndexError):
        return False


class _Pending:
    __slots__ = ("index", "ts", "payload", "data", "fut")

    def __init__(self, index: int, ts: int, payload: list[Any], data: bytes,
                 fut: asyncio.Future[Any]) -> None:
        self.index = index
        self.ts = ts
        self.payload = payload
        self.data = data
        self.fut = fut


class DurableClassicQueue(QueueProcess):
    """A durable classic queue on this node, its log in the node's storage."""

    kind = "classic"

    def __init__(self, host: Host, vhost: str, name: str, config: qm.QueueConfig,
                 glog: st.GroupLog, snapshot_every: int = 20_000) -> None:
        super().__init__(host, vhost, name, config)
        self.glog = glog
        self.group_id = glog.group_id
        self.snapshot_every = snapshot_every
        self.applied_since_snapshot = 0
        self.stopped: BaseException | None = None
        # Keys of live transient messages (a superset: pruned at snapshots).
        self._transient: set[int] = set()
        self._pending: deque[_Pending] = deque()
        self.recovered = self._recover()
        self._next = glog.last_index() + 1
        self._reaper: asyncio.TimerHandle | None = self._loop.call_later(REAP_INTERVAL_S, self._reap)
        if self.state.timer_at is not None:
            self._set_timer(max(self.state.timer_at - int(time.time() * 1000), 0))
        self._loop.call_soon(self._redeliver_checked_out)

    # ---------------------------------------------------------------- recovery
    def _recover(self) -> dict[str, int]:
        """Replay the log from the latest snapshot, end this node's earlier
        channels, drop ready transient messages, and snapshot the result."""
        glog = self.glog
        snap = glog.latest_snapshot()
        start = 1
        if snap is not None:
            doc = msgpack.unpackb(snap.data, raw=False, strict_map_key=False)
            self.state = qm.restore(doc["state"])
            # message keys (raft indexes in a snapshot of state version 1)
            shift = KEY_POS_BITS if is_version_1(doc["state"]) else 0
            self._transient = {i << shift for i in doc.get("transient", ())}
            start = snap.meta.index + 1
        last = glog.last_index()
        stats = {"replayed": 0, "channels_down": 0, "transient_dropped": 0}
        self._replaying = True
        last_ts = 0
        try:
            lo = start
            while lo <= last:
                entries = glog.entries(lo, last + 1, max_bytes=16 << 20)
                if not entries:
                    raise st.UnavailableError(f"group {self.group_id!r}: entries from {lo} unreadable")
                for e in entries:
                    last_ts, payload = msgpack.unpackb(e.data, raw=False, strict_map_key=False)
                    try:
                        self._apply_logged(e.index, last_ts, payload)
                    except Exception as exc:  # noqa: BLE001 - failed the same way when first applied
                        log.debug("%s: replayed entry %d failed: %s", self.name, e.index, exc)
                    stats["replayed"] += 1
                lo = entries[-1].index + 1
            # Channels of this node's earlier lives are gone: their consumers'
            # messages return, their publisher entries go. At the last entry's
            # time, so nothing expires here (a logged Tick does that later).
            here = self.host.node_name
            st_ = self.state
            chans = {cid.channel for cid in st_.consumers} | set(st_.publishers)
            for ch in sorted(c for c in chans if c.split("|", 1)[0] == here):
                self._apply_machine(Meta(max(last, 1), TERM, last_ts), qm.ChannelDown(ChannelRef(ch)))
                stats["channels_down"] += 1
            stats["transient_dropped"] = self._drop_ready_transient()
        finally:
            self._replaying = False
        changed = stats["replayed"] or stats["channels_down"] or stats["transient_dropped"]
        if changed and last >= 1:
            self._snapshot(last)
        if stats["replayed"] or stats["transient_dropped"]:
            log.info("classic queue %s/%s recovered: %s, %d messages", self.vhost, self.name, stats,
                     self.state.messages_total())
        return stats

    def _drop_ready_transient(self) -> int:
        """Remove every ready transient message (what a purge does, for those only)."""
        st_ = self.state
        drop = self._transient
        n = 0
        if drop:
            for q in (st_.returns, st_.hi, st_.lo):
                keep = [r for r in q if rec_key(r) not in drop]
                if len(keep) == len(q):
                    continue
                for r in q:
                    idx = rec_key(r)
                    if idx in drop:
                        n += 1
                        st_.ready_bytes -= r & SIZE_MASK
                        st_.extra.pop(idx, None)
                        st_.out_of_order.discard(idx)
                q.clear()
                q.extend(keep)
        # transient messages still checked out (by consumers on other nodes) stay tracked
        self._transient = drop & set(live_keys(st_))
        return n

    def _snapshot(self, index: int) -> None:
        """Write the state as of `index` (durable and applied) and release
        the segments below the smallest live message."""
        live = live_keys(self.state)
        self._transient &= set(live)
        data = msgpack.packb({"state": qm.snapshot(self.state), "transient": sorted(self._transient)},
                             use_bin_type=True)
        self.glog.save_snapshot(index, TERM, b"", data)
        self.applied_since_snapshot = 0
        self.glog.release(key_index(live[0]) if live else index + 1)

    # ---------------------------------------------------------------- applying
    def _apply_machine(self, meta: Meta, cmd: qm.Command) -> Any:
        self.state, reply, effects = qm.apply(meta, cmd, self.state)
        if effects and not self._replaying:
            self._run_effects(effects)
        return reply

    def _apply_logged(self, index: int, ts: int, payload: list[Any]) -> Any:
        """Apply one durable entry (live or replayed). A machine error is the
        command's reply failure, the same in both (the machine is deterministic)."""
        if wire.is_enqueue(payload) and not is_persistent(wire.enqueue_properties(payload)):
            self._transient.add(msg_key(index))
        self.applied_since_snapshot += 1
        return self._apply_payload(index, TERM, ts, payload)

    def _run_effects(self, effects: list[qe.Effect]) -> None:
        if not self._replaying:  # replayed history: its effects already happened
            super()._run_effects(effects)

    def _release(self, eff: qe.ReleaseCursor) -> None:
        super()._release(eff)
        if self.applied_since_snapshot >= self.snapshot_every:
            self.applied_since_snapshot = 0
            self._loop.call_soon(self._write_snapshot, eff.index, qm.snapshot(self.state),
                                 set(self._transient), live_keys(self.state))

    def _write_snapshot(self, index: int, state: bytes, transient: set[int], live: list[int]) -> None:
        if self.deleted or self.stopped is not None:
            return
        try:
            current = self.glog.snapshot_meta()
            if current is not None and current.index >= index:
                return
            transient &= set(live)
            data = msgpack.packb({"state": state, "transient": sorted(transient)}, use_bin_type=True)
            self.glog.save_snapshot(index, TERM, b"", data)
            self.glog.release(key_index(live[0]) if live else index + 1)
        except (st.StorageError, OSError) as exc:  # a full disk: the log stays, try again later
            log.warning("classic queue %s/%s: snapshot at %d not written: %s", self.vhost, self.name,
                        index, exc)
            self.applied_since_snapshot = self.snapshot_every

    # ---------------------------------------------------------------- the log
    def _submit(self, payload: list[Any]) -> asyncio.Future[Any]:
        if self.deleted:
            raise QueueGone(f"queue '{self.name}' in vhost '{self.vhost}' is gone")
        if self.stopped is not None:
            raise st.GroupFailedError(f"classic queue {self.group_id!r} stopped: {self.stopped}")
        fut: asyncio.Future[Any] = self._loop.create_future()
        ts = int(time.time() * 1000)
        data = packb([ts, payload])
        if not wire.is_plain(payload):
            # apply exactly what a replay decodes
            payload = msgpack.unpackb(data, raw=False, strict_map_key=False)[1]
        for attempt in (0, 1):
            index = self._next
            try:
                self.glog.append([st.Entry(index, TERM, data, 0)])
            except (st.LogGapError, st.StorageIOError) as exc:
                # storage dropped a failed batch before its on_error reached
                # us (the log refuses to build on it: StorageIOError, see
                # GroupLog.wal_failed): resync to what is durable, try once more
                self._write_failed(exc)
                if attempt == 0:
                    continue
                self._fail(payload, fut, exc)
                return fut
            except st.StorageError as failed:
                self._stop(failed)
                raise
            self._next = index + 1
            self._pending.append(_Pending(index, ts, payload, data, fut))
            return fut
        raise AssertionError("unreachable")

    def on_durable(self) -> None:
        """The WAL writer made some entries durable: apply them, in order."""
        pending = self._pending
        if not pending or self.stopped is not None:
            return
        try:
            durable = self.glog.durable_index()
        except st.StorageError as failed:
            self._stop(failed)
            return
        while pending and pending[0].index <= durable:
            p = pending.popleft()
            try:
                reply = self._apply_logged(p.index, p.ts, p.payload)
            except Exception as exc:  # noqa: BLE001 - the command fails; replay fails it the same way
                log.warning("classic queue %s/%s: entry %d failed: %s", self.vhost, self.name, p.index, exc)
                if not p.fut.done():
                    p.fut.set_exception(exc)
                continue
            if not p.fut.done():
                p.fut.set_result(reply)

    def on_storage_error(self, exc: BaseException) -> None:
        log.error("classic queue %s/%s: write failed: %s", self.vhost, self.name, exc)
        self._write_failed(exc)

    def _write_failed(self, exc: BaseException) -> None:
        """Storage dropped every entry that was not durable when a write
        failed (and accepted the ones appended since): the pending commands
        beyond its last index will never be applied."""
        try:
            last = self.glog.last_index()
        except st.StorageError as exc2:
            self._stop(exc2)
            return
        lost: list[_Pending] = []
        while self._pending and self._pending[-1].index > last:
            lost.append(self._pending.pop())
        self._next = last + 1
        for p in reversed(lost):
            self._fail(p.payload, p.fut, exc)
        self.on_durable()

    @staticmethod
    def _fail(payload: list[Any], fut: asyncio.Future[Any], exc: BaseException) -> None:
        if fut.done():
            return
        if wire.is_enqueue(payload):
            fut.set_result(qm.EnqueueResult.REJECTED)  # never confirmed: nack
        else:
            fut.set_exception(exc)

    def _stop(self, exc: BaseException) -> None:
        """The log is unusable (corrupt, closed): nothing more is applied here."""
        if self.stopped is None:
            self.stopped = exc
            log.error("classic queue %s/%s stopped: %s", self.vhost, self.name, exc)
            while self._pending:
                p = self._pending.popleft()
                if not p.fut.done():
                    p.fut.set_exception(st.GroupFailedError(f"classic queue stopped: {exc}"))

    def _read_message(self, key: int) -> Message:
        index = key_index(key)
        return wire.queue_message(self.glog.entries(index, index + 1)[0].data, key_pos(key))

    # ---------------------------------------------------------------- channels
    def _reap(self) -> None:
        """Consumers of channels gone for good (a peer node restarted) are
        removed, those of channels only suspected gone keep their publisher
        entry (as QuorumQueue.reap_dead_channels)."""
        self._reaper = None
        if self.deleted:
            return
        self._reaper = self._loop.call_later(REAP_INTERVAL_S, self._reap)
        if self.stopped is not None:
            return
        host = self.host
        st_ = self.state
        consumers = {cid.channel for cid in st_.consumers}
        gone = {ch for ch in consumers | set(st_.publishers) if host.channel_gone(ch)}
        suspect = {ch for ch in consumers - gone if host.channel_dead(ch)}
        for ch, keep in [*((c, False) for c in sorted(gone)), *((c, True) for c in sorted(suspect))]:
            try:
                self.command(qm.ChannelDown(ch, keep_publisher=keep)).add_done_callback(_retrieve)
            except Exception as exc:  # noqa: BLE001 - stopped or deleted meanwhile
                log.debug("%s: ChannelDown(%s) not submitted: %s", self.name, ch, exc)

    def _redeliver_checked_out(self) -> None:
        """After a restart, consumers on other nodes that are still there get
        their checked-out messages again (deliveries in flight were lost)."""
        if self.deleted:
            return
        st_ = self.state
        for cid, c in list(st_.consumers.items()):
            if not c.checked or cid.tag == DEQUEUE_TAG or cid.channel.split("|", 1)[0] == self.host.node_name:
                continue
            deliveries = tuple((MsgId(msg_id), rec_key(r), st_.extra.get(rec_key(r), (0, 0))[0], True)
                               for msg_id, r in c.checked.items())
            try:
                self._deliver(qe.Deliver(cid, deliveries))
            except Exception as exc:  # noqa: BLE001 - best effort
                log.warning("%s: redelivery to %s failed: %s", self.name, cid, exc)

    def close(self) -> None:
        super().close()
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        gone = QueueGone(f"queue '{self.name}' in vhost '{self.vhost}' is gone")
        while self._pending:
            p = self._pending.popleft()
            if not p.fut.done():
                p.fut.set_exception(gone)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


__all__ = ["DurableClassicQueue", "group_id", "is_persistent"]
