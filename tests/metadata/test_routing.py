"""Routing: exchange types, e2e bindings, alternate exchanges, cache invalidation,
and the topic trie checked against a slow regex reference with hypothesis."""
from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.metadata import (
    Bind,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    MetadataError,
    SetPolicy,
    Unbind,
    route,
)
from broker.metadata.routing import TopicTrie
from broker.metadata.state import Binding

from .helpers import Driver


def R(d: Driver, exchange: str, key: str = "", headers: Any = None) -> Any:
    r = route(d.state, "/", exchange, key, headers)
    return r if isinstance(r, MetadataError) else sorted(r)


@pytest.fixture
def d() -> Driver:
    drv = Driver()
    for q in ("a", "b", "c"):
        drv.ok(DeclareQueue("/", q, members=("n1",)))
    return drv


def test_default_exchange_routes_by_queue_name(d: Driver) -> None:
    assert R(d, "", "a") == ["a"]
    assert R(d, "", "zzz") == []


def test_missing_and_internal_exchange(d: Driver) -> None:
    err = R(d, "nope", "k")
    assert err.reply_text == "NOT_FOUND - no exchange 'nope' in vhost '/'"
    d.ok(DeclareExchange("/", "xi", "direct", internal=True))
    err = R(d, "xi", "k")
    assert (err.code, err.reply_text) == (403, "ACCESS_REFUSED - cannot publish to internal exchange 'xi' in vhost '/'")


def test_direct_and_fanout(d: Driver) -> None:
    d.ok(Bind("/", "amq.direct", "a", routing_key="k1"))
    d.ok(Bind("/", "amq.direct", "b", routing_key="k1"))
    d.ok(Bind("/", "amq.direct", "c", routing_key="k2"))
    assert R(d, "amq.direct", "k1") == ["a", "b"]
    assert R(d, "amq.direct", "k2") == ["c"]
    assert R(d, "amq.direct", "k3") == []
    d.ok(Bind("/", "amq.fanout", "a", routing_key="whatever"))
    d.ok(Bind("/", "amq.fanout", "c"))
    assert R(d, "amq.fanout", "anything") == ["a", "c"]


def test_cache_invalidated_on_bind_unbind_delete(d: Driver) -> None:
    assert R(d, "amq.direct", "k") == []
    d.ok(Bind("/", "amq.direct", "a", routing_key="k"))
    assert R(d, "amq.direct", "k") == ["a"]
    d.ok(Bind("/", "amq.direct", "b", routing_key="k"))
    assert R(d, "amq.direct", "k") == ["a", "b"]
    d.ok(Unbind("/", "amq.direct", "a", routing_key="k"))
    assert R(d, "amq.direct", "k") == ["b"]
    d.ok(DeleteQueue("/", "b"))
    assert R(d, "amq.direct", "k") == []
    d.ok(DeclareExchange("/", "t", "topic"))
    d.ok(Bind("/", "t", "a", routing_key="x.*"))
    assert R(d, "t", "x.y") == ["a"]
    d.ok(DeleteExchange("/", "t"))
    assert R(d, "t", "x.y").code == 404
    d.ok(DeclareExchange("/", "t", "fanout"))  # same name, new type, no stale table
    assert R(d, "t", "x.y") == []


# Verified against RabbitMQ 3.10.8: the edge cases with empty words/keys
# ("*.*"/"a.", "#.*"/"", "#"/"", ""/"", "a.#.d"/"a.d", "*"/"", "a..b", "#.#"/"").
TOPIC_TABLE = [
    ("a.b.c", "a.b.c", True), ("a.*.c", "a.b.c", True), ("a.*.c", "a.c", False),
    ("a.#", "a", True), ("a.#", "a.b.c", True), ("#", "", True), ("#", "a.b", True),
    ("*", "", False), ("*", "a", True), ("*", "a.b", False), ("#.c", "c", True),
    ("#.c", "a.b.c", True), ("#.c", "a.b.c.d", False), ("a.#.d", "a.d", True),
    ("a.#.d", "a.b.c.d", True), ("a.*.#", "a", False), ("a.*.#", "a.b", True),
    ("#.#", "", True), ("*.*", "a.", True), ("a..b", "a..b", True), ("", "", True),
    ("", "a", False), ("#.*", "", False), ("#.*", "a.b", True),
]


@pytest.mark.parametrize("pattern,key,hit", TOPIC_TABLE)
def test_topic_table(d: Driver, pattern: str, key: str, hit: bool) -> None:
    d.ok(Bind("/", "amq.topic", "a", routing_key=pattern))
    assert R(d, "amq.topic", key) == (["a"] if hit else [])
    assert reference_topic_match(pattern, key) == hit  # the reference agrees too


