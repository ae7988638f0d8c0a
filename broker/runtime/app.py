"""The broker process: one node and its management servers.

Where it sits: the process entry (`qq-broker`, `python -m broker`:
broker/__main__.py calls `main`). It reads the configuration, tunes the
allocator and the garbage collector for throughput, and runs `serve`: start
the `Node` (runtime/node.py), then the management servers over it
(`start_management`: the HTTP API, metrics and the membership reconciler of
`broker.mgmt`, handed the node's typed port `mgmt_port.NodePort`), print
"ready on port N", and on SIGINT/SIGTERM close the management servers, then
the node. SIGUSR1 writes the node's status to the log.

Tests that run nodes in-process start a `Node` alone; one that wants its
management API as well calls `start_management(node)` after `Node.start()`
and closes what it returns before `Node.stop()`.

May import: every runtime module, `broker.mgmt` (the one place the runtime
starts it).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from pathlib import Path

import broker.compiled as compiled
from broker.common.config import Config, ConfigError, load_config
from broker.mgmt import ManagementServers, start_servers

from .definitions import DefinitionsError
from .mgmt_port import NodePort
from .node import Node

#: glibc's mallopt parameters (setting either fixes both: glibc's dynamic
#: adjustment of them goes off)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: blocks this big or bigger get their own mapping; smaller ones, message
#: bodies included, come from the heap and are reused once freed
MMAP_THRESHOLD_BYTES = 32 << 20
#: free memory at the top of the heap kept for the next blocks
TRIM_THRESHOLD_BYTES = 32 << 20
#: seconds between two malloc_trim(0) calls, which hand the kernel back the
#: pages of every free block of the heap, not only at its top
TRIM_EVERY_S = 10.0


def tune_malloc(trim_every: float = TRIM_EVERY_S) -> bool:
    """Bodies come from the heap, and a thread gives free memory back.

    With a fixed 64 KiB mmap threshold (the broker's choice until this), every
    64 KiB or 1 MiB body, and every copy of one, was a fresh mapping: an
    mmap, a page fault per 4 KiB touched and an munmap with a TLB shootdown
    when freed, half of the event loop's CPU in the 64 KiB row (perf). From
    the heap: 64 KiB 2.9k -> 4.7k msg/s, 1 MiB 253 -> 374 msg/s, 1 node
    (bench/report.py). The cost is the heap's holes: bodies freed in another
    order than allocated leave free blocks between live ones, which glibc
    keeps (and the RSS with them) unless asked; the trimmer thread asks every
    `trim_every` s (0: never). In tests/e2e/test_hostile.py's slow consumer,
    RSS levels off at ~230 MiB instead of ~155 MiB with mappings (glibc's
    default, a threshold growing to 32 MiB with no trimming, grew without
    end there). malloc_trim takes ~3 ms on a 1 GiB heap with nothing to give
    back, ~45 ms when it returns 500 MiB (the heap's lock is held meanwhile).
    Returns False where there is no glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
        ok = bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)) and ok
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    if trim_every > 0:
        import threading
        import time

        def trimmer() -> None:
            while True:
                time.sleep(trim_every)
                trim(0)  # ctypes lets go of the GIL for the call

        threading.Thread(target=trimmer, name="malloc-trim", daemon=True).start()
    return ok


def main(argv: list[str] | None = None) -> int:
    tune_malloc()
    ap = argparse.ArgumentParser(prog="qq-broker", description="Run one broker node.")
    ap.add_argument("--config", help="rabbitmq.conf-style configuration file")
    ap.add_argument("--log-level", default=os.environ.get("QQ_LOG_LEVEL", "INFO"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        text = Path(args.config).read_text() if args.config else ""
        config = load_config(text, os.environ, source=args.config or "config")
    except (ConfigError, OSError) as exc:
        print(f"qq-broker: invalid configuration: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    tune_gc()
    # compiled (mypyc) or pure Python: broker/compiled.py
    logging.getLogger("broker").info("modules: %s", compiled.describe())
    return asyncio.run(serve(config))


def tune_gc() -> None:
    """Young collections every 50,000 allocations instead of 700: a message
    allocates dozens of objects, so the default ran one every few messages,
    each walking the young generation (bench/report.py: +15-25% throughput,
    lower p99, 3 nodes, 1 KiB); older generations at the default ratios, so
    cyclic garbage (closed connections) still goes within seconds under load.
    What exists before the node starts (modules, configuration) is frozen
    out of the walks; nothing of the node is: a recovered queue deleted later
    must be collectable."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 10, 10)


def management_wanted(config: Config) -> bool:
    """Any management listener (HTTP API, metrics; plain or TLS) or the
    membership reconciler is configured."""
    return bool(config["management.tcp.port"] or config["prometheus.tcp.port"]
                or config["management.ssl.port"] or config["prometheus.ssl.port"]
                or config["quorum_queue.continuous_membership_reconciliation.enabled"])


async def start_management(node: Node) -> ManagementServers | None:
    """The management servers over a started node, or None when none is
    configured. (Their TLS files were checked by `Node.start` before it
    touched the disk.)"""
    if not management_wanted(node.config):
        return None
    return await start_servers(NodePort(node))


async def serve(config: Config) -> int:
    """Run one node until SIGINT/SIGTERM; the process's exit status."""
    node = Node(config)
    mgmt: ManagementServers | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, node.log_status)
    try:
        await node.start()
        mgmt = await start_management(node)
    except DefinitionsError as exc:
        print(f"qq-broker: {exc}", file=sys.stderr, flush=True)
        await node.stop()
        return 2
    except (RuntimeError, ConfigError) as exc:
        print(f"qq-broker {node.node_name}: cannot start: {exc}", file=sys.stderr, flush=True)
        await node.stop()
        return 1
    print(f"qq-broker {node.node_name}: ready on port {node.port}", flush=True)
    await stop.wait()
    if mgmt is not None:
        await mgmt.close()
    await node.stop()
    return 0


__all__ = ["main", "management_wanted", "serve", "start_management", "tune_gc", "tune_malloc"]
