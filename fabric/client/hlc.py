"""A hybrid logical clock for the client process: wall time that never runs backwards or repeats.

A timestamp is ``ms << 16 | logical``: the physical part is the largest wall clock
time (ms since the epoch) this process has seen, from its own clock or from the
messages it received; the logical part counts events within one such millisecond.
So a message sent after this process received another carries a larger clock,
whatever the machines' clocks say (Kulkarni et al., "Logical Physical Clocks",
2014). Queues with ``ordering = "strict"`` order records by it (header ``x-hlc``).
"""

from __future__ import annotations

import threading
import time

LOGICAL_BITS = 16
LOGICAL_MAX = (1 << LOGICAL_BITS) - 1


class HybridClock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ms = 0
        self._logical = 0

    def tick(self, wall_ms: int | None = None) -> int:
        """The clock for a send event."""
        wall = int(time.time() * 1000) if wall_ms is None else wall_ms
        with self._lock:
            if wall > self._ms:
                self._ms, self._logical = wall, 0
            elif self._logical < LOGICAL_MAX:
                self._logical += 1
            else:  # 65536 events in one millisecond: borrow the next one
                self._ms, self._logical = self._ms + 1, 0
            return self._ms << LOGICAL_BITS | self._logical

    def observe(self, remote_ms: int) -> None:
        """A message stamped ``remote_ms`` was received: later sends come after it."""
        with self._lock:
            if remote_ms > self._ms:
                self._ms, self._logical = remote_ms, 0


CLOCK = HybridClock()  # one per process, shared by its producers and consumers


def header_value(hlc: int) -> bytes:
    """The ``x-hlc`` header: 20 decimal digits, so byte order is clock order."""
    return b"%020d" % hlc
