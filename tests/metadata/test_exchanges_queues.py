"""Exchange, queue and binding commands, with RabbitMQ's exact reply texts.

Every text in the VERIFIED tables was observed from RabbitMQ 3.10.8 with pika
(see docs/metadata.md for how); rows marked ours are texts RabbitMQ has no
counterpart for.
"""
from __future__ import annotations

from typing import Any

import pytest

from broker.metadata import (
    Bind,
    BindingRemoved,
    Bootstrap,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteExclusiveQueues,
    DeleteQueue,
    ExchangeDeclareOk,
    ExchangeDeleted,
    InvalidCommand,
    LeaderChanged,
    MembersChanged,
    QueueDeclared,
    QueueDeclareOk,
    QueueDeleted,
    QueueDeleteOk,
    SetQueueLeader,
    SetQueueMembers,
    Unbind,
    new_state,
)
from broker.metadata.commands import AddVhost, DeleteVhost, VhostDeleted

from .helpers import Driver

N = ("n1", "n2", "n3")


def Q(name: str, **kw: Any) -> DeclareQueue:
    kw.setdefault("members", N if kw.get("arguments", {}).get("x-queue-type") == "quorum" else N[:1])
    return DeclareQueue("/", name, **kw)


QQ = {"x-queue-type": "quorum"}


@pytest.fixture
def d() -> Driver:
    drv = Driver()
    drv.ok(DeclareExchange("/", "x1", "direct", durable=False))
    drv.ok(DeclareExchange("/", "x2", "direct", durable=False, arguments={"alternate-exchange": "ae"}))
    drv.ok(Q("q1", durable=True))
    drv.ok(Q("q5", arguments={"x-max-length": 10, "x-message-ttl": 1000, "x-single-active-consumer": False}))
    drv.ok(Q("qq", arguments=QQ))
    return drv


