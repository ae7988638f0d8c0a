"""The quorum-queue state machine: `apply(meta, command, state)`.

Pipeline position: Raft commits a command; every replica calls
`apply(meta, command, state) -> (state, reply, effects)` with the entry's
`Meta`; the leader's runtime interprets the effects and returns the reply to
the client. Deterministic: the only clock is `meta.timestamp_ms` and the only
input is the command, so every replica reaches the same state.

Purity decision: for speed the state is mutated *in place* and the same
object is returned (a Python-level copy per command would cost more than the
whole command). Purity where it matters is given by `snapshot()`/`restore()`
(a byte-exact, msgpack-encoded copy that behaves identically from then on);
callers that need the "before" state take a snapshot first.

Message records: bodies are never in the state. A message is named by its
key, ``raft_index << KEY_POS_BITS | position`` (types.py: the entry that
holds it and its place in a batch entry). A ready message is one int,
``key << 32 | size`` (see `pack`), in a `RecordFifo`. Only
messages carrying a non-default field (delivery count, redelivered, expiry)
have an entry in the side dict `extra`: key -> (delivery_count,
times_returned). A message with an expiry (TTL) carries it in the same int,
above the key: ``(expiry_ms + 1) << 96 | key << 32 | size``, so TTL
costs a few bytes per message, not a dict entry.

Ready messages live in three FIFOs: `returns` (returned while a delivery limit
is set: served first, i.e. "near the head"), `hi` (priority > 4) and `lo`
(normal, and returned messages when the limit is disabled: the back; for a
classic queue, `requeue_in_place`, back in index order where it was).
Between `hi` and `lo` every third pick takes `lo` unless `hi`'s head is older
(RabbitMQ 4.x rabbit_fifo_q, weight 2).

Why one file of this size: like `rabbit_fifo.erl`, it is one `apply` over one
state: each command's handler is short, but they share the ready/checked-out
bookkeeping, and a reader checks a rule (delivery limit, dead lettering,
single active consumer) by reading one file.
"""
from __future__ import annotations

from bisect import insort
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .commands import (
    COMMAND_TYPES,
    Cancel,
    ChannelDown,
    Checkout,
    Command,
    ConsumerDown,
    Credit,
    CreditMode,
    Dequeue,
    Discard,
    DlxCheckout,
    DlxSettle,
    Enqueue,
    Modify,
    Purge,
    Return,
    Settle,
    Tick,
    UpdateConfig,
)
from .config import QueueConfig
from .effects import (
    OK,
    ActiveConsumerChanged,
    CheckoutOk,
    ConsumerCancelled,
    CreditReply,
    DeadLetter,
    DeadLetterDeliver,
    DeadLetterReason,
    DeleteQueue,
    Deliver,
    Delivery,
    Dequeued,
    DequeueEmpty,
    DequeueRefused,
    Effect,
    EnqueueResult,
    NotFound,
    OutOfOrder,
    Purged,
    RejectPublish,
    ReleaseCursor,
    Reply,
    ResumePublish,
    SetTimer,
)
from .errors import QueueCommandError, QueueInvariantError
from .fifo import RecordFifo
from .types import BATCH_MAX, DEQUEUE_TAG, KEY_POS_BITS, ChannelRef, ConsumerId, Meta, MsgId

SIZE_BITS = 32
SIZE_MASK = (1 << SIZE_BITS) - 1
IDX_BITS = 64
IDX_MASK = (1 << IDX_BITS) - 1
EXP_SHIFT = SIZE_BITS + IDX_BITS
UNLIMITED_CREDIT = 1 << 62
HIGH_PRIORITY_ABOVE = 4
PRIORITY_WEIGHT = 2
RELEASE_CURSOR_INTERVAL = 4096  # commands between two ReleaseCursor effects
DLX_DEFAULT_PREFETCH = 32

# consumer status
UP = 0          # may receive deliveries (has credit or not)
CANCELLED = 1   # basic.cancel'ed; kept until its checked-out messages are settled
WAITING = 2     # single active consumer: waiting to become active
QUIESCING = 3   # SAC: active but handing over once its checked-out drain
DEQUEUE = 4     # a channel's basic.get pseudo-consumer

_REASONS = list(DeadLetterReason)
_REASON_CODE = {r: i for i, r in enumerate(_REASONS)}

# the empty header of a message with nothing non-default
_NO_HDR = (0, 0)


def pack(key: int, size: int, expiry_ms: int | None = None) -> int:
    """The compact record of a message: its key, body size and (when it
    has one) its expiry time, in one int."""
    rec = (key << SIZE_BITS) | size
    if expiry_ms is not None:
        rec |= (expiry_ms + 1) << EXP_SHIFT
    return rec


def rec_key(rec: int) -> int:
    """The message key of a packed record (types.py: entry index and position)."""
    return (rec >> SIZE_BITS) & IDX_MASK


def rec_expiry(rec: int) -> int | None:
    """The expiry time (ms) of a packed record, or None."""
    e = rec >> EXP_SHIFT
    return e - 1 if e else None