def reference_topic_match(pattern: str, key: str) -> bool:
    """Slow reference: a regex over '/'-prefixed words built from the pattern."""
    words = key.split(".") if key else []
    subject = "".join("/" + w for w in words)
    parts = []
    for w in pattern.split(".") if pattern else []:
        if w == "*":
            parts.append("/[^/]*")
        elif w == "#":
            parts.append("(?:/[^/]*)*")
        else:
            parts.append("/" + re.escape(w))
    return re.fullmatch("".join(parts), subject) is not None


word = st.sampled_from(["a", "b", "c", "", "ab"])
pattern_word = st.sampled_from(["a", "b", "c", "*", "#", "", "ab"])
keys = st.lists(word, max_size=6).map(".".join)
patterns = st.lists(pattern_word, max_size=6).map(".".join)


@given(st.lists(patterns, min_size=1, max_size=25), st.lists(keys, min_size=1, max_size=10))
def test_topic_trie_matches_reference(pats: list[str], ks: list[str]) -> None:
    bindings = [Binding("/", "t", f"q{i}", "queue", p) for i, p in enumerate(pats)]
    trie = TopicTrie(bindings)
    for k in ks:
        expected = {f"q{i}" for i, p in enumerate(pats) if reference_topic_match(p, k)}
        assert set(trie.match(k)[0]) == expected, (k, pats)
        assert set(trie.match(k)[0]) == expected  # memoised answer is the same


# Rows marked verified, plus x-foo/any/any-with-x/all-with-x/true-vs-1 rows,
# were checked against RabbitMQ 3.10.8 with publisher confirms and basic.get.
HEADERS_TABLE: list[tuple[dict[str, Any], dict[str, Any] | None, bool]] = [
    ({"x-match": "all"}, None, True),  # vacuous all (verified)
    ({"x-match": "any"}, {"a": 1}, False),  # empty any (verified)
    ({"a": 1}, {"a": 1}, True),  # x-match defaults to all
    ({"a": 1, "b": 2}, {"a": 1}, False),
    ({"x-match": "any", "a": 1, "b": 2}, {"a": 1}, True),
    ({"x-match": "any", "a": 1, "b": 2}, {"a": 2, "b": 3}, False),
    ({"x-match": "all", "x-foo": "1", "a": 1}, {"a": 1}, True),  # x- keys ignored (verified)
    ({"x-match": "all-with-x", "x-foo": "1", "a": 1}, {"a": 1}, False),
    ({"x-match": "all-with-x", "x-foo": "1", "a": 1}, {"a": 1, "x-foo": "1"}, True),
    ({"x-match": "any-with-x", "x-foo": "1"}, {"x-foo": "1"}, True),
    ({"x-match": "any", "x-foo": "1"}, {"x-foo": "1"}, False),
    ({"x-match": "all", "b": None}, {"b": "anything"}, True),  # void = presence (verified)
    ({"x-match": "all", "b": None}, {"c": 1}, False),
    ({"a": True}, {"a": 1}, False),  # Erlang: true =/= 1
    ({"a": "s"}, {"a": b"s"}, True),
    ({"a": {"n": [1, 2]}}, {"a": {"n": [1, 2]}}, True),
]


@pytest.mark.parametrize("args,headers,hit", HEADERS_TABLE)
def test_headers(d: Driver, args: dict[str, Any], headers: dict[str, Any] | None, hit: bool) -> None:
    d.ok(Bind("/", "amq.headers", "a", arguments=args))
    assert R(d, "amq.headers", "", headers) == (["a"] if hit else [])


def test_exchange_to_exchange_and_cycles(d: Driver) -> None:
    for name, t in (("e1", "topic"), ("e2", "direct"), ("e3", "fanout")):
        d.ok(DeclareExchange("/", name, t))
    d.ok(Bind("/", "e1", "e2", "exchange", "k.#"))
    d.ok(Bind("/", "e2", "e3", "exchange", "k.x"))
    d.ok(Bind("/", "e3", "e1", "exchange"))  # cycle e1 -> e2 -> e3 -> e1
    d.ok(Bind("/", "e2", "a", routing_key="k.x"))
    d.ok(Bind("/", "e3", "b"))
    d.ok(Bind("/", "e1", "c", routing_key="k.x"))
    assert R(d, "e1", "k.x") == ["a", "b", "c"]
    assert R(d, "e3", "k.x") == ["a", "b", "c"]
    assert R(d, "e3", "other") == ["b"]
    assert R(d, "e1", "k.y") == []
    # internal destinations are fine as e2e targets
    d.ok(DeclareExchange("/", "inner", "fanout", internal=True))
    d.ok(Bind("/", "amq.fanout", "inner", "exchange"))
    d.ok(Bind("/", "inner", "a"))
    assert R(d, "amq.fanout") == ["a"]


