"""Retention in slices: every queue's retention applied once in RETENTION_CHECK_MS, a slice of
the queues every RETENTION_SLICE_MS, so that many queues never hold the loop at once.

A round takes the store's queue names (last first) and looks at ``ceil(queues * slice / check)``
of them per slice; queues made while a round is under way join it at once. The spark.* groups
that hold retention back are read once a round (a read of the group table)."""

from __future__ import annotations

import logging

from fabric.errors import FabricError
from fabric.store.store import Store

log = logging.getLogger("fabric.broker")
RETENTION_CHECK_MS = 10_000  # every queue's retention is applied once in this long...
RETENTION_SLICE_MS = 1_000  # ...a slice of the queues this often (10,000 at once held the loop ~20 ms)


class RetentionRounds:
    def __init__(self, store: Store, now_ms: int) -> None:
        self.store = store
        self.next_ms = now_ms + RETENTION_SLICE_MS
        self._todo: list[str] = []  # this round's queues still to look at, last first
        self._count = 0  # how many of them each slice looks at
        self._holders: dict[str, list[str]] | None = None  # this round's spark.* groups
        self._round: set[str] = set()  # every queue this round looks at
        self._shape = (0, 0)  # the store's shape when the round was last looked at

    def tick(self, now_ms: int) -> list[str]:
        """Apply retention to the next slice of the queues if one is due; the queues it looked at."""
        if now_ms < self.next_ms:
            return []
        self.next_ms = now_ms + RETENTION_SLICE_MS
        store = self.store
        shape = store.shape()
        if not self._todo:
            names = store.queue_names()
            self._todo = names[::-1]
            self._round = set(names)
            self._count = -(-len(names) * RETENTION_SLICE_MS // RETENTION_CHECK_MS)
            self._holders = None
        elif shape != self._shape:  # queues made since the round began join it, first
            new = [n for n in store.queue_names() if n not in self._round]
            self._todo.extend(reversed(new))
            self._round.update(new)
        self._shape = shape
        todo = self._todo
        names = [todo.pop() for _ in range(min(self._count, len(todo)))]
        try:
            if self._holders is None:  # once a round: it reads the group table (sqlite)
                self._holders = store.retention_holders()
            store.enforce_retention(now_ms, names, self._holders)
        except FabricError:
            log.exception("retention pass failed")
        return names