class Consumer:
    """One consumer (or a channel's basic.get pseudo-consumer).

    Invariant (SIMPLE_PREFETCH, bounded): credit == prefetch - len(checked)
    while the consumer is UP. Invariant: `in_service` iff the id sits in
    exactly one of the state's service deques.
    """

    __slots__ = ("cid", "priority", "mode", "prefetch", "credit", "checked", "next_msg_id",
                 "status", "in_service")

    def __init__(self, cid: ConsumerId, priority: int, mode: CreditMode, prefetch: int,
                 status: int) -> None:
        self.cid = cid
        self.priority = priority
        self.mode = mode
        self.prefetch = prefetch
        if mode is CreditMode.SIMPLE_PREFETCH:
            self.credit = prefetch if prefetch > 0 else UNLIMITED_CREDIT
        else:
            self.credit = prefetch
        # msg_id -> packed record, in delivery (msg id) order
        self.checked: dict[int, int] = {}
        self.next_msg_id = 0
        self.status = status
        self.in_service = False


class QueueState:
    """The whole replicated state of one quorum queue (see module docstring)."""

    __slots__ = (
        "config", "lo", "hi", "returns", "prio_counter", "extra", "ttl_seen", "out_of_order",
        "ready_bytes",
        "consumers", "service", "service_prios", "sac_active", "sac_waiting", "publishers",
        "rejected", "blocked", "dlx_pending", "dlx_checked", "dlx_bytes", "dlx_prefetch", "dlx_attached",
        "dlx_next_id", "last_active", "timer_at", "since_cursor", "deleted", "dls",
        "enqueued_total", "dead_lettered_total", "has_limits", "cursor_due", "msg_id_base",
    )

    def __init__(self, config: QueueConfig, created_ms: int | None = None) -> None:
        self.config = config
        # ready records packed in machine words (fifo.py): 8 bytes a message
        self.lo = RecordFifo()
        self.hi = RecordFifo()
        self.returns: deque[int] = deque()
        self.prio_counter = 0
        self.extra: dict[int, tuple[int, int]] = {}
        self.ttl_seen = False  # sticky: some message ever carried an expiry
        # message keys appended to `lo` out of index order (returns to the back)
        self.out_of_order: set[int] = set()
        self.ready_bytes = 0
        self.consumers: dict[ConsumerId, Consumer] = {}
        # consumer priority -> round-robin deque of consumer ids with credit
        self.service: dict[int, deque[ConsumerId]] = {}
        self.service_prios: list[int] = []  # negated priorities, ascending
        self.sac_active: ConsumerId | None = None
        self.sac_waiting: list[ConsumerId] = []  # by priority desc, then arrival
        self.publishers: dict[ChannelRef, int] = {}  # publisher -> last accepted seq
        # publisher -> numbers answered REJECTED, as [lo, hi] runs (ascending):
        # a re-sent rejected number answers REJECTED again, never DUPLICATE
        self.rejected: dict[ChannelRef, list[list[int]]] = {}
        # Invariant: a consumer created with a ConsumerId used before starts its
        # msg ids above every id the earlier one used (a settle of the old ids,
        # re-sent late, must not settle the new consumer's messages). New
        # consumers start at this; removed consumers raise it.
        self.msg_id_base = 0
        self.blocked = False  # reject-publish in force
        # at-least-once dead letters: (record, reason code, delivery count)
        self.dlx_pending: deque[tuple[int, int, int]] = deque()
        self.dlx_checked: dict[int, tuple[int, int, int]] = {}
        self.dlx_bytes = 0
        self.dlx_prefetch = DLX_DEFAULT_PREFETCH
        self.dlx_attached = False
        self.dlx_next_id = 0
        self.last_active: int | None = created_ms
        self.timer_at: int | None = None
        self.since_cursor = 0
        self.deleted = False
        # scratch (always empty between commands): (reason code, record, delivery count)
        self.dls: list[tuple[int, int, int]] = []
        self.enqueued_total = 0
        self.dead_lettered_total = 0
        # derived from config (not serialised): a length limit is configured
        self.has_limits = config.max_length is not None or config.max_length_bytes is not None
        # scratch (always False between commands): a ReleaseCursor is due once
        # this command's dead letters are accounted for (see apply)
        self.cursor_due = False

    # ------------------------------------------------------------ queries

    def messages_ready(self) -> int:
        return len(self.lo) + len(self.hi) + len(self.returns)

    def messages_checked_out(self) -> int:
        return sum(len(c.checked) for c in self.consumers.values())

    def messages_dlx(self) -> int:
        return len(self.dlx_pending) + len(self.dlx_checked)

    def messages_total(self) -> int:
        return self.messages_ready() + self.messages_checked_out() + self.messages_dlx()

    def consumer_count(self) -> int:
        return sum(1 for c in self.consumers.values() if c.status in (UP, QUIESCING, WAITING))

    def smallest_live_index(self) -> int | None:
        """Smallest raft index still holding a live message, or None."""
        key = self.smallest_live_key()
        return None if key is None else key >> KEY_POS_BITS

    def smallest_live_key(self) -> int | None:
        """Smallest key of a live message (ready, checked out, returned or
        dead-lettered awaiting confirmation), or None."""
        cands: list[int] = []
        if self.lo:
            cands.append(rec_key(self.lo[0]))
        if self.hi:
            cands.append(rec_key(self.hi[0]))
        if self.out_of_order:
            cands.append(min(self.out_of_order))
        if self.returns:
            cands.append(min(rec_key(r) for r in self.returns))
        for c in self.consumers.values():
            if c.checked:
                cands.append(min(rec_key(r) for r in c.checked.values()))
        if self.dlx_pending:
            cands.append(min(rec_key(r) for r, _, _ in self.dlx_pending))
        if self.dlx_checked:
            cands.append(min(rec_key(r) for r, _, _ in self.dlx_checked.values()))
        return min(cands) if cands else None

    def overview(self) -> dict[str, Any]:
        """Numbers for the management API / metrics (names as RabbitMQ's)."""
        checked_bytes = sum((r & SIZE_MASK) for c in self.consumers.values()
                            for r in c.checked.values())
        return {
            "messages_ready": self.messages_ready(),
            "messages_ready_high": len(self.hi),
            "messages_ready_normal": len(self.lo),
            "messages_ready_returned": len(self.returns),
            "messages_unacknowledged": self.messages_checked_out(),
            "messages_dlx": self.messages_dlx(),
            "messages": self.messages_total(),
            "message_bytes_ready": self.ready_bytes,
            "message_bytes_unacknowledged": checked_bytes,
            "message_bytes_dlx": self.dlx_bytes,
            "consumers": self.consumer_count(),
            "publishers": len(self.publishers),
            "single_active_consumer_tag": self.sac_active.tag if self.sac_active else None,
            "delivery_limit": self.config.delivery_limit,
            "reject_publish": self.blocked,
            "smallest_raft_index": self.smallest_live_index(),
        }


