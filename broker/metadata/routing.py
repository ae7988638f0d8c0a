"""Exchange routing: (exchange, routing key, headers) -> destination queues.

Where it sits: on every basic.publish the runtime calls `route(state, ...)`
against its local replica of the metadata state, then enqueues into the
returned queues' Raft groups. Pure and hot: routing tables are compiled once
per exchange and cached in `state.routing_cache`; the machine drops an
exchange's entry whenever its bindings or the exchange change, and clears the
whole cache when policies change (alternate exchanges may come from policies).

Semantics follow RabbitMQ:
- default exchange ``""``: the queue named by the routing key, if it exists;
- direct: bindings whose key equals the routing key;
- fanout: every binding;
- topic: words split on ``.``; ``*`` matches exactly one word, ``#`` zero or
  more; compiled into a trie so matching is O(words), not O(bindings), and
  recent results are memoised per routing key;
- headers: ``x-match`` all (default) / any ignore binding keys starting with
  ``x-``; all-with-x / any-with-x include them (``x-match`` itself never
  counts); a binding value of void (None) only requires the header's presence;
  "all" over zero keys matches every message, "any" over zero keys none;
- exchange-to-exchange bindings are followed breadth-first, each exchange at
  most once (cycle-safe); an exchange whose own bindings produce no
  destination routes to its alternate exchange (argument, else policy) if
  that exists.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import ACCESS_REFUSED, MetadataError, not_found, rs
from .policies import exchange_alternate
from .state import Binding, ExchangeRecord, MetadataState
from .types import (
    ExchangeName,
    FieldValue,
    FrozenTable,
    QueueName,
    VhostName,
    freeze_value,
    lookup,
)

EMPTY: frozenset[QueueName] = frozenset()
_NO_X: tuple[str, ...] = ()
TOPIC_MEMO_LIMIT = 8192

# (queues, exchanges) reached directly through one exchange's bindings.
Targets = tuple[frozenset[QueueName], tuple[str, ...]]
_NOTHING: Targets = (EMPTY, _NO_X)


def _targets(bindings: list[Binding]) -> Targets:
    qs = frozenset(QueueName(b.destination) for b in bindings if b.destination_kind == "queue")
    xs = tuple(dict.fromkeys(b.destination for b in bindings if b.destination_kind == "exchange"))
    return qs, xs


# -- topic trie --------------------------------------------------------------------


class _TopicNode:
    __slots__ = ("children", "star", "hash", "bindings", "targets")

    def __init__(self) -> None:
        self.children: dict[str, _TopicNode] = {}
        self.star: _TopicNode | None = None
        self.hash: _TopicNode | None = None
        self.bindings: list[Binding] = []
        self.targets: Targets = _NOTHING  # of `bindings`, precomputed


def split_words(key: str) -> list[str]:
    """RabbitMQ splits on '.', and the empty key has zero words."""
    return key.split(".") if key else []


class TopicTrie:
    """Binding keys compiled into a trie over words. Matching visits at most
    one node per (trie node, word position), so it is O(words) for patterns
    without ``#`` and O(words^2) in the worst case with them, independent of
    the number of bindings; results are memoised per routing key."""

    __slots__ = ("root", "memo")

    def __init__(self, bindings: list[Binding]) -> None:
        self.root = _TopicNode()
        self.memo: dict[str, Targets] = {}
        terminals: dict[int, _TopicNode] = {}
        for b in bindings:
            node = self.root
            for w in split_words(b.routing_key):
                if w == "*":
                    node.star = node.star or _TopicNode()
                    node = node.star
                elif w == "#":
                    node.hash = node.hash or _TopicNode()
                    node = node.hash
                else:
                    nxt = node.children.get(w)
                    if nxt is None:
                        nxt = node.children[w] = _TopicNode()
                    node = nxt
            node.bindings.append(b)
            terminals[id(node)] = node
        for node in terminals.values():
            node.targets = _targets(node.bindings)

    def match(self, routing_key: str) -> Targets:
        hit = self.memo.get(routing_key)
        if hit is not None:
            return hit
        words = split_words(routing_key)
        n = len(words)
        found: dict[int, _TopicNode] = {}
        seen: set[tuple[int, int]] = set()
        stack: list[tuple[_TopicNode, int]] = [(self.root, 0)]
        pop, push = stack.pop, stack.append
        while stack:
            node, i = pop()
            if i == n:
                if node.bindings:
                    found[id(node)] = node
            else:
                nxt = node.children.get(words[i])
                if nxt is not None:
                    push((nxt, i + 1))
                if node.star is not None:
                    push((node.star, i + 1))
            h = node.hash
            if h is not None:
                # '#' swallows words i..j-1 for every j in i..n; the same
                # (node, position) can be reached twice only through '#'.
                hid = id(h)
                for j in range(i, n + 1):
                    if (hid, j) not in seen:
                        seen.add((hid, j))
                        push((h, j))
        if not found:
            result = _NOTHING
        elif len(found) == 1:
            result = next(iter(found.values())).targets
        else:
            qs = frozenset().union(*(nd.targets[0] for nd in found.values()))
            xs = tuple(dict.fromkeys(x for nd in found.values() for x in nd.targets[1]))
            result = (qs, xs)
        if len(self.memo) >= TOPIC_MEMO_LIMIT:
            self.memo.clear()
        self.memo[routing_key] = result
        return result


# -- headers -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _HeadersBinding:
    any: bool
    pattern: tuple[tuple[str, FieldValue, bool], ...]  # (key, value, void?)
    binding: Binding


def _compile_headers(b: Binding) -> _HeadersBinding:
    mode = lookup(b.arguments, "x-match")
    mode = mode if isinstance(mode, str) else "all"
    with_x = mode.endswith("-with-x")
    pattern = tuple(
        (k, v, v is None)
        for k, v in b.arguments
        if k != "x-match" and (with_x or not k.startswith("x-"))
    )
    return _HeadersBinding(mode.startswith("any"), pattern, b)


def _values_equal(binding_value: FieldValue, header_value: FieldValue) -> bool:
    if isinstance(binding_value, bool) != isinstance(header_value, bool):
        return False  # Erlang: true =/= 1
    if isinstance(header_value, (dict, list)):
        header_value = freeze_value(header_value)
    if isinstance(binding_value, bytes) and isinstance(header_value, str):
        header_value = header_value.encode("utf-8")
    elif isinstance(binding_value, str) and isinstance(header_value, bytes):
        binding_value = binding_value.encode("utf-8")
    return bool(binding_value == header_value)


def headers_match(hb: _HeadersBinding, headers: Mapping[str, FieldValue]) -> bool:
    if hb.any:
        for k, v, void in hb.pattern:
            if k in headers and (void or _values_equal(v, headers[k])):
                return True
        return False
    for k, v, void in hb.pattern:
        if k not in headers or not (void or _values_equal(v, headers[k])):
            return False
    return True


# -- compiled exchanges --------------------------------------------------------------


@dataclass(slots=True)
class CompiledExchange:
    record: ExchangeRecord
    alternate: str | None
    direct: dict[str, Targets] = field(default_factory=dict)
    fanout: Targets = _NOTHING
    topic: TopicTrie | None = None
    headers: tuple[_HeadersBinding, ...] = ()

    def match(self, routing_key: str, headers: Mapping[str, FieldValue] | None) -> Targets:
        t = self.record.type
        if t == "direct":
            return self.direct.get(routing_key, _NOTHING)
        if t == "fanout":
            return self.fanout
        if t == "topic":
            assert self.topic is not None
            return self.topic.match(routing_key)
        if not self.headers:
            return _NOTHING
        h = headers or {}
        return _targets([hb.binding for hb in self.headers if headers_match(hb, h)])


def compile_exchange(state: MetadataState, x: ExchangeRecord) -> CompiledExchange:
    bindings = state.bindings_from(x.vhost, x.name)
    c = CompiledExchange(x, exchange_alternate(state, x))
    if x.type == "direct":
        by_key: dict[str, list[Binding]] = {}
        for b in bindings:
            by_key.setdefault(b.routing_key, []).append(b)
        c.direct = {k: _targets(bs) for k, bs in by_key.items()}
    elif x.type == "fanout":
        c.fanout = _targets(bindings)
    elif x.type == "topic":
        c.topic = TopicTrie(bindings)
    else:
        c.headers = tuple(_compile_headers(b) for b in bindings)
    return c


def compiled(state: MetadataState, vhost: VhostName, name: str) -> CompiledExchange | None:
    key = (vhost, ExchangeName(name))
    c: CompiledExchange | None = state.routing_cache.get(key)
    if c is None:
        x = state.exchanges.get(key)
        if x is None:
            return None
        c = state.routing_cache[key] = compile_exchange(state, x)
    return c


def _default_targets(state: MetadataState, vhost: VhostName, routing_key: str) -> Targets:
    if (vhost, routing_key) in state.queues:
        return frozenset((QueueName(routing_key),)), _NO_X
    return _NOTHING


def route(
    state: MetadataState,
    vhost: VhostName,
    exchange: str,
    routing_key: str,
    headers: Mapping[str, FieldValue] | FrozenTable | None = None,
) -> frozenset[QueueName] | MetadataError:
    """Destination queues for a publish, or the refusal (404 missing exchange,
    403 internal exchange) with RabbitMQ's text."""
    if isinstance(headers, FrozenTable):
        headers = dict(headers.items)
    if exchange == "":
        return _default_targets(state, vhost, routing_key)[0]
    first = compiled(state, vhost, exchange)
    if first is None:
        return not_found("exchange", exchange, vhost)
    if first.record.internal:
        return MetadataError(
            ACCESS_REFUSED, f"cannot publish to internal {rs('exchange', exchange, vhost)}"
        )
    qs, xs = first.match(routing_key, headers)
    if not qs and not xs and first.alternate is not None:
        xs = (first.alternate,)
    if not xs:
        return qs  # fast path: no exchange-to-exchange hops
    queues: set[QueueName] = set(qs)
    seen = {exchange, *xs}
    work = list(xs)
    while work:
        name = work.pop(0)
        if name == "":
            more_q, more_x = _default_targets(state, vhost, routing_key)
            alternate = None
        else:
            c = compiled(state, vhost, name)
            if c is None:
                continue  # e.g. an alternate exchange that does not exist
            more_q, more_x = c.match(routing_key, headers)
            alternate = c.alternate
        if not more_q and not more_x and alternate is not None:
            more_x = (alternate,)
        queues.update(more_q)
        for n in more_x:
            if n not in seen:
                seen.add(n)
                work.append(n)
    return frozenset(queues)
