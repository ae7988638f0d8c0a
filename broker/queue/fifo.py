"""A FIFO of message records packed in machine words.

A ready message is one record: an int `(expiry + 1) << 96 | index << 32 |
size` (machine.py). Kept in a `deque[int]`, every record costs an 8-byte slot
plus a 32-40 byte int object: 40 bytes per ready message. `RecordFifo` keeps
them in chunks of unsigned 64-bit arrays instead: word 0 of every record,
word 1 (bits 64-127: indexes past 2**32, expiries) and word 2 (bits 128-191:
expiries) only in chunks that hold such a record. A ready message without an
expiry costs 8 bytes, with an expiry 24.

It does what the machine asks of `lo` and `hi`: append, extend, popleft, the first
and last record, length, iteration in order, clear, and a sorted insert
(`insort`, where the queue keeps index order). Behaviour is that of a deque
of the same ints; a record of 192 bits or more is refused (ValueError).
"""
from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator

_U64 = (1 << 64) - 1
_LIMIT = 1 << 192
CHUNK = 4096  # records per chunk an append starts (an insert may grow one past it)


class _Chunk:
    __slots__ = ("w0", "w1", "w2", "head")

    def __init__(self) -> None:
        self.w0 = array("Q")
        self.w1: array[int] | None = None
        self.w2: array[int] | None = None
        self.head = 0  # records before it were popped

    def get(self, i: int) -> int:
        v: int = self.w0[i]
        if self.w1 is not None:
            v |= self.w1[i] << 64
            if self.w2 is not None:
                v |= self.w2[i] << 128
        return v

    def _widen(self, rec: int) -> None:
        n = len(self.w0)
        if self.w1 is None:
            self.w1 = array("Q", bytes(8 * n))
        if rec >> 128 and self.w2 is None:
            self.w2 = array("Q", bytes(8 * n))

    def _check(self, rec: int) -> None:
        if rec < 0 or rec >= _LIMIT:
            raise ValueError(f"record out of range: {rec}")
        if rec >> 64 and (self.w1 is None or (rec >> 128 and self.w2 is None)):
            self._widen(rec)

    def _words(self) -> tuple[tuple[int, array[int] | None], ...]:
        return (0, self.w0), (64, self.w1), (128, self.w2)

    def set(self, pos: int, rec: int) -> None:
        """Overwrite physical position `pos` (a popped slot) with `rec`."""
        self._check(rec)
        for shift, w in self._words():
            if w is not None:
                w[pos] = (rec >> shift) & _U64

    def put(self, pos: int, rec: int) -> None:
        """Insert `rec` before physical position `pos` (len(w0): append)."""
        self._check(rec)
        for shift, w in self._words():
            if w is not None:
                w.insert(pos, (rec >> shift) & _U64)


class RecordFifo:
    """A deque-like FIFO of non-negative ints below 2**192 (see the module doc)."""

    __slots__ = ("_chunks", "_len", "_chunk")

    def __init__(self, items: Iterable[int] = (), chunk: int = CHUNK) -> None:
        self._chunks: deque[_Chunk] = deque()
        self._len = 0
        self._chunk = chunk  # records per chunk an append starts (tests use small ones)
        self.extend(items)

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __repr__(self) -> str:
        return f"RecordFifo({list(self)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RecordFifo, deque, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=False))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like deque

    def append(self, rec: int) -> None:
        chunks = self._chunks
        if chunks:
            c = chunks[-1]
            w0 = c.w0
            if len(w0) < self._chunk:
                if c.w1 is None and 0 <= rec <= _U64:  # the common case, inline
                    w0.append(rec)
                else:
                    c.put(len(w0), rec)
                self._len += 1
                return
        c = _Chunk()
        c.put(0, rec)
        chunks.append(c)
        self._len += 1

    def extend(self, recs: Iterable[int]) -> None:
        for rec in recs:
            self.append(rec)

    def popleft(self) -> int:
        if not self._len:
            raise IndexError("pop from an empty RecordFifo")
        chunks = self._chunks
        c = chunks[0]
        h = c.head
        rec: int = c.w0[h] if c.w1 is None else c.get(h)
        c.head = h = h + 1
        if h == len(c.w0):
            if len(chunks) == 1:  # emptied: the next append reuses it (a queue kept drained)
                del c.w0[:]
                c.w1 = c.w2 = None
                c.head = 0
            else:
                chunks.popleft()
        self._len -= 1
        return rec

    def __getitem__(self, i: int) -> int:
        n = self._len
        if i == 0 and n:  # the head: what the machine looks at most
            c = self._chunks[0]
            return c.w0[c.head] if c.w1 is None else c.get(c.head)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("RecordFifo index out of range")
        chunks = self._chunks
        if i == n - 1:
            c = chunks[-1]
            return c.get(len(c.w0) - 1)
        for c in chunks:
            live = len(c.w0) - c.head
            if i < live:
                return c.get(c.head + i)
            i -= live
        raise AssertionError("length and chunks disagree")  # pragma: no cover

    def __iter__(self) -> Iterator[int]:
        for c in list(self._chunks):
            for i in range(c.head, len(c.w0)):
                yield c.get(i)

    def clear(self) -> None:
        self._chunks.clear()
        self._len = 0

    def insort(self, rec: int, key: Callable[[int], int]) -> None:
        """Insert `rec` before the first record whose key is >= key(rec)
        (`bisect_left` then `insert` on a deque sorted by `key`)."""
        k = key(rec)
        for c in self._chunks:
            last = c.get(len(c.w0) - 1)
            if key(last) < k:
                continue
            lo, hi = c.head, len(c.w0)
            while lo < hi:
                mid = (lo + hi) // 2
                if key(c.get(mid)) < k:
                    lo = mid + 1
                else:
                    hi = mid
            if lo == c.head and lo > 0:
                c.set(lo - 1, rec)  # back into the slot the last popleft freed
                c.head = lo - 1
            else:
                c.put(lo, rec)
            self._len += 1
            return
        self.append(rec)
