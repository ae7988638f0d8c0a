"""msgpack encoding with one reused Packer per thread and `default` hook.

`msgpack.packb` builds a new Packer per call, and a Packer allocates its
256 KiB buffer up front: above the node's malloc mmap threshold (64 KiB,
`app.tune_malloc`) that is an mmap and a munmap for every message packed,
about 8 us each on the publish path (bench/profile.py). A Packer kept per
thread reuses its buffer (`autoreset`: every `pack` starts empty and returns
its own bytes). A Packer that packed 1 MiB or more is dropped, so no thread
keeps a snapshot-sized buffer; a `default` hook that packs again gets a
fresh Packer. `array_header` heads a batch of items packed one by one (the
peer transport's frames).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import msgpack

_local = threading.local()
# A Packer whose output passed this size is dropped: its buffer (as big as
# the biggest object it packed, a snapshot with bodies say) is not kept.
KEEP_BELOW = 1 << 20


def _packer(default: Callable[[Any], Any] | None) -> msgpack.Packer:
    try:
        packers: dict[Any, msgpack.Packer] = _local.packers
    except AttributeError:
        packers = _local.packers = {}
    p = packers.get(default)
    if p is None:
        p = packers[default] = msgpack.Packer(use_bin_type=True, default=default)
    return p


def array_header(n: int) -> bytes:
    """msgpack's header of an `n`-item array (items packed separately follow it)."""
    out: bytes = _packer(None).pack_array_header(n)
    return out


def packb(obj: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """Like `msgpack.packb(obj, use_bin_type=True, default=default)`."""
    local = _local
    if getattr(local, "busy", False):  # re-entered from a `default` hook: not the shared buffer
        out: bytes = msgpack.packb(obj, use_bin_type=True, default=default)
        return out
    p = _packer(default)
    local.busy = True
    try:
        out = p.pack(obj)
    finally:
        local.busy = False
    if len(out) >= KEEP_BELOW:
        del local.packers[default]
    return out