def test_alternate_exchange(d: Driver) -> None:
    d.ok(DeclareExchange("/", "ae", "fanout"))
    d.ok(DeclareExchange("/", "main", "direct", arguments={"alternate-exchange": "ae"}))
    d.ok(Bind("/", "ae", "c"))
    d.ok(Bind("/", "main", "a", routing_key="k"))
    assert R(d, "main", "k") == ["a"]
    assert R(d, "main", "unroutable") == ["c"]
    # an alternate exchange that does not exist is ignored
    d.ok(DeclareExchange("/", "dangling", "direct", arguments={"alternate-exchange": "missing"}))
    assert R(d, "dangling", "k") == []
    # alternate exchanges that point at each other terminate
    d.ok(DeclareExchange("/", "p", "direct", arguments={"alternate-exchange": "r"}))
    d.ok(DeclareExchange("/", "r", "direct", arguments={"alternate-exchange": "p"}))
    assert R(d, "p", "k") == []
    # the default exchange as an alternate routes by queue name
    d.ok(DeclareExchange("/", "to-default", "direct", arguments={"alternate-exchange": ""}))
    assert R(d, "to-default", "b") == ["b"]


def test_alternate_exchange_from_policy(d: Driver) -> None:
    d.ok(DeclareExchange("/", "ae", "fanout"))
    d.ok(DeclareExchange("/", "main", "direct"))
    d.ok(Bind("/", "ae", "c"))
    assert R(d, "main", "k") == []
    d.ok(SetPolicy("/", "ae-pol", "^main$", {"alternate-exchange": "ae"}, apply_to="exchanges"))
    assert R(d, "main", "k") == ["c"]
    # the exchange's own argument wins over the policy
    d.ok(DeclareExchange("/", "ae2", "fanout"))
    d.ok(Bind("/", "ae2", "b"))
    d.ok(DeclareExchange("/", "main2", "direct", arguments={"alternate-exchange": "ae2"}))
    d.ok(SetPolicy("/", "ae-pol2", "^main2$", {"alternate-exchange": "ae"}, apply_to="exchanges"))
    assert R(d, "main2", "k") == ["b"]


def test_routing_only_returns_existing_queues(d: Driver) -> None:
    d.ok(DeclareExchange("/", "t", "topic"))
    for i in range(50):
        d.ok(DeclareQueue("/", f"q{i}", members=("n1",)))
        d.ok(Bind("/", "t", f"q{i}", routing_key=f"s.{i % 5}.#"))
    for i in range(0, 50, 2):
        d.ok(DeleteQueue("/", f"q{i}"))
    got = route(d.state, "/", "t", "s.3.z")
    assert not isinstance(got, MetadataError)
    assert sorted(got) == sorted(f"q{i}" for i in range(50) if i % 5 == 3 and i % 2 == 1)


# -- cache invalidation under random topology changes ---------------------------------

_x = st.sampled_from(["e1", "e2", "e3"])
_q = st.sampled_from(["a", "b", "c", "d"])
_k = st.sampled_from(["k", "k.x", "#", "*.x", "k.*"])
_topology = st.one_of(
    st.builds(Bind, st.just("/"), _x, _q, st.just("queue"), _k),
    st.builds(Bind, st.just("/"), _x, _x, st.just("exchange"), _k),
    st.builds(Unbind, st.just("/"), _x, _q, st.just("queue"), _k),
    st.builds(Unbind, st.just("/"), _x, _x, st.just("exchange"), _k),
    st.builds(DeclareExchange, st.just("/"), _x, st.sampled_from(["direct", "fanout", "topic"]),
              arguments=st.sampled_from([{}, {"alternate-exchange": "e3"}])),
    st.builds(DeleteExchange, st.just("/"), _x),
    st.builds(DeclareQueue, st.just("/"), _q, members=st.just(("n1",))),
    st.builds(DeleteQueue, st.just("/"), _q),
    st.builds(SetPolicy, st.just("/"), st.just("ae"), st.sampled_from(["^e1$", "^e2$", "x"]),
              st.sampled_from([{"alternate-exchange": "e2"}, {"alternate-exchange": "e1"}]),
              apply_to=st.just("exchanges")),
)


@given(st.lists(st.tuples(_topology, st.sampled_from(["k", "k.x", "z"])), min_size=5, max_size=40))
def test_cached_routes_equal_fresh_routes(steps: list[tuple[Any, str]]) -> None:
    from broker.metadata import from_bytes, to_bytes

    d = Driver()
    for name in ("e1", "e2", "e3"):
        d.ok(DeclareExchange("/", name, "topic"))
    for cmd, key in steps:
        d(cmd)
        fresh = from_bytes(to_bytes(d.state))  # same state, empty routing cache
        for x in ("e1", "e2", "e3"):
            assert route(d.state, "/", x, key) == route(fresh, "/", x, key), (x, key)
