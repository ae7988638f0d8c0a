"""What it costs to hand work from a storage thread to the event loop.

The WAL writer told the loop that a batch is durable with one
`loop.call_soon_threadsafe` per Raft group that had records in it; with one
publisher spread over 100 queues that was about one hand-off per message.
The node now queues the group ids and hands off once a drain
(runtime/node.py `DurableHandoff`). This measures one hand-off per
notification against one per batch of `--batch` notifications (a list the
loop walks), on uvloop, both ends counted (the thread's calls and the loop's
callbacks, from the first call to the last callback):

    .venv/bin/python bench/loop_handoff.py
    .venv/bin/python bench/loop_handoff.py --notifications 500000 --batch 50
"""
from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import uvloop


def measure(loop: Any, n: int, batch: int) -> tuple[float, float]:
    """(us per notification on the thread, us per notification end to end)."""
    got = [0]

    def one(_g: int) -> None:
        got[0] += 1

    def many(gs: list[int]) -> None:
        got[0] += len(gs)

    thread_s = [0.0]

    def worker() -> None:
        t = time.perf_counter()
        if batch > 1:
            for i in range(0, n, batch):
                loop.call_soon_threadsafe(many, list(range(i, min(n, i + batch))))
        else:
            for i in range(n):
                loop.call_soon_threadsafe(one, i)
        thread_s[0] = time.perf_counter() - t
        loop.call_soon_threadsafe(loop.stop)

    th = threading.Thread(target=worker)
    t0 = time.perf_counter()
    th.start()
    loop.run_forever()
    th.join()
    total = time.perf_counter() - t0
    if got[0] != n:
        raise RuntimeError(f"{got[0]} notifications arrived, {n} sent")
    return thread_s[0] / n * 1e6, total / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--notifications", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    loop = uvloop.new_event_loop()
    try:
        for r in range(args.rounds):
            for b in (1, args.batch):
                on_thread, total = measure(loop, args.notifications, b)
                what = "one call a notification" if b == 1 else f"one call per {b}"
                print(f"round {r + 1}, {what:>24}: {on_thread:5.2f} us on the thread, "
                      f"{total:5.2f} us end to end (a notification)", flush=True)
    finally:
        loop.close()


if __name__ == "__main__":
    main()
