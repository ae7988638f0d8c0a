"""On-disk formats of broker/storage, as pure encode/decode functions.

Sits under wal.py / segment.py / snapshot.py, which do the file I/O; this
module only turns values into bytes and back, so every format is defined in
one place (docs/STORAGE.md documents the same layouts byte by byte).
All integers are little-endian. Checksums are CRC-32/ISO-HDLC (zlib.crc32's),
computed by `crc32` below: zlib-ng's (carry-less multiply, ~60 GB/s on this
machine) where the zlib-ng package is installed, else the standard library's
(~7 GB/s); both give the same value for the same bytes.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import NamedTuple

from .errors import CorruptSegmentError, CorruptSnapshotError, InvalidGroupIdError

try:  # the same function, ~9x faster on 64 KiB bodies (bench/storage.py)
    from zlib_ng.zlib_ng import crc32 as crc32
except ImportError:  # pragma: no cover - zlib-ng is a pinned broker dependency
    from zlib import crc32 as crc32

# --------------------------------------------------------------------- WAL
WAL_MAGIC = b"QQWL"
WAL_VERSION = 1
#: magic[4] version u8, reserved[3], file sequence u64
WAL_HEADER = struct.Struct("<4sB3xQ")
WAL_HEADER_SIZE = WAL_HEADER.size  # 16

#: Record: crc u32 | length u32 | type u8 | flags u8 | reserved u16 | group_ref u32
#:         | index u64 | term u64 | payload[length]
#: crc = crc32(payload, crc32(record bytes 4..31)).
REC_CRC = struct.Struct("<I")
REC_REST = struct.Struct("<IBBHIQQ")  # everything after the crc
REC_HEADER_SIZE = 4 + REC_REST.size  # 32

REC_GROUP = 1  # defines group_ref -> group id (payload: UTF-8 id) within one WAL file
REC_ENTRY = 2  # a log entry; flags = entry kind, payload = data
REC_HARD_STATE = 3  # index = commit, term = term, flags bit0 = voted_for present
REC_DELETE = 4  # the group was deleted from this node: forget everything before
REC_TYPES = frozenset({REC_GROUP, REC_ENTRY, REC_HARD_STATE, REC_DELETE})

HS_HAS_VOTE = 0x01
#: ENTRY record `reserved` bit: this entry starts a new log for its group
#: (append after a snapshot install); everything before it is void.
REC_FLAG_RESET = 0x0001

_pack_rest = REC_REST.pack
_pack_crc = REC_CRC.pack
_crc32 = crc32


def encode_wal_header(seq: int) -> bytes:
    return WAL_HEADER.pack(WAL_MAGIC, WAL_VERSION, seq)


def decode_wal_header(buf: bytes) -> int | None:
    """The file's sequence number, or None if the header is torn/invalid."""
    if len(buf) < WAL_HEADER_SIZE:
        return None
    magic, version, seq = WAL_HEADER.unpack_from(buf, 0)
    if magic != WAL_MAGIC or version != WAL_VERSION:
        return None
    return int(seq)


def encode_record(rtype: int, flags: int, ref: int, index: int, term: int, payload: bytes) -> bytes:
    rest = _pack_rest(len(payload), rtype, flags, 0, ref, index, term)
    return _pack_crc(_crc32(payload, _crc32(rest))) + rest + payload


def encode_entry_header(
    ref: int, index: int, term: int, kind: int, data: bytes, reset: bool = False
) -> bytes:
    """The 32-byte header of an ENTRY record (the data follows it verbatim)."""
    rest = _pack_rest(len(data), REC_ENTRY, kind, REC_FLAG_RESET if reset else 0, ref, index, term)
    return _pack_crc(_crc32(data, _crc32(rest))) + rest


def encode_hard_state(ref: int, term: int, voted_for: str | None, commit: int) -> bytes:
    vote = b"" if voted_for is None else voted_for.encode("utf-8")
    flags = 0 if voted_for is None else HS_HAS_VOTE
    return encode_record(REC_HARD_STATE, flags, ref, commit, term, vote)