VERIFIED: list[tuple[str, Any, int, str]] = [
    ("amq prefix", DeclareExchange("/", "amq.foo", "direct"), 403,
     "ACCESS_REFUSED - exchange name 'amq.foo' contains reserved prefix 'amq.*'"),
    ("default declare", DeclareExchange("/", "", "direct"), 403,
     "ACCESS_REFUSED - operation not permitted on the default exchange"),
    ("unknown type", DeclareExchange("/", "x9", "foo"), 503,
     "COMMAND_INVALID - invalid exchange type 'foo'"),
    ("x type", DeclareExchange("/", "x1", "fanout", durable=False), 406,
     "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'x1' in vhost '/': received 'fanout' but current is 'direct'"),
    ("x durable", DeclareExchange("/", "x1", "direct", durable=True), 406,
     "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'x1' in vhost '/': received 'true' but current is 'false'"),
    ("x auto_delete", DeclareExchange("/", "x1", "direct", durable=False, auto_delete=True), 406,
     "PRECONDITION_FAILED - inequivalent arg 'auto_delete' for exchange 'x1' in vhost '/': received 'true' but current is 'false'"),
    ("x internal", DeclareExchange("/", "x1", "direct", durable=False, internal=True), 406,
     "PRECONDITION_FAILED - inequivalent arg 'internal' for exchange 'x1' in vhost '/': received 'true' but current is 'false'"),
    ("x ae added", DeclareExchange("/", "x1", "direct", durable=False, arguments={"alternate-exchange": "ae"}), 406,
     "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'x1' in vhost '/': received the value 'ae' of type 'longstr' but current is none"),
    ("x ae removed", DeclareExchange("/", "x2", "direct", durable=False), 406,
     "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'x2' in vhost '/': received none but current is the value 'ae' of type 'longstr'"),
    ("x ae changed", DeclareExchange("/", "x2", "direct", durable=False, arguments={"alternate-exchange": "ae2"}), 406,
     "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'x2' in vhost '/': received 'ae2' but current is 'ae'"),
    ("amq.direct durable", DeclareExchange("/", "amq.direct", "direct", durable=False), 406,
     "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'amq.direct' in vhost '/': received 'false' but current is 'true'"),
    ("passive missing x", DeclareExchange("/", "nope", passive=True), 404,
     "NOT_FOUND - no exchange 'nope' in vhost '/'"),
    ("passive missing amq.x", DeclareExchange("/", "amq.nope", passive=True), 404,
     "NOT_FOUND - no exchange 'amq.nope' in vhost '/'"),
    ("delete amq.direct", DeleteExchange("/", "amq.direct"), 403,
     "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed"),
    ("delete default", DeleteExchange("/", ""), 403,
     "ACCESS_REFUSED - operation not permitted on the default exchange"),
    ("queue amq prefix", Q("amq.q"), 403,
     "ACCESS_REFUSED - queue name 'amq.q' contains reserved prefix 'amq.*'"),
    ("q durable", Q("q1", durable=False), 406,
     "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q1' in vhost '/': received 'false' but current is 'true'"),
    ("q auto_delete", Q("q1", auto_delete=True), 406,
     "PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue 'q1' in vhost '/': received 'true' but current is 'false'"),
    ("q exclusive", Q("q1", exclusive_owner="conn-1"), 405,
     "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'q1' in vhost '/'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration."),
    ("q max-length added", Q("q1", arguments={"x-max-length": 10}), 406,
     "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q1' in vhost '/': received the value '10' of type 'signedint' but current is none"),
    ("q max-length long", Q("q1", arguments={"x-max-length": 10**12}), 406,
     "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q1' in vhost '/': received the value '1000000000000' of type 'long' but current is none"),
    ("q type quorum", Q("q1", arguments=QQ), 406,
     "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q1' in vhost '/': received the value 'quorum' of type 'longstr' but current is none"),
    ("q dlx", Q("q1", arguments={"x-dead-letter-exchange": "d"}), 406,
     "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'q1' in vhost '/': received the value 'd' of type 'longstr' but current is none"),
    ("q sac", Q("q1", arguments={"x-single-active-consumer": True}), 406,
     "PRECONDITION_FAILED - inequivalent arg 'x-single-active-consumer' for queue 'q1' in vhost '/': received the value 'true' of type 'bool' but current is none"),
    ("q max-length changed", Q("q5", arguments={"x-max-length": 20, "x-message-ttl": 1000, "x-single-active-consumer": False}), 406,
     "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q5' in vhost '/': received '20' but current is '10'"),
    ("q ttl as string", Q("q5", arguments={"x-max-length": 10, "x-message-ttl": "1000", "x-single-active-consumer": False}), 406,
     "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q5' in vhost '/': received '1000' but current is '1000'"),
    ("q sac changed", Q("q5", arguments={"x-max-length": 10, "x-message-ttl": 1000, "x-single-active-consumer": True}), 406,
     "PRECONDITION_FAILED - inequivalent arg 'x-single-active-consumer' for queue 'q5' in vhost '/': received 'true' but current is 'false'"),
    ("qq no type", Q("qq", members=N), 406,
     "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'qq' in vhost '/': received none but current is the value 'quorum' of type 'longstr'"),
    ("qq classic", Q("qq", arguments={"x-queue-type": "classic"}), 406,
     "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'qq' in vhost '/': received 'classic' but current is 'quorum'"),
    ("qq non-durable redeclare", Q("qq", durable=False, arguments=QQ), 406,
     "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'qq' in vhost '/': received 'false' but current is 'true'"),
    ("qq2 non-durable", Q("qq2", durable=False, arguments=QQ), 406,
     "PRECONDITION_FAILED - invalid property 'non-durable' for queue 'qq2' in vhost '/'"),
    ("qq2 auto-delete", Q("qq2", auto_delete=True, arguments=QQ), 406,
     "PRECONDITION_FAILED - invalid property 'auto-delete' for queue 'qq2' in vhost '/'"),
    ("qq2 exclusive", Q("qq2", exclusive_owner="c1", arguments=QQ), 406,
     "PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue 'qq2' in vhost '/'"),
    ("qq2 all bad", Q("qq2", durable=False, exclusive_owner="c1", auto_delete=True, arguments=QQ), 406,
     "PRECONDITION_FAILED - invalid property 'auto-delete' for queue 'qq2' in vhost '/'"),
    ("qq3 exclusive+transient", Q("qq3", durable=False, exclusive_owner="c1", arguments=QQ), 406,
     "PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue 'qq3' in vhost '/'"),
    ("qq server-named", Q("amq.gen-abc", server_named=True, arguments=QQ), 406,
     "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue"),
    ("qq server-named exclusive", Q("amq.gen-abc", server_named=True, exclusive_owner="c1", arguments=QQ), 406,
     "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue"),
    ("unsupported type", Q("q3", arguments={"x-queue-type": "foo"}), 406,
     "PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue 'q3' in vhost '/': \"unsupported queue type 'foo'\""),
    ("amq.gen by name", Q("amq.gen-foo"), 403,
     "ACCESS_REFUSED - queue name 'amq.gen-foo' contains reserved prefix 'amq.*'"),
    ("passive missing q", DeclareQueue("/", "nope", passive=True), 404,
     "NOT_FOUND - no queue 'nope' in vhost '/'"),
    ("bind missing x", Bind("/", "nope", "q1", routing_key="rk"), 404,
     "NOT_FOUND - no exchange 'nope' in vhost '/'"),
    ("bind missing q", Bind("/", "amq.direct", "nope", routing_key="rk"), 404,
     "NOT_FOUND - no queue 'nope' in vhost '/'"),
    ("bind default", Bind("/", "", "q1", routing_key="rk"), 403,
     "ACCESS_REFUSED - operation not permitted on the default exchange"),
    ("unbind default", Unbind("/", "", "q1", routing_key="q1"), 403,
     "ACCESS_REFUSED - operation not permitted on the default exchange"),
    ("bind bad x-match", Bind("/", "amq.headers", "q1", arguments={"x-match": "foo"}), 406,
     "PRECONDITION_FAILED - Invalid x-match field value <<\"foo\">>; expected all, any, all-with-x, or any-with-x"),
    ("e2e missing destination", Bind("/", "amq.direct", "nope", "exchange", "rk"), 404,
     "NOT_FOUND - no exchange 'nope' in vhost '/'"),
    ("e2e missing source", Bind("/", "nope", "x1", "exchange", "rk"), 404,
     "NOT_FOUND - no exchange 'nope' in vhost '/'"),
]