def new_state(config: QueueConfig, created_ms: int | None = None) -> QueueState:
    """A fresh, empty queue. `created_ms` (the declaration's log timestamp)
    starts the x-expires clock; when None the first command starts it."""
    return QueueState(config, created_ms)


# ================================================================ helpers


def _over_limit(st: QueueState) -> bool:
    cfg = st.config
    if cfg.max_length is not None:
        n = len(st.lo) + len(st.hi) + len(st.returns) + len(st.dlx_pending) + len(st.dlx_checked)
        if n > cfg.max_length:
            return True
    if cfg.max_length_bytes is not None and st.ready_bytes + st.dlx_bytes > cfg.max_length_bytes:
        return True
    return False


def _below_soft_limit(st: QueueState) -> bool:
    """Reject-publish is lifted at 80% of the limits (RabbitMQ ?LOW_LIMIT)."""
    cfg = st.config
    if cfg.max_length is not None:
        n = st.messages_ready() + st.messages_dlx()
        if n > (cfg.max_length * 4) // 5:
            return False
    if cfg.max_length_bytes is not None:
        if st.ready_bytes + st.dlx_bytes > (cfg.max_length_bytes * 4) // 5:
            return False
    return True


def _take_next(st: QueueState) -> int:
    """Remove and return the next ready record. Precondition: one is ready."""
    if st.returns:
        return st.returns.popleft()
    hi = st.hi
    lo = st.lo
    c = st.prio_counter
    st.prio_counter = 0 if c == PRIORITY_WEIGHT else c + 1
    if hi and not (lo and c == PRIORITY_WEIGHT
                   and (lo[0] >> SIZE_BITS) & IDX_MASK < (hi[0] >> SIZE_BITS) & IDX_MASK):
        return hi.popleft()
    rec = lo.popleft()
    if st.out_of_order:
        st.out_of_order.discard((rec >> SIZE_BITS) & IDX_MASK)
    return rec


def _expire_heads(st: QueueState, now: int) -> None:
    """Dead-letter `expired` every message at a head whose expiry has passed.
    Only heads are looked at (as RabbitMQ does): an expired message behind a
    live one waits until it reaches the head."""
    extra = st.extra
    for q in (st.returns, st.hi, st.lo):
        while q:
            rec = q[0]
            e = rec >> EXP_SHIFT
            if not e or e - 1 >= now:
                break
            q.popleft()
            idx = (rec >> SIZE_BITS) & IDX_MASK
            h = extra.pop(idx, _NO_HDR) if extra else _NO_HDR
            if st.out_of_order:
                st.out_of_order.discard(idx)
            st.ready_bytes -= rec & SIZE_MASK
            st.dls.append((_REASON_CODE[DeadLetterReason.EXPIRED], rec, h[0]))


def _add_service(st: QueueState, c: Consumer) -> None:
    if c.in_service:
        return
    c.in_service = True
    dq = st.service.get(c.priority)
    if dq is None:
        dq = deque()
        st.service[c.priority] = dq
        insort(st.service_prios, -c.priority)
    dq.append(c.cid)


def _next_consumer(st: QueueState) -> Consumer | None:
    consumers = st.consumers
    service = st.service
    for np in st.service_prios:
        dq = service[-np]
        while dq:
            cid = dq.popleft()
            c = consumers.get(cid)
            if c is None:
                continue
            c.in_service = False
            if c.status == UP and c.credit > 0:
                return c
    return None


