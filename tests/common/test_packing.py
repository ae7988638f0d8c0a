"""broker.common.packing: the reused per-thread Packer encodes exactly what
msgpack.packb does, and a failed pack leaves nothing behind for the next."""
from __future__ import annotations

import threading
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.common.packing import array_header, packb

_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=50) | st.binary(max_size=300),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=10), inner, max_size=8),
    max_leaves=30)


@settings(max_examples=300, derandomize=True)
@given(_values)
def test_same_bytes_as_packb(value: Any) -> None:
    assert packb(value) == msgpack.packb(value, use_bin_type=True)


def test_big_then_small_and_a_failure_in_between() -> None:
    big = [1, b"x" * 300_000]  # grows the reused buffer past its initial size
    assert packb(big) == msgpack.packb(big, use_bin_type=True)
    try:
        packb([1, 2, object()])
    except TypeError:
        pass
    else:
        raise AssertionError("an object msgpack cannot encode was packed")
    assert packb([3]) == b"\x91\x03"  # nothing of the failed pack is left in the buffer


def test_a_hook_that_packs_again_and_big_buffers_are_not_kept() -> None:
    from broker.common import packing

    def hook(obj: Any) -> Any:
        if isinstance(obj, set):
            return [packb(sorted(obj), hook)]  # re-enters packb on this thread
        raise TypeError(obj)

    value = ["a", {2, 1}, b"z"]
    assert packb(value, hook) == msgpack.packb(value, use_bin_type=True, default=hook)
    packb([b"x" * (2 << 20)])
    assert None not in packing._local.packers  # the Packer that grew to 2 MiB was dropped
    assert packb([1]) == b"\x91\x01"


def test_default_hook_and_threads() -> None:
    def hook(obj: Any) -> Any:
        if isinstance(obj, set):
            return sorted(obj)
        raise TypeError(obj)

    assert packb({1, 2}, hook) == msgpack.packb([1, 2])
    results: list[bytes] = []

    def work(i: int) -> None:
        for _ in range(2000):
            out = packb([i, b"y" * i])
            if out != msgpack.packb([i, b"y" * i], use_bin_type=True):
                results.append(out)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(1, 5)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert results == []


def test_array_header_then_items_is_the_array() -> None:
    for n in (0, 1, 15, 16, 65535, 65536):
        items = list(range(n))
        assert array_header(n) + b"".join(packb(i) for i in items) == msgpack.packb(items)
