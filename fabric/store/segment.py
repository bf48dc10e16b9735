"""One segment: a file of record batches laid end to end, with its two sparse indexes.

Theory of operation
-------------------
A segment file ``<base offset>.log`` holds whole batches, each stamped with its
base offset, in offset order and without gaps. Only the last segment of a
partition (the *active* one) is appended to; the others are *sealed*: their
data and indexes were flushed and fsynced at roll, and they only serve reads.

``append`` is the hot path: one ``os.write`` of the caller's bytes, a few
attribute updates, and every ``index_interval_bytes`` one in-memory index entry.
A failed write is undone with ``ftruncate`` back to the old end, so the file
never holds a partial batch that a later append would bury.

Reads start from the sparse offset index and walk batch *headers* (not records)
to the batch that contains the wanted offset, then return whole batches with one
``os.pread``. ``scan`` walks the whole file verifying every CRC, rebuilds both
indexes, and stops at the first damage, which recovery then truncates away.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fabric.errors import ProtocolError, StorageError
from fabric.protocol.batch import CRC_START, HEADER_SIZE, LENGTH_PREFIX, BatchHeader, crc32c, parse_header
from fabric.store.files import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    segment_path,
    storage_error,
    unlink_quiet,
    write_all,
)
from fabric.store.index import OffsetIndex, TimeIndex

SCAN_CHUNK_BYTES = 4 * 1024 * 1024
REL_OFFSET_MAX = 0xFFFFFFFF  # relative offsets and positions are u32 in the indexes
NO_TIMESTAMP = -(2**63)


class SegmentDamage(StorageError):
    """A segment holds something other than whole, good batches at ``position``."""

    def __init__(self, path: Path, position: int, reason: str, *, torn: bool) -> None:
        super().__init__(f"{path.name}: {reason} at byte {position}")
        self.position = position
        self.reason = reason
        self.torn = torn  # the file ends inside a batch (a torn write), rather than bad bytes


def walk_batches(
    fd: int, path: Path, start: int, end: int, *, verify: bool, chunk_bytes: int = SCAN_CHUNK_BYTES
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` of the batches in ``[start, end)`` of a segment file.

    Reads in chunks with ``os.pread``; with ``verify`` every batch's CRC32C is
    checked. Raises ``SegmentDamage`` at the first batch that is cut short,
    malformed or (when verifying) fails its CRC.
    """
    buf = b""
    buf_start = start
    pos = start
    while pos < end:
        rel = pos - buf_start
        if len(buf) - rel < HEADER_SIZE:
            buf, buf_start, rel = os.pread(fd, min(chunk_bytes, end - pos), pos), pos, 0
            if len(buf) < HEADER_SIZE:
                raise SegmentDamage(path, pos, f"{len(buf)} bytes left, less than a batch header", torn=True)
        try:
            h = parse_header(buf, rel)
        except ProtocolError as exc:
            raise SegmentDamage(path, pos, f"bad batch header ({exc.message})", torn=False) from None
        size = h.batch_length + LENGTH_PREFIX
        if pos + size > end:
            raise SegmentDamage(path, pos, f"batch of {size} bytes cut short at {end - pos}", torn=True)
        if verify:
            if len(buf) - rel < size:
                buf, buf_start, rel = os.pread(fd, max(size, min(chunk_bytes, end - pos)), pos), pos, 0
                if len(buf) < size:
                    raise SegmentDamage(path, pos, "file shrank during the scan", torn=True)
            if crc32c(memoryview(buf)[rel + CRC_START : rel + size]) != h.crc:
                raise SegmentDamage(path, pos, "CRC32C mismatch", torn=False)
        yield pos, h
        pos += size


@dataclass(slots=True)
class ScanResult:
    batches: int
    damage: SegmentDamage | None