def _checkout(st: QueueState, now: int, effects: list[Effect]) -> None:
    """Deliver ready messages round-robin to consumers with credit, highest
    consumer priority first. (Hot path: locals instead of attribute lookups.)"""
    if not st.service_prios:
        return
    returns = st.returns
    hi = st.hi
    lo = st.lo
    if not (returns or hi or lo):
        return
    extra = st.extra
    ttl = st.ttl_seen
    service = st.service
    first: Consumer | None = None
    first_list: list[Delivery] = []
    others: dict[ConsumerId, list[Delivery]] | None = None
    while returns or hi or lo:
        if ttl:
            _expire_heads(st, now)
            if not (returns or hi or lo):
                break
        c = _next_consumer(st)
        if c is None:
            break
        rec = _take_next(st)
        st.ready_bytes -= rec & SIZE_MASK
        mid = c.next_msg_id
        c.next_msg_id = mid + 1
        c.checked[mid] = rec
        idx = (rec >> SIZE_BITS) & IDX_MASK
        h = extra.get(idx) if extra else None
        d: Delivery = (MsgId(mid), idx, h[0], h[1] > 0) if h is not None \
            else (MsgId(mid), idx, 0, False)
        if c is first:
            first_list.append(d)
        elif first is None:
            first = c
            first_list.append(d)
        else:
            if others is None:
                others = {}
            lst = others.get(c.cid)
            if lst is None:
                others[c.cid] = [d]
            else:
                lst.append(d)
        c.credit -= 1
        if c.credit > 0:
            # just popped from its service deque: back to the end (round robin)
            dq = service.get(c.priority)
            if dq is None:
                _add_service(st, c)
            else:
                c.in_service = True
                dq.append(c.cid)
    if first is not None:
        effects.append(Deliver(first.cid, tuple(first_list)))
    if others:
        for cid, lst in others.items():
            effects.append(Deliver(cid, tuple(lst)))


def _drop_for_limits(st: QueueState) -> None:
    """overflow=drop-head: drop (dead-letter `maxlen`) from the head until the
    queue is within its limits again."""
    code = _REASON_CODE[DeadLetterReason.MAXLEN]
    while _over_limit(st) and (st.returns or st.hi or st.lo):
        rec = _take_next(st)
        st.ready_bytes -= rec & SIZE_MASK
        h = st.extra.pop(rec_key(rec), None) if st.extra else None
        st.dls.append((code, rec, h[0] if h else 0))


def _return_one(st: QueueState, rec: int, count_failure: bool) -> None:
    """Put a checked-out message back (or dead-letter it past the limit)."""
    idx = rec_key(rec)
    dc, returned = st.extra.get(idx, _NO_HDR)
    if count_failure:
        dc += 1
    limit = st.config.delivery_limit
    if limit is not None and dc > limit:
        st.extra.pop(idx, None)
        st.dls.append((_REASON_CODE[DeadLetterReason.DELIVERY_LIMIT], rec, dc))
        return
    st.extra[idx] = (dc, returned + 1)
    if limit is not None:
        st.returns.append(rec)
    elif st.config.requeue_in_place:
        # `lo` stays in index order: the message goes back where it was
        lo = st.lo
        if lo and rec_key(lo[-1]) > idx:
            lo.insort(rec, rec_key)
        else:
            lo.append(rec)
    else:
        st.lo.append(rec)
        st.out_of_order.add(idx)
    st.ready_bytes += rec & SIZE_MASK


def _discard_one(st: QueueState, rec: int) -> None:
    h = st.extra.pop(rec_key(rec), None) if st.extra else None
    st.dls.append((_REASON_CODE[DeadLetterReason.REJECTED], rec, h[0] if h else 0))


def _remove_consumer(st: QueueState, c: Consumer, now: int) -> None:
    del st.consumers[c.cid]
    if c.next_msg_id > st.msg_id_base:
        st.msg_id_base = c.next_msg_id
    c.in_service = False
    st.last_active = now


def _sac_insert_waiting(st: QueueState, c: Consumer) -> None:
    c.status = WAITING
    pos = len(st.sac_waiting)
    for i, wid in enumerate(st.sac_waiting):
        if st.consumers[wid].priority < c.priority:
            pos = i
            break
    st.sac_waiting.insert(pos, c.cid)


def _sac_activate_next(st: QueueState, effects: list[Effect]) -> None:
    """Make the first waiting consumer the active one (if none is active)."""
    if st.sac_active is not None or not st.sac_waiting:
        return
    cid = st.sac_waiting.pop(0)
    c = st.consumers[cid]
    c.status = UP
    st.sac_active = cid
    effects.append(ActiveConsumerChanged(cid, True))
    if c.credit > 0:
        _add_service(st, c)


def _sac_maybe_hand_over(st: QueueState, c: Consumer, effects: list[Effect]) -> None:
    """A quiescing active consumer with nothing checked out yields to the
    highest-priority waiting consumer."""
    if c.status == QUIESCING and not c.checked:
        st.sac_active = None
        _sac_insert_waiting(st, c)
        effects.append(ActiveConsumerChanged(c.cid, False))
        _sac_activate_next(st, effects)


def _after_consumer_change(st: QueueState, c: Consumer, now: int,
                           effects: list[Effect]) -> None:
    status = c.status
    if status == UP:
        if c.credit > 0 and not c.in_service:
            _add_service(st, c)
    elif not c.checked:
        if status == CANCELLED or status == DEQUEUE:
            _remove_consumer(st, c, now)
        elif status == QUIESCING:
            _sac_maybe_hand_over(st, c, effects)


