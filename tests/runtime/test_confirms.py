"""Publisher confirms, delivery tags and nack grouping (runtime/confirms.py) as
transcripts, tables and properties; then the channel's use of them with a fake
connection (exact frames, reply codes and texts).

Confirm transcripts, one line per step:

    > publish queues=N      the channel's next sequence number (1, 2, ...) goes to N queues
    > ok SEQ                one target queue accepted SEQ
    > refuse SEQ            one target queue refused SEQ (SEQ will be nacked)
    ! flush                 the connection flushes: settled_confirms(outstanding)
    < ack SEQ [multiple]    the next frame sent
    < nack SEQ
    < nothing               no (more) frames from this flush
    = unconfirmed N         publishes still waiting for a queue
"""

from __future__ import annotations

from collections import OrderedDict, deque
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands as C

from broker import queue as qm
from broker.amqp import NEED_DATA, PAUSED, ServerConnection
from broker.amqp import events as ev
from broker.queue.types import ChannelRef, ConsumerId, MsgId
from broker.runtime.channel import Channel, ChannelError
from broker.runtime.confirms import (
    ACK,
    NACK,
    Confirm,
    claim_acked,
    group_by_consumer,
    settled_confirms,
    take_acked,
    take_tags,
    unconfirmed,
    unknown_tag_text,
)
from broker.runtime.msg_stats import NodeStats
from broker.runtime.queues import QueueProcess
from tests.amqp.helpers import method, parse_frames

# ---------------------------------------------------------------- confirm transcripts
CONFIRM_TRANSCRIPTS = {
    "one publish, one queue": """
        > publish queues=1
        ! flush
        < nothing
        > ok 1
        ! flush
        < ack 1 multiple
        ! flush
        < nothing
    """,
    "acks fold into one multiple ack, up to the first unsettled": """
        > publish queues=1
        > publish queues=1
        > publish queues=1
        > ok 3
        > ok 1
        = unconfirmed 1
        ! flush
        < ack 1 multiple
        > ok 2
        ! flush
        < ack 3 multiple
        = unconfirmed 0
    """,
    "nothing goes out while the oldest publish waits": """
        > publish queues=1
        > publish queues=1
        > ok 2
        ! flush
        < nothing
        > ok 1
        ! flush
        < ack 2 multiple
    """,
    "a nack flushes the acks before it and goes alone": """
        > publish queues=1
        > publish queues=1
        > publish queues=1
        > publish queues=1
        > ok 1
        > refuse 2
        > ok 3
        > ok 4
        ! flush
        < ack 1
        < nack 2
        < ack 4 multiple
    """,
    "a run of acks before a nack is one multiple ack": """
        > publish queues=1
        > publish queues=1
        > publish queues=1
        > ok 1
        > ok 2
        > refuse 3
        ! flush
        < ack 2 multiple
        < nack 3
    """,
    "nacks are never folded": """
        > publish queues=1
        > publish queues=1
        > refuse 1
        > refuse 2
        ! flush
        < nack 1
        < nack 2
    """,
    "a nack first, then acks": """
        > publish queues=1
        > publish queues=1
        > refuse 1
        > ok 2
        ! flush
        < nack 1
        < ack 2 multiple
    """,
    "two queues: confirmed once both reported, nacked if either refused": """
        > publish queues=2
        > publish queues=2
        > ok 1
        > ok 2
        ! flush
        < nothing
        = unconfirmed 2
        > refuse 1
        ! flush
        < nack 1
        > ok 2
        ! flush
        < ack 2 multiple
    """,
    "an unroutable publish is acked at once, in its turn": """
        > publish queues=1
        > publish queues=0
        ! flush
        < nothing
        > ok 1
        ! flush
        < ack 2 multiple
    """,
}