@pytest.mark.parametrize("label,command,code,text", VERIFIED, ids=[r[0] for r in VERIFIED])
def test_refusals_match_rabbitmq(d: Driver, label: str, command: Any, code: int, text: str) -> None:
    before = (dict(d.state.exchanges), dict(d.state.queues), {k: dict(v) for k, v in d.state.bindings.items()})
    err = d.err(command)
    assert (err.code, err.reply_text) == (code, text)
    assert err.hard == (code == 503)
    assert d.effects == []
    # a refusal leaves the state as it was
    after = (dict(d.state.exchanges), dict(d.state.queues), {k: dict(v) for k, v in d.state.bindings.items()})
    assert after == before


ACCEPTED: list[tuple[str, Any]] = [
    ("amq.direct equivalent redeclare", DeclareExchange("/", "amq.direct", "direct", durable=True)),
    ("amq.direct passive", DeclareExchange("/", "amq.direct", passive=True)),
    ("exchange non-equivalence arg ignored", DeclareExchange("/", "x1", "direct", durable=False, arguments={"foo": "bar"})),
    ("queue unchecked arg", Q("q1", arguments={"x-foo": 10})),
    ("queue classic type equals none", Q("q1", arguments={"x-queue-type": "classic"})),
    ("q5 int width ignored", Q("q5", arguments={"x-max-length": 10, "x-message-ttl": 1000, "x-single-active-consumer": False})),
    ("delete missing exchange", DeleteExchange("/", "nope")),
    ("delete missing queue", DeleteQueue("/", "nope")),
    ("delete missing amq queue", DeleteQueue("/", "amq.q")),
    ("unbind missing binding", Unbind("/", "amq.direct", "q1", routing_key="zzz")),
    ("unbind missing queue", Unbind("/", "amq.direct", "nope", routing_key="zzz")),
    ("unbind missing exchange", Unbind("/", "nope", "q1", routing_key="zzz")),
    ("classic non-durable", Q("qc2", durable=False, arguments={"x-queue-type": "classic"})),
]


@pytest.mark.parametrize("label,command", ACCEPTED, ids=[r[0] for r in ACCEPTED])
def test_accepted_like_rabbitmq(d: Driver, label: str, command: Any) -> None:
    d.ok(command)


def test_in_use_and_not_empty(d: Driver) -> None:
    d.ok(Bind("/", "x1", "q1", routing_key="rk"))
    assert d.err(DeleteExchange("/", "x1", if_unused=True)).reply_text == (
        "PRECONDITION_FAILED - exchange 'x1' in vhost '/' in use")
    assert d.err(DeleteQueue("/", "q1", if_empty=True, message_count=1)).reply_text == (
        "PRECONDITION_FAILED - queue 'q1' in vhost '/' not empty")
    assert d.err(DeleteQueue("/", "q1", if_unused=True, consumer_count=1)).reply_text == (
        "PRECONDITION_FAILED - queue 'q1' in vhost '/' in use")
    # counts of zero pass the same checks
    reply = d.ok(DeleteQueue("/", "q1", if_unused=True, if_empty=True))
    assert isinstance(reply, QueueDeleteOk) and reply.record is not None
    assert reply.record.name == "q1"