def _consumer_gone(st: QueueState, c: Consumer, now: int, effects: list[Effect],
                   delivered: frozenset[int] | None = None) -> None:
    """Consumer/channel down: return everything it holds and remove it. Each
    return counts as a failed delivery, except for messages known not to have
    reached the client (`delivered` given and not holding their msg id)."""
    for msg_id, rec in c.checked.items():
        _return_one(st, rec, delivered is None or msg_id in delivered)
    c.checked.clear()
    was_active = st.sac_active == c.cid
    if c.status == WAITING:
        st.sac_waiting.remove(c.cid)
    if c.status != DEQUEUE and c.status != CANCELLED:
        effects.append(ConsumerCancelled(c.cid))
    _remove_consumer(st, c, now)
    if was_active:
        st.sac_active = None
        _sac_activate_next(st, effects)


def _flush_dead_letters(st: QueueState, effects: list[Effect]) -> None:
    """Turn the dead letters collected during this command into effects (or
    into at-least-once pending dead letters)."""
    dls = st.dls
    cfg = st.config
    st.dead_lettered_total += len(dls)
    if cfg.at_least_once:
        for code, rec, dc in dls:
            st.dlx_pending.append((rec, code, dc))
            st.dlx_bytes += rec & SIZE_MASK
    elif cfg.dead_letter_exchange is not None:
        i = 0
        n = len(dls)
        while i < n:
            code = dls[i][0]
            j = i
            batch: list[tuple[int, int]] = []
            while j < n and dls[j][0] == code:
                batch.append((rec_key(dls[j][1]), dls[j][2]))
                j += 1
            effects.append(DeadLetter(_REASONS[code], tuple(batch), cfg.dead_letter_exchange,
                                      cfg.dead_letter_routing_key))
            i = j
    dls.clear()


def _dlx_checkout(st: QueueState, effects: list[Effect]) -> None:
    cfg = st.config
    if not (st.dlx_attached and cfg.at_least_once and cfg.dead_letter_exchange is not None):
        return
    batch: list[tuple[int, int, DeadLetterReason, int]] = []
    while st.dlx_pending and len(st.dlx_checked) < st.dlx_prefetch:
        item = st.dlx_pending.popleft()
        i = st.dlx_next_id
        st.dlx_next_id = i + 1
        st.dlx_checked[i] = item
        batch.append((i, rec_key(item[0]), _REASONS[item[1]], item[2]))
    if batch:
        effects.append(DeadLetterDeliver(tuple(batch), cfg.dead_letter_exchange,
                                         cfg.dead_letter_routing_key))


def _drop_dlx(st: QueueState) -> None:
    """Strategy left at-least-once: unconfirmed dead letters are deleted."""
    st.dlx_pending.clear()
    st.dlx_checked.clear()
    st.dlx_bytes = 0


def _block(st: QueueState, effects: list[Effect]) -> None:
    st.blocked = True
    for p in st.publishers:
        effects.append(RejectPublish(p))


def _maybe_unblock(st: QueueState, effects: list[Effect]) -> None:
    if st.config.overflow != "reject-publish" or _below_soft_limit(st):
        st.blocked = False
        for p in st.publishers:
            effects.append(ResumePublish(p))


def _head_expiry(st: QueueState) -> int | None:
    best: int | None = None
    for q in (st.returns, st.hi, st.lo):
        if q:
            e = rec_expiry(q[0])
            if e is not None and (best is None or e < best):
                best = e
    return best


def _maybe_timer(st: QueueState, now: int, effects: list[Effect]) -> None:
    exp = _head_expiry(st)
    if exp is None:
        return
    at = exp + 1  # a message expires once now > expiry
    if st.timer_at is None or at < st.timer_at or st.timer_at <= now:
        st.timer_at = at
        effects.append(SetTimer(at, max(0, at - now)))


def _release_cursor(st: QueueState, meta: Meta, effects: list[Effect]) -> None:
    """Ask for a ReleaseCursor at the end of this command (apply emits it).

    Invariant: the smallest live index is computed only after the command's
    dead letters were moved to the at-least-once pending list, so a snapshot
    taken at the cursor never releases their bodies."""
    st.cursor_due = True


def _emit_release_cursor(st: QueueState, meta: Meta, effects: list[Effect]) -> None:
    st.cursor_due = False
    st.since_cursor = 0
    sli = st.smallest_live_index()
    effects.append(ReleaseCursor(meta.index, meta.index + 1 if sli is None else sli))


# ================================================================ handlers


#: Runs of rejected numbers kept per publisher (one per blocked period it
#: lived through); the oldest go first.
MAX_REJECTED_RUNS = 64


def _note_rejected(st: QueueState, pub: ChannelRef, seq: int) -> None:
    runs = st.rejected.setdefault(pub, [])
    if runs and runs[-1][1] == seq - 1:
        runs[-1][1] = seq
    else:
        runs.append([seq, seq])
        if len(runs) > MAX_REJECTED_RUNS:
            del runs[0]


def _was_rejected(st: QueueState, pub: ChannelRef, seq: int) -> bool:
    runs = st.rejected.get(pub)
    if not runs:
        return False
    return any(lo <= seq <= hi for lo, hi in runs)


