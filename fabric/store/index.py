"""Sparse indexes beside each segment: offset -> file position, and time -> offset.

Theory of operation
-------------------
As in Kafka (``OffsetIndex.java``, ``TimeIndex.java``) the indexes are derived
data: they are never checksummed, only checked for sanity when loaded, and
rebuilt from the segment by a scan whenever they look wrong.

``.index``      entries of ``relative offset u32, file position u32``, little-endian.
                One entry per ``index_interval_bytes`` of appended data, pointing at
                the *base* offset of a batch. A lookup finds the greatest entry at or
                below the wanted offset; the reader walks batch headers from there.
``.timeindex``  entries of ``max timestamp so far i64, relative offset u32``. An entry
                ``(T, r)`` means every batch up to and including the batch at ``r``
                has ``max_timestamp <= T``. Entries are added beside offset-index
                entries when the maximum grew, and once more when the segment is
                sealed, so the last entry carries the segment's maximum.

Both live in memory as ``array`` columns (binary search with ``bisect``) and
reach the file through a small write buffer that is flushed every few KiB, at
roll and at close: appends never pay a syscall for the index.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from itertools import pairwise
from pathlib import Path

from fabric.errors import StorageError
from fabric.store.files import atomic_write, storage_error, unlink_quiet

_LITTLE = sys.byteorder == "little"
PENDING_FLUSH_BYTES = 4096
INDEX_FILE_BYTES_MAX = 1 << 30  # a 1 GiB segment at 512-byte intervals needs 16 MiB; anything this big is junk


def _strictly_increasing(values: array) -> bool:
    return all(a < b for a, b in pairwise(values))


def _non_decreasing(values: array) -> bool:
    return all(a <= b for a, b in pairwise(values))


class _IndexFile:
    """The buffered, append-only file behind one index."""

    entry: struct.Struct

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending = bytearray()
        self._fd = -1
        self.disk_ok = True  # False: the file is stale (failed write, rebuild); the next flush rewrites it

    def _queue(self, entry: bytes) -> None:
        self._pending += entry
        if len(self._pending) >= PENDING_FLUSH_BYTES:
            self.flush()

    def open_for_append(self) -> None:
        if self._fd < 0:
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            except OSError as exc:
                raise storage_error(exc, f"opening {self.path}") from None

    def flush(self) -> bool:
        """Bring the file up to date; on failure keep the entries in memory and report False.

        Indexes are rebuildable, so a failed index write never fails an append: the
        file is marked stale and rewritten whole at the next flush.
        """
        if not self.disk_ok:
            try:
                self.rewrite(durable=False)
            except StorageError:
                return False
            return True
        if not self._pending:
            return True
        try:
            self.open_for_append()
            n = os.write(self._fd, self._pending)
        except (OSError, StorageError):
            self.disk_ok = False
            return False
        del self._pending[:n]
        return not self._pending

    def sync(self) -> bool:
        """Flush and fsync; False if the file could not be made durable."""
        if not self.disk_ok:
            try:
                self.rewrite(durable=True)
            except StorageError:
                return False
            return True
        if not self.flush():
            return False
        try:
            self.open_for_append()  # an index with no entries still gets its (empty) file
            os.fsync(self._fd)
        except (OSError, StorageError):
            self.disk_ok = False
            return False
        return True

    def rewrite(self, *, durable: bool) -> None:
        """Replace the file with the in-memory entries (after a rebuild or a failed write)."""
        self._close_fd()
        atomic_write(self.path, self.to_bytes(), durable=durable)
        self._pending.clear()
        self.disk_ok = True

    def mark_stale(self) -> None:
        """The in-memory entries changed wholesale: the next flush rewrites the file."""
        self._pending.clear()
        self.disk_ok = False

    def _close_fd(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def close(self) -> None:
        """Flush what is buffered (best effort) and close the file."""
        self.flush()
        self._close_fd()

    def delete(self) -> None:
        self._pending.clear()
        self._close_fd()
        unlink_quiet(self.path)

    def to_bytes(self) -> bytes:
        raise NotImplementedError


class OffsetIndex(_IndexFile):
    """Relative offset -> file position, sparse."""

    entry = struct.Struct("<II")

    def __init__(self, path: Path, rels: array | None = None, positions: array | None = None) -> None:
        super().__init__(path)
        self.rels = rels if rels is not None else array("I")
        self.positions = positions if positions is not None else array("I")

    def __len__(self) -> int:
        return len(self.rels)

    def append(self, rel: int, position: int) -> None:
        self.rels.append(rel)
        self.positions.append(position)
        self._queue(self.entry.pack(rel, position))

    def lookup(self, rel: int) -> int:
        """File position of the greatest indexed batch at or below ``rel`` (0 if none)."""
        i = bisect_right(self.rels, rel) - 1
        return self.positions[i] if i >= 0 else 0

    def truncate_from(self, rel_end: int) -> None:
        """Drop entries for batches at or beyond ``rel_end`` (in memory; ``rewrite`` persists)."""
        keep = bisect_left(self.rels, rel_end)
        if keep < len(self.rels):
            del self.rels[keep:]
            del self.positions[keep:]
            self.mark_stale()

    def last(self) -> tuple[int, int]:
        """``(rel, position)`` of the last entry, ``(0, 0)`` when empty."""
        if not self.rels:
            return 0, 0
        return self.rels[-1], self.positions[-1]

    def to_bytes(self) -> bytes:
        out = array("I", bytes(8 * len(self.rels)))
        out[0::2] = self.rels
        out[1::2] = self.positions
        if not _LITTLE:
            out.byteswap()
        return out.tobytes()

    @classmethod
    def load(cls, path: Path, file_size: int) -> OffsetIndex | None:
        """The index in ``path`` if it exists and is sane for a segment file of ``file_size`` bytes, else None."""
        try:
            size = os.path.getsize(path)
            if size % cls.entry.size or size > INDEX_FILE_BYTES_MAX:
                return None
            with open(path, "rb") as f:
                raw = f.read()
        except OSError:
            return None
        if len(raw) != size:
            return None
        both = array("I")
        both.frombytes(raw)
        if not _LITTLE:
            both.byteswap()
        rels, positions = both[0::2], both[1::2]
        if not (_strictly_increasing(rels) and _strictly_increasing(positions)):
            return None
        if positions and positions[-1] >= file_size:
            return None
        return cls(path, rels, positions)


class TimeIndex(_IndexFile):
    """Max timestamp so far -> relative offset, sparse."""

    entry = struct.Struct("<qI")

    def __init__(self, path: Path, stamps: array | None = None, rels: array | None = None) -> None:
        super().__init__(path)
        self.stamps = stamps if stamps is not None else array("q")
        self.rels = rels if rels is not None else array("I")

    def __len__(self) -> int:
        return len(self.rels)

    @property
    def last_timestamp(self) -> int:
        return self.stamps[-1] if self.stamps else -1

    def maybe_append(self, max_timestamp: int, rel: int) -> None:
        """Add ``(max_timestamp, rel)`` if the maximum grew since the last entry."""
        if (not self.stamps or max_timestamp > self.stamps[-1]) and (not self.rels or rel > self.rels[-1]):
            self.stamps.append(max_timestamp)
            self.rels.append(rel)
            self._queue(self.entry.pack(max_timestamp, rel))

    def after_below(self, timestamp: int) -> int:
        """The smallest relative offset that can hold a batch with ``max_timestamp >= timestamp``."""
        i = bisect_left(self.stamps, timestamp) - 1
        return self.rels[i] + 1 if i >= 0 else 0

    def to_bytes(self) -> bytes:
        return b"".join(self.entry.pack(t, r) for t, r in zip(self.stamps, self.rels))

    @classmethod
    def load(cls, path: Path) -> TimeIndex | None:
        try:
            size = os.path.getsize(path)
            if size % cls.entry.size or size > INDEX_FILE_BYTES_MAX:
                return None
            with open(path, "rb") as f:
                raw = f.read()
        except OSError:
            return None
        if len(raw) != size:
            return None
        stamps, rels = array("q"), array("I")
        for t, r in cls.entry.iter_unpack(raw):
            stamps.append(t)
            rels.append(r)
        if not (_non_decreasing(stamps) and _strictly_increasing(rels)):
            return None
        return cls(path, stamps, rels)

    def truncate_from(self, rel_end: int) -> None:
        """Drop entries for batches at or beyond ``rel_end`` (in memory; ``rewrite`` persists)."""
        keep = bisect_left(self.rels, rel_end)
        if keep < len(self.rels):
            del self.stamps[keep:]
            del self.rels[keep:]
            self.mark_stale()