def test_server_named_queue_redeclared_by_name_is_refused() -> None:
    d = Driver()
    d.ok(DeclareQueue("/", "amq.gen-1", durable=False, exclusive_owner="c1", server_named=True, members=N[:1]))
    # verified: even the owner cannot redeclare it by name (it is no longer server-named)
    err = d.err(DeclareQueue("/", "amq.gen-1", durable=False, exclusive_owner="c1", members=N[:1]))
    assert err.reply_text == "ACCESS_REFUSED - queue name 'amq.gen-1' contains reserved prefix 'amq.*'"
    d.ok(DeclareQueue("/", "amq.gen-1", passive=True, exclusive_owner="c1"))


def test_unknown_command_is_a_bug() -> None:
    from broker.metadata import CommandMeta, apply

    with pytest.raises(InvalidCommand):
        apply(CommandMeta(1, 1), object(), Driver().state)  # type: ignore[arg-type]


def test_declare_records_and_effects() -> None:
    d = Driver()
    reply = d.ok(DeclareQueue("/", "qq", arguments=QQ, members=N, leader="n2"))
    assert isinstance(reply, QueueDeclareOk) and reply.created
    r = reply.record
    assert (r.type, r.members, r.leader, r.created_at, r.durable) == ("quorum", N, "n2", 1000, True)
    assert d.effects == [QueueDeclared(r)]
    again = d.ok(DeclareQueue("/", "qq", arguments=QQ, members=("n9",)))
    assert isinstance(again, QueueDeclareOk) and not again.created and again.record == r
    assert d.effects == []
    passive = d.ok(DeclareQueue("/", "qq", passive=True))
    assert passive.record == r
    x = d.ok(DeclareExchange("/", "e", "topic"))
    assert isinstance(x, ExchangeDeclareOk) and x.created and x.record.type == "topic"


def test_relaxed_checks_ignore_queue_type() -> None:
    d = Driver()
    d.ok(Q("qq", arguments=QQ))
    d.err(Q("qq", arguments={"x-queue-type": "classic"}))
    d.ok(Q("qq", arguments={"x-queue-type": "classic"}, relaxed_checks=True))
    # relaxed checks do not relax anything else
    assert d.err(Q("qq", durable=False, arguments=QQ, relaxed_checks=True)).code == 406


def test_vhost_default_queue_type() -> None:
    d = Driver()
    d.ok(AddVhost("v", default_queue_type="quorum"))
    r = d.ok(DeclareQueue("v", "q", members=N)).record
    assert r.type == "quorum"
    # redeclaring without x-queue-type is equivalent on that vhost
    d.ok(DeclareQueue("v", "q", members=N))
    # exclusive / transient / server-named declarations stay classic
    assert d.ok(DeclareQueue("v", "e", exclusive_owner="c", members=N[:1])).record.type == "classic"
    assert d.ok(DeclareQueue("v", "t", durable=False, members=N[:1])).record.type == "classic"
    assert d.ok(DeclareQueue("v", "amq.gen-1", server_named=True, members=N[:1])).record.type == "classic"
    # an explicit type wins over the default
    assert d.ok(DeclareQueue("v", "c", arguments={"x-queue-type": "classic"}, members=N[:1])).record.type == "classic"
    assert d.err(AddVhost("w", default_queue_type="stream")).code == 406  # type: ignore[arg-type]


LOCKED = (
    "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'ex' in vhost '/'. It could "
    "be originally declared on another connection or the exclusive property value does not match "
    "that of the original declaration."
)


