"""Sets and maps of int offsets, held as sorted disjoint half-open ranges ``[start, end)``.

Theory of operation
-------------------
Queue bookkeeping is about *runs* of offsets: a record batch of 500 messages is
delivered, leased, acked and settled as one range, never as 500 entries. So the
structures here cost O(log n + k) per operation, where n is the number of ranges
held and k the number of ranges an operation touches, whatever the number of
offsets involved.

:class:`RangeSet` keeps a set of offsets as two parallel sorted lists, ``starts``
and ``ends``. Ranges that overlap or touch are merged, so one set has exactly one
representation::

    starts[i] < ends[i] < starts[i + 1]

:class:`RangeMap` gives every offset of its ranges a value (a lease, a receive
count). Touching ranges merge only when their values are equal::

    starts[i] < ends[i] <= starts[i + 1], and values[i] != values[i + 1] when they touch

Lookups bisect ``starts`` or ``ends``; changes replace one slice of each list. An
empty range (``start == end``) is a no-op everywhere; ``start > end`` raises
:class:`~fabric.errors.BadParameter`.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

from fabric.errors import BadParameter

V = TypeVar("V")


def _check(start: int, end: int) -> None:
    if start > end:
        raise BadParameter(f"range [{start}, {end}) has start > end")


class RangeSet:
    """A set of int offsets as sorted, disjoint, non-touching ``[start, end)`` ranges."""

    __slots__ = ("_ends", "_size", "_starts")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._size = 0
        for start, end in ranges:
            self.add(start, end)

    # -- changes --------------------------------------------------------------

    def add(self, start: int, end: int) -> int:
        """Add ``[start, end)``; returns how many offsets were not in the set before."""
        _check(start, end)
        if start == end:
            return 0
        starts, ends = self._starts, self._ends
        i = bisect_left(ends, start)  # first range ending at or after start: overlaps or touches
        j = bisect_right(starts, end)  # ranges starting at or before end
        had = 0
        if i < j:
            had = sum(e - s for s, e in zip(starts[i:j], ends[i:j]))
            start, end = min(start, starts[i]), max(end, ends[j - 1])
        starts[i:j] = [start]
        ends[i:j] = [end]
        added = end - start - had
        self._size += added
        return added

    def remove(self, start: int, end: int) -> int:
        """Remove ``[start, end)``; returns how many offsets were in the set."""
        _check(start, end)
        starts, ends = self._starts, self._ends
        i = bisect_right(ends, start)  # first range ending after start
        j = bisect_left(starts, end)  # ranges starting before end
        if i >= j or start == end:
            return 0
        removed = sum(min(e, end) - max(s, start) for s, e in zip(starts[i:j], ends[i:j]))
        keep_s: list[int] = []
        keep_e: list[int] = []
        if starts[i] < start:
            keep_s.append(starts[i])
            keep_e.append(start)
        if ends[j - 1] > end:
            keep_s.append(end)
            keep_e.append(ends[j - 1])
        starts[i:j] = keep_s
        ends[i:j] = keep_e
        self._size -= removed
        return removed

    def clear(self) -> None:
        self._starts.clear()
        self._ends.clear()
        self._size = 0

    # -- queries --------------------------------------------------------------

    def __contains__(self, x: object) -> bool:
        if not isinstance(x, int):
            return False
        i = bisect_right(self._starts, x) - 1
        return i >= 0 and x < self._ends[i]

    def __len__(self) -> int:
        """The number of offsets (not ranges) in the set."""
        return self._size

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self._starts, self._ends)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RangeSet):
            return NotImplemented
        return self._starts == other._starts and self._ends == other._ends

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RangeSet({self.to_list()})"

    @property
    def ranges_count(self) -> int:
        return len(self._starts)

    def first(self) -> int | None:
        """The smallest offset in the set."""
        return self._starts[0] if self._starts else None

    def span_at(self, x: int) -> tuple[int, int] | None:
        """The range that holds ``x``, if any."""
        i = bisect_right(self._starts, x) - 1
        if i >= 0 and x < self._ends[i]:
            return self._starts[i], self._ends[i]
        return None

    def intersect(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of the set inside ``[start, end)``, in order."""
        _check(start, end)
        if start == end:
            return []
        starts, ends = self._starts, self._ends
        i = bisect_right(ends, start)
        j = bisect_left(starts, end)
        return [(max(starts[k], start), min(ends[k], end)) for k in range(i, j)]

    def overlaps(self, start: int, end: int) -> bool:
        _check(start, end)
        return start < end and bisect_right(self._ends, start) < bisect_left(self._starts, end)

    def covers(self, start: int, end: int) -> bool:
        """Every offset of ``[start, end)`` is in the set (true for an empty range)."""
        _check(start, end)
        if start == end:
            return True
        span = self.span_at(start)
        return span is not None and span[1] >= end

    def count(self, start: int, end: int) -> int:
        """How many offsets of ``[start, end)`` are in the set."""
        return sum(e - s for s, e in self.intersect(start, end))

    def first_gap(self, start: int, end: int) -> tuple[int, int] | None:
        """The first maximal run of offsets in ``[start, end)`` that is *not* in the set."""
        _check(start, end)
        i = bisect_right(self._starts, start)
        s = start
        if i > 0 and self._ends[i - 1] > start:
            s = self._ends[i - 1]
        if s >= end:
            return None
        e = self._starts[i] if i < len(self._starts) else end
        return s, min(e, end)

    def gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        """The runs of ``[start, end)`` that are not in the set, in order."""
        out: list[tuple[int, int]] = []
        gap = self.first_gap(start, end)
        while gap is not None:
            out.append(gap)
            gap = self.first_gap(gap[1], end)
        return out

    # -- copies and JSON -------------------------------------------------------

    def copy(self) -> RangeSet:
        other = RangeSet()
        other._starts = self._starts.copy()
        other._ends = self._ends.copy()
        other._size = self._size
        return other

    def to_list(self) -> list[list[int]]:
        """JSON-able form: ``[[start, end], ...]``."""
        return [[s, e] for s, e in zip(self._starts, self._ends)]

    @classmethod
    def from_list(cls, data: object) -> RangeSet:
        """The inverse of :meth:`to_list`; any list of ``[start, end]`` int pairs is accepted."""
        if not isinstance(data, list):
            raise BadParameter(f"a range list must be a list, not {type(data).__name__}")
        out = cls()
        for item in data:
            if not (
                isinstance(item, list | tuple)
                and len(item) == 2
                and type(item[0]) is int
                and type(item[1]) is int
                and item[0] <= item[1]
            ):
                raise BadParameter(f"not a [start, end] range: {item!r}")
            out.add(item[0], item[1])
        return out


