"""Benchmark of the quorum-queue state machine (broker.queue).

Prints:
- bytes of state per ready message, measured with tracemalloc for N ready
  messages (default 1,000,000; target <= 64 B, RabbitMQ documents >= 32 B);
- commands applied per second for an enqueue + checkout + settle workload
  (one consumer, prefetch 1000, one Settle per delivered message; target
  >= 200,000/s): once including building each Meta/command object in the
  loop (as the runtime must), once with them pre-built (the machine alone);
  plus a 4-consumer round-robin variant and enqueue-only.

Usage: .venv/bin/python bench/queue_machine.py [--messages N] [--ops N]
"""
from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

from broker.queue import (
    ChannelRef,
    Checkout,
    ConsumerId,
    Deliver,
    Enqueue,
    Meta,
    QueueConfig,
    Settle,
    apply,
    new_state,
)


def _clock() -> float:
    """CPU time of this process: on the shared 2-core machine wall time mostly
    measures the other tenants (pass --wall to use wall time instead)."""
    return time.process_time() if not _WALL else time.perf_counter()


_WALL = False


def memory_per_message(n: int, ttl: bool = False) -> float:
    cfg = QueueConfig("bench", message_ttl_ms=60_000 if ttl else None)
    pub = ChannelRef("pub")
    gc.collect()
    tracemalloc.start()
    state = new_state(cfg, created_ms=0)
    base = tracemalloc.get_traced_memory()[0]
    for i in range(1, n + 1):
        apply(Meta(i, 1, 1_000), Enqueue(pub, i, 1024), state)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert state.messages_ready() == n
    return used / n


def throughput_enqueue_checkout_settle(ops: int, consumers: int = 1) -> float:
    state = new_state(QueueConfig("bench"), created_ms=0)
    cids = [ConsumerId(ChannelRef(f"ch{i}"), "c") for i in range(consumers)]
    idx = 0
    for c in cids:
        idx += 1
        apply(Meta(idx, 1, 0), Checkout(c, 1000), state)
    pub = ChannelRef("pub")
    commands = 0
    t0 = _clock()
    n = ops // 2
    for seq in range(1, n + 1):
        idx += 1
        _, _, effects = apply(Meta(idx, 1, seq), Enqueue(pub, seq, 100), state)
        commands += 1
        for e in effects:
            if isinstance(e, Deliver):
                for d in e.deliveries:
                    idx += 1
                    apply(Meta(idx, 1, seq), Settle(e.consumer, (d[0],)), state)
                    commands += 1
    dt = _clock() - t0
    assert state.messages_total() == 0, state.overview()
    return commands / dt


def throughput_prebuilt(ops: int) -> float:
    """Enqueue + checkout + settle with the commands and metas built before the
    clock starts: the machine's own apply rate (one consumer, so msg id k is
    the k-th enqueued message)."""
    state = new_state(QueueConfig("bench"), created_ms=0)
    c = ConsumerId(ChannelRef("ch"), "c")
    apply(Meta(1, 1, 0), Checkout(c, 1000), state)
    pub = ChannelRef("pub")
    n = ops // 2
    script = []
    idx = 1
    for seq in range(1, n + 1):
        idx += 1
        script.append((Meta(idx, 1, seq), Enqueue(pub, seq, 100)))
        idx += 1
        script.append((Meta(idx, 1, seq), Settle(c, (seq - 1,))))
    t0 = _clock()
    for meta, cmd in script:
        apply(meta, cmd, state)
    dt = _clock() - t0
    assert state.messages_total() == 0, state.overview()
    return len(script) / dt


def throughput_enqueue_only(ops: int) -> float:
    state = new_state(QueueConfig("bench"), created_ms=0)
    pub = ChannelRef("pub")
    t0 = _clock()
    for i in range(1, ops + 1):
        apply(Meta(i, 1, i), Enqueue(pub, i, 100), state)
    return ops / (_clock() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--wall", action="store_true", help="rates per wall-clock second")
    a = ap.parse_args()
    global _WALL
    _WALL = a.wall
    unit = "wall" if a.wall else "CPU"
    print(f"(rates are commands per {unit} second)")
    print(f"memory: {memory_per_message(a.messages):.1f} bytes/ready message "
          f"({a.messages} messages, no TTL)")
    print(f"memory: {memory_per_message(a.messages // 4, ttl=True):.1f} bytes/ready message "
          f"({a.messages // 4} messages, x-message-ttl set)")
    print(f"throughput enqueue+checkout+settle, 1 consumer: "
          f"{throughput_enqueue_checkout_settle(a.ops):,.0f} commands/s")
    print(f"throughput enqueue+checkout+settle, 1 consumer, commands pre-built: "
          f"{throughput_prebuilt(a.ops):,.0f} commands/s")
    print(f"throughput enqueue+checkout+settle, 4 consumers: "
          f"{throughput_enqueue_checkout_settle(a.ops, consumers=4):,.0f} commands/s")
    print(f"throughput enqueue only: {throughput_enqueue_only(a.ops):,.0f} commands/s")


if __name__ == "__main__":
    main()
