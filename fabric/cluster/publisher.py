"""What a node publishes to etcd for the others, and reads back from them: one key per group.

Theory of operation
-------------------
``note`` (any thread) records the newest value of a ``(queue, group)``; ``step`` (the cluster
thread) publishes what was noted at most every ``publish_ms`` (``_publish_one``, one
transaction per key, which a subclass writes), and returns what changed under the prefix since
the last call: one watch, re-read whole after a lost watch (compacted, etcd away). A value
whose publish failed (etcd away, a lost race) is noted again (``_again``) for the next step,
unless something newer was noted meanwhile. The two kinds: committed offsets
(:mod:`fabric.cluster.group_offsets`) and queue groups' lease tables
(:mod:`fabric.cluster.group_states`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from fabric.cluster.meta import KeyValue, MetaStore, MetaUnavailable, Watch, cancel_quietly

log = logging.getLogger(__name__)
PUBLISH_MS = 1000

V = TypeVar("V")  # what is noted and published per group
U = TypeVar("U")  # what an update read back from etcd is


def read_group(kv: KeyValue, prefix: str, read: Callable[[Any], V | None]) -> tuple[str, str, V] | None:
    """``(queue, group, value)`` of a ``<prefix><queue>/<group>`` key whose JSON value ``read``
    accepts (it returns None or raises ValueError, TypeError or AttributeError for one it does
    not); None for any other key, and a warning for an unreadable value."""
    if not kv.key.startswith(prefix):
        return None
    queue, sep, group = kv.key[len(prefix) :].partition("/")
    if not sep or not queue or not group:
        return None
    try:
        value = read(json.loads(kv.value))
    except (ValueError, TypeError, AttributeError):
        value = None
    if value is None:
        log.warning("cannot read %s: %r", kv.key, kv.value[:200])
        return None
    return queue, group, value


class GroupPublisher(Generic[V, U]):
    def __init__(
        self, meta: MetaStore, prefix: str, parse: Callable[[KeyValue], U | None], *, publish_ms: int = PUBLISH_MS
    ) -> None:
        self._meta = meta
        self._prefix = prefix
        self._parse = parse
        self._publish_ms = publish_ms
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str], V] = {}
        self._watch: Watch | None = None
        self._next_publish_ms = 0

    def step(self, now_ms: int) -> list[U]:
        """Publish what is due; return the groups whose value changed in etcd."""
        if now_ms >= self._next_publish_ms:
            self._next_publish_ms = now_ms + self._publish_ms
            self._publish()
        return self._poll()

    def close(self) -> None:
        self._drop_watch()

    # --- for the subclass ---------------------------------------------------------------------

    def _publish_one(self, queue: str, group: str, value: V) -> bool:
        """Write one group's value; True when etcd holds it (or need not: the queue is gone)."""
        raise NotImplementedError

    def _again(self, queue: str, group: str, value: V) -> None:
        """Lock held: ``value`` failed to publish; keep it for the next step (``_pending`` may
        hold a newer value noted meanwhile)."""
        raise NotImplementedError

    # --- internals ----------------------------------------------------------------------------

    def _publish(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for (queue, group), value in pending.items():
            try:
                done = self._publish_one(queue, group, value)
            except MetaUnavailable as exc:
                log.debug("publishing %s%s/%s failed: %s", self._prefix, queue, group, exc)
                done = False
            if not done:
                with self._lock:
                    self._again(queue, group, value)

    def _poll(self) -> list[U]:
        parse = self._parse
        try:
            if self._watch is None:
                kvs, revision = self._meta.get_prefix(self._prefix)
                self._watch = self._meta.watch(self._prefix, revision + 1)
                return [u for u in map(parse, kvs) if u is not None]
            events = self._watch.poll(0)
        except MetaUnavailable:  # WatchCompacted too: read everything again next time
            self._drop_watch()
            return []
        return [u for u in (parse(e.kv) for e in events if e.type == "put") if u is not None]

    def _drop_watch(self) -> None:
        cancel_quietly(self._watch)
        self._watch = None
