"""RecordFifo behaves as a deque of the same ints (random operation
sequences checked against a real deque), packs records without an expiry in
8 bytes and refuses records it cannot hold."""
from __future__ import annotations

import tracemalloc
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.queue.fifo import RecordFifo
from broker.queue.machine import EXP_SHIFT, SIZE_BITS, rec_key

_index = st.integers(1, 2**40)
_record = st.one_of(
    st.builds(lambda i, s: i << SIZE_BITS | s, st.integers(1, 2**31), st.integers(0, 2**32 - 1)),
    st.builds(lambda i, s: i << SIZE_BITS | s, _index, st.integers(0, 2**32 - 1)),
    st.builds(lambda e, i, s: (e + 1) << EXP_SHIFT | i << SIZE_BITS | s,
              st.integers(0, 2**44), _index, st.integers(0, 2**32 - 1)),
)
_ops = st.lists(st.one_of(
    st.tuples(st.just("append"), _record),
    st.tuples(st.just("popleft"), st.none()),
    st.tuples(st.just("insort"), _record),
    st.tuples(st.just("many"), st.integers(0, 3000)),
    st.tuples(st.just("clear"), st.none()),
    st.tuples(st.just("extend"), st.lists(_record, max_size=80)),
), max_size=60)


def small(items: Iterable[int] = ()) -> RecordFifo:
    """A fifo of 64-record chunks: many chunk boundaries in small tests."""
    return RecordFifo(items, chunk=64)


@settings(max_examples=400, derandomize=True, deadline=None)
@given(_ops)
def test_same_as_a_deque(ops: list[tuple[str, object]]) -> None:
    f, d = small(), deque[int]()
    next_idx = 1
    for op, arg in ops:
        if op == "append":
            f.append(arg)  # type: ignore[arg-type]
            d.append(arg)  # type: ignore[arg-type]
        elif op == "popleft":
            if d:
                assert f.popleft() == d.popleft()
            else:
                with pytest.raises(IndexError):
                    f.popleft()
        elif op == "insort":
            # the machine insorts only into an index-ordered `lo`: keep d sorted
            d = deque(sorted(d, key=rec_key))
            f = small(d)
            rec = int(arg)  # type: ignore[call-overload]
            d.insert(bisect_left(d, rec_key(rec), key=rec_key), rec)
            f.insort(rec, rec_key)
        elif op == "many":
            for _ in range(int(arg)):  # type: ignore[call-overload]
                rec = next_idx << SIZE_BITS | 10
                next_idx += 1
                f.append(rec)
                d.append(rec)
        elif op == "extend":
            f.extend(arg)  # type: ignore[arg-type]
            d.extend(arg)  # type: ignore[arg-type]
        else:
            f.clear()
            d.clear()
        assert len(f) == len(d) and bool(f) == bool(d)
        if d:
            assert f[0] == d[0] and f[-1] == d[-1]
            mid = len(d) // 2
            assert f[mid] == d[mid] and f[-mid - 1] == d[-mid - 1]
    assert list(f) == list(d)
    assert f == d


def test_out_of_range_records_are_refused_and_leave_nothing() -> None:
    f = small([5])
    for bad in (-1, 1 << 192):
        with pytest.raises(ValueError):
            f.append(bad)
    assert list(f) == [5]
    with pytest.raises(IndexError):
        f[1]


def test_eight_bytes_per_record_without_expiry() -> None:
    n = 200_000
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    f = RecordFifo()
    for i in range(1, n + 1):
        f.append(i << SIZE_BITS | 1024)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert used / n < 9.0, used / n
    assert f[0] == 1 << SIZE_BITS | 1024 and f[-1] == n << SIZE_BITS | 1024


def test_requeue_at_the_head_reuses_the_popped_slot() -> None:
    """Take the head and put it back, over and over (a consumer nacking the
    head of an index-ordered queue): no slot is left behind per cycle."""
    f = small(i << SIZE_BITS | 5 for i in range(1, 11))
    for _ in range(10_000):
        rec = f.popleft()
        f.insort(rec, rec_key)
    assert list(f) == [i << SIZE_BITS | 5 for i in range(1, 11)]
    assert sum(len(c.w0) for c in f._chunks) == 10
    wide = (7 + 1) << EXP_SHIFT | 1 << SIZE_BITS | 5  # a wider record into a narrow slot
    f.popleft()
    f.insort(wide, rec_key)
    assert f[0] == wide and len(f) == 10
    with pytest.raises(ValueError):
        f.popleft()
        f.insort(-1, lambda r: 0)
    assert len(f) == 9 and f[0] == 2 << SIZE_BITS | 5
