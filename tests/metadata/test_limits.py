"""Per-vhost and per-user limits in the metadata machine: validation, the
max-queues refusal (texts verified against RabbitMQ 3.10.8 with pika and its
management API), clean-up with the vhost/user, and the pure connection and
channel checks the runtime uses."""
from __future__ import annotations

import msgpack
import pytest

from broker.metadata import (
    AddUser,
    AddVhost,
    ClearUserLimit,
    ClearVhostLimit,
    DeclareQueue,
    DeleteQueue,
    DeleteUser,
    DeleteVhost,
    MetadataError,
    QueueDeclareOk,
    SetUserLimit,
    SetVhostLimit,
    channel_refused,
    connection_limits_in_force,
    connection_refused,
    from_bytes,
    to_bytes,
    user_limit,
    vhost_limit,
)

from .helpers import Driver


def declare(d: Driver, name: str, vhost: str = "/", **kw: object) -> object:
    return d(DeclareQueue(vhost, name, members=("n1",), **kw))  # type: ignore[arg-type]


def test_max_queues_refuses_new_queues_only_with_rabbitmqs_text() -> None:
    d = Driver()
    d.ok(SetVhostLimit("/", "max-queues", 1))
    assert isinstance(declare(d, "q1"), QueueDeclareOk)
    err = declare(d, "q2")
    assert isinstance(err, MetadataError) and err.code == 406 and not err.hard
    assert err.reply_text == ("PRECONDITION_FAILED - cannot declare queue 'q2': "
                              "queue limit in vhost '/' (1) is reached")
    # redeclaring and passively declaring the existing queue still work
    assert isinstance(declare(d, "q1"), QueueDeclareOk)
    assert isinstance(d(DeclareQueue("/", "q1", passive=True)), QueueDeclareOk)
    # server-named and exclusive queues count and are refused the same way
    err = declare(d, "amq.gen-x", server_named=True, exclusive_owner="c1", durable=False)
    assert isinstance(err, MetadataError)
    assert err.text == "cannot declare queue 'amq.gen-x': queue limit in vhost '/' (1) is reached"
    # another vhost is not limited
    d.ok(AddVhost("v"))
    assert isinstance(declare(d, "q2", "v"), QueueDeclareOk)
    assert isinstance(declare(d, "q3", "v"), QueueDeclareOk)
    # deleting a queue makes room; lifting the limit allows any number
    d.ok(DeleteQueue("/", "q1"))
    assert isinstance(declare(d, "q2"), QueueDeclareOk)
    d.ok(SetVhostLimit("/", "max-queues", -1))
    assert isinstance(declare(d, "q3"), QueueDeclareOk)
    d.ok(ClearVhostLimit("/", "max-queues"))
    assert vhost_limit(d.state, "/", "max-queues") is None


def test_max_queues_zero_allows_none() -> None:
    d = Driver()
    d.ok(SetVhostLimit("/", "max-queues", 0))
    err = declare(d, "q")
    assert isinstance(err, MetadataError)
    assert err.text == "cannot declare queue 'q': queue limit in vhost '/' (0) is reached"


@pytest.mark.parametrize(("cmd", "text"), [
    (SetVhostLimit("/", "max-foo", 1), 'Unrecognised terms [{<<"max-foo">>,1}] in limits'),
    (SetVhostLimit("/", "max-channels", 1), 'Unrecognised terms [{<<"max-channels">>,1}] in limits'),
    (SetVhostLimit("/", "max-queues", "x"), 'max-queues should be a number, actually was <<"x">>'),  # type: ignore[arg-type]
    (SetVhostLimit("/", "max-queues", 1.5), "max-queues should be a number, actually was 1.5"),  # type: ignore[arg-type]
    (SetVhostLimit("/", "max-queues", True), "max-queues should be a number, actually was true"),
    (SetVhostLimit("/", "max-queues", 1 << 63), f"max-queues should be a number, actually was {1 << 63}"),
    (SetUserLimit("guest", "max-queues", 3), 'Unrecognised terms [{<<"max-queues">>,3}] in user-limits'),
    (SetUserLimit("guest", "max-channels", "abc"), 'max-channels should be a number, actually was <<"abc">>'),  # type: ignore[arg-type]
    (SetVhostLimit("nope", "max-queues", 1), "no vhost 'nope'"),
    (SetUserLimit("nope", "max-channels", 1), "no user 'nope'"),
    (ClearVhostLimit("nope", "max-queues"), "no vhost 'nope'"),
    (ClearUserLimit("nope", "max-channels"), "no user 'nope'"),
])
def test_bad_limits_are_refused_and_change_nothing(cmd: object, text: str) -> None:
    d = Driver()
    assert d.err(cmd).text == text
    assert not d.state.vhost_limits and not d.state.user_limits