def _enqueue(meta: Meta, cmd: Enqueue, st: QueueState) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    pub = cmd.publisher
    if pub is not None:
        # Invariant: a tracked publisher's numbers are taken one after the
        # other, so `seq <= last` was itself accepted (or rejected) before and
        # confirming it again is safe; a gap is refused, never skipped.
        publishers = st.publishers
        last = publishers.get(pub, 0)
        seq = cmd.seq
        if seq <= last:
            return (EnqueueResult.REJECTED if _was_rejected(st, pub, seq)
                    else EnqueueResult.DUPLICATE), effects
        if seq != last + 1:
            return OutOfOrder(last + 1), effects
        publishers[pub] = seq
        if st.blocked:
            if last == 0:
                effects.append(RejectPublish(pub))
            _note_rejected(st, pub, seq)
            return EnqueueResult.REJECTED, effects
    elif st.blocked:
        return EnqueueResult.REJECTED, effects
    size = cmd.size
    if size < 0 or size > SIZE_MASK:
        raise QueueCommandError(f"enqueue size out of range: {size}")
    pos = meta.pos
    if pos < 0 or pos >= BATCH_MAX:
        raise QueueCommandError(f"batch position out of range: {pos}")
    idx = (meta.index << KEY_POS_BITS) | pos
    if meta.index < 0 or idx > IDX_MASK:
        raise QueueCommandError(f"raft index out of range: {meta.index}")
    cfg = st.config
    ttl = cfg.message_ttl_ms
    exp = cmd.expiration_ms
    if ttl is not None or exp is not None:
        if exp is None or (ttl is not None and ttl < exp):
            exp = ttl
        assert exp is not None
        if exp < 0:
            raise QueueCommandError(f"negative expiration: {exp}")
        st.ttl_seen = True
        rec = (meta.timestamp_ms + exp + 1) << EXP_SHIFT | (idx << SIZE_BITS) | size
    else:
        rec = (idx << SIZE_BITS) | size
    prio = cmd.priority
    if prio is not None and prio > HIGH_PRIORITY_ABOVE:
        st.hi.append(rec)
    else:
        st.lo.append(rec)
    st.ready_bytes += size
    st.enqueued_total += 1
    if st.service_prios:
        _checkout(st, meta.timestamp_ms, effects)
    # length limits are enforced for every command in `apply`
    return EnqueueResult.ACCEPTED, effects


def _checkout_cmd(meta: Meta, cmd: Checkout, st: QueueState) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    now = meta.timestamp_ms
    if cmd.prefetch < 0:
        raise QueueCommandError(f"negative prefetch: {cmd.prefetch}")
    if cmd.consumer.tag == DEQUEUE_TAG:
        raise QueueCommandError("the empty consumer tag is reserved for basic.get")
    st.last_active = now
    cid = cmd.consumer
    c = st.consumers.get(cid)
    if c is not None and c.status != CANCELLED:
        # re-registration: update prefetch/priority in place
        c.prefetch = cmd.prefetch
        c.mode = cmd.mode
        if cmd.mode is CreditMode.SIMPLE_PREFETCH:
            c.credit = (cmd.prefetch - len(c.checked)) if cmd.prefetch > 0 else UNLIMITED_CREDIT
        else:
            c.credit = cmd.prefetch
        c.priority = cmd.priority
    else:
        old = c
        c = Consumer(cid, cmd.priority, cmd.mode, cmd.prefetch, UP)
        c.next_msg_id = st.msg_id_base
        if old is not None:  # a cancelled consumer re-subscribing keeps its unacked
            c.checked = old.checked
            c.next_msg_id = old.next_msg_id
            if cmd.mode is CreditMode.SIMPLE_PREFETCH and cmd.prefetch > 0:
                c.credit = cmd.prefetch - len(c.checked)
        st.consumers[cid] = c
        if st.config.single_active_consumer:
            if st.sac_active is None:
                st.sac_active = cid
                effects.append(ActiveConsumerChanged(cid, True))
            else:
                _sac_insert_waiting(st, c)
                effects.append(ActiveConsumerChanged(cid, False))
                active = st.consumers[st.sac_active]
                if c.priority > active.priority and active.status == UP:
                    active.status = QUIESCING
                    _sac_maybe_hand_over(st, active, effects)
    if c.status == UP and c.credit > 0:
        _add_service(st, c)
    _checkout(st, now, effects)
    return CheckoutOk(cid, c.status == UP, st.messages_ready()), effects


def _credit(meta: Meta, cmd: Credit, st: QueueState) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    c = st.consumers.get(cmd.consumer)
    if c is None or c.status == DEQUEUE:
        return NotFound(), effects
    if cmd.credit < 0:
        raise QueueCommandError(f"negative credit: {cmd.credit}")
    if c.mode is CreditMode.CREDITED:
        c.credit = cmd.credit
    else:
        c.prefetch = cmd.credit
        c.credit = (cmd.credit - len(c.checked)) if cmd.credit > 0 else UNLIMITED_CREDIT
    if c.status == UP and c.credit > 0:
        _add_service(st, c)
    _checkout(st, meta.timestamp_ms, effects)
    drained = 0
    if cmd.drain and c.mode is CreditMode.CREDITED:
        drained = c.credit
        c.credit = 0
    return CreditReply(c.cid, c.credit, st.messages_ready(), drained), effects


