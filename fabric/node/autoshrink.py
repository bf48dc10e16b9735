"""Shrinking (queue settings ``auto_partitions_min``, ``auto_partitions_idle_ms``): a queue that
auto-expand grew gives partitions back, halving, once its load stays low.

Theory of operation
-------------------
``ShrinkPolicy`` is pure (no clock, no I/O): fed, about once a second, the bytes the queue took
since the last look, it says when to halve. The queue is *idle* while its partitions average
less than a quarter of ``auto_partitions_bytes_per_s`` each (after halving they take at most
half of it each: the queue does not grow straight back); it halves once it has been idle for
``auto_partitions_idle_ms`` without a break: ``n -> n / 2``, when ``n`` is even and ``n / 2``
is at least ``auto_partitions_min`` (default: the count at create; doubling from there and
halving back retrace the same counts).

The rule that keeps every key in order (docs/architecture.md "Shrinking"):

* the upper half, ``p >= n / 2``, *retires*: it takes no new writes (PRODUCE gets the
  retriable PARTITION_RETIRED, ``retiring`` true) and stays readable;
* a key on a kept partition stays there (``crc32c(key) % n == crc32c(key) % (n / 2)`` when it is
  below ``n / 2``); a key on a retired partition ``p`` hashes to ``p - n / 2`` afterwards. Its
  producer keeps retrying the batch at ``p`` until ``p`` is gone, so nothing newer of that key
  is written anywhere before every group has read all of ``p``;
* ``p`` is *drained* (:func:`partition_drained`) when every consumer group of the queue has
  committed (stream) or settled (queue, key_shared: no lease outstanding) up to its end and no
  delayed message waits for the queue, or, with no group at all, when retention or a purge
  emptied it;
* when every retired partition is drained, they go with their data (the count drops to
  ``n / 2``, stream groups rebalance, their holders are told with a revoke); a batch still
  addressed to one gets PARTITION_RETIRED with ``retiring`` false and the count, and the
  producer sends it to ``p % count``: where its keys hash now.

``AutoShrink`` is the node's glue (single node; a cluster's partitions do not shrink).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fabric.errors import FabricError
from fabric.settings import QueueSettings

if TYPE_CHECKING:
    from fabric.node.broker import Broker

log = logging.getLogger("fabric.broker")
CHECK_MS = 1000  # how often the node looks at its queues' load and at what retires
IDLE_SHARE = 4  # idle: below auto_partitions_bytes_per_s / IDLE_SHARE per partition


def shrink_target(settings: QueueSettings) -> int | None:
    """The count a queue shrinks to next (half of it), or None: odd, or half is below the minimum."""
    n = settings.partitions
    if n % 2 or n // 2 < max(1, settings.auto_partitions_min):
        return None
    return n // 2


def partition_drained(end: int, log_start: int, floors: Iterable[int], delayed: bool) -> bool:
    """A retiring partition may go: every group's floor (committed offset, or first unsettled
    offset) is at its ``end`` (what retention removed counts as consumed); with no group, it is
    empty. Never while delayed messages wait for the queue."""
    if delayed:
        return False
    floors = list(floors)
    if not floors:
        return log_start >= end
    return all(max(f, log_start) >= end for f in floors)


@dataclass(slots=True)
class ShrinkPolicy:
    """One queue's load over time on this node. Pure."""

    last_bytes: int = -1
    last_ms: int = 0
    idle_since_ms: int | None = None

    def observe(self, now_ms: int, total_bytes: int, settings: QueueSettings) -> int | None:
        """``total_bytes``: the queue's bytes appended so far (a counter). Returns the partition
        count to shrink to, or None."""
        if self.last_bytes < 0 or now_ms <= self.last_ms or total_bytes < self.last_bytes:
            self.last_bytes, self.last_ms = total_bytes, now_ms
            return None
        rate = (total_bytes - self.last_bytes) * 1000 / (now_ms - self.last_ms) / settings.partitions
        self.last_bytes, self.last_ms = total_bytes, now_ms
        target = shrink_target(settings)
        if (
            target is None
            or not settings.auto_partitions_max
            or not settings.auto_partitions_idle_ms
            or rate * IDLE_SHARE >= settings.auto_partitions_bytes_per_s
        ):
            self.idle_since_ms = None
            return None
        if self.idle_since_ms is None:
            self.idle_since_ms = now_ms
        if now_ms - self.idle_since_ms < settings.auto_partitions_idle_ms:
            return None
        self.idle_since_ms = None  # after a shrink, the idleness has to last again
        return target