def test_exclusive_queue_access() -> None:
    d = Driver()
    d.ok(DeclareQueue("/", "ex", durable=False, exclusive_owner="c1", members=N[:1]))
    # verified: passive declare, bind and delete from another connection
    assert d.err(DeclareQueue("/", "ex", passive=True, exclusive_owner="c2")).reply_text == LOCKED
    assert d.err(DeclareQueue("/", "ex", passive=True)).reply_text == LOCKED
    d.ok(DeclareQueue("/", "ex", passive=True, exclusive_owner="c1"))
    assert d.err(Bind("/", "amq.direct", "ex", owner="c2")).reply_text == LOCKED
    d.ok(Bind("/", "amq.direct", "ex", routing_key="k", owner="c1"))
    assert d.err(DeleteQueue("/", "ex", owner="c2")).reply_text == LOCKED
    d.ok(DeclareQueue("/", "ex2", durable=False, exclusive_owner="c1", members=N[:1]))
    d.ok(DeclareQueue("/", "other", exclusive_owner="c2", durable=False, members=N[:1]))
    d.ok(DeleteExclusiveQueues("c1"))
    deleted = sorted(e.record.name for e in d.effects if isinstance(e, QueueDeleted))
    assert deleted == ["ex", "ex2"]
    assert [e for e in d.effects if isinstance(e, BindingRemoved)]
    assert ("/", "other") in d.state.queues and ("/", "ex") not in d.state.queues


def test_deletes_cascade_bindings_and_auto_delete() -> None:
    d = Driver()
    d.ok(DeclareExchange("/", "ad", "fanout", auto_delete=True))
    d.ok(DeclareExchange("/", "mid", "fanout"))
    d.ok(Q("a"))
    d.ok(Q("b"))
    d.ok(Bind("/", "ad", "a"))
    d.ok(Bind("/", "ad", "b"))
    d.ok(Bind("/", "mid", "ad", "exchange"))
    d.ok(Bind("/", "ad", "mid", "exchange"))  # a cycle is a valid topology
    d.ok(DeleteQueue("/", "a"))
    assert ("/", "ad") in d.state.exchanges  # still has bindings
    d.ok(Unbind("/", "ad", "mid", "exchange"))
    assert ("/", "ad") in d.state.exchanges
    d.ok(DeleteQueue("/", "b"))  # last source binding of 'ad' goes with 'b'
    assert ExchangeDeleted("/", "ad") in d.effects
    assert ("/", "ad") not in d.state.exchanges
    assert d.state.bindings_to("/", "exchange", "ad") == []
    assert d.state.bindings_from("/", "mid") == []


def test_unbind_last_binding_deletes_auto_delete_exchange() -> None:
    d = Driver()
    d.ok(DeclareExchange("/", "ad", "direct", auto_delete=True))
    d.ok(Q("a"))
    d.ok(Bind("/", "ad", "a", routing_key="k"))
    d.ok(Unbind("/", "ad", "a", routing_key="k"))
    assert ExchangeDeleted("/", "ad") in d.effects


def test_members_and_leader() -> None:
    d = Driver()
    d.ok(Q("qq", arguments=QQ))
    d.ok(SetQueueMembers("/", "qq", ("n1", "n2", "n4")))
    assert d.effects == [MembersChanged("/", "qq", N, ("n1", "n2", "n4"))]
    d.ok(SetQueueMembers("/", "qq", ("n2", "n4")))  # leader n1 removed -> unknown
    assert LeaderChanged("/", "qq", None) in d.effects
    assert d.state.queues[("/", "qq")].leader is None
    d.ok(SetQueueLeader("/", "qq", "n4"))
    assert d.effects == [LeaderChanged("/", "qq", "n4")]
    d.ok(SetQueueLeader("/", "qq", "n4"))
    assert d.effects == []  # idempotent
    assert d.err(SetQueueLeader("/", "qq", "n9")).code == 406
    assert d.err(SetQueueMembers("/", "nope", ("n1",))).reply_text == "NOT_FOUND - no queue 'nope' in vhost '/'"
    with pytest.raises(InvalidCommand):
        SetQueueMembers("/", "qq", ())
    with pytest.raises(InvalidCommand):
        DeclareQueue("/", "x")  # no members
    with pytest.raises(InvalidCommand):
        DeclareQueue("/", "x", members=("a",), leader="b")


