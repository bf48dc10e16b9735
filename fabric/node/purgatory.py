"""Requests whose reply comes later.

A handler that will answer later (a long-poll FETCH, a PRODUCE waiting for its fdatasync or its
replicas, a request passed on to another node or to etcd) raises :class:`Deferred`: the broker
then sends nothing now, and whoever holds the request answers it once it can. Requests that
wait on a partition (a long-poll FETCH until records become visible or its ``wait_ms`` runs
out) wait in a :class:`Purgatory`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from typing import Any, Generic, NamedTuple, TypeVar

from fabric.node.partition import NodePartition

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class SyncWait(NamedTuple):
    """An append to an ``fsync = "always"`` partition waiting for the fdatasync that covers it:
    then consumers may see up to ``end`` and ``reply`` goes to ``client`` (None: nobody waits)."""

    generation: int  # the flusher's generation that covers it
    partition: NodePartition
    end: int
    client: bytes | None
    reply: list[Any] | None
    acks_all: bool


class Deferred(Exception):
    """Raised by a handler that will reply later (long poll, fsync before ack)."""


class Purgatory(Generic[K, T]):
    """Requests that wait for something to happen on a partition, or for their deadline.

    Watchers are kept by key (a partition, ``(queue, p)``) in the order they came; a heap of
    deadlines finds the ones whose time ran out. A request leaves it exactly once: woken with
    its partition (:meth:`wake`), expired (:meth:`expire`) or drained at a stop (:meth:`drain`).
    Whoever takes it out answers it. A woken request's deadline stays in the heap until it is
    due and is skipped then; the heap is emptied whenever nothing waits.
    """

    def __init__(self) -> None:
        self._watchers: dict[K, dict[int, T]] = {}
        self._deadlines: list[tuple[int, int, K]] = []
        self._ids = itertools.count()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def park(self, key: K, deadline_ms: int, item: T) -> None:
        seq = next(self._ids)
        self._watchers.setdefault(key, {})[seq] = item
        heapq.heappush(self._deadlines, (deadline_ms, seq, key))
        self._count += 1

    def waiting(self, key: K) -> int:
        """How many requests wait on ``key``."""
        return len(self._watchers.get(key, ()))

    def wake(self, key: K) -> list[T]:
        """Every request waiting on ``key``, in the order they came; they wait no more."""
        watchers = self._watchers.pop(key, None)
        if not watchers:
            return []
        self._count -= len(watchers)
        if not self._count:
            self._deadlines.clear()
        return list(watchers.values())

    def expire(self, now_ms: int) -> list[T]:
        """The requests whose deadline is at or before ``now_ms``, earliest first."""
        out = []
        heap = self._deadlines
        while heap and heap[0][0] <= now_ms:
            _, seq, key = heapq.heappop(heap)
            watchers = self._watchers.get(key)
            if watchers is not None and seq in watchers:
                out.append(watchers.pop(seq))
                self._count -= 1
                if not watchers:
                    del self._watchers[key]
        return out

    def next_deadline_ms(self) -> int | None:
        """The earliest deadline of a request still waiting (None: nothing waits)."""
        heap = self._deadlines
        while heap:
            _, seq, key = heap[0]
            if seq in self._watchers.get(key, ()):
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def drain(self) -> list[T]:
        """Every request still waiting (the node is stopping)."""
        out = [item for watchers in self._watchers.values() for item in watchers.values()]
        self._watchers.clear()
        self._deadlines.clear()
        self._count = 0
        return out
