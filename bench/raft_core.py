"""Raft core throughput: entries committed per second through an in-memory
3-node cluster (no I/O: MemoryStorage, messages handed over in memory).

The leader takes proposals in batches (`propose_batch`); every node drains
its Ready, "persists" synchronously into MemoryStorage, applies committed
entries (a no-op state machine) and hands messages to their destination.
The number printed is entries committed on the leader (and applied on every
node) per wall-clock second.

    .venv/bin/python bench/raft_core.py [--entries N] [--batch B] [--size BYTES] [--single] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.raft import MemoryStorage, Message, RaftConfig, RaftNode, Role  # noqa: E402


def run(total: int, batch: int, size: int, inflight_batches: int, single: bool = False) -> tuple[float, int]:
    ids = ["a", "b", "c"]
    cfg = RaftConfig(max_entries_per_msg=4096, max_size_per_msg=4 << 20, max_inflight_msgs=256)
    stores = {i: MemoryStorage(voters=ids) for i in ids}
    nodes = {i: RaftNode(i, stores[i], cfg, random.Random(k)) for k, i in enumerate(ids)}
    applied = dict.fromkeys(ids, 0)
    net: deque[Message] = deque()

    def drain(nid: str) -> None:
        node = nodes[nid]
        st = stores[nid]
        while node.has_ready():
            rd = node.ready()
            net.extend(rd.messages)
            if rd.snapshot is not None:
                st.apply_snapshot(rd.snapshot)
            if rd.entries:
                st.append(rd.entries)
            if rd.hard_state is not None:
                st.set_hard_state(rd.hard_state)
            net.extend(rd.persisted_messages)
            if rd.committed_entries:
                applied[nid] = rd.committed_entries[-1].index
            node.advance(rd, persisted=rd.must_persist)

    def pump() -> None:
        busy = True
        while busy:
            busy = False
            for nid in ids:
                if nodes[nid].has_ready():
                    drain(nid)
                    busy = True
            while net:
                m = net.popleft()
                nodes[m.dst].step(m)
                busy = True

    nodes["a"].campaign()
    pump()
    leader = nodes["a"]
    assert leader.role is Role.LEADER
    payload = b"x" * size
    start_index = leader.log.last_index()
    target = start_index + total
    data = [payload] * batch
    t0 = time.perf_counter()
    proposed = 0
    while min(applied.values()) < target:
        # Keep a few batches outstanding so replication is pipelined.
        while proposed < total and leader.log.last_index() - leader.log.committed < batch * inflight_batches:
            n = min(batch, total - proposed)
            if single:
                # A host loop iteration that received n separate proposals:
                # they still leave in one append per follower (broadcast is
                # deferred to ready()).
                for _ in range(n):
                    leader.propose(payload)
            else:
                leader.propose_batch(data[:n])
            proposed += n
            drain("a")
        # Deliver one round of messages, then let every node react.
        k = len(net)
        for _ in range(k):
            m = net.popleft()
            nodes[m.dst].step(m)
        for nid in ids:
            drain(nid)
        if not net and not any(n.has_ready() for n in nodes.values()) and proposed >= total:
            pump()
            break
    elapsed = time.perf_counter() - t0
    committed = leader.log.committed - start_index
    assert committed >= total, (committed, total)
    return elapsed, committed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--entries", type=int, default=300_000)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--pipeline", type=int, default=4, help="batches outstanding")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--single", action="store_true", help="propose() each entry instead of propose_batch()")
    a = ap.parse_args()
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        run(a.entries, a.batch, a.size, a.pipeline, a.single)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return
    rates = []
    for _ in range(a.repeat):
        el, n = run(a.entries, a.batch, a.size, a.pipeline, a.single)
        rates.append(n / el)
    print(
        f"raft_core: 3 nodes, {'propose() x' if a.single else 'propose_batch of '}{a.batch} per ready, {a.size} B entries, {a.entries} entries/run: "
        f"best {max(rates):,.0f} entries/s (runs: {', '.join(f'{r:,.0f}' for r in rates)})"
    )


if __name__ == "__main__":
    main()
