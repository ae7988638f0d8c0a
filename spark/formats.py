"""Decoding the broker's on-disk files for the audit: segment headers and
indexes, WAL record headers, snapshot headers. Never entry data.

Where it sits: below `spark.io` (which lists files and runs these functions
in parallel on Spark executors) and beside `broker.storage`, whose codec it
reuses (docs/STORAGE.md is the byte-level specification). Functions take a
`Reader` (size + positional reads) so the same code reads local files and
Hadoop-style URIs, and count the bytes they read: the audit reports bytes
read against bytes on disk.
"""
from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from typing import Any, Protocol

from broker.storage import codec
from broker.storage.errors import CorruptSegmentError, CorruptWalError

SEGMENT_SUFFIX = ".segment"
WAL_SUFFIX = ".wal"
SNAPSHOT_SUFFIX = ".snapshot"


class Reader(Protocol):
    size: int
    bytes_read: int

    def pread(self, n: int, offset: int) -> bytes: ...

    def close(self) -> None: ...


class LocalReader:
    """A local file read with pread (no buffering: only requested bytes are read)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self._fd).st_size
        self.bytes_read = 0

    def pread(self, n: int, offset: int) -> bytes:
        data = os.pread(self._fd, n, offset)
        self.bytes_read += len(data)
        return data

    def close(self) -> None:
        os.close(self._fd)


class ArrowReader:
    """A file behind a Hadoop-style URI (s3a://, hdfs://, gs://...) through
    pyarrow.fs, which must be installed on the executors."""

    def __init__(self, uri: str) -> None:
        from pyarrow import fs as pafs  # optional dependency, only for remote URIs

        filesystem, path = pafs.FileSystem.from_uri(arrow_uri(uri))
        self._f = filesystem.open_input_file(path)
        self.size = int(self._f.size())
        self.bytes_read = 0

    def pread(self, n: int, offset: int) -> bytes:
        data = bytes(self._f.read_at(n, offset))
        self.bytes_read += len(data)
        return data

    def close(self) -> None:
        self._f.close()


def arrow_uri(uri: str) -> str:
    """Hadoop scheme names pyarrow does not know (s3a/s3n -> s3)."""
    for old in ("s3a://", "s3n://"):
        if uri.startswith(old):
            return "s3://" + uri[len(old):]
    return uri


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def open_reader(uri: str) -> Reader:
    return LocalReader(local_path(uri)) if is_local(uri) else ArrowReader(uri)


def seq_of(name: str, suffix: str) -> int | None:
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    return int(stem) if stem.isdigit() else None


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    seq: int
    first_index: int
    last_index: int
    entries: int
    max_entries: int
    reset: bool
    bytes: int
    data_bytes: int
    bytes_read: int


def read_segment(reader: Reader, name: str) -> SegmentHeader:
    """Header and used index slots of one segment file (STORAGE.md "Segment
    file format"); raises broker.storage.CorruptSegmentError."""
    seq = seq_of(name, SEGMENT_SUFFIX)
    if seq is None:
        raise CorruptSegmentError(f"{name}: not a segment file name")
    flags, max_count, count = codec.decode_segment_header(
        reader.pread(codec.SEG_HEADER_SIZE, 0), name)
    slots = codec.decode_segment_index(
        reader.pread(count * codec.SEG_SLOT_SIZE, codec.SEG_HEADER_SIZE), count, reader.size, name,
        bool(flags & codec.SEG_FLAG_SPARSE))
    return SegmentHeader(
        seq=seq, first_index=slots[0].idx, last_index=slots[-1].idx, entries=count,
        max_entries=max_count, reset=bool(flags & codec.SEG_FLAG_RESET), bytes=reader.size,
        data_bytes=sum(s.length for s in slots), bytes_read=reader.bytes_read)


@dataclass(frozen=True, slots=True)
class WalSummary:
    """One WAL file: per group id, [records, bytes, entries, first, last]."""

    seq: int
    bytes: int
    groups: dict[str, list[int]]
    records: int
    end: int  # offset after the last well-formed record header
    torn: bool
    bytes_read: int


def read_wal(reader: Reader, name: str, chunk: int = 1 << 16) -> WalSummary:
    """Walk the record headers of one WAL file (STORAGE.md "WAL file format"),
    skipping ENTRY payloads; GROUP payloads (the group id) are read. Record
    checksums cover the payload, so they are not verified: a record whose
    header is short, of unknown type or runs past the end of the file ends the
    walk (`torn`). Raises broker.storage.CorruptWalError on a bad file header."""
    head = reader.pread(codec.WAL_HEADER_SIZE, 0)
    seq = codec.decode_wal_header(head)
    if seq is None:
        raise CorruptWalError(f"{name}: bad WAL file header")
    refs: dict[int, str] = {}
    groups: dict[str, list[int]] = {}
    pos = codec.WAL_HEADER_SIZE
    size = reader.size
    buf, buf_at = b"", pos
    records = 0
    torn = False
    while pos < size:
        if pos + codec.REC_HEADER_SIZE > size:
            torn = True
            break
        if not (buf_at <= pos and pos + codec.REC_HEADER_SIZE <= buf_at + len(buf)):
            buf, buf_at = reader.pread(chunk, pos), pos
        rel = pos - buf_at
        length, rtype, _flags, _reserved, ref, index, _term = codec.REC_REST.unpack_from(buf, rel + 4)
        end = pos + codec.REC_HEADER_SIZE + length
        if rtype not in codec.REC_TYPES or end > size:
            torn = True
            break
        if rtype == codec.REC_GROUP:
            if end <= buf_at + len(buf):
                payload = buf[rel + codec.REC_HEADER_SIZE: rel + codec.REC_HEADER_SIZE + length]
            else:
                payload = reader.pread(length, pos + codec.REC_HEADER_SIZE)
            refs[ref] = payload.decode("utf-8", "replace")
        gid = refs.get(ref, f"?ref{ref}")
        acc = groups.setdefault(gid, [0, 0, 0, 0, 0])
        acc[0] += 1
        acc[1] += end - pos
        if rtype == codec.REC_ENTRY:
            acc[2] += 1
            acc[3] = index if acc[3] == 0 else min(acc[3], index)
            acc[4] = max(acc[4], index)
        records += 1
        pos = end
    return WalSummary(seq, size, groups, records, pos, torn, reader.bytes_read)


def read_snapshot_header(reader: Reader) -> tuple[int, int] | None:
    """(index, term) if the 44-byte header and the file length check out."""
    head = reader.pread(codec.SNAP_HEADER_SIZE, 0)
    if len(head) < codec.SNAP_HEADER_SIZE:
        return None
    magic, version, index, term, clen, dlen, _crc = codec.SNAP_HEADER.unpack_from(head)
    (hcrc,) = codec.REC_CRC.unpack_from(head, codec.SNAP_HEADER.size)
    if (magic, version) != (codec.SNAP_MAGIC, codec.SNAP_VERSION):
        return None
    if zlib.crc32(head[: codec.SNAP_HEADER.size]) != hcrc:
        return None
    if reader.size != codec.SNAP_HEADER_SIZE + clen + dlen:
        return None
    return int(index), int(term)


def compose(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set `log_first`/`log_last` (the entries still part of the log, None if
    the file is void) on one group's readable segment rows, by STORAGE.md's
    composition rule (broker.storage.codec.compose)."""
    rows = sorted(segments, key=lambda r: r["seq"])
    live = codec.compose([(r["first_index"], r["last_index"], r["reset"]) for r in rows])
    for r, rng in zip(rows, live, strict=True):
        r["log_first"], r["log_last"] = (rng if rng else (None, None))
    return rows
