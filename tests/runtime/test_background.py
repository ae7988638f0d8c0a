"""runtime/background.py: spawned work is referenced until it ends (the
event loop holds tasks weakly), and its failure is logged, not lost."""
from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from broker.runtime import background
from broker.runtime.background import spawn


async def test_spawned_work_is_kept_until_done_and_its_failure_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    done = asyncio.Event()
    release = asyncio.Event()

    async def work() -> None:
        await release.wait()
        done.set()

    async def fails() -> None:
        raise RuntimeError("no leader")

    spawn(work(), "the work")
    assert len(background._running) == 1  # referenced while it runs
    with caplog.at_level(logging.DEBUG, logger="broker.background"):
        spawn(fails(), "a side command", logging.WARNING)
        gc.collect()  # nothing else references the tasks
        release.set()
        await asyncio.wait_for(done.wait(), 5)
        for _ in range(3):
            await asyncio.sleep(0)
    assert not background._running  # and let go once done
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "a side command failed: no leader")]