def test_negative_values_mean_no_limit_and_clearing_a_missing_limit_is_fine() -> None:
    d = Driver()
    d.ok(SetVhostLimit("/", "max-connections", -5))  # RabbitMQ accepts any negative
    d.ok(SetUserLimit("guest", "max-channels", -1))
    assert vhost_limit(d.state, "/", "max-connections") is None
    assert user_limit(d.state, "guest", "max-channels") is None
    assert not connection_limits_in_force(d.state)
    d.ok(ClearVhostLimit("/", "max-queues"))
    d.ok(ClearUserLimit("guest", "max-connections"))


def test_limits_go_with_their_vhost_and_user() -> None:
    d = Driver()
    d.ok(AddVhost("v"))
    d.ok(AddUser("u", ""))
    d.ok(SetVhostLimit("v", "max-queues", 3))
    d.ok(SetUserLimit("u", "max-connections", 3))
    d.ok(AddVhost("v", description="updated"))  # updating keeps the limits
    d.ok(AddUser("u", "", tags=("management",)))
    assert vhost_limit(d.state, "v", "max-queues") == 3
    assert user_limit(d.state, "u", "max-connections") == 3
    d.ok(DeleteVhost("v"))
    d.ok(DeleteUser("u"))
    assert not d.state.vhost_limits and not d.state.user_limits
    d.ok(AddVhost("v"))
    d.ok(AddUser("u", ""))  # created again: without the old limits
    assert vhost_limit(d.state, "v", "max-queues") is None
    assert user_limit(d.state, "u", "max-connections") is None


def test_connection_and_channel_checks_have_rabbitmqs_texts_and_order() -> None:
    d = Driver()
    s = d.state
    assert connection_refused(s, "/", "guest", 100, 100) is None
    d.ok(SetVhostLimit("/", "max-connections", 1))
    d.ok(SetUserLimit("guest", "max-connections", 2))
    assert connection_limits_in_force(s)
    assert connection_refused(s, "/", "guest", 0, 0) is None
    err = connection_refused(s, "/", "guest", 1, 5)  # the vhost's limit is checked first
    assert err is not None and err.code == 530 and err.hard
    assert err.reply_text == ("NOT_ALLOWED - access to vhost '/' refused for user 'guest': "
                              "connection limit (1) is reached")
    err = connection_refused(s, "other", "guest", 1, 2)
    assert err is not None
    assert err.reply_text == ("NOT_ALLOWED - connection refused for user 'guest': "
                              "user connection limit (2) is reached")
    assert connection_refused(s, "other", "guest", 1, 1) is None
    assert channel_refused(s, "guest", 1000) is None
    d.ok(SetUserLimit("guest", "max-channels", 0))
    err = channel_refused(s, "guest", 0)
    assert err is not None and err.reply_text == (
        "NOT_ALLOWED - number of channels opened for user 'guest' has reached the maximum "
        "allowed user limit of (0)")
    assert channel_refused(s, "other", 5) is None


def test_snapshot_keeps_limits_and_reads_snapshots_from_before_limits() -> None:
    d = Driver()
    d.ok(SetVhostLimit("/", "max-queues", 2))
    d.ok(SetUserLimit("guest", "max-channels", 7))
    restored = from_bytes(to_bytes(d.state))
    assert restored == d.state
    assert vhost_limit(restored, "/", "max-queues") == 2
    assert user_limit(restored, "guest", "max-channels") == 7
    doc = msgpack.unpackb(to_bytes(d.state), raw=False, strict_map_key=False)
    del doc["vhost_limits"], doc["user_limits"]
    old = from_bytes(msgpack.packb(doc, use_bin_type=True))
    assert not old.vhost_limits and not old.user_limits
