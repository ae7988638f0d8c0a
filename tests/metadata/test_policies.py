"""Policies and operator policies: validation texts, matching, precedence."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.metadata import (
    ClearOperatorPolicy,
    ClearPolicy,
    DeclareQueue,
    PolicyChanged,
    SetOperatorPolicy,
    SetPolicy,
    effective_definition,
    queue_operator_policy,
    queue_policy,
)
from broker.metadata.commands import AddVhost
from broker.metadata.policies import merge
from broker.metadata.state import PolicyRecord
from broker.metadata.types import freeze_table

from .helpers import Driver

N = ("n1", "n2", "n3")

# Texts verified with `rabbitmqctl set_policy` / `set_operator_policy` on 3.10.8.
VERIFIED: list[tuple[bool, dict[str, Any], str]] = [
    (False, {"foo": 1}, '[{<<"foo">>,1}] are not recognised policy settings'),
    (False, {"max-length": "abc"}, '<<"abc">> is not a valid maximum length'),
    (False, {"max-length": -1}, "-1 is not a valid maximum length"),
    (False, {"message-ttl": "x"}, '<<"x">> is not a valid message TTL'),
    (False, {"message-ttl": -1}, "-1 is not a valid message TTL"),
    (False, {"expires": 0}, "0 is not a valid queue expiry"),
    (False, {"expires": 1.5}, "1.5 is not a valid queue expiry"),
    (False, {"overflow": "foo"}, '<<"foo">> is not a valid overflow value'),
    (False, {"dead-letter-exchange": 1}, "1 is not a valid dead letter exchange name"),
    (False, {"delivery-limit": "x"}, '<<"x">> is not a valid delivery limit'),
    (False, {"max-length-bytes": "x"}, '<<"x">> is not a valid maximum length in bytes'),
    (False, {"dead-letter-strategy": "x"}, '<<"x">> is not a valid dead letter strategy'),
    (False, {"queue-leader-locator": "x"}, '<<"x">> is not a valid queue leader locator value'),
    (False, {"alternate-exchange": 1}, "1 is not a valid alternate exchange name"),
    (False, {}, "no policy provided"),
    (True, {"dead-letter-exchange": "x"}, '[{<<"dead-letter-exchange">>,<<"x">>}] are not recognised policy settings'),
    (True, {"overflow": "drop-head"}, '[{<<"overflow">>,<<"drop-head">>}] are not recognised policy settings'),
    (True, {"foo": 1}, '[{<<"foo">>,1}] are not recognised policy settings'),
    # ours (no 3.10 counterpart): max-length as a boolean, target-group-size 0
    (False, {"max-length": True}, "true is not a valid maximum length"),
    (False, {"target-group-size": 0}, "0 is not a valid target group size"),
]


@pytest.mark.parametrize("operator,definition,text", VERIFIED)
def test_validation_texts(operator: bool, definition: dict[str, Any], text: str) -> None:
    d = Driver()
    cmd = (SetOperatorPolicy if operator else SetPolicy)("/", "p1", "^q", definition)
    err = d.err(cmd)
    assert (err.code, err.text) == (406, text)
    assert not d.state.policies and not d.state.operator_policies


def test_pattern_and_apply_to_validation() -> None:
    d = Driver()
    assert d.err(SetPolicy("/", "p", "^(q", {"max-length": 1})).text.startswith(
        "pattern should be regular expression but is invalid: ")
    assert d.err(SetPolicy("/", "p", "^q", {"max-length": 1}, apply_to="foo")).text.startswith(
        "apply-to 'foo' unrecognised; should be 'queues'")
    assert d.err(SetPolicy("nov", "p", "^q", {"max-length": 1})).reply_text == "NOT_FOUND - no vhost 'nov'"
    assert d.err(ClearPolicy("/", "nope")).text == "Parameter does not exist"  # verified
    assert d.err(ClearOperatorPolicy("/", "nope")).text == "Parameter does not exist"


ACCEPTED = [
    {"dead-letter-routing-key": "x"},  # verified: accepted without a dlx
    {"queue-leader-locator": "balanced", "dead-letter-strategy": "at-least-once"},
    {"delivery-limit": -1},  # 4.x: unlimited
    {"overflow": "reject-publish", "max-length-bytes": 0, "expires": 1, "message-ttl": 0},
    {"target-group-size": 3, "dead-letter-exchange": "dlx"},
]


@pytest.mark.parametrize("definition", ACCEPTED)
def test_accepted_definitions(definition: dict[str, Any]) -> None:
    Driver().ok(SetPolicy("/", "p", "^q", definition))


def test_matching_priority_apply_to_and_ties() -> None:
    d = Driver()
    d.ok(DeclareQueue("/", "qq.orders", arguments={"x-queue-type": "quorum"}, members=N))
    d.ok(DeclareQueue("/", "cq.orders", members=N[:1]))
    q = d.state.queues[("/", "qq.orders")]
    c = d.state.queues[("/", "cq.orders")]
    d.ok(SetPolicy("/", "b-all", "orders", {"max-length": 1}))  # unanchored search
    assert queue_policy(d.state, q).name == "b-all"
    d.ok(SetPolicy("/", "a-all", "orders", {"max-length": 2}))  # tie: first name wins
    assert queue_policy(d.state, q).name == "a-all"
    d.ok(SetPolicy("/", "z-qq", "^qq\\.", {"max-length": 3}, priority=5, apply_to="quorum_queues"))
    assert queue_policy(d.state, q).name == "z-qq"
    assert queue_policy(d.state, c).name == "a-all"  # quorum_queues does not cover classic
    d.ok(SetPolicy("/", "cls", ".*", {"max-length": 4}, priority=9, apply_to="classic_queues"))
    assert queue_policy(d.state, c).name == "cls"
    assert queue_policy(d.state, q).name == "z-qq"
    d.ok(SetPolicy("/", "ex", ".*", {"alternate-exchange": "ae"}, priority=99, apply_to="exchanges"))
    assert queue_policy(d.state, q).name == "z-qq"
    # policies of other vhosts never apply
    d.ok(AddVhost("v"))
    d.ok(SetPolicy("v", "other", ".*", {"max-length": 9}, priority=100))
    assert queue_policy(d.state, q).name == "z-qq"


def test_policy_changed_effect_lists_affected_queues() -> None:
    d = Driver()
    for n in ("a1", "a2", "b1"):
        d.ok(DeclareQueue("/", n, members=N[:1]))
    d.ok(SetPolicy("/", "pa", "^a", {"max-length": 5}))
    assert d.effects == [PolicyChanged((("/", "a1"), ("/", "a2")))]
    d.ok(SetPolicy("/", "pa", "^a", {"max-length": 6}))  # definition change affects them too
    assert d.effects == [PolicyChanged((("/", "a1"), ("/", "a2")))]
    d.ok(SetPolicy("/", "pz", "^zzz", {"max-length": 5}))
    assert d.effects == []
    d.ok(SetOperatorPolicy("/", "op", "1$", {"max-length": 2}))
    assert d.effects == [PolicyChanged((("/", "a1"), ("/", "b1")))]
    d.ok(ClearPolicy("/", "pa"))
    assert d.effects == [PolicyChanged((("/", "a1"), ("/", "a2")))]
    assert queue_operator_policy(d.state, d.state.queues[("/", "b1")]).name == "op"


PRECEDENCE: list[tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None, dict[str, Any]]] = [
    # client argument wins over the policy
    ({"x-max-length": 10}, {"max-length": 5}, None, {"max-length": 10}),
    ({}, {"max-length": 5, "overflow": "reject-publish"}, None, {"max-length": 5, "overflow": "reject-publish"}),
    ({"x-overflow": "drop-head"}, {"overflow": "reject-publish"}, None, {"overflow": "drop-head"}),
    # operator policy: the lower value wins over both
    ({"x-max-length": 10}, {"max-length": 5}, {"max-length": 7}, {"max-length": 7}),
    ({"x-max-length": 3}, None, {"max-length": 7}, {"max-length": 3}),
    ({}, None, {"message-ttl": 100}, {"message-ttl": 100}),
    ({"x-message-ttl": 50, "x-expires": 9000}, {"expires": 1000}, {"message-ttl": 100, "expires": 5000}, {"message-ttl": 50, "expires": 5000}),
    ({"x-delivery-limit": -1}, None, {"delivery-limit": 20}, {"delivery-limit": 20}),
    ({"x-delivery-limit": 5}, None, {"delivery-limit": -1}, {"delivery-limit": 5}),
    # target-group-size is a floor: the higher wins
    ({"x-quorum-target-group-size": 3}, None, {"target-group-size": 5}, {"target-group-size": 5}),
    # non-policy queue arguments are not part of the effective definition
    ({"x-single-active-consumer": True, "x-queue-type": "quorum"}, None, None, {}),
]


def _pol(definition: dict[str, Any] | None, name: str = "p") -> PolicyRecord | None:
    if definition is None:
        return None
    return PolicyRecord("/", name, ".*", "all", 0, freeze_table(definition))  # type: ignore[arg-type]


@pytest.mark.parametrize("args,policy,operator,expected", PRECEDENCE)
def test_precedence(args: dict[str, Any], policy: Any, operator: Any, expected: dict[str, Any]) -> None:
    assert merge(freeze_table(args), _pol(policy), _pol(operator)) == expected


def test_effective_definition_through_state() -> None:
    d = Driver()
    d.ok(DeclareQueue("/", "q", arguments={"x-queue-type": "quorum", "x-max-length": 100}, members=N))
    d.ok(SetPolicy("/", "p", "^q$", {"max-length": 5, "dead-letter-exchange": "dlx"}))
    d.ok(SetOperatorPolicy("/", "op", "^q", {"max-length": 50, "delivery-limit": 10}))
    q = d.state.queues[("/", "q")]
    assert effective_definition(d.state, q) == {
        "max-length": 50, "dead-letter-exchange": "dlx", "delivery-limit": 10}


limit = st.one_of(st.none(), st.integers(0, 1000))


@given(limit, limit, limit)
def test_numeric_precedence_property(arg: int | None, pol: int | None, op: int | None) -> None:
    args = {} if arg is None else {"x-max-length": arg}
    got = merge(
        freeze_table(args),
        _pol(None if pol is None else {"max-length": pol}),
        _pol(None if op is None else {"max-length": op}),
    ).get("max-length")
    client_or_policy = arg if arg is not None else pol
    if op is None:
        assert got == client_or_policy
    elif client_or_policy is None:
        assert got == op
    else:
        assert got == min(client_or_policy, op)
        assert got <= op  # the operator's ceiling always holds