def _cancel(meta: Meta, cmd: Cancel, st: QueueState) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    c = st.consumers.get(cmd.consumer)
    if c is None or c.status in (CANCELLED, DEQUEUE):
        return NotFound(), effects
    now = meta.timestamp_ms
    st.last_active = now
    was_active = st.sac_active == c.cid
    if c.status == WAITING:
        st.sac_waiting.remove(c.cid)
    c.status = CANCELLED
    effects.append(ConsumerCancelled(c.cid))
    if not c.checked:
        _remove_consumer(st, c, now)
    if was_active:
        st.sac_active = None
        effects.append(ActiveConsumerChanged(c.cid, False))
        _sac_activate_next(st, effects)
        _checkout(st, now, effects)
    return OK, effects


def _dequeue(meta: Meta, cmd: Dequeue, st: QueueState) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    cfg = st.config
    if cfg.single_active_consumer:
        return DequeueRefused(405, f"RESOURCE_LOCKED - cannot obtain access to locked "
                                   f"{cfg.resource}. basic.get operations are not supported "
                                   f"by quorum queues with single active consumer"), effects
    now = meta.timestamp_ms
    st.last_active = now
    if st.ttl_seen:
        _expire_heads(st, now)
    if not (st.returns or st.hi or st.lo):
        return DequeueEmpty(), effects
    rec = _take_next(st)
    st.ready_bytes -= rec & SIZE_MASK
    idx = rec_key(rec)
    h = st.extra.get(idx, _NO_HDR) if st.extra else _NO_HDR
    if cmd.settled:
        if st.extra:
            st.extra.pop(idx, None)
        mid = 0
    else:
        cid = ConsumerId(cmd.channel, DEQUEUE_TAG)
        c = st.consumers.get(cid)
        if c is None:
            c = Consumer(cid, 0, CreditMode.SIMPLE_PREFETCH, 0, DEQUEUE)
            c.next_msg_id = st.msg_id_base
            st.consumers[cid] = c
        mid = c.next_msg_id
        c.next_msg_id = mid + 1
        c.checked[mid] = rec
    return Dequeued(MsgId(mid), idx, h[0], h[1] > 0, st.messages_ready()), effects


def _settle(meta: Meta, cmd: Settle, st: QueueState) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    c = st.consumers.get(cmd.consumer)
    if c is None:
        return NotFound(), effects
    checked = c.checked
    extra = st.extra
    n = 0
    for mid in cmd.msg_ids:
        rec = checked.pop(mid, None)
        if rec is None:
            continue
        n += 1
        if extra:
            extra.pop((rec >> SIZE_BITS) & IDX_MASK, None)
    if c.mode is CreditMode.SIMPLE_PREFETCH:
        c.credit += n
    if c.status == UP:
        if c.credit > 0 and not c.in_service:
            _add_service(st, c)
    else:
        _after_consumer_change(st, c, meta.timestamp_ms, effects)
    if st.returns or st.hi or st.lo:
        _checkout(st, meta.timestamp_ms, effects)
    return OK, effects


def _settle_like(meta: Meta, consumer: ConsumerId, msg_ids: tuple[MsgId, ...], st: QueueState,
                 action: Callable[[QueueState, int], None]) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    c = st.consumers.get(consumer)
    if c is None:
        return NotFound(), effects
    n = 0
    for mid in msg_ids:
        rec = c.checked.pop(mid, None)
        if rec is None:
            continue
        n += 1
        action(st, rec)
    if c.mode is CreditMode.SIMPLE_PREFETCH:
        c.credit += n
    _after_consumer_change(st, c, meta.timestamp_ms, effects)
    _checkout(st, meta.timestamp_ms, effects)
    return OK, effects


def _return(meta: Meta, cmd: Return, st: QueueState) -> tuple[Reply, list[Effect]]:
    return _settle_like(meta, cmd.consumer, cmd.msg_ids, st,
                        lambda s, r: _return_one(s, r, True))


def _discard(meta: Meta, cmd: Discard, st: QueueState) -> tuple[Reply, list[Effect]]:
    return _settle_like(meta, cmd.consumer, cmd.msg_ids, st, _discard_one)


def _modify(meta: Meta, cmd: Modify, st: QueueState) -> tuple[Reply, list[Effect]]:
    if cmd.undeliverable_here:
        return _settle_like(meta, cmd.consumer, cmd.msg_ids, st, _discard_one)
    failed = cmd.delivery_failed
    return _settle_like(meta, cmd.consumer, cmd.msg_ids, st,
                        lambda s, r: _return_one(s, r, failed))


def _purge(meta: Meta, cmd: Purge, st: QueueState) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    n = st.messages_ready()
    if st.extra:
        for q in (st.returns, st.hi, st.lo):
            for rec in q:
                st.extra.pop(rec_key(rec), None)
    st.returns.clear()
    st.hi.clear()
    st.lo.clear()
    st.out_of_order.clear()
    st.ready_bytes = 0
    _release_cursor(st, meta, effects)
    return Purged(n), effects


def _consumer_down(meta: Meta, cmd: ConsumerDown, st: QueueState) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    c = st.consumers.get(cmd.consumer)
    if c is None:
        return NotFound(), effects
    _consumer_gone(st, c, meta.timestamp_ms, effects)
    _checkout(st, meta.timestamp_ms, effects)
    return OK, effects