def _run_confirm_transcript(text: str) -> None:
    out: deque[Confirm] = deque()
    by_seq: dict[int, Confirm] = {}
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    i = 0
    while i < len(lines):
        line = lines[i]
        words = line.split()
        i += 1
        if words[:2] == [">", "publish"]:
            seq = len(by_seq) + 1
            c = by_seq[seq] = Confirm(seq, int(words[2].removeprefix("queues=")))
            out.append(c)
        elif words[0] == ">" and words[1] in ("ok", "refuse"):
            c = by_seq[int(words[2])]
            assert c.remaining > 0, line
            if words[1] == "refuse":
                c.nack = True
            c.remaining -= 1
        elif words == ["!", "flush"]:
            before = list(out)
            frames, acked = settled_confirms(out)
            popped = before[:len(before) - len(out)]
            assert acked == sum(1 for c in popped if not c.nack)
            expected: list[tuple[str, int, bool]] = []
            while i < len(lines) and lines[i].startswith("<"):
                exp = lines[i].split()
                i += 1
                if exp[1:] != ["nothing"]:
                    expected.append((exp[1], int(exp[2]), exp[3:] == ["multiple"]))
            assert frames == expected, f"after step {i} of {text}"
        elif words[:2] == ["=", "unconfirmed"]:
            assert unconfirmed(out) == int(words[2]), line
        else:
            raise AssertionError(f"bad transcript line {line!r}")


@pytest.mark.parametrize("name", list(CONFIRM_TRANSCRIPTS))
def test_confirm_transcript(name: str) -> None:
    _run_confirm_transcript(CONFIRM_TRANSCRIPTS[name])


def test_frame_kinds_are_the_constants() -> None:
    out = deque([Confirm(1, 0), Confirm(2, 0)])
    out[1].nack = True
    frames, _ = settled_confirms(out)
    assert [f[0] for f in frames] == [ACK, NACK]
    assert frames[0][0] is ACK and frames[1][0] is NACK  # the channel compares with `is`


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.data())
def test_every_publish_is_confirmed_once_in_order_and_multiple_acks_cover_only_accepted(
        data: st.DataObject) -> None:
    """A client's view (pika, aio-pika): an ack with `multiple` confirms every
    seq it still has unconfirmed up to the tag. Whatever order the queues
    report in and wherever the flushes fall: every seq is confirmed exactly
    once, with its true outcome, in sequence order, and an ack never covers a
    refused or still unsettled publish."""
    targets = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=25), label="targets")
    total = sum(targets)
    oks = data.draw(st.lists(st.booleans(), min_size=total, max_size=total), label="outcomes")
    outcomes: dict[int, list[bool]] = {}
    for seq, n in enumerate(targets, 1):
        outcomes[seq], oks = oks[:n], oks[n:]
    # (0 publish, 1 a queue reports, 2 flush; which waiting publish reports)
    steps = data.draw(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 99)), max_size=150),
                      label="steps")
    out: deque[Confirm] = deque()
    by_seq: dict[int, Confirm] = {}
    reported: dict[int, int] = {}
    client_unconfirmed: set[int] = set()
    confirmed: dict[int, str] = {}

    def flush() -> None:
        frames, acked = settled_confirms(out)
        acks = 0
        last = 0
        for kind, tag, multiple in frames:
            assert tag > last, frames  # in order, never the same seq twice
            last = tag
            assert tag in client_unconfirmed, (tag, frames)
            if kind == NACK:
                assert not multiple
                covered = {tag}
            else:
                covered = {s for s in client_unconfirmed if s <= tag} if multiple else {tag}
            for s in covered:
                c = by_seq[s]
                assert c.remaining == 0, (s, frames)  # never confirmed before every queue reported
                assert c.nack == (kind == NACK), (s, kind, frames)
                assert s not in confirmed
                confirmed[s] = kind
            acks += len(covered) if kind == ACK else 0
            client_unconfirmed.difference_update(covered)
        assert acked == acks
        # confirms go out in sequence order: what is confirmed is a prefix
        assert sorted(confirmed) == list(range(1, len(confirmed) + 1))

    published = 0

    def step(choice: int, pick: int) -> None:
        nonlocal published
        waiting = [s for s in reported if reported[s] < targets[s - 1]]
        if choice == 0 and published < len(targets):
            published += 1
            out.append(Confirm(published, targets[published - 1]))
            by_seq[published] = out[-1]
            reported[published] = 0
            client_unconfirmed.add(published)
        elif choice == 1 and waiting:
            s = waiting[pick % len(waiting)]
            c = by_seq[s]
            if not outcomes[s][reported[s]]:
                c.nack = True
            reported[s] += 1
            c.remaining -= 1
        else:
            flush()

    for choice, pick in steps:
        step(choice, pick)
    # then whatever is left: the remaining publishes, the newest reports first
    while published < len(targets):
        step(0, 0)
    while any(reported[s] < targets[s - 1] for s in reported):
        step(1, -1)
    flush()
    assert not out and not client_unconfirmed
    assert confirmed == {s: NACK if not all(ok) else ACK for s, ok in outcomes.items()}


