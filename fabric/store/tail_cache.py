"""The tail cache: the most recently appended batches of a partition, in memory.

Consumers that keep up read what was just written; serving them from memory
means a partition at the tail causes no disk reads at all. The cache always
holds a contiguous run of batches ending at the log end, bounded by
``capacity_bytes``: old batches fall off the front, a batch larger than the
whole capacity empties it, and truncation cuts its back.
"""

from __future__ import annotations

from bisect import bisect_right

COMPACT_AFTER = 1024  # drop evicted slots from the lists once this many pile up


class TailCache:
    __slots__ = ("_bases", "_batches", "_head", "capacity_bytes", "size_bytes")

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = max(0, capacity_bytes)
        self.size_bytes = 0
        self._bases: list[int] = []
        self._batches: list[bytes] = []
        self._head = 0  # index of the oldest live entry

    def __len__(self) -> int:
        return len(self._bases) - self._head

    @property
    def first_offset(self) -> int | None:
        """Base offset of the oldest cached batch, None when empty."""
        return self._bases[self._head] if self._head < len(self._bases) else None

    def add(self, base_offset: int, batch: bytes) -> None:
        """Remember a batch just appended at the log end."""
        size = len(batch)
        if size > self.capacity_bytes:
            self.clear()
            return
        self._bases.append(base_offset)
        self._batches.append(batch)
        self.size_bytes += size
        if self.size_bytes > self.capacity_bytes:
            self._evict(self.capacity_bytes)

    def _evict(self, limit_bytes: int) -> None:
        head, batches = self._head, self._batches
        while self.size_bytes > limit_bytes:
            self.size_bytes -= len(batches[head])
            batches[head] = b""
            head += 1
        self._head = head
        if head >= COMPACT_AFTER and head * 2 >= len(batches):
            del self._bases[:head]
            del self._batches[:head]
            self._head = 0

    def read(self, offset: int, max_bytes: int) -> bytes | None:
        """Batches from the one containing ``offset``, as ``PartitionLog.read``; None if not cached."""
        bases = self._bases
        if self._head >= len(bases) or offset < bases[self._head]:
            return None
        i = bisect_right(bases, offset, self._head) - 1
        batches = self._batches
        first = batches[i]
        total = len(first)
        j = i + 1
        end = len(bases)
        while j < end and total + len(batches[j]) <= max_bytes:
            total += len(batches[j])
            j += 1
        return first if j == i + 1 else b"".join(batches[i:j])

    def drop_before(self, offset: int) -> None:
        """Forget batches that start before ``offset`` (after retention deleted them)."""
        i = bisect_right(self._bases, offset, self._head) - 1
        keep_from = max(i, self._head)
        while self._head < keep_from:
            self.size_bytes -= len(self._batches[self._head])
            self._batches[self._head] = b""
            self._head += 1

    def drop_from(self, offset: int) -> None:
        """Forget batches at or after ``offset`` and any batch containing it (after a truncation)."""
        i = bisect_right(self._bases, offset - 1, self._head)
        # entry i-1 starts before offset but may extend past it: callers truncate at batch starts
        for batch in self._batches[i:]:
            self.size_bytes -= len(batch)
        del self._bases[i:]
        del self._batches[i:]

    def clear(self) -> None:
        self._bases.clear()
        self._batches.clear()
        self._head = 0
        self.size_bytes = 0