def _channel_down(meta: Meta, cmd: ChannelDown, st: QueueState) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    if not cmd.keep_publisher:
        # the channel's own identity and its renumbered ones ("ref~N")
        for pub in [p for p in st.publishers if p == cmd.channel or p.startswith(cmd.channel + "~")]:
            del st.publishers[pub]
            st.rejected.pop(pub, None)
    known = dict(cmd.delivered) if cmd.delivered is not None else None
    for c in [c for c in st.consumers.values() if c.cid.channel == cmd.channel]:
        ids = None if known is None else frozenset(known.get(c.cid.tag, ()))
        _consumer_gone(st, c, meta.timestamp_ms, effects, ids)
    _checkout(st, meta.timestamp_ms, effects)
    return OK, effects


def _update_config(meta: Meta, cmd: UpdateConfig, st: QueueState) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    old = st.config
    new = cmd.config
    if (new.name, new.vhost) != (old.name, old.vhost):
        raise QueueCommandError(f"config for {new.resource} applied to {old.resource}")
    # x-single-active-consumer is fixed at declaration
    new = replace(new, single_active_consumer=old.single_active_consumer)
    st.config = new
    st.has_limits = new.max_length is not None or new.max_length_bytes is not None
    if old.at_least_once and not new.at_least_once:
        _drop_dlx(st)
    _checkout(st, meta.timestamp_ms, effects)
    return OK, effects


def _tick(meta: Meta, cmd: Tick, st: QueueState) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    now = meta.timestamp_ms
    if st.timer_at is not None and st.timer_at <= now:
        st.timer_at = None
    if st.ttl_seen:
        _expire_heads(st, now)
    _checkout(st, now, effects)
    exp = st.config.expires_ms
    if (exp is not None and not st.deleted and not st.consumers
            and st.last_active is not None and now - st.last_active >= exp):
        st.deleted = True
        effects.append(DeleteQueue("expired"))
    _release_cursor(st, meta, effects)
    return OK, effects


def _dlx_checkout_cmd(meta: Meta, cmd: DlxCheckout, st: QueueState) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    if cmd.prefetch <= 0:
        raise QueueCommandError(f"dead-letter worker prefetch must be positive: {cmd.prefetch}")
    # a new worker: whatever the old one held goes back to the front, in order
    for i in sorted(st.dlx_checked, reverse=True):
        st.dlx_pending.appendleft(st.dlx_checked[i])
    st.dlx_checked.clear()
    st.dlx_prefetch = cmd.prefetch
    st.dlx_attached = True
    _dlx_checkout(st, effects)
    return OK, effects


def _dlx_settle(meta: Meta, cmd: DlxSettle, st: QueueState) -> tuple[Reply, list[Effect]]:
    effects: list[Effect] = []
    for i in cmd.msg_ids:
        item = st.dlx_checked.pop(i, None)
        if item is not None:
            st.dlx_bytes -= item[0] & SIZE_MASK
    _dlx_checkout(st, effects)
    return OK, effects


Handler = Callable[[Meta, Any, QueueState], tuple[Reply, list[Effect]]]
_HANDLERS: dict[type, Handler] = {
    Enqueue: _enqueue,
    Checkout: _checkout_cmd,
    Credit: _credit,
    Cancel: _cancel,
    Dequeue: _dequeue,
    Settle: _settle,
    Return: _return,
    Discard: _discard,
    Modify: _modify,
    Purge: _purge,
    ConsumerDown: _consumer_down,
    ChannelDown: _channel_down,
    UpdateConfig: _update_config,
    Tick: _tick,
    DlxCheckout: _dlx_checkout_cmd,
    DlxSettle: _dlx_settle,
}
if set(_HANDLERS) != set(COMMAND_TYPES):  # pragma: no cover - import-time contract
    raise QueueInvariantError("every command type needs exactly one handler")


def apply(meta: Meta, command: Command | object, state: QueueState
          ) -> tuple[QueueState, Reply, list[Effect]]:
    """Apply one committed command. Returns the (same, mutated) state, the
    reply for the caller and the effects for the leader's runtime, in order.
    Anything but a `Command` is refused with `QueueCommandError` (so the
    parameter is typed `object`: compiled code must not refuse it first with
    a TypeError)."""
    handler = _HANDLERS.get(type(command))
    if handler is None:
        raise QueueCommandError(f"not a queue command: {command!r}")
    st = state
    if st.last_active is None:
        st.last_active = meta.timestamp_ms
    reply, effects = handler(meta, command, st)
    if st.has_limits:
        # evaluated after every command: returns and policy changes can also
        # take the queue over its limits
        cfg = st.config
        if cfg.overflow == "reject-publish":
            if not st.blocked and _over_limit(st):
                _block(st, effects)
        elif _over_limit(st):
            _drop_for_limits(st)
    if st.dls:
        _flush_dead_letters(st, effects)
        if st.dlx_pending:
            _dlx_checkout(st, effects)
    if st.blocked:
        _maybe_unblock(st, effects)
    if st.ttl_seen:
        _maybe_timer(st, meta.timestamp_ms, effects)
    n = st.since_cursor + 1
    if st.cursor_due or n >= RELEASE_CURSOR_INTERVAL:
        _emit_release_cursor(st, meta, effects)
    else:
        st.since_cursor = n
    return st, reply, effects


__all__ = ["Consumer", "QueueState", "apply", "new_state", "pack"]