# ---------------------------------------------------------------- delivery tags
UNKNOWN = "unknown"


@pytest.mark.parametrize(("tags", "tag", "multiple", "taken", "left"), [
    # one tag
    ([1, 2, 3], 2, False, [2], [1, 3]),
    ([1, 2, 3], 4, False, UNKNOWN, [1, 2, 3]),
    ([1, 2, 3], 0, False, UNKNOWN, [1, 2, 3]),
    ([], 1, False, UNKNOWN, []),
    # multiple: every tag up to it
    ([1, 2, 3], 2, True, [1, 2], [3]),
    ([1, 2, 3], 3, True, [1, 2, 3], []),
    # ... and the tag itself must be outstanding (RabbitMQ 3.10.8 closes the
    # channel, 406 "unknown delivery tag 3", after tag 3 alone was acked)
    ([1, 2, 3], 9, True, UNKNOWN, [1, 2, 3]),     # above the newest
    ([2, 3, 5], 4, True, UNKNOWN, [2, 3, 5]),     # not outstanding, though tags below it are
    ([3, 4], 2, True, UNKNOWN, [3, 4]),           # below the oldest
    ([], 1, True, UNKNOWN, []),
    # multiple with tag 0: everything, even nothing
    ([1, 2, 3], 0, True, [1, 2, 3], []),
    ([], 0, True, [], []),
])
def test_take_acked(tags: list[int], tag: int, multiple: bool, taken: Any, left: list[int]) -> None:
    unacked = OrderedDict((t, f"d{t}") for t in tags)
    got = take_acked(unacked, tag, multiple)
    if taken == UNKNOWN:
        assert got is None
    else:
        assert got == [f"d{t}" for t in taken]
    assert list(unacked) == left


def test_a_tag_acked_twice_is_unknown_the_second_time() -> None:
    unacked = OrderedDict([(1, "a"), (2, "b")])
    assert take_acked(unacked, 1, False) == ["a"]
    assert take_acked(unacked, 1, False) is None
    assert take_acked(unacked, 1, True) is None  # not outstanding any more
    assert unknown_tag_text(1) == "unknown delivery tag 1"


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 40), unique=True).map(sorted), st.integers(0, 45), st.booleans())
def test_take_acked_matches_the_rule(tags: list[int], tag: int, multiple: bool) -> None:
    """multiple: the tags up to `tag` (0: all), unknown if `tag` (not 0) is
    not outstanding; single: that tag, unknown if it is not outstanding."""
    unacked = OrderedDict((t, t) for t in tags)
    got = take_acked(unacked, tag, multiple)
    if multiple:
        want = list(tags) if tag == 0 else [t for t in tags if t <= tag]
        if tag != 0 and tag not in tags:
            assert got is None and list(unacked) == tags
            return
    else:
        want = [tag] if tag in tags else []
        if not want:
            assert got is None and list(unacked) == tags
            return
    assert got == want
    assert list(unacked) == [t for t in tags if t not in want]


def test_a_transaction_claims_its_tags_when_they_arrive() -> None:
    """tx mode: each ack/nack/reject is checked at the method against what is
    outstanding minus what the transaction already claimed; nothing leaves
    `unacked` before the commit takes the claimed tags."""
    unacked = OrderedDict((t, f"d{t}") for t in (1, 2, 3, 5))
    claimed: set[int] = set()
    assert claim_acked(unacked, claimed, 2, False) == [2]
    assert claim_acked(unacked, claimed, 2, False) is None  # acked twice in one transaction
    assert claim_acked(unacked, claimed, 4, True) is None  # not outstanding
    assert claim_acked(unacked, claimed, 3, True) == [1, 3]  # 2 is already claimed
    assert claim_acked(unacked, claimed, 0, True) == [5]
    assert claim_acked(unacked, claimed, 0, True) == []
    assert list(unacked) == [1, 2, 3, 5] and claimed == {1, 2, 3, 5}
    assert take_tags(unacked, [2]) == ["d2"]
    unacked.pop(3)  # gone before the commit (its queue was deleted)
    assert take_tags(unacked, [1, 3]) == ["d1"]
    assert list(unacked) == [5]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 30), unique=True).map(sorted),
       st.lists(st.tuples(st.integers(0, 32), st.booleans()), max_size=8))