class RangeMap(Generic[V]):
    """Disjoint ``[start, end)`` ranges, each with a value; touching ranges with equal values merge."""

    __slots__ = ("_ends", "_size", "_starts", "_values")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._values: list[V] = []
        self._size = 0

    def set(self, start: int, end: int, value: V) -> None:
        """Give every offset of ``[start, end)`` the value ``value`` (replacing what was there)."""
        _check(start, end)
        if start == end:
            return
        self.pop(start, end)
        starts, ends, values = self._starts, self._ends, self._values
        p = bisect_left(starts, start)  # nothing overlaps [start, end) any more
        left = p > 0 and ends[p - 1] == start and values[p - 1] == value
        right = p < len(starts) and starts[p] == end and values[p] == value
        if left and right:
            ends[p - 1] = ends[p]
            del starts[p], ends[p], values[p]
        elif left:
            ends[p - 1] = end
        elif right:
            starts[p] = start
        else:
            starts.insert(p, start)
            ends.insert(p, end)
            values.insert(p, value)
        self._size += end - start

    def pop(self, start: int, end: int) -> list[tuple[int, int, V]]:
        """Remove ``[start, end)``; returns the pieces that were there, cut to the range, in order."""
        _check(start, end)
        starts, ends, values = self._starts, self._ends, self._values
        i = bisect_right(ends, start)
        j = bisect_left(starts, end)
        if i >= j or start == end:
            return []
        out = [(max(starts[k], start), min(ends[k], end), values[k]) for k in range(i, j)]
        keep_s: list[int] = []
        keep_e: list[int] = []
        keep_v: list[V] = []
        if starts[i] < start:
            keep_s.append(starts[i])
            keep_e.append(start)
            keep_v.append(values[i])
        if ends[j - 1] > end:
            keep_s.append(end)
            keep_e.append(ends[j - 1])
            keep_v.append(values[j - 1])
        starts[i:j] = keep_s
        ends[i:j] = keep_e
        values[i:j] = keep_v
        self._size -= sum(e - s for s, e, _ in out)
        return out

    def intersect(self, start: int, end: int) -> list[tuple[int, int, V]]:
        """The pieces inside ``[start, end)``, cut to the range, in order."""
        _check(start, end)
        if start == end:
            return []
        starts, ends, values = self._starts, self._ends, self._values
        i = bisect_right(ends, start)
        j = bisect_left(starts, end)
        return [(max(starts[k], start), min(ends[k], end), values[k]) for k in range(i, j)]

    def get(self, x: int) -> V | None:
        i = bisect_right(self._starts, x) - 1
        if i >= 0 and x < self._ends[i]:
            return self._values[i]
        return None

    def __contains__(self, x: object) -> bool:
        if not isinstance(x, int):
            return False
        i = bisect_right(self._starts, x) - 1
        return i >= 0 and x < self._ends[i]

    def first(self) -> tuple[int, int, V] | None:
        if not self._starts:
            return None
        return self._starts[0], self._ends[0], self._values[0]

    def __len__(self) -> int:
        """The number of offsets (not ranges) in the map."""
        return self._size

    def __iter__(self) -> Iterator[tuple[int, int, V]]:
        return zip(self._starts, self._ends, self._values)

    def __repr__(self) -> str:
        return f"RangeMap({list(self)})"

    @property
    def ranges_count(self) -> int:
        return len(self._starts)
