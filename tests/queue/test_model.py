"""Hypothesis stateful test of the queue machine against a slow, obviously
correct ledger model.

The model keeps one entry per accepted message saying where it is (ready,
checked out by (consumer, msg_id), awaiting dead-letter confirmation, or gone
with a reason) and its delivery count. After every command it reconciles with
the machine's containers and checks that:

- every live message is in exactly one place, and only moved as the command
  and the emitted effects say (a delivery is announced by a Deliver effect or
  a Dequeued reply, a return only happens for a returned/abandoned message);
- a message only disappears because it was settled, purged, confirmed by the
  dead-letter worker, or dead-lettered with a valid reason (rejected, expired
  after its expiry, maxlen under drop-head, delivery_limit past the limit),
  and with a DLX configured (at-most-once) exactly those appear in DeadLetter
  effects with that reason;
- first deliveries of each priority class are in publish (message key) order,
  and a high-priority message published before a normal one goes first;
- prefetch is never exceeded; drop-head length limits always hold and
  reject-publish never accepts a publish while over the limit (overshoot of
  one at most, plus returned messages);
- snapshot/restore at any point changes nothing: a restored shadow copy is
  driven with the same commands and must give identical replies, effects
  and state.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker.queue import (
    BATCH_MAX,
    Cancel,
    ChannelDown,
    ChannelRef,
    Checkout,
    ConsumerDown,
    ConsumerId,
    DeadLetter,
    DeadLetterDeliver,
    DeadLetterReason,
    Deliver,
    Dequeue,
    Dequeued,
    Discard,
    DlxCheckout,
    DlxSettle,
    Enqueue,
    EnqueueResult,
    Meta,
    Modify,
    OutOfOrder,
    Purge,
    QueueConfig,
    QueueState,
    Return,
    Settle,
    Tick,
    apply,
    msg_key,
    new_state,
    restore,
    snapshot,
    to_plain,
)
from broker.queue.commands import Command
from broker.queue.effects import Effect, Reply
from broker.queue.machine import rec_key
from broker.queue.types import DEQUEUE_TAG

CONFIGS = [
    QueueConfig("q"),
    QueueConfig("q", delivery_limit=2, dead_letter_exchange="dlx"),
    QueueConfig("q", delivery_limit=None),
    QueueConfig("q", max_length=3, dead_letter_exchange="dlx"),
    QueueConfig("q", max_length_bytes=25, delivery_limit=1),
    QueueConfig("q", max_length=3, overflow="reject-publish", dead_letter_exchange="dlx",
                dead_letter_strategy="at-least-once", delivery_limit=1),
    QueueConfig("q", message_ttl_ms=50, dead_letter_exchange="dlx"),
    QueueConfig("q", single_active_consumer=True, delivery_limit=3),
]
CHANNELS = [ChannelRef("ch1"), ChannelRef("ch2")]
CONSUMERS = [ConsumerId(ch, t) for ch in CHANNELS for t in ("a", "b")]
R = DeadLetterReason


@dataclass
class Msg:
    idx: int
    size: int
    hi: bool
    expiry: int | None
    dc: int = 0
    returned: int = 0
    loc: object = "ready"  # "ready" | ("out", ConsumerId, mid) | "dlx"


@dataclass
class Step:
    """What the command being applied allows to happen."""

    returned: set[int] = field(default_factory=set)       # may go back (count failure)
    returned_nofail: set[int] = field(default_factory=set)  # may go back, not counted
    discarded: set[int] = field(default_factory=set)
    settled: set[int] = field(default_factory=set)
    purge: bool = False


class QueueModel(RuleBasedStateMachine):
    @initialize(cfg=st.sampled_from(CONFIGS))
    def setup(self, cfg: QueueConfig) -> None:
        self.cfg = cfg
        self.state: QueueState = new_state(cfg, created_ms=0)
        self.shadow: QueueState | None = None
        self.index = 0
        self.pos = 0  # of the last command in its entry
        self.enqueue_entry = False  # the last entry is an enqueue (batch) entry
        self.now = 0
        self.msgs: dict[int, Msg] = {}
        self.last_seq: dict[ChannelRef, int] = {}
        self.rejected_seqs: dict[ChannelRef, set[int]] = {}
        self.prefetch: dict[ConsumerId, int] = {}
        self.last_first: dict[bool, int] = {True: 0, False: 0}

    # ------------------------------------------------------------ driver

    def _next(self, batched: bool) -> tuple[int, int]:
        """(index, pos) of the next command: the next position of the last
        entry when `batched` and that entry is a batch of enqueues with room,
        else a new entry."""
        if batched and self.enqueue_entry and self.pos + 1 < BATCH_MAX:
            return self.index, self.pos + 1
        return self.index + 1, 0

    def _apply(self, cmd: Command, step: Step, advance: int = 0,
               new: Msg | None = None, batched: bool = False) -> tuple[Reply, list[Effect]]:
        self.index, self.pos = self._next(batched)
        self.enqueue_entry = isinstance(cmd, Enqueue)
        self.now += advance
        meta = Meta(self.index, 1, self.now, self.pos)
        _, reply, effects = apply(meta, cmd, self.state)
        if self.shadow is not None:
            _, r2, e2 = apply(meta, cmd, self.shadow)
            assert (r2, e2) == (reply, effects)
        if new is not None and reply is EnqueueResult.ACCEPTED:
            self.msgs[new.idx] = new
        self._reconcile(cmd, step, reply, effects)
        return reply, effects

    def _machine_locations(self) -> dict[int, object]:
        s = self.state
        seen: dict[int, object] = {}

        def put(idx: int, loc: object) -> None:
            assert idx not in seen, f"message {idx} in two places: {seen[idx]} and {loc}"
            seen[idx] = loc

        for q in (s.lo, s.hi, s.returns):
            for rec in q:
                put(rec_key(rec), "ready")
        for c in s.consumers.values():
            for mid, rec in c.checked.items():
                put(rec_key(rec), ("out", c.cid, mid))
        for rec, _, _ in s.dlx_pending:
            put(rec_key(rec), "dlx")
        for rec, _, _ in s.dlx_checked.values():
            put(rec_key(rec), "dlx")
        return seen

    def _reconcile(self, cmd: Command, step: Step, reply: Reply, effects: list[Effect]) -> None:
        cfg = self.state.config
        delivered: dict[int, tuple[ConsumerId, int, int, bool]] = {}
        for e in effects:
            if isinstance(e, Deliver):
                for mid, idx, dc, red in e.deliveries:
                    assert idx not in delivered
                    delivered[idx] = (e.consumer, mid, dc, red)
        if isinstance(reply, Dequeued):
            assert isinstance(cmd, Dequeue)
            delivered[reply.key] = (ConsumerId(cmd.channel, DEQUEUE_TAG), reply.msg_id,
                                           reply.delivery_count, reply.redelivered)
        dead: dict[int, DeadLetterReason] = {}
        for e in effects:
            if isinstance(e, DeadLetter):
                for idx, _dc in e.messages:
                    assert idx not in dead
                    dead[idx] = e.reason
        where = self._machine_locations()
        for idx in where:
            assert idx in self.msgs, f"unknown or resurrected message {idx}"
        dlx_reasons = {rec_key(rec): code for rec, code, _ in self.state.dlx_pending}
        dlx_reasons.update({rec_key(rec): code
                            for rec, code, _ in self.state.dlx_checked.values()})
        for idx, m in list(self.msgs.items()):
            before = m.loc
            was_out = isinstance(before, tuple)
            returned = idx in step.returned or idx in step.returned_nofail
            if returned:
                m.returned += 1
                if idx in step.returned:
                    m.dc += 1
            # why it may have left the ready/out places
            reasons: set[DeadLetterReason] = set()
            if idx in step.discarded:
                reasons.add(R.REJECTED)
            if returned and cfg.delivery_limit is not None and m.dc > cfg.delivery_limit:
                reasons.add(R.DELIVERY_LIMIT)
            ready_now = before == "ready" or (returned and R.DELIVERY_LIMIT not in reasons)
            if ready_now and m.expiry is not None and self.now > m.expiry:
                reasons.add(R.EXPIRED)
            if ready_now and (cfg.max_length is not None or cfg.max_length_bytes is not None) \
                    and cfg.overflow == "drop-head":
                reasons.add(R.MAXLEN)
            loc = where.get(idx)
            if idx in delivered:
                c, mid, dc, red = delivered[idx]
                assert ready_now, f"delivered {idx} that was not ready ({before})"
                assert (dc, red) == (m.dc, m.returned > 0)
                if not red:  # first deliveries are FIFO within a priority class
                    assert idx > self.last_first[m.hi]
                    self.last_first[m.hi] = idx
                if loc is None:  # a settled basic.get
                    assert isinstance(cmd, Dequeue) and cmd.settled
                    del self.msgs[idx]
                    continue
                assert loc == ("out", c, mid)
            elif loc is not None and isinstance(loc, tuple):
                assert loc == before, f"{idx} moved {before} -> {loc} without a delivery"
            elif loc == "ready":
                assert before == "ready" or returned, f"{idx} became ready from {before}"
            elif loc == "dlx":
                if before != "dlx":
                    reason = list(DeadLetterReason)[dlx_reasons[idx]]
                    assert reason in reasons, f"{idx} dead-lettered {reason} from {before}"
            else:  # gone
                if idx in step.settled and was_out:
                    pass
                elif before == "dlx":
                    assert isinstance(cmd, DlxSettle) or not cfg.at_least_once
                elif step.purge and ready_now:
                    pass
                else:
                    assert reasons, f"{idx} vanished from {before} with no reason"
                    if cfg.dead_letter_exchange is not None and not cfg.at_least_once:
                        assert dead.get(idx) in reasons, f"{idx} not dead-lettered: {dead}"
                    dead.pop(idx, None)
                del self.msgs[idx]
                continue
            m.loc = loc
        assert not dead, f"dead-lettered messages that were not live: {dead}"
        # a high-priority message published before a normal one is delivered first
        fresh_lo = [i for i, d in delivered.items() if not d[3] and i in self.msgs
                    and not self.msgs[i].hi]
        if fresh_lo:
            waiting_hi = [m.idx for m in self.msgs.values()
                          if m.hi and m.loc == "ready" and m.returned == 0]
            assert not waiting_hi or min(waiting_hi) > min(fresh_lo)
        # prefetch is never exceeded by a delivery (a consumer re-registered with a
        # lower prefetch may hold more, but then gets nothing until below it)
        for c in {d[0] for d in delivered.values()}:
            p = self.prefetch.get(c, 0)
            if c.tag != DEQUEUE_TAG and p > 0:
                assert len(self.state.consumers[c].checked) <= p

    # ------------------------------------------------------------ rules

    @rule(pub=st.sampled_from([None, *CHANNELS]), seq_delta=st.integers(-1, 2),
          size=st.integers(0, 12), prio=st.sampled_from([None, 0, 5, 9]),
          expiration=st.sampled_from([None, None, 0, 30, 500]), batched=st.booleans())
    def enqueue(self, pub: ChannelRef | None, seq_delta: int, size: int, prio: int | None,
                expiration: int | None, batched: bool) -> None:
        last = self.last_seq.get(pub, 0) if pub is not None else 0
        seq = max(0, last + seq_delta)
        dup = pub is not None and seq <= last
        gap = pub is not None and seq > last + 1
        before_count = self.state.messages_ready() + self.state.messages_dlx()
        ttl = self.cfg.message_ttl_ms
        exps = [x for x in (ttl, expiration) if x is not None]
        expiry = self.now + min(exps) if exps else None
        msg = Msg(msg_key(*self._next(batched)), size, prio is not None and prio > 4, expiry)
        reply, _ = self._apply(Enqueue(pub, seq, size, prio, expiration), Step(), new=msg,
                               batched=batched)
        if dup:
            expected = (EnqueueResult.REJECTED if seq in self.rejected_seqs.get(pub, set())
                        else EnqueueResult.DUPLICATE)
            assert reply is expected
        elif gap:
            assert reply == OutOfOrder(last + 1)
        else:
            if pub is not None:
                self.last_seq[pub] = seq
            if reply is EnqueueResult.REJECTED:
                if pub is not None:
                    self.rejected_seqs.setdefault(pub, set()).add(seq)
                assert self.cfg.overflow == "reject-publish"
                assert self.cfg.max_length is not None
                assert before_count > (self.cfg.max_length * 4) // 5
            else:
                assert reply is EnqueueResult.ACCEPTED
                if self.cfg.overflow == "reject-publish" and self.cfg.max_length is not None:
                    # never accepted while over the limit (overshoot of one at most)
                    assert before_count <= self.cfg.max_length
        if reply is not EnqueueResult.ACCEPTED:
            assert msg.idx not in self._machine_locations()

    @rule(c=st.sampled_from(CONSUMERS), prefetch=st.integers(0, 3), prio=st.integers(0, 2))
    def checkout(self, c: ConsumerId, prefetch: int, prio: int) -> None:
        self.prefetch[c] = prefetch
        self._apply(Checkout(c, prefetch, prio), Step())

    def _out(self, c: ConsumerId) -> list[int]:
        return sorted(m.loc[2] for m in self.msgs.values()  # type: ignore[index]
                      if isinstance(m.loc, tuple) and m.loc[1] == c)

    def _idx_of(self, c: ConsumerId, mids: list[int]) -> set[int]:
        return {m.idx for m in self.msgs.values()
                if isinstance(m.loc, tuple) and m.loc[1] == c and m.loc[2] in mids}

    @rule(c=st.sampled_from([*CONSUMERS, ConsumerId(CHANNELS[0], DEQUEUE_TAG)]),
          kind=st.sampled_from(["settle", "return", "discard", "modify", "modify_failed",
                                "modify_undeliverable"]),
          data=st.data())
    def settle_like(self, c: ConsumerId, kind: str, data: st.DataObject) -> None:
        out = self._out(c)
        mids = data.draw(st.lists(st.sampled_from(out), unique=True)) if out else []
        if data.draw(st.booleans()):
            mids = [*mids, 10_000]  # an unknown id is ignored
        idxs = self._idx_of(c, mids)
        t = tuple(mids)
        if kind == "settle":
            self._apply(Settle(c, t), Step(settled=idxs))
        elif kind == "return":
            self._apply(Return(c, t), Step(returned=idxs))
        elif kind == "discard":
            self._apply(Discard(c, t), Step(discarded=idxs))
        elif kind == "modify":
            self._apply(Modify(c, t, False, False), Step(returned_nofail=idxs))
        elif kind == "modify_failed":
            self._apply(Modify(c, t, True, False), Step(returned=idxs))
        else:
            self._apply(Modify(c, t, False, True), Step(discarded=idxs))

    @rule(c=st.sampled_from(CONSUMERS))
    def cancel(self, c: ConsumerId) -> None:
        self._apply(Cancel(c), Step())

    @rule(c=st.sampled_from(CONSUMERS))
    def consumer_down(self, c: ConsumerId) -> None:
        self._apply(ConsumerDown(c), Step(returned=self._idx_of(c, self._out(c))))

    @rule(ch=st.sampled_from(CHANNELS))
    def channel_down(self, ch: ChannelRef) -> None:
        idxs = {m.idx for m in self.msgs.values()
                if isinstance(m.loc, tuple) and m.loc[1].channel == ch}  # type: ignore[attr-defined]
        self.last_seq.pop(ch, None)
        self.rejected_seqs.pop(ch, None)
        self._apply(ChannelDown(ch), Step(returned=idxs))

    @rule(ch=st.sampled_from(CHANNELS), settled=st.booleans())
    def dequeue(self, ch: ChannelRef, settled: bool) -> None:
        self._apply(Dequeue(ch, settled), Step())

    @rule()
    def purge(self) -> None:
        self._apply(Purge(), Step(purge=True))

    @rule(advance=st.sampled_from([0, 1, 20, 60, 600]))
    def tick(self, advance: int) -> None:
        self._apply(Tick(), Step(), advance=advance)

    @precondition(lambda self: self.cfg.at_least_once)
    @rule(prefetch=st.integers(1, 3))
    def dlx_checkout(self, prefetch: int) -> None:
        self._apply(DlxCheckout(prefetch), Step())

    @precondition(lambda self: self.cfg.at_least_once)
    @rule(data=st.data())
    def dlx_settle(self, data: st.DataObject) -> None:
        ids = sorted(self.state.dlx_checked)
        chosen = data.draw(st.lists(st.sampled_from(ids), unique=True)) if ids else []
        _, effects = self._apply(DlxSettle(tuple(chosen)), Step())
        assert all(isinstance(e, DeadLetterDeliver) for e in effects)

    @rule()
    def snapshot_restore(self) -> None:
        copy = restore(snapshot(self.state))
        assert to_plain(copy) == to_plain(self.state)
        self.shadow = copy

    # ------------------------------------------------------------ invariants

    @invariant()
    def limits_respected(self) -> None:
        cfg = self.state.config
        n = self.state.messages_ready() + self.state.messages_dlx()
        b = self.state.ready_bytes + self.state.dlx_bytes
        # drop-head holds the limits strictly; reject-publish only refuses
        # publishes (returned messages may take it over; checked in `enqueue`)
        if cfg.overflow == "drop-head":
            if cfg.max_length is not None:
                assert n <= cfg.max_length
            if cfg.max_length_bytes is not None:
                assert b <= cfg.max_length_bytes

    @invariant()
    def counts_agree(self) -> None:
        s = self.state
        assert s.ready_bytes == sum(m.size for m in self.msgs.values() if m.loc == "ready")
        assert s.messages_total() == len(self.msgs)
        if s.config.single_active_consumer:
            assert sum(1 for c in s.consumers.values() if c.status == 0) <= 1

    @invariant()
    def shadow_equal(self) -> None:
        if self.shadow is not None:
            assert to_plain(self.shadow) == to_plain(self.state)


QueueModel.TestCase.settings = settings(max_examples=500, stateful_step_count=40,
                                            report_multiple_bugs=False)
TestQueueModel = QueueModel.TestCase
