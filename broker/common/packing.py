"""msgpack encoding with one reused Packer per thread and `default` hook.

`msgpack.packb` builds a new Packer per call, and a Packer allocates its
256 KiB buffer up front: above the node's malloc mmap threshold (64 KiB,
`node.tune_malloc`) that is an mmap and a munmap for every message packed,
about 8 us each on the publish path (bench/profile.py). A Packer kept per
thread reuses its buffer (`autoreset`: every `pack` starts empty and returns
its own bytes). Not for snapshots: the buffer keeps the size of the largest
object it packed.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import msgpack

_local = threading.local()


def packb(obj: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """Like `msgpack.packb(obj, use_bin_type=True, default=default)`."""
    try:
        packers: dict[Any, msgpack.Packer] = _local.packers
    except AttributeError:
        packers = _local.packers = {}
    p = packers.get(default)
    if p is None:
        p = packers[default] = msgpack.Packer(use_bin_type=True, default=default)
    out: bytes = p.pack(obj)
    return out