def test_claims_settle_what_the_same_acks_would_outside_a_transaction(
        tags: list[int], acks: list[tuple[int, bool]]) -> None:
    """Claiming then taking at commit settles exactly what the same acks
    applied one by one would, and refuses at the same ack."""
    direct = OrderedDict((t, t) for t in tags)
    in_tx = OrderedDict((t, t) for t in tags)
    claimed: set[int] = set()
    for tag, multiple in acks:
        want = take_acked(direct, tag, multiple)
        got = claim_acked(in_tx, claimed, tag, multiple)
        if want is None:
            assert got is None
            break
        assert got == want
    take_tags(in_tx, sorted(claimed))
    assert list(in_tx) == list(direct)


# ---------------------------------------------------------------- nack grouping
def test_group_by_consumer_keeps_first_seen_order_and_delivery_order() -> None:
    qa, qb = SimpleNamespace(uid=("/", "a", 1)), SimpleNamespace(uid=("/", "b", 1))
    qa2 = SimpleNamespace(uid=("/", "a", 2))  # 'a' deleted and declared again: another queue
    c1 = ConsumerId(ChannelRef("n/c1/1.1"), "t1")
    c2 = ConsumerId(ChannelRef("n/c1/1.1"), "t2")
    entries = [(qa, c1, 10, 0.0, 0), (qb, c1, 11, 0.0, 0), (qa, c2, 12, 0.0, 0),
               (qa, c1, 13, 0.0, 0), (qa2, c1, 14, 0.0, 0), (qb, c1, 9, 0.0, 0)]
    groups = group_by_consumer(entries)
    assert list(groups.items()) == [
        ((("/", "a", 1), c1), [10, 13]),
        ((("/", "b", 1), c1), [11, 9]),
        ((("/", "a", 1), c2), [12]),
        ((("/", "a", 2), c1), [14]),
    ]
    assert group_by_consumer([]) == {}


# ---------------------------------------------------------------- the channel's use of them
class _Queue(QueueProcess):
    """A queue the channel's acks name (only its uid is read)."""

    def __init__(self, uid: tuple[str, str, int]) -> None:  # no host, no state
        self.vhost, self.name, self.uid = uid[0], uid[1], uid


