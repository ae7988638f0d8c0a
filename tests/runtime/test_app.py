"""The process wiring (runtime/app.py): which configurations start the
management servers over the node, and how it tunes malloc. No broker
process (the malloc test runs a small Python one)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from broker.common.config import load_config
from broker.runtime.app import management_wanted, start_management

OFF = {"QQ__MANAGEMENT__TCP__PORT": "0", "QQ__PROMETHEUS__TCP__PORT": "0"}


@pytest.mark.parametrize("extra, wanted", [
    ({}, False),
    ({"QQ__MANAGEMENT__TCP__PORT": "15672"}, True),
    ({"QQ__PROMETHEUS__TCP__PORT": "15692"}, True),
    ({"QQ__MANAGEMENT__SSL__PORT": "15671"}, True),
    ({"QQ__PROMETHEUS__SSL__PORT": "15691"}, True),
    ({"QQ__QUORUM_QUEUE__CONTINUOUS_MEMBERSHIP_RECONCILIATION__ENABLED": "true"}, True),
])
def test_management_is_started_when_a_listener_or_the_reconciler_is_configured(
        extra: dict[str, str], wanted: bool) -> None:
    assert management_wanted(load_config("", {**OFF, **extra})) is wanted


def test_the_defaults_start_the_management_api_and_metrics() -> None:
    assert management_wanted(load_config("", {}))


def test_nothing_is_started_over_a_node_without_management() -> None:
    node: Any = SimpleNamespace(config=load_config("", OFF))
    assert asyncio.run(start_management(node)) is None


_HOLES = r"""
import os, sys, time
from broker.runtime.app import tune_malloc

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024

assert tune_malloc(trim_every=float(sys.argv[1]))
bodies = [os.urandom(64) * 1024 for _ in range(4000)]  # 250 MiB of 64 KiB bodies, from the heap
full = rss()
del bodies[::2]  # every other one freed: holes between live bodies, none at the top
deadline = time.monotonic() + float(sys.argv[2])
while rss() > full - 100 and time.monotonic() < deadline:
    time.sleep(0.01)
print(full, rss())
"""


@pytest.mark.parametrize("trim_every, returned", [(0.05, True), (0, False)])
def test_bodies_come_from_the_heap_and_the_trimmer_gives_holes_back(trim_every: float, returned: bool) -> None:
    """64 KiB bodies are heap blocks (an mmap each would return its memory at
    free, trimmer or not); freeing every other one leaves holes glibc keeps,
    until the trimmer thread hands their pages back (about 125 MiB)."""
    import subprocess
    import sys

    wait = "10" if returned else "2"  # without a trimmer: two seconds of nothing given back
    out = subprocess.run([sys.executable, "-c", _HOLES, str(trim_every), wait],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    full, after = map(int, out.split())
    assert full >= 250
    if returned:
        assert after < full - 100, (full, after)
    else:
        assert after > full - 20, (full, after)
