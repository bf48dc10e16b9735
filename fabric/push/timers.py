"""A lazy timer heap over offsets: lease deadlines and nack delays of a key_shared table.

Theory of operation
-------------------
A lease table sets one time for many offsets at once (a deliver leases a batch until
one deadline, a nack delays a range until one time), and later moves some of those
offsets on (acked, settled, leased again with a new deadline). :class:`TimerHeap`
keeps one heap entry ``(time_ms, seq, offsets)`` per call and never searches the heap
to remove an offset: the owner checks each offset it gets back against its own state
(is it still leased, with this very deadline?) and skips the stale ones.

- :meth:`TimerHeap.due` pops every entry whose time has come and yields its
  ``(time, offset)`` pairs for the caller to check.
- :meth:`TimerHeap.top` answers "when to call again": it drops stale offsets and
  entries from the top until it finds a live one.
- :meth:`TimerHeap.compact` bounds the garbage: when the offsets the heap refers to
  outnumber the live ones (twice over, plus 1024), it rebuilds the heap from the live
  ``(time, offset)`` pairs, one entry per time.

``seq`` keeps entries with equal times in push order and keeps the heap from ever
comparing the offset lists. Time is a parameter (``now_ms``): no clock here.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator


class TimerHeap:
    """A heap of ``(time_ms, seq, offsets)``, one entry per call; offsets that moved on are skipped lazily."""

    __slots__ = ("heap", "refs", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, list[int]]] = []
        self.refs = 0  # offsets referenced by the heap, live or stale
        self.seq = 0

    def push(self, time_ms: int, offsets: list[int]) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time_ms, self.seq, offsets))
        self.refs += len(offsets)

    def due(self, now_ms: int) -> Iterator[tuple[int, int]]:
        """Pops the entries whose time has come: ``(time, offset)`` pairs, each to be checked by the caller."""
        heap = self.heap
        while heap and heap[0][0] <= now_ms:
            t, _, offsets = heapq.heappop(heap)
            self.refs -= len(offsets)
            for o in offsets:
                yield t, o

    def top(self, live: Callable[[int, int], bool]) -> int | None:
        """The earliest time with a live offset; stale offsets and entries on top are dropped."""
        heap = self.heap
        while heap:
            t, _, offsets = heap[0]
            i = 0
            while i < len(offsets) and not live(offsets[i], t):
                i += 1
            if i:
                del offsets[:i]
                self.refs -= i
            if offsets:
                return t
            heapq.heappop(heap)
        return None

    def compact(self, live_count: int, live: Callable[[], Iterable[tuple[int, int]]]) -> None:
        """Rebuild from the live ``(time, offset)`` pairs when stale offsets outnumber them."""
        if self.refs <= 2 * live_count + 1024:
            return
        by_time: dict[int, list[int]] = defaultdict(list)
        for t, o in live():
            by_time[t].append(o)
        self.heap = []
        self.refs = 0
        for t, offsets in by_time.items():
            self.seq += 1
            self.heap.append((t, self.seq, sorted(offsets)))
            self.refs += len(offsets)
        heapq.heapify(self.heap)
