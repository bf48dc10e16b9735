"""A cumulative-bucket histogram without locks: one thread observes, another copies it.

Used for the node's request and fdatasync timings (fabric.node.metrics exports them); one
``observe`` is a bisect and two additions, so it may sit on per-request paths."""

from __future__ import annotations

import bisect

# seconds; request handling and fdatasync here sit between ~20 us and a few ms
LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)
COUNT_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0)  # requests per fdatasync


class Histogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last bucket is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def copy(self) -> tuple[list[int], float]:
        return list(self.counts), self.sum
