"""Queue groups' lease tables, shared by the nodes of a cluster through etcd.

Theory of operation
-------------------
A queue or key_shared group lives on its coordinator (the leader of the queue's partition 0),
which checkpoints the group's lease tables (per partition: floor, cursor, settled ranges above
the floor, the receive count of every delivered and unsettled offset) about once a second. In a
cluster the coordinator also hands each checkpoint to ``note``; ``step`` (the cluster thread)
publishes the newest one per group at most every ``publish_ms`` to
``/groupstates/<queue>/<group>`` (a put in a txn that checks the queue key, so a deleted queue
leaves nothing behind). Only the coordinator writes, so the last write wins.

``step`` also returns what other nodes published (one watch on ``/groupstates/``, read whole
after a lost watch). A node that does not hold the group keeps the newest copy in its own store;
when it becomes the coordinator after a failover, it opens the group from that copy: the
messages settled out of order stay settled, and every unsettled delivery is redeliverable at
once **with its receive count**, so a message that keeps failing still reaches the dead-letter
queue after ``max_receive_count`` deliveries, however many failovers happen in between. What
was settled in the last second or so before a failover is delivered again (at least once).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from fabric.cluster.keys import GROUP_STATES_PREFIX, group_state_key, queue_key
from fabric.cluster.meta import Compare, KeyValue, MetaStore, MetaUnavailable, Put, Watch, cancel_quietly

log = logging.getLogger(__name__)
PUBLISH_MS = 1000

GroupState = tuple[str, str, dict[str, Any]]  # (queue, group, the group's checkpoint)


def parse_group_state(kv: KeyValue) -> GroupState | None:
    """``(queue, group, state)`` of a ``/groupstates/`` key; None for anything unreadable."""
    if not kv.key.startswith(GROUP_STATES_PREFIX):
        return None
    queue, sep, group = kv.key[len(GROUP_STATES_PREFIX) :].partition("/")
    if not sep or not queue or not group:
        return None
    try:
        state = json.loads(kv.value)
    except ValueError:
        state = None
    if not isinstance(state, dict) or not isinstance(state.get("leases"), dict):
        log.warning("cannot read %s: %r", kv.key, kv.value[:200])
        return None
    return queue, group, state


class GroupStates:
    def __init__(self, meta: MetaStore, *, publish_ms: int = PUBLISH_MS) -> None:
        self._meta = meta
        self._publish_ms = publish_ms
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str], dict[str, Any]] = {}
        self._watch: Watch | None = None
        self._next_publish_ms = 0

    def note(self, queue: str, group: str, state: dict[str, Any]) -> None:
        """A checkpoint this node (the group's coordinator) took, any thread; the newest is
        published on a later ``step``."""
        with self._lock:
            self._pending[(queue, group)] = state

    def step(self, now_ms: int) -> list[GroupState]:
        """Publish what is due; return the groups whose state other nodes published."""
        if now_ms >= self._next_publish_ms:
            self._next_publish_ms = now_ms + self._publish_ms
            self._publish()
        return self._poll()

    def close(self) -> None:
        cancel_quietly(self._watch)
        self._watch = None

    def _publish(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for (queue, group), state in pending.items():
            key = group_state_key(queue, group)
            try:
                value = json.dumps(state, separators=(",", ":")).encode()
                self._meta.txn([Compare(queue_key(queue), "create_revision", ">", 0)], [Put(key, value)])
            except MetaUnavailable as exc:
                log.debug("publishing the state of %s/%s failed: %s", queue, group, exc)
                with self._lock:  # again next time, unless a newer one was noted meanwhile
                    self._pending.setdefault((queue, group), state)

    def _poll(self) -> list[GroupState]:
        try:
            if self._watch is None:
                kvs, revision = self._meta.get_prefix(GROUP_STATES_PREFIX)
                self._watch = self._meta.watch(GROUP_STATES_PREFIX, revision + 1)
                return [u for u in map(parse_group_state, kvs) if u is not None]
            events = self._watch.poll(0)
        except MetaUnavailable:  # WatchCompacted too: read everything again next time
            cancel_quietly(self._watch)
            self._watch = None
            return []
        return [u for u in (parse_group_state(e.kv) for e in events if e.type == "put") if u is not None]
