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

from broker.common.config import Config, ConfigError, load_config
from broker.mgmt import ManagementServers, start_servers

from .definitions import DefinitionsError
from .mgmt_port import NodePort
from .node import Node

#: glibc's mallopt parameter; its value: a fixed threshold (setting one also
#: turns off glibc's dynamic adjustment of it)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 64 * 1024


def tune_malloc() -> bool:
    """Give message-sized buffers (64 KiB and up) their own mappings,
    returned to the kernel when freed. glibc's default threshold grows with
    every large block freed (up to 32 MiB), after which bodies are carved
    from the heap, whose freed holes the next ones do not fit: a broker
    streaming 64 KiB messages then grew by ~25 MiB per 32 MiB passed through
    and never gave it back (bench: tests/e2e/test_hostile.py's slow
    consumer). Returns False where there is no glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


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
