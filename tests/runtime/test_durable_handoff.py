"""DurableHandoff (runtime/node.py): the WAL writer thread's durable reports
carried onto the event loop in batches. Every report made on a real thread
reaches the loop (none is lost between a drain's take and its flag), each
group once a drain, and one group's failing report does not drop another's."""
from __future__ import annotations

import asyncio
import random
import threading

from broker.runtime.node import DurableHandoff


async def test_every_report_from_another_thread_reaches_the_loop_after_it_was_made() -> None:
    loop = asyncio.get_running_loop()
    rng = random.Random(5)
    groups = [f"g{i}" for i in range(50)]
    # per group: how many reports were made before the loop last saw it
    made = {g: 0 for g in groups}
    seen_after: dict[str, int] = {}
    drains: list[str] = []

    def on_loop(gid: str) -> None:
        drains.append(gid)
        seen_after[gid] = made[gid]

    handoff = DurableHandoff(loop, on_loop)
    plan = [rng.choice(groups) for _ in range(20_000)]

    def writer() -> None:
        for k, gid in enumerate(plan):
            made[gid] += 1  # the durable state moves, then it is reported
            handoff.notify(gid, k, 1)

    t = threading.Thread(target=writer)
    t.start()
    while t.is_alive():
        await asyncio.sleep(0.001)
    t.join()
    await asyncio.sleep(0)  # the drain scheduled by the last report
    for _ in range(100):
        if all(seen_after.get(g) == made[g] for g in set(plan)):
            break
        await asyncio.sleep(0.001)
    assert {g: seen_after.get(g) for g in set(plan)} == {g: made[g] for g in set(plan)}
    # batched: far fewer calls than reports
    assert len(drains) < len(plan)


async def test_a_failing_report_does_not_drop_the_others_in_its_drain() -> None:
    loop = asyncio.get_running_loop()
    got: list[str] = []
    done = asyncio.Event()

    def on_loop(gid: str) -> None:
        if gid == "bad":
            raise RuntimeError("boom")
        got.append(gid)
        if gid == "last":
            done.set()

    handoff = DurableHandoff(loop, on_loop)

    def writer() -> None:
        for gid in ("a", "bad", "b", "a", "last"):
            handoff.notify(gid, 1, 1)

    t = threading.Thread(target=writer)
    t.start()
    t.join()
    await asyncio.wait_for(done.wait(), 5)
    assert got == ["a", "b", "last"]
