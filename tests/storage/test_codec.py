"""Pure format functions: records, segments, snapshots, group-dir names and the
composition rule that says which segment/WAL entries are live."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.storage import CorruptSegmentError, CorruptSnapshotError, InvalidGroupIdError, codec


@given(st.text(min_size=1, max_size=120))
def test_group_dir_names_are_safe_and_invertible(gid: str) -> None:
    try:
        gid.encode("utf-8")
    except UnicodeEncodeError:
        with pytest.raises(InvalidGroupIdError):
            codec.encode_group_dir(gid)
        return
    name = codec.encode_group_dir(gid)
    assert "/" not in name and name not in (".", "..") and "\0" not in name
    assert len(name) <= codec.MAX_DIR_NAME
    assert all(c.isascii() for c in name)
    if "~" not in name:
        assert codec.decode_group_dir(name) == gid


def test_group_dir_examples() -> None:
    assert codec.encode_group_dir("%2F/orders") == "%252F%2Forders"
    assert codec.encode_group_dir("..") == "%2E%2E"
    long = codec.encode_group_dir("q" * 500)
    assert "~" in long and long != codec.encode_group_dir("q" * 501)
    assert codec.decode_group_dir(long) is None
    with pytest.raises(InvalidGroupIdError):
        codec.encode_group_dir("")


@given(st.integers(0, 255), st.integers(1, 2**32), st.integers(1, 2**64 - 1),
       st.integers(0, 2**64 - 1), st.binary(max_size=300))
def test_record_roundtrip_and_every_bit_flip_is_caught(kind: int, ref: int, index: int,
                                                        term: int, data: bytes) -> None:
    ref = ref % 2**32
    rec = codec.encode_entry_header(ref, index, term, kind, data) + data
    got = codec.decode_record(rec, 0)
    assert got is not None
    assert (got.rtype, got.flags, got.ref, got.index, got.term, got.payload) == (
        codec.REC_ENTRY, kind, ref, index, term, data)
    assert got.end == len(rec)
    assert codec.decode_record(rec[:-1], 0) is None  # torn
    for bit in range(0, len(rec) * 8, 7):
        bad = bytearray(rec)
        bad[bit // 8] ^= 1 << (bit % 8)
        assert codec.decode_record(bytes(bad), 0) is None


def test_hard_state_and_group_records() -> None:
    hs = codec.decode_record(codec.encode_hard_state(3, 7, "n2", 5), 0)
    assert hs is not None and (hs.term, hs.index, hs.payload, hs.flags) == (7, 5, b"n2", 1)
    hs = codec.decode_record(codec.encode_hard_state(3, 7, None, 5), 0)
    assert hs is not None and hs.flags == 0 and hs.payload == b""
    g = codec.decode_record(codec.encode_group_def(9, "%2F/q"), 0)
    assert g is not None and (g.rtype, g.ref, g.payload) == (codec.REC_GROUP, 9, b"%2F/q")


def test_segment_roundtrip_and_checks() -> None:
    ents = [(10 + k, 2 + k // 2, k % 3, bytes([k]) * k) for k in range(5)]
    buf = codec.encode_segment(8, ents, reset=True)
    flags, max_count, count = codec.decode_segment_header(buf, "t")
    assert (flags, max_count, count) == (codec.SEG_FLAG_RESET, 8, 5)
    slots = codec.decode_segment_index(buf[16:], count, len(buf), "t")
    assert [s.idx for s in slots] == [10, 11, 12, 13, 14]
    assert slots[0].offset == 16 + 8 * 32
    for s, (index, term, kind, data) in zip(slots, ents, strict=True):
        stored = buf[s.offset : s.offset + s.length]
        assert stored == bytes([kind]) + data and s.term == term
        assert codec.entry_crc(index, term, stored) == s.crc
    assert len(buf) == 16 + 8 * 32 + sum(1 + len(e[3]) for e in ents)
    with pytest.raises(CorruptSegmentError):
        codec.decode_segment_header(b"XXSG" + buf[4:], "t")
    with pytest.raises(CorruptSegmentError):
        codec.decode_segment_index(buf[16:], count, len(buf) - 1, "t")
    with pytest.raises(ValueError):
        codec.encode_segment(2, ents)


def test_snapshot_roundtrip_and_damage() -> None:
    buf = codec.encode_snapshot_header(9, 4, b"cfg", b"data") + b"cfg" + b"data"
    assert codec.decode_snapshot(buf, "s") == (9, 4, b"cfg", b"data")
    for n in (0, 10, len(buf) - 1):
        with pytest.raises(CorruptSnapshotError):
            codec.decode_snapshot(buf[:n], "s")
    bad = bytearray(buf)
    bad[-1] ^= 4
    with pytest.raises(CorruptSnapshotError):
        codec.decode_snapshot(bytes(bad), "s")


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        ([(1, 10, False)], [(1, 10)]),
        ([(1, 10, False), (11, 20, False)], [(1, 10), (11, 20)]),
        ([(1, 10, False), (5, 7, False)], [(1, 4), (5, 7)]),  # overwrite
        ([(1, 10, False), (1, 3, False)], [None, (1, 3)]),
        ([(1, 10, False), (5, 7, False), (3, 4, False)], [(1, 2), None, (3, 4)]),
        ([(1, 10, False), (20, 25, False)], [None, (20, 25)]),  # gap restarts the log
        ([(1, 10, False), (5, 8, True)], [None, (5, 8)]),  # explicit reset
        ([(5, 8, True), (1, 2, False)], [None, (1, 2)]),
    ],
)
def test_compose(runs: list[tuple[int, int, bool]], expected: list[tuple[int, int] | None]
                 ) -> None:
    assert codec.compose(runs) == expected


@given(st.binary(max_size=70_000), st.integers(0, 2**32 - 1), st.integers(0, 64))
def test_the_fast_crc_is_zlibs_crc32(data: bytes, start: int, skip: int) -> None:
    """Files written with zlib-ng's crc32 read back with the standard
    library's (the fallback, and what the Spark audit checks with), and the
    other way round: the same CRC-32 for the same bytes, seeded or not, from
    bytes or from a memoryview into a bigger buffer."""
    import zlib

    from zlib_ng import zlib_ng

    assert codec.crc32 is zlib_ng.crc32  # the broker's pinned dependency is in use
    assert codec.crc32(data) == zlib.crc32(data)
    assert codec.crc32(data, start) == zlib.crc32(data, start)
    view = memoryview(data)[skip:]
    assert codec.crc32(view, start) == zlib.crc32(view, start)
