"""The node's heap and CPython's cyclic garbage collector: what each collection costs, and keeping
what lives as long as its queues out of the collector's scans.

Theory of operation
-------------------
CPython frees most objects by reference counting; the cyclic collector finds garbage in cycles by
scanning tracked objects, generation by generation. A full (generation 2) collection scans every
tracked object the process holds, and the node's loop stands still while it runs: every request
in flight waits. A queue partition costs a node a few dozen tracked objects (its log, segments,
index, replication role, cluster record), so at ten thousand queues a full collection scanned
about 400,000 objects and took about 160 ms on the 2-core machine (measured in
memory), and the young objects of a busy partition bring one about every time a quarter as many
again have been promoted.

``gc.freeze()`` moves every tracked object into a permanent generation that collections skip.
The node freezes what it loaded at start (``start``), and again when its set of queues has changed
and then stayed still for ``SETTLE_MS`` (or every ``UNFROZEN_MAX_MS`` while it keeps changing), so
queues created at run time leave the scans too. A young collection runs first, so young cyclic
garbage is not frozen with them. Frozen objects are still freed by reference counting; only
cycles among them would outlive their use, so when queues have been deleted since the last freeze
the node thaws everything, collects once (one full-collection pause, as the collector would have
taken anyway) and freezes again.

Every collection is timed by generation (``pauses``; ``fabric_gc_pause_seconds`` in the metrics),
so a stall in the latency figures can be matched to the collector, or ruled out.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from fabric.histogram import LATENCY_BUCKETS, Histogram

GC_GEN0_THRESHOLD = 20_000  # allocations between young collections (CPython's default: 700)
SETTLE_MS = 5_000  # the set of queues still this long: freeze what it added
UNFROZEN_MAX_MS = 60_000  # while queues keep being created, freeze at least this often


class Heap:
    def __init__(self) -> None:
        self.pauses = [Histogram(LATENCY_BUCKETS) for _ in range(3)]  # seconds, by generation
        self.freezes = 0
        self._started = 0.0
        self._shape: tuple[int, int] | None = None  # (queues created, deleted) at the last freeze
        self._changed_ms: int | None = None  # when the shape was first seen to differ from it
        self._last_seen: tuple[int, int] | None = None
        self._last_change_ms = 0

    def start(self, shape: tuple[int, int]) -> None:
        """What is loaded now (store indexes, metadata, code) lives as long as the node: keep it out
        of the collector's scans, and collect the young generation less often."""
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
        self._shape = self._last_seen = shape
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses[min(int(info.get("generation", 2)), 2)].observe(time.perf_counter() - self._started)

    def tick(self, now_ms: int, shape: tuple[int, int]) -> bool:
        """``shape``: how many queues were created and deleted so far. True when it froze."""
        if shape == self._shape:
            self._changed_ms = None
            return False
        if shape != self._last_seen:
            self._last_seen, self._last_change_ms = shape, now_ms
        if self._changed_ms is None:
            self._changed_ms = now_ms
        if now_ms - self._last_change_ms < SETTLE_MS and now_ms - self._changed_ms < UNFROZEN_MAX_MS:
            return False
        self.freeze(deleted=self._shape is None or shape[1] != self._shape[1])
        self._shape, self._changed_ms = shape, None
        return True

    def freeze(self, *, deleted: bool) -> None:
        if deleted:  # what the deleted queues held may sit in frozen cycles: look at everything once
            gc.unfreeze()
            gc.collect()
        else:
            gc.collect(1)
        gc.freeze()
        self.freezes += 1