class Segment:
    """A segment file plus its offset and time indexes."""

    __slots__ = (
        "base_offset",
        "broken",
        "created_ms",
        "directory",
        "fd",
        "index_interval",
        "last_batch_base",
        "max_timestamp",
        "next_offset",
        "offset_index",
        "path",
        "sealed",
        "since_index",
        "size",
        "time_index",
        "written_ms",
    )

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval: int,
        created_ms: int,
        offset_index: OffsetIndex | None = None,
        time_index: TimeIndex | None = None,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.path = segment_path(directory, base_offset, LOG_SUFFIX)
        self.index_interval = index_interval
        self.created_ms = created_ms
        self.offset_index = offset_index or OffsetIndex(segment_path(directory, base_offset, INDEX_SUFFIX))
        self.time_index = time_index or TimeIndex(segment_path(directory, base_offset, TIME_INDEX_SUFFIX))
        self.fd = -1
        self.size = 0
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.last_batch_base = base_offset
        self.since_index = 0
        self.sealed = False
        self.written_ms: int | None = None  # last append (wall clock); the file's mtime after a restart
        self.broken = False  # a failed write could not be undone: the file may end in a partial batch

    def __repr__(self) -> str:
        return f"Segment({self.path.name}, size={self.size}, next_offset={self.next_offset}, sealed={self.sealed})"

    # ----------------------------------------------------------------- files

    @classmethod
    def create(cls, directory: Path, base_offset: int, *, index_interval: int, now_ms: int) -> Segment:
        """A new, empty, writable segment (stale index files of that name are removed)."""
        seg = cls(directory, base_offset, index_interval=index_interval, created_ms=now_ms)
        try:
            unlink_quiet(seg.offset_index.path)
            unlink_quiet(seg.time_index.path)
            seg.fd = os.open(seg.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise storage_error(exc, f"creating segment {seg.path}") from None
        if os.fstat(seg.fd).st_size:
            os.close(seg.fd)
            raise StorageError(f"segment {seg.path} already exists and is not empty")
        return seg

    def open_file(self, *, writable: bool) -> None:
        if self.fd >= 0:
            return
        flags = os.O_RDWR | os.O_APPEND if writable else os.O_RDONLY
        try:
            self.fd = os.open(self.path, flags)
        except OSError as exc:
            raise storage_error(exc, f"opening segment {self.path}") from None

    def reader(self) -> int:
        """A file descriptor for reads (sealed segments open theirs on first use)."""
        if self.fd < 0:
            self.open_file(writable=False)
        return self.fd

    def file_size(self) -> int:
        return os.fstat(self.reader()).st_size

    # ---------------------------------------------------------------- append

    def append(self, batch: bytes | bytearray, base_offset: int, record_count: int, max_timestamp: int) -> None:
        """Write one stamped batch at the end. On failure the file is cut back and the error raised."""
        pos = self.size
        try:
            n = os.write(self.fd, batch)
            if n != len(batch):
                write_all(self.fd, memoryview(batch)[n:])
        except OSError as exc:
            self.cut_file(pos)
            raise storage_error(exc, f"appending {len(batch)} bytes to {self.path.name}") from None
        self._account(pos, len(batch), base_offset, record_count, max_timestamp)

    def _account(self, pos: int, size: int, base_offset: int, record_count: int, max_timestamp: int) -> None:
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
        if self.since_index >= self.index_interval:
            rel = base_offset - self.base_offset
            self.offset_index.append(rel, pos)
            self.time_index.maybe_append(self.max_timestamp, rel)
            self.since_index = 0
        self.since_index += size
        self.size = pos + size
        self.last_batch_base = base_offset
        self.next_offset = base_offset + record_count

    def cut_file(self, size: int) -> None:
        """Truncate the file to ``size`` bytes (undoing a failed write)."""
        try:
            os.ftruncate(self.fd, size)
        except OSError as exc:
            self.broken = True
            raise StorageError(
                f"{self.path.name}: could not undo a failed write with ftruncate ({exc.strerror}); "
                "the partition must be reopened to recover"
            ) from None

    def fits(self, batch_bytes: int, last_offset: int, segment_bytes: int) -> bool:
        """Whether a batch can go into this segment without passing its size or u32 index limits."""
        return self.size + batch_bytes <= segment_bytes and last_offset - self.base_offset <= REL_OFFSET_MAX

    # ------------------------------------------------------------------ read

    def locate(self, offset: int) -> tuple[int, BatchHeader] | None:
        """Position and header of the first batch whose offsets reach past ``offset``."""
        start = self.offset_index.lookup(offset - self.base_offset) if offset > self.base_offset else 0
        chunk = 2 * self.index_interval + HEADER_SIZE
        for pos, h in walk_batches(self.reader(), self.path, start, self.size, verify=False, chunk_bytes=chunk):
            if h.base_offset + h.record_count > offset:
                return pos, h
        return None

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one containing ``offset``; the first is whole even past ``max_bytes``."""
        found = self.locate(offset)
        if found is None:
            return b""
        start, first = found
        first_size = first.batch_length + LENGTH_PREFIX
        want = min(max(max_bytes, first_size), self.size - start)
        try:
            data = os.pread(self.reader(), want, start)
        except OSError as exc:
            raise storage_error(exc, f"reading {self.path.name}") from None
        if len(data) < first_size:
            raise SegmentDamage(self.path, start, "file shorter than its batches", torn=True)
        cut = first_size
        while cut + HEADER_SIZE <= len(data):
            try:
                size = parse_header(data, cut).batch_length + LENGTH_PREFIX
            except ProtocolError:
                break  # the next read starting here reports the damage
            if cut + size > len(data):
                break
            cut += size
        return data if cut == len(data) else data[:cut]

    def find_timestamp(self, timestamp: int) -> int | None:
        """Base offset of the first batch with ``max_timestamp >= timestamp``, or None."""
        if self.max_timestamp < timestamp:
            return None
        rel = self.time_index.after_below(timestamp)
        start = self.offset_index.lookup(rel)
        for _pos, h in walk_batches(self.reader(), self.path, start, self.size, verify=False):
            if h.max_timestamp >= timestamp:
                return h.base_offset
        return None

    # ------------------------------------------------------------ recovery

    def scan(self, *, verify: bool, end: int | None = None) -> ScanResult:
        """Rebuild indexes and counters from the file; stop before the first damage.

        After the scan ``size`` is the end of the good prefix; the file itself is
        not changed (the caller decides to truncate or set the file aside).
        """
        end = self.file_size() if end is None else end
        for index in (self.offset_index, self.time_index):
            index.truncate_from(0)
            index.mark_stale()
        self.size, self.since_index = 0, 0
        self.next_offset, self.last_batch_base, self.max_timestamp = self.base_offset, self.base_offset, NO_TIMESTAMP
        batches = 0
        try:
            for pos, h in walk_batches(self.reader(), self.path, 0, end, verify=verify):
                if h.base_offset != self.next_offset:
                    raise SegmentDamage(
                        self.path, pos, f"batch base offset {h.base_offset}, expected {self.next_offset}", torn=False
                    )
                self._account(pos, h.batch_length + LENGTH_PREFIX, h.base_offset, h.record_count, h.max_timestamp)
                batches += 1
        except SegmentDamage as damage:
            return ScanResult(batches, damage)
        except OSError as exc:
            return ScanResult(batches, SegmentDamage(self.path, self.size, f"read error: {exc.strerror}", torn=False))
        return ScanResult(batches, None)

    def resume_from_index(self, file_size: int) -> int:
        """Trust the loaded indexes and walk (with CRCs) only from the last index entry to the end.

        Returns the number of batches checked; raises ``SegmentDamage`` if the tail
        does not chain to exactly ``file_size`` or disagrees with the indexes.
        """
        rel, pos = self.offset_index.last()
        fd = self.reader()
        try:
            first = parse_header(os.pread(fd, HEADER_SIZE, 0)) if file_size else None
        except ProtocolError as exc:
            raise SegmentDamage(self.path, 0, f"bad first batch header ({exc.message})", torn=False) from None
        if first is not None and first.base_offset != self.base_offset:
            raise SegmentDamage(self.path, 0, f"first batch has base offset {first.base_offset}", torn=False)
        expected = self.base_offset + rel
        max_ts = self.time_index.last_timestamp
        count = 0
        since = 0
        last_base = self.base_offset
        for at, h in walk_batches(fd, self.path, pos, file_size, verify=True):
            if count == 0 and h.base_offset != expected:
                raise SegmentDamage(self.path, at, "offset index entry points at the wrong batch", torn=False)
            if count and h.base_offset != expected:
                raise SegmentDamage(
                    self.path, at, f"batch base offset {h.base_offset}, expected {expected}", torn=False
                )
            expected = h.base_offset + h.record_count
            max_ts = max(max_ts, h.max_timestamp)
            last_base = h.base_offset
            since += h.batch_length + LENGTH_PREFIX
            count += 1
        if self.time_index.rels and self.time_index.rels[-1] > last_base - self.base_offset:
            raise SegmentDamage(self.path, file_size, "time index runs past the last batch", torn=False)
        self.size, self.next_offset, self.last_batch_base = file_size, expected, last_base
        self.max_timestamp = max_ts if file_size else NO_TIMESTAMP
        self.since_index = since
        return count

    # ------------------------------------------------------------- lifecycle

    def flush_indexes(self, *, durable: bool) -> None:
        """Write buffered index entries (fsync them when ``durable``); an index that cannot be
        written is removed, to be rebuilt from the segment at the next open."""
        for index in (self.offset_index, self.time_index):
            ok = index.sync() if durable else index.flush()
            if not ok:
                index.delete()

    def seal(self, *, durable: bool) -> None:
        """Stop appending: final time-index entry, flush (and fsync) data and indexes."""
        if self.size:
            self.time_index.maybe_append(self.max_timestamp, self.last_batch_base - self.base_offset)
        self.flush_indexes(durable=durable)
        self.offset_index.close()
        self.time_index.close()
        if durable and self.fd >= 0:
            try:
                os.fdatasync(self.fd)
            except OSError as exc:
                raise storage_error(exc, f"fdatasync of {self.path.name}") from None
        self.sealed = True

    def close(self) -> None:
        self.offset_index.close()
        self.time_index.close()
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def delete(self) -> None:
        """Close and remove the segment's files (data first: a half-deleted segment loses only an index)."""
        self.close()
        unlink_quiet(self.path)
        self.offset_index.delete()
        self.time_index.delete()
