"""A partition log: a directory of segments, appended at the end, read anywhere, trimmed at the front.

Theory of operation
-------------------
``PartitionLog`` is the single writer of one partition directory (Kafka's
``LocalLog``): one thread (the store's event loop) calls ``append``, ``read``,
``enforce_retention``, ``truncate_to``, ``reset_to`` and ``close``. Offsets are assigned
here: each batch gets ``base_offset = next_offset`` by rewriting its header in
place, so the bytes the caller then pushes to consumers are the bytes on disk.

The one exception to single-threadedness is ``sync``, called by the flusher
thread. It takes ``_io_lock`` for the whole ``fdatasync`` of the active
segment; the writer takes the same lock only where it swaps the active
segment or closes file descriptors (roll, retention, truncation, close). So an
fd is never closed while it is being synced, a roll waits for at most one
in-flight fdatasync, and appends never take the lock at all. At roll the old
segment is fdatasynced inline (unless ``fsync = "never"``), so only the active
segment ever holds unsynced data.

Reads are served from the tail cache when the offset is recent, else from the
segment that holds it. Offsets may have gaps (a sealed segment truncated by
recovery); a read at a missing offset returns the next batches that exist.

A queue with ``encrypt = true`` hands its logs the node's ``AtRestKeys``: ``append``
seals each batch after stamping it (``fabric/security/at_rest.py``) and the tail cache
keeps the plaintext; ``read`` opens what comes from disk, ``read_stored`` returns the
stored bytes for replicas. A log without keys takes one ``is None`` test per append and
per read. A partition whose segments need a key id the key file lacks is opened (its
recovery needs no key) but ``refused``: every read and append fails with that message.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from fabric.errors import CorruptBatch, FabricError, OffsetOutOfRange, ProtocolError, StorageError
from fabric.protocol.batch import (
    ENCRYPTED,
    HEADER_SIZE,
    LENGTH_PREFIX,
    BatchHeader,
    iter_batches,
    parse_header,
    stamp,
)
from fabric.security.at_rest import AtRestKeys, OpenedBatches, key_id_of
from fabric.settings import QueueSettings
from fabric.store.files import atomic_write, fsync_dir, remove_tree, storage_error
from fabric.store.recovery import RecoveryReport, load_segments, write_clean_marker
from fabric.store.segment import NO_TIMESTAMP, REL_OFFSET_MAX, Segment
from fabric.store.tail_cache import TailCache

TAIL_CACHE_BYTES = 4 * 1024 * 1024
OPENED_BYTES = 4 * 1024 * 1024  # an encrypted partition's recently decrypted batches
READ_BYTES_MAX = 64 * 1024 * 1024
START_FILE = "start-offset"
SEALED_FDS_MAX = 8  # open file descriptors kept for reading sealed segments, per partition


class PartitionLog:
    """The segments of one partition and the operations on them."""

    def __init__(
        self,
        directory: Path,
        settings: QueueSettings,
        segments: list[Segment],
        report: RecoveryReport,
        *,
        tail_cache_bytes: int,
        at_rest: AtRestKeys | None = None,
    ) -> None:
        self.directory = directory
        self.settings = settings
        self.recovery = report
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._active = segments[-1]
        self._next_offset = self._active.next_offset
        self._size_bytes = sum(s.size for s in segments)
        self._cache = TailCache(tail_cache_bytes)
        self._segment_bytes = settings.segment_bytes
        self._segment_ms = settings.segment_ms
        self._durable_roll = settings.fsync != "never"
        self._io_lock = threading.Lock()
        self._appends = 0  # appends so far; sync() compares it with the count it last made durable
        self._synced_appends = 0
        self._appended_bytes = 0  # bytes appended so far; sync() remembers the count it made durable
        self._synced_bytes = 0
        self.syncs = 0  # fdatasync calls made by sync()
        self._closed = False
        self._failed: str | None = None
        self._first_timestamp: tuple[int, int] | None = None  # (segment base, first_timestamp) cache
        self._readers: OrderedDict[int, Segment] = OrderedDict()  # sealed segments with an open fd, LRU
        self.last_append_ms: int | None = None
        self.leader_epoch = 0  # stamped on appended batches; the node's replication sets it when it leads
        # offsets below this were removed from the front (dead-lettered by a queue's overflow
        # policy) without deleting their segment yet; persisted in START_FILE
        self._start = min(max(_read_start(directory), self._bases[0]), self._next_offset)
        self._at_rest = at_rest  # the keys of an encrypted queue, None for any other
        self._opened = OpenedBatches(OPENED_BYTES if at_rest is not None else 0)
        self.refused: str | None = None  # why the partition is not served (a missing at-rest key)
        if at_rest is not None:
            self._check_keys(at_rest)
        for seg in segments[:-1]:
            seg.close()  # sealed segments open their file again on first read

    @classmethod
    def open(
        cls,
        directory: Path,
        settings: QueueSettings,
        *,
        now_ms: int,
        tail_cache_bytes: int = TAIL_CACHE_BYTES,
        at_rest: AtRestKeys | None = None,
    ) -> PartitionLog:
        """Open (creating if missing) and recover the partition in ``directory``. ``at_rest``: the
        node's keys, for a queue with ``encrypt = true``."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error(exc, f"creating {directory}") from None
        segments, report = load_segments(directory, settings, now_ms=now_ms)
        start = _read_start(directory)
        if start > segments[-1].next_offset:  # a reset_to interrupted after its start file was written
            segments = _start_empty(directory, settings, segments, start, now_ms)
        return cls(directory, settings, segments, report, tail_cache_bytes=tail_cache_bytes, at_rest=at_rest)

    def refuse(self, reason: str) -> None:
        """Serve nothing from now on: every read and append fails with ``reason`` (the files stay as
        they are; a clean close still writes the clean-shutdown marker)."""
        self.refused = reason
        self._failed = reason

    def _check_keys(self, at_rest: AtRestKeys) -> None:
        """Refuse the partition if the first or last batch of a segment names a key id the key file
        lacks (key ids only grow, so these are the ids the log changed keys at; a batch between
        them with another missing id is refused when it is read)."""
        wanted: set[int] = set()
        try:
            for seg in self._segments:
                if not seg.size:
                    continue
                found = seg.locate(seg.last_batch_base)
                for pos in {0, found[0] if found is not None else 0}:
                    head = os.pread(seg.reader(), HEADER_SIZE + 6, pos)
                    key_id = key_id_of(head, 0, parse_header(head))
                    if key_id is not None:
                        wanted.add(key_id)
        except (OSError, FabricError) as exc:
            self.refuse(f"partition {self.directory}: its at-rest key ids could not be read ({exc})")
            return
        missing = at_rest.missing(wanted)
        if missing:
            self.refuse(f"partition {self.directory} is not served: {at_rest.missing_message(missing)}")

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.directory}, offsets [{self.log_start_offset}, {self._next_offset}), "
            f"{len(self._segments)} segments, {self._size_bytes} bytes)"
        )

    # ------------------------------------------------------------ properties

    @property
    def log_start_offset(self) -> int:
        return self._start if self._start > self._bases[0] else self._bases[0]

    @property
    def next_offset(self) -> int:
        """The log end offset: the offset the next appended record gets (the high watermark on one node)."""
        return self._next_offset

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    @property
    def active_base_offset(self) -> int:
        """The first offset of the segment being written (moves when the log rolls or is cut)."""
        return self._active.base_offset

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def message_count(self) -> int:
        """Records between the log start and end (gaps left by recovery included)."""
        return self._next_offset - self.log_start_offset

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def last_timestamp_ms(self) -> int | None:
        """The newest batch ``max_timestamp`` in the log, None when empty."""
        newest = max(s.max_timestamp for s in self._segments)
        return None if newest == NO_TIMESTAMP else newest

    def _reading(self, seg: Segment) -> Segment:
        """Note a read from ``seg``; keep at most ``SEALED_FDS_MAX`` sealed segments' files open."""
        if seg is not self._active:
            readers = self._readers
            readers[seg.base_offset] = seg
            readers.move_to_end(seg.base_offset)
            if len(readers) > SEALED_FDS_MAX:
                _base, idle = readers.popitem(last=False)
                with self._io_lock:
                    idle.close()
        return seg

    def _forget(self, seg: Segment) -> None:
        """``seg`` leaves the log: close and remove its files."""
        self._readers.pop(seg.base_offset, None)
        seg.delete()

    @property
    def first_timestamp_ms(self) -> int | None:
        """``first_timestamp`` of the oldest batch (one header read, cached), None when empty."""
        for seg in self._segments:
            if seg.size:
                if self._first_timestamp is None or self._first_timestamp[0] != seg.base_offset:
                    try:
                        header = parse_header(os.pread(self._reading(seg).reader(), HEADER_SIZE, 0))
                    except (OSError, ProtocolError):
                        return None
                    self._first_timestamp = (seg.base_offset, header.first_timestamp)
                return self._first_timestamp[1]
        return None

    def segments(self) -> list[dict[str, int]]:
        """One summary per segment, oldest first (for describe and tests)."""
        return [
            {"base_offset": s.base_offset, "next_offset": s.next_offset, "size_bytes": s.size} for s in self._segments
        ]

    # ----------------------------------------------------------------- write

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"partition {self.directory} is closed")
        if self._failed:
            raise StorageError(self._failed)

    def append(self, batch: bytearray, header: BatchHeader, *, now_ms: int, leader_epoch: int | None = None) -> int:
        """Stamp ``batch`` with the next offsets (in place) and append it; return its base offset.

        The caller has checked the CRC and passes the parsed header. Raises
        ``DiskFull`` or ``StorageError`` with the log unchanged.
        """
        if self._closed or self._failed:
            self._check_open()
        if self._at_rest is not None:
            return self._append_sealed(batch, header, now_ms, leader_epoch)
        if len(batch) != header.batch_length + LENGTH_PREFIX:
            raise CorruptBatch(f"batch is {len(batch)} bytes but its header says {header.batch_length + LENGTH_PREFIX}")
        base = self._next_offset
        stamp(batch, base, self.leader_epoch if leader_epoch is None else leader_epoch)
        self._write(batch, base, header, now_ms)
        if self._cache.capacity_bytes:
            self._cache.add(base, bytes(batch))
        return base

    def _append_sealed(self, batch: bytearray, header: BatchHeader, now_ms: int, leader_epoch: int | None) -> int:
        """``append`` for an encrypted queue: stamp, seal (a replica's copy of its leader's stored
        batch comes sealed already), write; the tail cache keeps the plaintext."""
        assert self._at_rest is not None
        if len(batch) != header.batch_length + LENGTH_PREFIX:
            raise CorruptBatch(f"batch is {len(batch)} bytes but its header says {header.batch_length + LENGTH_PREFIX}")
        base = self._next_offset
        stamp(batch, base, self.leader_epoch if leader_epoch is None else leader_epoch)
        sealed = header.attributes & ENCRYPTED
        self._write(batch if sealed else self._at_rest.seal(batch, header, now_ms), base, header, now_ms)
        if self._cache.capacity_bytes:
            if sealed:
                self._cache.clear()  # the cache holds plaintext only, and always ends at the log end
            else:
                self._cache.add(base, bytes(batch))
        return base

    def _write(self, stored: bytearray | bytes, base: int, header: BatchHeader, now_ms: int) -> None:
        """Write a stamped batch (as stored: plain or sealed) at ``base``, rolling the segment
        first when it is full or old; the log is unchanged if the write fails."""
        size = len(stored)
        count = header.record_count
        seg = self._active
        if seg.size and (
            seg.size + size > self._segment_bytes
            or now_ms - seg.created_ms >= self._segment_ms
            or base + count - 1 - seg.base_offset > REL_OFFSET_MAX
        ):
            seg = self._roll(now_ms)
        try:
            seg.append(stored, base, count, header.max_timestamp)
            seg.written_ms = now_ms
        except StorageError:
            if seg.broken:
                self._failed = f"partition {self.directory} failed: a failed write could not be undone; reopen it"
            raise
        self._next_offset = base + count
        self._size_bytes += size
        self._appends += 1
        self._appended_bytes += size
        self.last_append_ms = now_ms

    def roll(self, now_ms: int) -> None:
        """Start a new segment now (if the active one holds anything)."""
        self._check_open()
        if self._active.size:
            self._roll(now_ms)

    def _roll(self, now_ms: int) -> Segment:
        old = self._active
        new = Segment.create(
            self.directory, self._next_offset, index_interval=self.settings.index_interval_bytes, now_ms=now_ms
        )
        try:
            old.seal(durable=self._durable_roll)
            if self._durable_roll:
                fsync_dir(self.directory)
        except (StorageError, OSError) as exc:
            # fdatasync failed: as in sync(), the data's durability is unknown from here on
            new.delete()
            old.sealed = False
            error = exc if isinstance(exc, StorageError) else storage_error(exc, f"rolling {old.path.name}")
            self._failed = f"partition {self.directory} failed: {error.message}; reopen it"
            raise error from None
        with self._io_lock:
            self._segments.append(new)
            self._bases.append(new.base_offset)
            self._active = new
        self._reading(old)  # its fd stays open for reads of the recent past
        return new

    def sync(self) -> None:
        """fdatasync the active segment (thread-safe; a no-op when nothing was appended since the last sync)."""
        with self._io_lock:
            if self._closed:
                return
            mark, marked_bytes = self._appends, self._appended_bytes
            if mark == self._synced_appends:
                return
            try:
                os.fdatasync(self._active.fd)
            except OSError as exc:
                # After a failed fdatasync the kernel may have dropped the dirty pages, and a retry
                # would report success: stop accepting appends until a reopen re-checks the files.
                self._failed = f"partition {self.directory} failed: fdatasync error ({exc.strerror}); reopen it"
                raise storage_error(exc, f"fdatasync of {self._active.path}") from None
            self._synced_appends = mark
            self._synced_bytes = marked_bytes
            self.syncs += 1

    @property
    def unsynced_bytes(self) -> int:
        """Bytes appended since the last completed ``sync`` (what the next fdatasync writes back)."""
        return self._appended_bytes - self._synced_bytes

    @property
    def dirty(self) -> bool:
        """Appends since the last completed ``sync``."""
        return self._appends != self._synced_appends

    # ------------------------------------------------------------------ read

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one containing ``offset``, at most ``max_bytes`` in total except that
        the first batch is always whole. ``b""`` at the log end; may stop at a segment boundary."""
        if offset < self.log_start_offset or offset > self._next_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside [{self.log_start_offset}, {self._next_offset}] of {self.directory.name}"
            )
        if offset == self._next_offset:
            return b""
        self._check_open()
        max_bytes = min(max_bytes, READ_BYTES_MAX)
        cached = self._cache.read(offset, max_bytes)
        if cached is not None:
            return cached
        if self._at_rest is not None:
            data = self._read_segments(offset, max_bytes)
            return self._at_rest.open_all(data, self._opened) if data else data
        return self._read_segments(offset, max_bytes)

    def read_stored(self, offset: int, max_bytes: int) -> bytes:
        """As ``read``, but the bytes as stored: an encrypted queue's batches stay sealed (what a
        leader sends its replicas, which store them as they are)."""
        if self._at_rest is None:
            return self.read(offset, max_bytes)
        if offset < self.log_start_offset or offset > self._next_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside [{self.log_start_offset}, {self._next_offset}] of {self.directory.name}"
            )
        if offset == self._next_offset:
            return b""
        self._check_open()
        return self._read_segments(offset, min(max_bytes, READ_BYTES_MAX))

    def _read_segments(self, offset: int, max_bytes: int) -> bytes:
        i = bisect_right(self._bases, offset) - 1
        for seg in self._segments[i:]:
            if offset < seg.next_offset:
                data = self._reading(seg).read(offset, max_bytes)
                if data:
                    return data
            offset = max(offset, seg.next_offset)  # a gap: continue with the next batch that exists
        return b""

    def batches(
        self, start: int, end: int, read_bytes: int = 4 * 1024 * 1024
    ) -> Iterator[tuple[bytes, int, BatchHeader]]:
        """Each CRC-checked batch from the one holding ``start`` up to ``end`` (exclusive), as
        ``(chunk, position in chunk, header)``, read ``read_bytes`` at a time (for scans that
        decode records: dedup rebuilds, dead-letter statistics)."""
        offset = max(start, self.log_start_offset)
        while offset < min(end, self._next_offset):
            data = self.read(offset, read_bytes)
            if not data:
                return
            for pos, h in iter_batches(data):
                if h.base_offset >= end:
                    return
                yield data, pos, h
                offset = h.next_offset

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first offset whose batch has ``max_timestamp >= timestamp_ms``, else ``next_offset``."""
        self._check_open()
        for seg in self._segments:
            if seg.max_timestamp >= timestamp_ms:
                found = self._reading(seg).find_timestamp(timestamp_ms)
                if found is not None:
                    return found
        return self._next_offset

    def apply_settings(self, settings: QueueSettings) -> None:
        """Take the queue's altered settings (``fabric queue alter --set``): retention from the
        next pass, segment size and age from the next append, fsync from the next roll."""
        self.settings = settings
        self._segment_bytes = settings.segment_bytes
        self._segment_ms = settings.segment_ms
        self._durable_roll = settings.fsync != "never"

    # ------------------------------------------------------------- trimming

    def enforce_retention(self, now_ms: int, keep_from: int | None = None) -> int:
        """Delete whole segments past ``retention_ms`` or beyond ``retention_bytes``, but none holding
        an offset at or after ``keep_from`` (a retention hold); return bytes deleted."""
        self._check_open()
        deleted = 0
        retention_ms = self.settings.retention_ms
        if retention_ms > 0:
            # Age is append time, not the producers' timestamps: a producer with a wrong clock
            # (or a replay of old data) must not get its messages deleted at once.
            cutoff = now_ms - retention_ms
            active = self._active
            if active.size and _written_ms(active) < cutoff and all(_written_ms(s) < cutoff for s in self._segments):
                self._roll(now_ms)  # everything expired: roll so the last segment can go too
            while len(self._segments) > 1 and _written_ms(self._segments[0]) < cutoff and self._free(keep_from):
                deleted += self._delete_oldest()
        retention_bytes = self.settings.retention_bytes
        if retention_bytes > 0:
            while len(self._segments) > 1 and self._size_bytes > retention_bytes and self._free(keep_from):
                deleted += self._delete_oldest()
        return deleted

    def _free(self, keep_from: int | None) -> bool:
        """Whether the oldest segment holds nothing at or after ``keep_from``."""
        return keep_from is None or self._segments[1].base_offset <= keep_from

    def advance_start(self, offset: int) -> int:
        """Remove the records below ``offset`` from the front (any offset up to the end; inside a
        batch, readers get that batch whole and skip the records before the start):
        readers start there from now on, whole segments below it are deleted, and the new start
        survives restarts. Returns the new log start offset."""
        self._check_open()
        if offset <= self.log_start_offset:
            return self.log_start_offset
        if offset > self._next_offset:
            raise OffsetOutOfRange(f"cannot start at {offset}: past the end {self._next_offset}")
        atomic_write(self.directory / START_FILE, b"%d\n" % offset, durable=self._durable_roll)
        self._start = offset
        while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
            self._delete_oldest()
        self._cache.drop_before(offset)
        return self.log_start_offset

    def _delete_oldest(self) -> int:
        with self._io_lock:
            seg = self._segments.pop(0)
            self._bases.pop(0)
            self._forget(seg)
        self._size_bytes -= seg.size
        self._cache.drop_before(self._bases[0])
        return seg.size

    def truncate_to(self, offset: int) -> int:
        """Remove every batch at or after the one containing ``offset``; return the new ``next_offset``.

        For replication (a follower truncating to its leader's history). The
        truncation is fsynced unless ``fsync = "never"``.
        """
        self._check_open()
        if offset < self._bases[0] or offset > self._next_offset:
            raise OffsetOutOfRange(f"cannot truncate to {offset}: outside [{self._bases[0]}, {self._next_offset}]")
        if offset == self._next_offset:
            return offset
        i = bisect_right(self._bases, offset) - 1
        with self._io_lock:
            while len(self._segments) > i + 1:
                self._forget(self._segments.pop())
                self._bases.pop()
            seg = self._segments[i]
            found = seg.locate(offset) if offset < seg.next_offset else None
            cut = found[0] if found is not None else seg.size
            if cut == 0 and len(self._segments) > 1:
                self._forget(self._segments.pop())
                self._bases.pop()
                seg = Segment.create(
                    self.directory,
                    seg.base_offset,
                    index_interval=self.settings.index_interval_bytes,
                    now_ms=seg.created_ms,
                )
                self._segments.append(seg)
                self._bases.append(seg.base_offset)
            else:
                self._readers.pop(seg.base_offset, None)
                self._reopen_truncated(seg, cut)
            self._active = seg
            if self._durable_roll:
                fsync_dir(self.directory)
        self._next_offset = seg.next_offset
        self._size_bytes = sum(s.size for s in self._segments)
        self._cache.drop_from(self._next_offset)
        self._opened.clear()  # the offsets cut off may be written again with other records
        self._appends += 1  # the next sync covers the new active segment
        return self._next_offset

    def reset_to(self, offset: int, now_ms: int) -> int:
        """Empty the log and start it at ``offset``, past its end (Kafka's ``truncateFullyAndStartAt``:
        a follower whose copy ends below its leader's log start). Returns the new log start.

        Crash-safe in the order of its steps: the start file is written first (the commit point:
        ``open`` finishes a reset whose start lies beyond the segments), then every segment is
        deleted and an empty one made at ``offset``. A crash before the start file reopens the old
        log; after it, the reset one. fsynced unless ``fsync = "never"``, as ``truncate_to``."""
        self._check_open()
        if offset <= self._next_offset:
            raise OffsetOutOfRange(f"cannot reset to {offset}: not past the end {self._next_offset}")
        atomic_write(self.directory / START_FILE, b"%d\n" % offset, durable=self._durable_roll)
        with self._io_lock:
            self._readers.clear()
            new = _start_empty(self.directory, self.settings, self._segments, offset, now_ms, self._durable_roll)
            self._segments = new
            self._bases = [offset]
            self._active = new[0]
        self._start = offset
        self._next_offset = offset
        self._size_bytes = 0
        self._first_timestamp = None
        self._cache.clear()
        self._opened.clear()
        self._appends += 1  # the next sync covers the new active segment
        return offset

    def _reopen_truncated(self, seg: Segment, cut: int) -> None:
        seg.close()
        seg.open_file(writable=True)
        try:
            os.ftruncate(seg.fd, cut)
            if self._durable_roll:
                os.fdatasync(seg.fd)
        except OSError as exc:
            raise storage_error(exc, f"truncating {seg.path.name}") from None
        result = seg.scan(verify=False, end=cut)
        if result.damage is not None:
            raise result.damage
        seg.flush_indexes(durable=self._durable_roll)
        seg.sealed = False

    # ------------------------------------------------------------- lifecycle

    def close(self, clean: bool = True) -> None:
        """Close every file. ``clean``: fsync data and indexes and write the clean-shutdown marker,
        so the next open skips scanning the active segment."""
        if self._closed:
            return
        with self._io_lock:
            self._closed = True
            try:
                if clean and (not self._failed or self.refused):
                    self._active.seal(durable=True)
                    write_clean_marker(self.directory, self._active)
                else:
                    self._active.flush_indexes(durable=False)
            finally:
                for seg in self._segments:
                    seg.close()
                self._cache.clear()

    def delete(self) -> None:
        """Close and remove the partition directory."""
        self.close(clean=False)
        remove_tree(self.directory)


def _read_start(directory: Path) -> int:
    """The persisted start offset of a partition (0 when there is none or it is unreadable)."""
    try:
        return int((directory / START_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _start_empty(
    directory: Path, settings: QueueSettings, segments: list[Segment], start: int, now_ms: int, durable: bool = True
) -> list[Segment]:
    """Delete ``segments`` (newest first) and make one empty segment at ``start``: the steps of a
    reset after its start file is written (a crash between them leaves a start file beyond the
    segments, or no segment at all, and ``open`` runs them again)."""
    for seg in reversed(segments):
        seg.delete()
    seg = Segment.create(directory, start, index_interval=settings.index_interval_bytes, now_ms=now_ms)
    if durable:
        fsync_dir(directory)
    return [seg]


def _written_ms(seg: Segment) -> int:
    """When ``seg`` was last appended to: remembered since open, else the file's mtime."""
    if seg.written_ms is None:
        try:
            seg.written_ms = os.stat(seg.path).st_mtime_ns // 1_000_000
        except OSError:
            seg.written_ms = 0
    return seg.written_ms