def encode_group_def(ref: int, group_id: str) -> bytes:
    return encode_record(REC_GROUP, 0, ref, 0, 0, group_id.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class WalRecord:
    rtype: int
    flags: int
    reserved: int
    ref: int
    index: int
    term: int
    payload: bytes
    offset: int  # file offset of the record's first byte
    end: int  # file offset just past the record


def decode_record(buf: bytes | memoryview, pos: int) -> WalRecord | None:
    """Decode the record at `pos`, or None if it is torn, truncated or corrupt."""
    if pos + REC_HEADER_SIZE > len(buf):
        return None
    (crc,) = REC_CRC.unpack_from(buf, pos)
    length, rtype, flags, reserved, ref, index, term = REC_REST.unpack_from(buf, pos + 4)
    if rtype not in REC_TYPES:
        return None
    end = pos + REC_HEADER_SIZE + length
    if end > len(buf):
        return None
    payload = bytes(buf[pos + REC_HEADER_SIZE : end])
    if _crc32(payload, _crc32(buf[pos + 4 : pos + REC_HEADER_SIZE])) != crc:
        return None
    return WalRecord(rtype, flags, reserved, ref, index, term, payload, pos, end)


def record_length_at(buf: bytes | memoryview, pos: int) -> int | None:
    """The length field of a (possibly corrupt) record, if it fits the buffer."""
    if pos + REC_HEADER_SIZE > len(buf):
        return None
    (length,) = struct.unpack_from("<I", buf, pos + 4)
    end = pos + REC_HEADER_SIZE + length
    return end if end <= len(buf) else None


# ----------------------------------------------------------------- segments
SEG_MAGIC = b"QQSG"
SEG_VERSION = 1
#: magic[4] version u8 flags u8 max_count u16 count u32 header_crc u32 (over bytes 0..11)
SEG_HEADER = struct.Struct("<4sBBHI")
#: Segment flag: this segment starts a new log (written after a snapshot
#: install reset it); every segment of a lower sequence number is void.
SEG_FLAG_RESET = 0x01
#: Segment flag: a compacted segment. Its index slots hold strictly increasing
#: (not consecutive) indexes; the file covers [first slot, last slot] and an
#: index in that range without a slot was compacted away (never served).
SEG_FLAG_SPARSE = 0x02
SEG_FLAGS = SEG_FLAG_RESET | SEG_FLAG_SPARSE
SEG_HEADER_SIZE = SEG_HEADER.size + 4  # 16
#: index slot: index u64 term u64 offset u64 length u32 crc u32
SEG_SLOT = struct.Struct("<QQQII")
SEG_SLOT_SIZE = SEG_SLOT.size  # 32
_IT = struct.Struct("<QQ")


def entry_crc(index: int, term: int, stored: bytes | memoryview) -> int:
    """Segment entry checksum: covers index, term, kind byte and data."""
    return _crc32(stored, _crc32(_IT.pack(index, term)))


def check_stored(s: SegmentSlot, stored: bytes | memoryview, where: str) -> None:
    """Raise CorruptSegmentError unless `stored` is the entry (kind byte +
    data) that slot `s` describes: its length and crc."""
    if len(stored) != s.length or entry_crc(s.idx, s.term, stored) != s.crc:
        raise CorruptSegmentError(f"{where}: entry {s.idx} checksum mismatch")


class SegmentSlot(NamedTuple):
    """One 32-byte index slot of a segment file."""

    idx: int  # the entry's Raft index ("index" would shadow tuple.index)
    term: int
    offset: int
    length: int
    crc: int


def encode_segment(
    max_count: int, entries: list[tuple[int, int, int, bytes]], reset: bool = False,
    sparse: bool = False,
) -> bytes:
    """Whole segment file for (index, term, kind, data) entries, consecutive
    indexes (sparse: strictly increasing indexes, a compacted segment)."""
    return b"".join(segment_parts(max_count, entries, reset, sparse))


def segment_parts(
    max_count: int, entries: list[tuple[int, int, int, bytes]], reset: bool = False,
    sparse: bool = False,
) -> list[bytes]:
    """encode_segment's file as the buffers to write back to back: each
    entry's data is one of them as it is (not copied), after its kind byte."""
    count = len(entries)
    if not 0 < count <= max_count:
        raise ValueError(f"segment holds 1..{max_count} entries, got {count}")
    flags = (SEG_FLAG_RESET if reset else 0) | (SEG_FLAG_SPARSE if sparse else 0)
    head = SEG_HEADER.pack(SEG_MAGIC, SEG_VERSION, flags, max_count, count)
    parts = [head, _pack_crc(_crc32(head))]
    slots: list[bytes] = []
    datas: list[bytes] = []
    offset = SEG_HEADER_SIZE + max_count * SEG_SLOT_SIZE
    pack_it = _IT.pack
    pack_slot = SEG_SLOT.pack
    crc32 = _crc32
    kinds = _KIND_BYTES
    for index, term, kind, data in entries:
        kb = kinds[kind]
        # entry_crc(index, term, kind byte + data), without building that
        crc = crc32(data, crc32(kb, crc32(pack_it(index, term))))
        slots.append(pack_slot(index, term, offset, len(data) + 1, crc))
        datas.append(kb)
        datas.append(data)
        offset += len(data) + 1
    parts.extend(slots)
    parts.append(bytes((max_count - count) * SEG_SLOT_SIZE))
    parts.extend(datas)
    return parts


#: the one-byte prefix (entry kind) of each stored segment entry
_KIND_BYTES = [bytes((k,)) for k in range(256)]


def decode_segment_header(buf: bytes, where: str) -> tuple[int, int, int]:
    """(flags, max_count, count) of a segment header; raises CorruptSegmentError."""
    if len(buf) < SEG_HEADER_SIZE:
        raise CorruptSegmentError(f"{where}: truncated segment header")
    magic, version, flags, max_count, count = SEG_HEADER.unpack_from(buf, 0)
    (crc,) = REC_CRC.unpack_from(buf, SEG_HEADER.size)
    if magic != SEG_MAGIC or version != SEG_VERSION:
        raise CorruptSegmentError(f"{where}: bad segment magic/version")
    if _crc32(buf[: SEG_HEADER.size]) != crc:
        raise CorruptSegmentError(f"{where}: segment header checksum mismatch")
    if not 0 < count <= max_count:
        raise CorruptSegmentError(f"{where}: segment count {count} out of range 1..{max_count}")
    if flags & ~SEG_FLAGS:
        raise CorruptSegmentError(f"{where}: unknown segment flags {flags:#x}")
    return int(flags), int(max_count), int(count)


def decode_segment_index(
    buf: bytes, count: int, file_size: int, where: str, sparse: bool = False
) -> list[SegmentSlot]:
    """Parse and structurally check `count` index slots (indexes consecutive,
    or strictly increasing for a sparse segment; data inside the file, terms
    non-decreasing)."""
    if len(buf) < count * SEG_SLOT_SIZE:
        raise CorruptSegmentError(f"{where}: truncated segment index")
    slots = list(map(SegmentSlot._make, SEG_SLOT.iter_unpack(buf[: count * SEG_SLOT_SIZE])))
    first = slots[0].idx
    prev_term = 0
    prev_idx = first - 1
    for n, s in enumerate(slots):
        if sparse:
            if s.idx <= prev_idx:
                raise CorruptSegmentError(f"{where}: index slot {n} holds index {s.idx} after {prev_idx}")
            prev_idx = s.idx
        elif s.idx != first + n:
            raise CorruptSegmentError(f"{where}: index slot {n} holds index {s.idx}, expected {first + n}")
        if s.term < prev_term:
            raise CorruptSegmentError(f"{where}: term goes backwards at index {s.idx}")
        if s.length < 1 or s.offset + s.length > file_size:
            raise CorruptSegmentError(f"{where}: entry {s.idx} lies outside the file")
        prev_term = s.term
    return slots


# ---------------------------------------------------------------- snapshots
SNAP_MAGIC = b"QQSN"
SNAP_VERSION = 1
#: magic[4] version u8 reserved[3] index u64 term u64 config_len u32 data_len u64 body_crc u32
SNAP_HEADER = struct.Struct("<4sB3xQQIQI")
SNAP_HEADER_SIZE = SNAP_HEADER.size + 4  # 44 (last u32 = crc of the preceding 40 bytes)


def encode_snapshot_header(index: int, term: int, config: bytes, data: bytes) -> bytes:
    body_crc = _crc32(data, _crc32(config))
    head = SNAP_HEADER.pack(SNAP_MAGIC, SNAP_VERSION, index, term, len(config), len(data), body_crc)
    return head + _pack_crc(_crc32(head))


def decode_snapshot(buf: bytes, where: str) -> tuple[int, int, bytes, bytes]:
    """(index, term, config, data); raises CorruptSnapshotError."""
    if len(buf) < SNAP_HEADER_SIZE:
        raise CorruptSnapshotError(f"{where}: truncated snapshot header")
    magic, version, index, term, clen, dlen, body_crc = SNAP_HEADER.unpack_from(buf, 0)
    (hcrc,) = REC_CRC.unpack_from(buf, SNAP_HEADER.size)
    if magic != SNAP_MAGIC or version != SNAP_VERSION or _crc32(buf[: SNAP_HEADER.size]) != hcrc:
        raise CorruptSnapshotError(f"{where}: bad snapshot header")
    if len(buf) != SNAP_HEADER_SIZE + clen + dlen:
        raise CorruptSnapshotError(f"{where}: snapshot length mismatch")
    config = buf[SNAP_HEADER_SIZE : SNAP_HEADER_SIZE + clen]
    data = buf[SNAP_HEADER_SIZE + clen :]
    if _crc32(data, _crc32(config)) != body_crc:
        raise CorruptSnapshotError(f"{where}: snapshot body checksum mismatch")
    return int(index), int(term), bytes(config), bytes(data)


# ------------------------------------------------------------ group naming
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
#: Longest encoded directory name kept verbatim; longer ones are shortened + hashed.
MAX_DIR_NAME = 200


def encode_group_dir(group_id: str) -> str:
    """Directory name for a group id: UTF-8 bytes, [A-Za-z0-9_-] kept, every
    other byte as %XX (uppercase hex). "%2F/orders" -> "%252F%2Forders".
    Names longer than 200 characters become the first 160 characters, "~",
    and the first 32 hex digits of sha256(UTF-8 id); the exact id is always
    in the group directory's GROUP file."""
    if not isinstance(group_id, str) or not group_id:
        raise InvalidGroupIdError(f"group id must be a non-empty str, got {group_id!r}")
    try:
        raw = group_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidGroupIdError(f"group id {group_id!r} is not valid UTF-8 text") from exc
    name = "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)
    if len(name) > MAX_DIR_NAME:
        name = name[:160] + "~" + hashlib.sha256(raw).hexdigest()[:32]
    return name


def decode_group_dir(name: str) -> str | None:
    """Inverse of encode_group_dir for non-shortened names (None for hashed ones)."""
    if "~" in name:
        return None
    out = bytearray()
    i = 0
    while i < len(name):
        if name[i] == "%":
            out.append(int(name[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(ord(name[i]))
            i += 1
    return out.decode("utf-8")


# -------------------------------------------------------------- composition
def compose(runs: list[tuple[int, int, bool]]) -> list[tuple[int, int] | None]:
    """How runs of entries written in order make one log.

    Each run is (first, last, reset), in write order (segment files by
    sequence number, then WAL runs oldest first). A run starting at `first`
    truncates the log built so far at `first` (Raft overwrite); a reset run,
    or one starting past the log's end + 1, voids everything before it.
    Returns, per run, the [lo, hi] range of its entries that survive, or None.
    """
    out: list[tuple[int, int] | None] = [None] * len(runs)
    live: list[int] = []  # runs with surviving entries, in index order
    cur_last = 0
    for n, (first, last, reset) in enumerate(runs):
        if reset or (live and first > cur_last + 1):
            for m in live:
                out[m] = None
            live = []
        else:
            while live:
                piece = out[live[-1]]
                assert piece is not None
                if piece[0] >= first:
                    out[live.pop()] = None
                    continue
                if piece[1] >= first:
                    out[live[-1]] = (piece[0], first - 1)
                break
        out[n] = (first, last)
        live.append(n)
        cur_last = last
    return out
