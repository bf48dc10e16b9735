"""Queue groups' lease tables, shared by the nodes of a cluster through etcd.

Theory of operation
-------------------
A queue or key_shared group lives on its coordinator (the leader of the queue's partition 0),
which checkpoints the group's lease tables (per partition: floor, cursor, settled ranges above
the floor, the receive count of every delivered and unsettled offset) about once a second. In a
cluster the coordinator also hands each checkpoint to ``note``; ``step`` (the cluster thread,
:class:`fabric.cluster.publisher.GroupPublisher`) publishes the newest one per group at most every ``publish_ms`` to
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
from typing import Any

from fabric.cluster.keys import GROUP_STATES_PREFIX, group_state_key, queue_key
from fabric.cluster.meta import Compare, KeyValue, MetaStore, Put
from fabric.cluster.publisher import PUBLISH_MS, GroupPublisher, read_group

GroupState = tuple[str, str, dict[str, Any]]  # (queue, group, the group's checkpoint)


def parse_group_state(kv: KeyValue) -> GroupState | None:
    """``(queue, group, state)`` of a ``/groupstates/`` key; None for anything unreadable."""
    return read_group(kv, GROUP_STATES_PREFIX, _state)


def _state(state: Any) -> dict[str, Any] | None:
    return state if isinstance(state, dict) and isinstance(state.get("leases"), dict) else None


class GroupStates(GroupPublisher[dict[str, Any], GroupState]):
    def __init__(self, meta: MetaStore, *, publish_ms: int = PUBLISH_MS) -> None:
        super().__init__(meta, GROUP_STATES_PREFIX, parse_group_state, publish_ms=publish_ms)

    def note(self, queue: str, group: str, state: dict[str, Any]) -> None:
        """A checkpoint this node (the group's coordinator) took, any thread; the newest is
        published on a later ``step``."""
        with self._lock:
            self._pending[(queue, group)] = state

    def _again(self, queue: str, group: str, state: dict[str, Any]) -> None:
        self._pending.setdefault((queue, group), state)  # unless a newer one was noted meanwhile

    def _publish_one(self, queue: str, group: str, state: dict[str, Any]) -> bool:
        value = json.dumps(state, separators=(",", ":")).encode()
        key = group_state_key(queue, group)
        self._meta.txn([Compare(queue_key(queue), "create_revision", ">", 0)], [Put(key, value)])
        return True  # written, or the queue is gone and nothing is to be kept
