"""Auto-expand (queue setting ``auto_partitions_max``): a queue whose partitions stay loaded gets
more of them, doubling, up to its maximum.

Theory of operation
-------------------
``ExpandPolicy`` is pure (no clock, no I/O): fed, about once a second, the bytes a queue's
partitions took on this node since the last look, it says when to grow and to how many. A
partition is *loaded* while it takes more than ``auto_partitions_bytes_per_s``; the queue grows
when the partitions this node leads have been loaded on average for ``auto_partitions_after_ms``
without a break; the new count is ``min(2 * partitions, auto_partitions_max)``; after a growth
the clock starts again (the load spreads over the new partitions first). Doubling, like
``fabric queue alter``, keeps every key whose ``crc32c(key) % n`` does not change in order.

``AutoExpand`` is the node's glue: it reads the broker's per-queue byte counters (what this node
appended as leader) and, on a single node, grows the queue itself; in a cluster it asks the
controller (ALTER_QUEUE through the cluster thread), one request per queue at a time. Two
leaders asking at once ask for the same count: the second is a no-op.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fabric.errors import FabricError
from fabric.settings import QueueSettings

if TYPE_CHECKING:
    from fabric.node.broker import Broker

log = logging.getLogger("fabric.broker")
CHECK_MS = 1000  # how often the node looks at its queues' load


@dataclass(slots=True)
class ExpandPolicy:
    """One queue's load over time on this node. Pure."""

    last_bytes: int = -1
    last_ms: int = 0
    loaded_since_ms: int | None = None

    def observe(self, now_ms: int, total_bytes: int, led: int, settings: QueueSettings) -> int | None:
        """``total_bytes``: the queue's bytes appended here so far (a counter); ``led``: how many of
        its partitions this node leads. Returns the partition count to grow to, or None."""
        if self.last_bytes < 0 or now_ms <= self.last_ms or total_bytes < self.last_bytes:
            self.last_bytes, self.last_ms = total_bytes, now_ms
            return None
        rate = (total_bytes - self.last_bytes) * 1000 / (now_ms - self.last_ms) / max(1, led)
        self.last_bytes, self.last_ms = total_bytes, now_ms
        limit = settings.auto_partitions_max
        if led == 0 or limit <= settings.partitions or rate <= settings.auto_partitions_bytes_per_s:
            self.loaded_since_ms = None
            return None
        if self.loaded_since_ms is None:
            self.loaded_since_ms = now_ms
            return None
        if now_ms - self.loaded_since_ms < settings.auto_partitions_after_ms:
            return None
        self.loaded_since_ms = None  # after a growth, the load has to last again
        return min(limit, 2 * settings.partitions)


class AutoExpand:
    """The node's side: look at the queues that may expand, grow them (or ask the controller)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.policies: dict[str, ExpandPolicy] = {}
        self._asking: set[str] = set()  # cluster: ALTER_QUEUE sent, answer not back yet
        self._next_ms = 0
        self.grown = 0  # growths this node made or asked for

    def tick(self, now_ms: int) -> None:
        if now_ms < self._next_ms:
            return
        self._next_ms = now_ms + CHECK_MS
        b = self.broker
        expandable = b.store.expandable()
        for name in self.policies.keys() - {name for name, _ in expandable}:
            del self.policies[name]  # grown to its limit, altered or deleted since
        retiring = b.store.retiring()
        for name, settings in expandable:
            if name in self._asking or name in retiring:
                self.policies.pop(name, None)
                continue
            led = self._led(name, settings)
            total = b.queue_in.get(name, (0, 0))[1]
            target = self.policies.setdefault(name, ExpandPolicy()).observe(now_ms, total, led, settings)
            if target is not None:
                self._grow(name, settings, target)

    def _led(self, name: str, settings: QueueSettings) -> int:
        leads = self.broker.placement.leads
        return sum(1 for p in range(settings.log_partitions) if leads(name, p))

    def _grow(self, name: str, settings: QueueSettings, target: int) -> None:
        b = self.broker
        log.info(
            "queue %r: its partitions stayed above %d bytes/s for %d ms: growing %d -> %d partitions "
            "(auto_partitions_max %d)",
            name,
            settings.auto_partitions_bytes_per_s,
            settings.auto_partitions_after_ms,
            settings.partitions,
            target,
            settings.auto_partitions_max,
        )
        self.grown += 1
        self._asking.add(name)

        def done(exc: FabricError | None) -> None:
            self._asking.discard(name)
            if exc is not None:
                log.warning("queue %r: auto-expand to %d partitions failed: %s", name, target, exc.message)

        b.placement.expand(name, target, done)  # a cluster: through the controller, done later
