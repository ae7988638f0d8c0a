"""x-argument validation (exact RabbitMQ reply texts, checked against a real
RabbitMQ 3.10 node where 3.10 and 4.x agree) and policy precedence."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.queue import QueueArgumentError, QueueConfig, parse_queue_arguments

RES = "queue 'q' in vhost '/'"


@pytest.mark.parametrize("args,text", [
    ({"x-max-length": -1}, f"invalid arg 'x-max-length' for {RES}: {{value_negative,-1}}"),
    ({"x-max-length": "abc"},
     f"invalid arg 'x-max-length' for {RES}: \"expected integer, got longstr\""),
    ({"x-max-length": True},
     f"invalid arg 'x-max-length' for {RES}: \"expected integer, got bool\""),
    ({"x-max-length-bytes": -5},
     f"invalid arg 'x-max-length-bytes' for {RES}: {{value_negative,-5}}"),
    ({"x-overflow": "foo"}, f"invalid arg 'x-overflow' for {RES}: invalid_overflow"),
    ({"x-overflow": "reject-publish-dlx"},
     f"invalid arg 'x-overflow' for {RES}: invalid_overflow"),
    ({"x-overflow": 1}, f"invalid arg 'x-overflow' for {RES}: {{unacceptable_type,signedint}}"),
    ({"x-message-ttl": -1}, f"invalid arg 'x-message-ttl' for {RES}: {{value_negative,-1}}"),
    ({"x-message-ttl": 315360000001},
     f"invalid arg 'x-message-ttl' for {RES}: {{value_too_large,315360000001}}"),
    ({"x-expires": 0}, f"invalid arg 'x-expires' for {RES}: {{value_zero,0}}"),
    ({"x-expires": -3}, f"invalid arg 'x-expires' for {RES}: {{value_negative,-3}}"),
    ({"x-expires": "x"}, f"invalid arg 'x-expires' for {RES}: \"expected integer, got longstr\""),
    ({"x-dead-letter-exchange": 5},
     f"invalid type 'signedint' for arg 'x-dead-letter-exchange' in {RES}"),
    ({"x-dead-letter-routing-key": "rk"},
     f"invalid arg 'x-dead-letter-routing-key' for {RES}: routing_key_but_no_dlx_defined"),
    ({"x-dead-letter-routing-key": 5, "x-dead-letter-exchange": "x"},
     f"invalid arg 'x-dead-letter-routing-key' for {RES}: {{unacceptable_type,signedint}}"),
    ({"x-dead-letter-strategy": "foo"},
     f"invalid arg 'x-dead-letter-strategy' for {RES}: invalid_dlx_strategy"),
    ({"x-single-active-consumer": "yes"},
     f"invalid arg 'x-single-active-consumer' for {RES}: {{unacceptable_type,longstr}}"),
    ({"x-max-priority": 5}, f"invalid arg 'x-max-priority' for {RES} of queue type "
                            "rabbit_quorum_queue"),
    ({"x-queue-mode": "lazy"}, f"invalid arg 'x-queue-mode' for {RES} of queue type "
                               "rabbit_quorum_queue"),
    ({"x-quorum-initial-group-size": 0},
     f"invalid arg 'x-quorum-initial-group-size' for {RES}: {{value_zero,0}}"),
    ({"x-quorum-initial-group-size": -1},
     f"invalid arg 'x-quorum-initial-group-size' for {RES}: {{value_negative,-1}}"),
    ({"x-queue-leader-locator": "foo"},
     f"invalid arg 'x-queue-leader-locator' for {RES}: invalid_queue_locator_arg"),
    ({"x-queue-leader-locator": 3},
     f"invalid arg 'x-queue-leader-locator' for {RES}: {{unacceptable_type,signedint}}"),
    ({"x-delivery-limit": "x"},
     f"invalid arg 'x-delivery-limit' for {RES}: \"expected integer, got longstr\""),
    # checked in RabbitMQ's order: x-expires before x-max-length
    ({"x-max-length": -1, "x-expires": 0}, f"invalid arg 'x-expires' for {RES}: {{value_zero,0}}"),
])
def test_invalid_arguments_are_refused_with_rabbitmq_texts(args: dict[str, object],
                                                           text: str) -> None:
    with pytest.raises(QueueArgumentError) as ei:
        parse_queue_arguments(args, "q", "/")
    assert ei.value.reply_code == 406
    assert ei.value.reply_text == "PRECONDITION_FAILED - " + text


def test_defaults_match_rabbitmq_4() -> None:
    c = parse_queue_arguments({"x-queue-type": "quorum", "x-unknown": 1}, "q", "/")
    assert c == QueueConfig(name="q", vhost="/")
    assert c.delivery_limit == 20 and c.overflow == "drop-head"
    assert c.dead_letter_strategy == "at-most-once" and not c.at_least_once


def test_valid_arguments_are_parsed() -> None:
    c = parse_queue_arguments({
        "x-max-length": 10, "x-max-length-bytes": 1000, "x-overflow": "reject-publish",
        "x-message-ttl": 0, "x-expires": 5000, "x-dead-letter-exchange": "dlx",
        "x-dead-letter-routing-key": "rk", "x-dead-letter-strategy": "at-least-once",
        "x-delivery-limit": 5, "x-single-active-consumer": True,
        "x-quorum-initial-group-size": 3, "x-queue-leader-locator": "least-leaders",
    }, "q", "v")
    assert (c.max_length, c.max_length_bytes, c.overflow, c.message_ttl_ms, c.expires_ms) == \
        (10, 1000, "reject-publish", 0, 5000)
    assert (c.dead_letter_exchange, c.dead_letter_routing_key, c.at_least_once) == \
        ("dlx", "rk", True)
    assert (c.delivery_limit, c.single_active_consumer, c.initial_group_size) == (5, True, 3)
    assert c.leader_locator == "balanced"


def test_delivery_limit_minus_one_disables_it() -> None:
    assert parse_queue_arguments({"x-delivery-limit": -1}, "q", "/").delivery_limit is None


@pytest.mark.parametrize("arg,pol,op,expected", [
    (None, None, None, 20),
    (5, None, None, 5),
    (None, 50, None, 50),
    (5, 50, None, 5),       # lowest wins
    (50, 5, None, 5),
    (-1, 50, None, 50),     # a non-negative one wins over unlimited
    (-1, None, None, None),
    (None, -1, 10, 10),
    (30, 40, 10, 10),
    (-1, -1, 5, 5),
    (5, -1, -1, 5),
    (-1, 10, 5, 5),
    (15, 10, 5, 5),
    (-1, -1, -1, None),
])
def test_delivery_limit_precedence(arg: int | None, pol: int | None, op: int | None,
                                   expected: int | None) -> None:
    args = {} if arg is None else {"x-delivery-limit": arg}
    policy = None if pol is None else {"delivery-limit": pol}
    oppol = None if op is None else {"delivery-limit": op}
    assert parse_queue_arguments(args, "q", "/", policy, oppol).delivery_limit == expected


def test_numeric_limits_take_the_lowest_of_argument_policy_and_operator_policy() -> None:
    c = parse_queue_arguments({"x-max-length": 100, "x-message-ttl": 10}, "q", "/",
                              {"max-length": 50, "message-ttl": 99, "expires": 7000},
                              {"max-length": 70, "expires": 9000})
    assert (c.max_length, c.message_ttl_ms, c.expires_ms) == (50, 10, 7000)


def test_dead_letter_arguments_win_over_policy_and_overflow_policy_wins() -> None:
    c = parse_queue_arguments({"x-dead-letter-exchange": "a", "x-overflow": "drop-head"}, "q", "/",
                              {"dead-letter-exchange": "b", "dead-letter-routing-key": "k",
                               "overflow": "reject-publish"})
    assert (c.dead_letter_exchange, c.dead_letter_routing_key, c.overflow) == \
        ("a", "k", "reject-publish")


def test_operator_policy_ignores_keys_it_may_not_set() -> None:
    c = parse_queue_arguments({}, "q", "/", None, {"dead-letter-exchange": "x"})
    assert c.dead_letter_exchange is None


def test_invalid_policy_value_is_refused() -> None:
    with pytest.raises(QueueArgumentError) as ei:
        parse_queue_arguments({}, "q", "/", {"max-length": -2})
    assert "value_negative" in ei.value.reply_text


def test_target_group_size_takes_the_highest() -> None:
    c = parse_queue_arguments({"x-quorum-target-group-size": 3}, "q", "/",
                              {"target-group-size": 5})
    assert c.target_group_size == 5
    assert parse_queue_arguments({}, "q", "/").target_group_size is None


def test_arguments_must_be_a_table() -> None:
    with pytest.raises(QueueArgumentError):
        parse_queue_arguments([], "q", "/")  # type: ignore[arg-type]


_KEYS = ["x-max-length", "x-max-length-bytes", "x-overflow", "x-message-ttl", "x-expires",
         "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy",
         "x-delivery-limit", "x-single-active-consumer", "x-max-priority",
         "x-quorum-initial-group-size", "x-quorum-target-group-size", "x-queue-leader-locator"]
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                    st.floats(allow_nan=False), st.text(max_size=5),
                    st.sampled_from(["drop-head", "reject-publish", "at-least-once",
                                     "balanced", "client-local"]),
                    st.lists(st.integers(), max_size=2))


@given(st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=5))
def test_any_argument_table_parses_or_is_refused_with_a_406(args: dict[str, object]) -> None:
    try:
        c = parse_queue_arguments(args, "q", "/")
    except QueueArgumentError as e:
        assert e.reply_code == 406 and e.reply_text.startswith("PRECONDITION_FAILED - ")
        assert "queue 'q' in vhost '/'" in e.reply_text
        return
    assert c.max_length is None or c.max_length >= 0
    assert c.delivery_limit is None or c.delivery_limit >= 0
    assert c.overflow in ("drop-head", "reject-publish")
