"""Work the runtime starts and does not wait for.

Where it sits: a low module of the runtime (no runtime imports). Metadata
commands sent on the side (a leader's election report, an auto-delete, a
membership write-back), a joiner's admission: `spawn` runs them as tasks the
module keeps referenced until done (the event loop holds tasks only weakly:
an unreferenced one may be collected mid-flight) and logs a failure, which
is retried or reported elsewhere (`log_failure`, also for futures the
caller already has)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from functools import partial
from typing import Any

log = logging.getLogger("broker.background")

_running: set[asyncio.Future[Any]] = set()


def spawn(aw: Awaitable[Any], what: str, level: int = logging.DEBUG) -> None:
    """Run `aw` in the background; a failure is logged at `level` as `what`."""
    fut = asyncio.ensure_future(aw)
    _running.add(fut)
    fut.add_done_callback(_running.discard)
    fut.add_done_callback(partial(log_failure, what, level))


def log_failure(what: str, level: int, fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.log(level, "%s failed: %s", what, fut.exception())


__all__ = ["log_failure", "spawn"]
