"""Routing throughput of broker.metadata.routing (pure, single thread).

Prints routes/s for:
  - a topic exchange with 10,000 wildcard-heavy bindings (memo hits: a working set of keys
    that repeats; memo misses: memo cleared per key, so the trie walk is measured),
  - a topic exchange with 10,000 selective bindings (one tenant prefix each),
  - a direct exchange with 10,000 bindings,
  - the default exchange (10,000 queues),
plus the time to compile the topic trie after a binding change, and a naive
O(bindings) regex scan over the same topic bindings for comparison.

Usage: .venv/bin/python bench/routing.py [--seconds 1.0]
"""
from __future__ import annotations

import argparse
import random
import re
import time

from broker.metadata import Bind, CommandMeta, DeclareExchange, DeclareQueue, apply, route
from broker.metadata.machine import initial_state
from broker.metadata.passwords import hash_password
from broker.metadata.routing import TOPIC_MEMO_LIMIT, compiled

N_BINDINGS = 10_000
WORDS = [f"w{i}" for i in range(100)]


def build(seed: int):
    rng = random.Random(seed)
    state = initial_state(hash_password("guest", b"\0\0\0\0"))
    i = 0

    def do(cmd):
        nonlocal i
        i += 1
        _, reply, _ = apply(CommandMeta(i, i), cmd, state)
        return reply

    do(DeclareExchange("/", "topic", "topic"))
    do(DeclareExchange("/", "selective", "topic"))
    do(DeclareExchange("/", "direct", "direct"))
    patterns = []
    for q in range(N_BINDINGS):
        name = f"q{q}"
        do(DeclareQueue("/", name, members=("n1",)))
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
        for j in range(len(words)):
            r = rng.random()
            if r < 0.15:
                words[j] = "*"
            elif r < 0.20:
                words[j] = "#"
        pattern = ".".join(words)
        patterns.append((pattern, name))
        do(Bind("/", "topic", name, routing_key=pattern))
        do(Bind("/", "direct", name, routing_key=f"key{q % 2000}"))
        # a selective topology: one tenant per binding, wildcards in the tail
        tail = ("*.created", "#", "orders.*", "*.*.done")[q % 4]
        do(Bind("/", "selective", name, routing_key=f"tenant{q}.{tail}"))
    return state, patterns


def rate(fn, keys, seconds: float) -> float:
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        for k in keys:
            fn(k)
        n += len(keys)
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    state, patterns = build(args.seed)
    print(f"setup: {N_BINDINGS} queues, 2 x {N_BINDINGS} topic + {N_BINDINGS} direct bindings "
          f"applied in {time.perf_counter() - t0:.2f}s")

    state.routing_cache.clear()
    t0 = time.perf_counter()
    compiled(state, "/", "topic")
    print(f"topic trie compile (10k bindings): {(time.perf_counter() - t0) * 1e3:.1f} ms")

    def topic_key() -> str:
        return ".".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))

    working_set = [topic_key() for _ in range(1000)]
    unique = [f"{topic_key()}.u{i}" if i % 2 else topic_key() for i in range(TOPIC_MEMO_LIMIT * 4)]
    hits = [len(route(state, "/", "topic", k)) for k in working_set[:200]]
    print(f"topic (wildcard-heavy): mean destinations per key {sum(hits) / len(hits):.1f}")

    def topic(k: str) -> object:
        return route(state, "/", "topic", k)

    r_hit = rate(topic, working_set, args.seconds)
    # defeat the memo: clear it before each pass over keys it has not seen
    def topic_cold(k: str) -> object:
        c = compiled(state, "/", "topic")
        c.topic.memo.clear()
        return route(state, "/", "topic", k)

    r_miss = rate(topic_cold, unique[:5000], args.seconds)
    def selective_cold(k: str) -> object:
        c = compiled(state, "/", "selective")
        c.topic.memo.clear()
        return route(state, "/", "selective", k)

    compiled(state, "/", "selective")
    sel_keys = [f"tenant{rng.randrange(12000)}." + rng.choice(
        ["orders.created", "x.created", "orders.y", "a.b.done", "z"]) for _ in range(1000)]
    sel = [len(route(state, "/", "selective", k)) for k in sel_keys[:200]]
    r_sel = rate(selective_cold, sel_keys, args.seconds)
    direct_keys = [f"key{rng.randrange(2500)}" for _ in range(1000)]
    r_direct = rate(lambda k: route(state, "/", "direct", k), direct_keys, args.seconds)
    default_keys = [f"q{rng.randrange(12000)}" for _ in range(1000)]
    r_default = rate(lambda k: route(state, "/", "", k), default_keys, args.seconds)

    regexes = []
    for pattern, name in patterns:
        parts = []
        for w in pattern.split("."):
            parts.append({"*": r"\.[^.]*", "#": r"(?:\.[^.]*)*"}.get(w, r"\." + re.escape(w)))
        regexes.append((re.compile("".join(parts)), name))

    def naive(k: str) -> object:
        s = "." + k
        return frozenset(n for rx, n in regexes if rx.fullmatch(s))

    r_naive = rate(naive, working_set[:20], min(args.seconds, 1.0))

    print(f"topic exchange, 10k bindings, memo hits : {r_hit:12,.0f} routes/s")
    print(f"topic exchange, 10k bindings, trie walk : {r_miss:12,.0f} routes/s")
    print(f"topic exchange, 10k selective bindings  : {r_sel:12,.0f} routes/s "
          f"(trie walk, mean {sum(sel) / len(sel):.1f} destinations)")
    print(f"direct exchange, 10k bindings           : {r_direct:12,.0f} routes/s")
    print(f"default exchange, 10k queues            : {r_default:12,.0f} routes/s")
    print(f"naive regex scan over 10k topic bindings: {r_naive:12,.0f} routes/s (reference)")


if __name__ == "__main__":
    main()
