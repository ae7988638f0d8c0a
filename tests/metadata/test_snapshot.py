"""Snapshot round-trip: random command sequences, then from_bytes(to_bytes(s)) == s,
and the restored state routes and answers exactly like the original."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.metadata import (
    AddUser,
    AddVhost,
    Bind,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    MetadataError,
    SetOperatorPolicy,
    SetPermissions,
    SetPolicy,
    SetQueueMembers,
    SnapshotError,
    Unbind,
    effective_definition,
    from_bytes,
    route,
    to_bytes,
)
from broker.metadata.commands import (
    ClearUserLimit,
    ClearVhostLimit,
    DeleteUser,
    DeleteVhost,
    SetParameter,
    SetTopicPermissions,
    SetUserLimit,
    SetVhostLimit,
)

from .helpers import Driver

names = st.sampled_from(["a", "b", "c", "d"])
vhosts = st.sampled_from(["/", "v"])
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=5),
              st.binary(max_size=4), st.floats(allow_nan=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=6,
)
tables = st.dictionaries(st.sampled_from(["k", "x-k", "alternate-exchange", "x-match"]), values, max_size=3)
keys = st.sampled_from(["", "a", "a.b", "#", "*.b", "a.#"])

commands = st.one_of(
    # hypothesis favours the first alternatives: put binding changes first
    st.builds(Bind, vhosts, names, names, st.sampled_from(["queue", "exchange"]), keys, tables),
    st.builds(AddVhost, st.just("v"), default_queue_type=st.sampled_from([None, "quorum"])),
    st.builds(AddUser, names, st.text(max_size=8), tags=st.tuples(st.sampled_from(["administrator", "x"]))),
    st.builds(SetPermissions, names, vhosts, st.just(".*"), st.just("^a"), st.just("")),
    st.builds(SetTopicPermissions, names, vhosts, names, st.just(".*"), st.just("^a")),
    st.builds(DeclareExchange, vhosts, names, st.sampled_from(["direct", "fanout", "topic", "headers"]),
              durable=st.booleans(), auto_delete=st.booleans(), internal=st.booleans(), arguments=tables),
    st.builds(DeleteExchange, vhosts, names),
    st.builds(DeclareQueue, vhosts, names, durable=st.booleans(), arguments=tables,
              members=st.just(("n1", "n2")), exclusive_owner=st.sampled_from([None, "c1"])),
    st.builds(DeleteQueue, vhosts, names),
    st.builds(Unbind, vhosts, names, names, st.sampled_from(["queue", "exchange"]), keys, tables),
    st.builds(SetPolicy, vhosts, names, st.sampled_from(["^a", "b", ".*"]),
              st.sampled_from([{"max-length": 3}, {"alternate-exchange": "a"}, {"overflow": "drop-head"}]),
              priority=st.integers(0, 3), apply_to=st.sampled_from(["all", "queues", "exchanges", "quorum_queues"])),
    st.builds(SetOperatorPolicy, vhosts, names, st.just(".*"), st.just({"max-length": 2})),
    st.builds(SetQueueMembers, vhosts, names, st.sampled_from([("n1",), ("n2", "n3")])),
    st.builds(SetParameter, vhosts, st.just("federation"), names, values),
    st.builds(SetVhostLimit, vhosts, st.sampled_from(["max-connections", "max-queues", "max-x"]),
              st.integers(-2, 40)),
    st.builds(ClearVhostLimit, vhosts, st.sampled_from(["max-connections", "max-queues"])),
    st.builds(SetUserLimit, names, st.sampled_from(["max-connections", "max-channels"]),
              st.integers(-2, 40)),
    st.builds(ClearUserLimit, names, st.sampled_from(["max-connections", "max-channels"])),
    st.builds(DeleteUser, names),
    st.builds(DeleteVhost, st.just("v")),
)


@settings(max_examples=60)
@given(st.lists(commands, min_size=20, max_size=60))
def test_roundtrip(cmds: list[Any]) -> None:
    d = Driver()
    # a populated starting point, so random commands hit existing entities
    d.ok(AddVhost("v"))
    for vhost in ("/", "v"):
        for name, t in zip("abcd", ("direct", "fanout", "topic", "headers"), strict=True):
            d.ok(DeclareExchange(vhost, name, t))
            d.ok(DeclareQueue(vhost, name, members=("n1",)))
    for c in cmds:
        d(c)  # refusals are fine; Driver checks invariants after each command
    data = to_bytes(d.state)
    restored = from_bytes(data)
    assert restored == d.state
    assert to_bytes(restored) == data  # deterministic encoding
    restored.check_invariants()
    for (vhost, name) in list(d.state.exchanges)[:6]:
        for key in ("a", "a.b", ""):
            assert route(restored, vhost, name, key, {"k": 1}) == route(d.state, vhost, name, key, {"k": 1})
    for q in d.state.queues.values():
        assert effective_definition(restored, q) == effective_definition(d.state, q)


def test_roundtrip_keeps_types() -> None:
    d = Driver()
    d.ok(DeclareQueue("/", "q", arguments={"b": b"\x00", "s": "x", "n": {"l": [1, 2.5, None, True]}}, members=("n1",)))
    r = from_bytes(to_bytes(d.state)).queues[("/", "q")]
    assert r == d.state.queues[("/", "q")]
    assert isinstance(dict(r.arguments)["b"], bytes) and isinstance(dict(r.arguments)["s"], str)


def test_a_snapshot_written_before_a_record_field_was_added_still_reads() -> None:
    """Records gained trailing fields with defaults (QueueRecord.leader_term):
    a snapshot without them reads with the defaults; a record with too many
    or too few fields is refused."""
    import msgpack

    d = Driver()
    d.ok(DeclareQueue("/", "q", members=("n1",)))
    doc = msgpack.unpackb(to_bytes(d.state), raw=False, strict_map_key=False)
    doc["queues"] = [raw[:-1] for raw in doc["queues"]]  # as written before leader_term
    old = from_bytes(msgpack.packb(doc, use_bin_type=True))
    assert old.queues[("/", "q")] == d.state.queues[("/", "q")]
    assert old.queues[("/", "q")].leader_term == 0
    doc["queues"] = [[*raw, 0, "extra"] for raw in doc["queues"]]
    with pytest.raises(SnapshotError, match="QueueRecord: expected"):
        from_bytes(msgpack.packb(doc, use_bin_type=True))


def test_decimal_and_injected_hooks() -> None:
    import decimal

    import msgpack

    d = Driver()
    d.ok(DeclareQueue("/", "q", arguments={"x-dec": decimal.Decimal("1.25")}, members=("n1",)))
    assert from_bytes(to_bytes(d.state)) == d.state

    class Stamp:  # stands in for a value only the runtime knows how to encode
        def __init__(self, v: int) -> None:
            self.v = v

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Stamp) and other.v == self.v

        def __hash__(self) -> int:
            return self.v

    d.ok(DeclareQueue("/", "t", arguments={"x-ts": Stamp(5)}, members=("n1",)))
    with pytest.raises(TypeError):
        to_bytes(d.state)
    def enc(o: object) -> msgpack.ExtType:
        if isinstance(o, Stamp):
            return msgpack.ExtType(9, bytes([o.v]))
        return msgpack.ExtType(1, str(o).encode())

    def dec(code: int, b: bytes) -> object:
        return Stamp(b[0]) if code == 9 else decimal.Decimal(b.decode())

    back = from_bytes(to_bytes(d.state, default=enc), ext_hook=dec)
    assert back == d.state


@pytest.mark.parametrize("data", [b"", b"\x93\x01\x02\x03", b"\x81\xa6format\x02", b"\xc1"])
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(SnapshotError):
        from_bytes(data)


def test_dangling_binding_in_snapshot_is_refused() -> None:
    d = Driver()
    d.ok(DeclareQueue("/", "q", members=("n1",)))
    d.ok(Bind("/", "amq.direct", "q", routing_key="k"))
    data = to_bytes(d.state)
    del d.state.queues[("/", "q")]  # corrupt: queue gone, binding kept
    with pytest.raises(SnapshotError):
        from_bytes(to_bytes(d.state))
    assert not isinstance(route(from_bytes(data), "/", "amq.direct", "k"), MetadataError)


@settings(max_examples=40)
@given(st.lists(commands, min_size=5, max_size=40))
def test_every_reply_round_trips(cmds: list[Any]) -> None:
    """The metadata leader sends a forwarded command's reply back as bytes
    (reply_to_bytes); the forwarder reads the same reply."""
    from broker.metadata import reply_from_bytes, reply_to_bytes

    d = Driver()
    d.ok(AddVhost("v"))
    kinds = set()
    for c in [DeclareQueue("/", "a", members=("n1",)), DeclareExchange("/", "a", "topic"), *cmds,
              DeleteQueue("/", "a"), DeleteQueue("/", "never")]:
        reply = d(c)
        kinds.add(type(reply).__name__)
        assert reply_from_bytes(reply_to_bytes(reply)) == reply
    assert {"QueueDeclareOk", "ExchangeDeclareOk", "QueueDeleteOk"} <= kinds


def test_a_reply_that_is_not_one_is_refused() -> None:
    import msgpack

    from broker.metadata import reply_from_bytes

    for junk in (b"\xc1", msgpack.packb(["zz"]), msgpack.packb([]), msgpack.packb(["q", [1]])):
        with pytest.raises(SnapshotError, match="not a metadata reply"):
            reply_from_bytes(junk)