def test_a_late_report_of_an_earlier_election_never_overwrites_a_later_one() -> None:
    """Leaders of successive terms report themselves asynchronously: the
    record keeps the latest term's leader whatever order the reports land in."""
    d = Driver()
    d.ok(Q("qq", arguments=QQ))
    d.ok(SetQueueMembers("/", "qq", ("n1", "n2", "n3")))
    d.ok(SetQueueLeader("/", "qq", "n3", 7))
    assert d.state.queues[("/", "qq")].leader == "n3"
    d.ok(SetQueueLeader("/", "qq", "n2", 5))  # elected earlier, reported later
    assert d.effects == []
    record = d.state.queues[("/", "qq")]
    assert (record.leader, record.leader_term) == ("n3", 7)
    d.ok(SetQueueLeader("/", "qq", "n2", 8))
    assert d.effects == [LeaderChanged("/", "qq", "n2")]
    d.ok(SetQueueLeader("/", "qq", "n2", 9))  # re-elected: the term moves, no change
    assert d.effects == [] and d.state.queues[("/", "qq")].leader_term == 9
    d.ok(SetQueueLeader("/", "qq", "n1"))  # term unknown (0): applied as before
    assert d.state.queues[("/", "qq")].leader == "n1"


def test_a_report_of_an_earlier_raft_configuration_never_overwrites_a_later_one() -> None:
    """Membership changes report the committed Raft configuration and its
    index; reports race, and the record keeps the latest configuration's
    members whatever order they land in (a stale list would make a voter
    delete its replica). A report about an earlier queue of that name (other
    created_at) changes nothing."""
    d = Driver()
    d.ok(Q("qq", arguments=QQ))
    created = d.state.queues[("/", "qq")].created_at
    d.ok(SetQueueMembers("/", "qq", ("n1", "n2", "n3", "n4"), 40, created))
    assert d.effects == [MembersChanged("/", "qq", N, ("n1", "n2", "n3", "n4"))]
    assert d.state.queues[("/", "qq")].members_index == 40
    d.ok(SetQueueMembers("/", "qq", ("n1", "n3", "n4"), 57, created))  # n2 removed at 57
    d.ok(SetQueueMembers("/", "qq", ("n1", "n2", "n3", "n4"), 40, created))  # late: the add at 40
    assert d.effects == []
    record = d.state.queues[("/", "qq")]
    assert (record.members, record.members_index) == (("n1", "n3", "n4"), 57)
    d.ok(SetQueueMembers("/", "qq", ("n1", "n3", "n4"), 57, created))  # same index: same list
    assert d.effects == []
    d.ok(SetQueueMembers("/", "qq", ("n1", "n3"), 90, created + 1))  # another incarnation
    assert d.effects == [] and d.state.queues[("/", "qq")].members == ("n1", "n3", "n4")
    d.ok(SetQueueMembers("/", "qq", ("n1", "n3"), 90, created))
    assert d.effects == [MembersChanged("/", "qq", ("n1", "n3", "n4"), ("n1", "n3"))]
    d.ok(SetQueueMembers("/", "qq", ("n1", "n3"), 0, created))  # the bootstrap configuration
    assert d.effects == [] and d.state.queues[("/", "qq")].members == ("n1", "n3")
    d.ok(SetQueueMembers("/", "qq", ("n1", "n2")))  # unindexed (older broker): applied
    record = d.state.queues[("/", "qq")]
    assert (record.members, record.members_index) == (("n1", "n2"), 90)
    d.ok(SetQueueMembers("/", "qq", ("n1", "n3"), 90, created))  # the same index repairs it
    assert d.effects == [MembersChanged("/", "qq", ("n1", "n2"), ("n1", "n3"))]


def test_bootstrap_and_vhosts() -> None:
    d = Driver(new_state())
    assert d.state.vhosts == {}
    d.ok(Bootstrap("hash"))
    assert set(d.state.exchanges) == {("/", n) for n in ("", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match")}
    assert d.state.users["guest"].tags == ("administrator",)
    p = d.state.permissions[("guest", "/")]
    assert (p.configure, p.write, p.read) == (".*", ".*", ".*")
    d.ok(Bootstrap("other"))  # no-op once initialised
    assert d.state.users["guest"].password_hash == "hash"
    d.ok(AddVhost("v"))
    d.ok(DeclareQueue("v", "q", members=N[:1]))
    d.ok(Bind("v", "amq.fanout", "q"))
    d.ok(DeleteVhost("v"))
    assert VhostDeleted("v") in d.effects
    assert any(isinstance(e, QueueDeleted) for e in d.effects)
    assert not any(k[0] == "v" for k in list(d.state.exchanges) + list(d.state.queues))
    assert d.err(DeleteVhost("v")).reply_text == "NOT_FOUND - no vhost 'v'"
    assert d.err(DeclareQueue("v", "q", members=N[:1])).code == 404