class AutoShrink:
    """The node's side: start shrinking idle queues, remove retired partitions once drained."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.policies: dict[str, ShrinkPolicy] = {}
        self._next_ms = 0
        self.shrunk = 0  # shrinks this node started

    def tick(self, now_ms: int) -> None:
        if now_ms < self._next_ms:
            return
        self._next_ms = now_ms + CHECK_MS
        b = self.broker
        if b.config.cluster is not None:
            return  # a cluster's partitions do not shrink (docs/architecture.md "Shrinking")
        store = b.store
        retiring = store.retiring()
        for name in retiring:
            if self.drained(name):
                try:
                    self.remove(name)
                except FabricError as exc:  # its record could not be written (a full disk): next time
                    log.warning("queue %r: removing its retired partitions failed: %s", name, exc.message)
        shrinkable = store.shrinkable()
        for name in self.policies.keys() - {name for name, _ in shrinkable}:
            del self.policies[name]
        for name, settings in shrinkable:
            if name in retiring:
                self.policies.pop(name, None)
                continue
            total = b.queue_in.get(name, (0, 0))[1]
            target = self.policies.setdefault(name, ShrinkPolicy()).observe(now_ms, total, settings)
            if target is not None:
                try:
                    self.start(name, settings, target)
                except FabricError as exc:
                    log.warning("queue %r: shrinking to %d partitions failed: %s", name, target, exc.message)

    def start(self, name: str, settings: QueueSettings, target: int) -> None:
        log.info(
            "queue %r: its partitions stayed below %d bytes/s for %d ms: shrinking %d -> %d partitions "
            "(partitions %d..%d retire: read until every group has consumed them, then removed)",
            name,
            settings.auto_partitions_bytes_per_s // IDLE_SHARE,
            settings.auto_partitions_idle_ms,
            settings.partitions,
            target,
            target,
            settings.partitions - 1,
        )
        self.broker.store.retire_partitions(name, target)
        self.shrunk += 1

    def drained(self, name: str) -> bool:
        """Every retiring partition of ``name`` is drained for every group."""
        b = self.broker
        store = b.store
        live = store.live_partitions(name)
        streams = b.streams.groups_of(name)
        groups = set(store.meta.groups(name)) | b.shared.groups_of(name) | streams
        delayed = b.delayed.describe(name).get("batches", 0) > 0
        for p in range(live, store.settings(name).partitions):
            plog = store.partition(name, p)
            row = {
                "partition": p,
                "log_start_offset": plog.log_start_offset,
                "next_offset": plog.next_offset,
                "high_watermark": plog.next_offset,  # a single node: what is written is visible once flushed
            }
            floors = []
            for group in groups:
                shared = b.shared.groups.get((name, group))
                floor = shared.floors().get(p) if shared is not None else None
                if floor is None:
                    floor = store.meta.committed(name, group).get(p)
                if floor is None and group in streams:  # a stream group that has not committed p yet
                    floor = b.streams.uncommitted_start(name, group, row)
                floors.append(floor if floor is not None else plog.log_start_offset)
            if not partition_drained(plog.next_offset, plog.log_start_offset, floors, delayed):
                return False
        return True

    def remove(self, name: str) -> None:
        """The retired partitions go: from what reads them, from the groups' offsets, then from disk."""
        b = self.broker
        store = b.store
        live = store.live_partitions(name)
        old = store.settings(name).partitions
        gone = range(live, old)
        store.remove_partitions(name)  # its record is the commit point: nothing changed if it fails
        parked = [fetch for p in gone for fetch in b.fetches.wake((name, p))]
        for p in gone:
            b.partitions.pop((name, p), None)
        b.streams.shrink(name, live)
        b.shared.shrink(name, gone)
        for sub in [s for s in b.subs.by_id.values() if s.queue == name]:
            for p in gone:
                if p in sub.cursors:
                    b.subs.unassign(sub, p)
        try:
            for group in store.meta.groups(name):
                store.meta.forget_partitions(name, group, live)
        except FabricError as exc:  # left behind: a later growth sets them to 0 anyway
            log.warning("queue %r: dropping the offsets of its removed partitions failed: %s", name, exc.message)
        for client, header, params in parked:
            b._answer_fetch(client, header, params, final=True)
        log.info(
            "queue %r: shrank %d -> %d partitions (the retired ones were consumed by every group)", name, old, live
        )
        b.deliver()