def _open_amqp(channel: int) -> ServerConnection:
    """A sans-I/O server connection through its handshake, `channel` open."""
    conn = ServerConnection()
    conn.receive_data(b"AMQP\x00\x00\x09\x01" + method(C.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\x00u\x00p")))
    while conn.next_event() is not PAUSED:
        pass
    conn.accept_login()
    conn.receive_data(method(C.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0))
                      + method(C.Connection.Open(virtual_host="/")))
    while conn.next_event() is not PAUSED:
        pass
    conn.accept_open()
    conn.receive_data(method(C.Channel.Open(), channel))
    while conn.next_event() is not NEED_DATA:
        pass
    conn.data_to_send()
    return conn


def _sent(written: list[bytes]) -> list[tuple[str, int, int, bool]]:
    """The confirms in what the channel wrote, decoded."""
    out = []
    for ch, m in parse_frames(b"".join(written)):
        assert isinstance(m, (C.Basic.Ack, C.Basic.Nack)), m
        out.append((m.name.split(".")[-1].lower(), ch, m.delivery_tag, m.multiple))
    return out


class _Host:
    """The least of a ChannelHost (runtime/channel.py) these paths touch."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, Any]] = []
        self.node = SimpleNamespace(incarnation="n1", commands=SimpleNamespace(
            queue_command_reliable=lambda uid, cmd, done=None: self.commands.append((uid, cmd))))
        self.id = "c1"
        self.channel_opens = 0
        self.nstats = NodeStats(self.node)  # type: ignore[arg-type]
        self.amqp = _open_amqp(3)
        self.written: list[Any] = []
        self.failed: list[tuple[Any, ChannelError]] = []
        self.confirms_dirty: set[Any] = set()
        self.settles_dirty: set[Any] = set()

    def write(self, data: Any) -> None:
        self.written.append(data)

    def channel_failed(self, ch: Any, err: ChannelError) -> None:
        self.failed.append((ch, err))


def _channel() -> tuple[Channel, _Host]:
    host = _Host()
    return Channel(host, 3), host  # type: ignore[arg-type]


def test_channel_flush_confirms_writes_the_frames_and_counts_the_acks() -> None:
    ch, host = _channel()
    for seq, nack in ((1, False), (2, True), (3, False), (4, False)):
        c = Confirm(seq, 0)
        c.nack = nack
        ch.outstanding.append(c)
    ch.outstanding.append(Confirm(5, 1))
    ch.flush_confirms()
    assert _sent(host.written) == [("ack", 3, 1, False), ("nack", 3, 2, False), ("ack", 3, 4, True)]
    assert (ch.stats.confirm, ch.totals.confirm) == (3, 3)
    assert [c.seq for c in ch.outstanding] == [5]


def _deliveries(ch: Channel) -> tuple[ConsumerId, ConsumerId]:
    qa, qb = _Queue(("/", "a", 1)), _Queue(("/", "b", 1))
    c1, c2 = ConsumerId(ch.ref, "t1"), ConsumerId(ch.ref, "t2")
    for tag, (q, cid, msg_id) in enumerate([(qa, c1, 10), (qb, c2, 20), (qa, c1, 11), (qa, c1, 12)], 1):
        ch.unacked[tag] = (q, cid, MsgId(msg_id), 0.0, 0)
    ch.next_tag = 5
    return c1, c2


@pytest.mark.parametrize(("call", "text", "method_id"), [
    (lambda ch: ch.ack(9, False), "unknown delivery tag 9", 80),
    (lambda ch: ch.ack(2, True), "unknown delivery tag 2", 80),   # below the oldest (tag 3)
    (lambda ch: ch.nack(9, False, True), "unknown delivery tag 9", 120),
    (lambda ch: ch.nack(0, False, False), "unknown delivery tag 0", 120),
])
def test_channel_unknown_delivery_tag_is_406(call: Any, text: str, method_id: int) -> None:
    """Code, text and the method's class/method ids (basic.ack 60/80,
    basic.nack 60/120) of the channel close; nothing is settled."""
    ch, host = _channel()
    _deliveries(ch)
    ch.ack(2, True)
    with pytest.raises(ChannelError) as info:
        call(ch)
    err = info.value
    assert (err.code, err.text, err.class_id, err.method_id) == (406, text, 60, method_id)
    assert list(ch.unacked) == [3, 4]
    ch.flush_settles()
    assert [type(cmd) for _, cmd in host.commands] == [qm.Settle, qm.Settle]  # the first ack's only


def test_channel_ack_multiple_settles_per_queue_and_consumer() -> None:
    ch, host = _channel()
    c1, c2 = _deliveries(ch)
    ch.ack(3, True)
    assert list(ch.unacked) == [4]
    assert (ch.stats.ack, ch.totals.ack) == (3, 3)
    assert ch.nstats.queue(("/", "a", 1)).ack == 2 and ch.nstats.queue(("/", "b", 1)).ack == 1
    ch.flush_settles()
    assert host.commands == [(("/", "a", 1), qm.Settle(c1, (10, 11))),
                             (("/", "b", 1), qm.Settle(c2, (20,)))]


@pytest.mark.parametrize(("requeue", "cmd"), [(True, qm.Return), (False, qm.Discard)])
def test_channel_nack_multiple_is_one_command_per_queue_and_consumer(requeue: bool, cmd: Any) -> None:
    ch, host = _channel()
    c1, c2 = _deliveries(ch)
    ch.nack(0, True, requeue)
    assert not ch.unacked and ch.stats.ack == 0
    assert host.commands == [(("/", "a", 1), cmd(c1, (10, 11, 12))),
                             (("/", "b", 1), cmd(c2, (20,)))]


def test_channel_reject_of_an_unknown_tag_names_basic_reject() -> None:
    """RabbitMQ's channel close names the method that failed (rabbit_channel:
    `Reason#amqp_error{method = MethodName}`): basic.reject is 60/90. The
    channel used to answer a reject with basic.nack's ids (60/120)."""
    ch, _host = _channel()
    _deliveries(ch)
    for event in (ev.Reject(1, 7, True), ev.Nack(1, 7, False, True)):
        ch._handle(event)
    failed = [(err.code, err.text, err.class_id, err.method_id) for _, err in _host.failed]
    assert failed == [(406, "unknown delivery tag 7", 60, 90), (406, "unknown delivery tag 7", 60, 120)]
    ch.tx = True
    ch._handle(ev.Reject(1, 8, False))  # checked at the method, in a transaction too
    assert [(err.text, err.class_id, err.method_id) for _, err in _host.failed[2:]] == [
        ("unknown delivery tag 8", 60, 90)]
