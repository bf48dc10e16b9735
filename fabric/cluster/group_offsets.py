"""Consumer groups' committed offsets, shared by every node of a cluster through etcd.

Theory of operation
-------------------
A group's commits land on the node its consumer talks to (``fabric.store`` keeps them there, as
on a single node). A consumer that moves to another node after a failover must find them there
too, so every node also publishes the commits it took, and applies those the others took:

* ``note`` (any thread) records a commit; ``step`` (the cluster thread) publishes what was
  noted at most every ``publish_ms`` (:class:`fabric.cluster.publisher.GroupPublisher`), one key per group, ``/groups/<queue>/<group>`` =
  ``{"<partition>": offset}``. A publish is a read-merge-CAS: per partition the larger offset
  wins, so two nodes serving members of one group (different partitions) never undo each
  other, and a publish for a queue that no longer exists fails (the txn also checks the queue
  key) instead of leaving offsets behind for a later queue of the same name.
* ``step`` also returns what changed in etcd since the last call (one watch on ``/groups/``,
  re-read whole after a lost watch), for the node to merge into its own store.

Replicated offsets only move forward: a reset to an earlier offset holds on the node that took
it, not on the others. A consumer moving nodes resumes from at most ``publish_ms`` behind its
last commit: redelivery (at-least-once), never a skip.
"""

from __future__ import annotations

import json
from typing import Any

from fabric.cluster.keys import GROUPS_PREFIX, group_key, queue_key
from fabric.cluster.meta import Compare, KeyValue, MetaStore, Put
from fabric.cluster.publisher import PUBLISH_MS, GroupPublisher, read_group

GroupUpdate = tuple[str, str, dict[int, int]]  # (queue, group, {partition: offset})


def parse_group(kv: KeyValue) -> GroupUpdate | None:
    """``(queue, group, offsets)`` of a ``/groups/`` key; None for anything unreadable."""
    return read_group(kv, GROUPS_PREFIX, _offsets)


def _offsets(raw: Any) -> dict[int, int]:
    return {int(p): int(o) for p, o in raw.items()}


class GroupOffsets(GroupPublisher[dict[int, int], GroupUpdate]):
    def __init__(self, meta: MetaStore, *, publish_ms: int = PUBLISH_MS) -> None:
        super().__init__(meta, GROUPS_PREFIX, parse_group, publish_ms=publish_ms)

    def note(self, queue: str, group: str, offsets: dict[int, int]) -> None:
        """A commit this node took (any thread); published on a later ``step``."""
        with self._lock:
            self._pending.setdefault((queue, group), {}).update(offsets)

    def _again(self, queue: str, group: str, offsets: dict[int, int]) -> None:
        # anything noted meanwhile is newer
        self._pending[(queue, group)] = {**offsets, **self._pending.get((queue, group), {})}

    def _publish_one(self, queue: str, group: str, offsets: dict[int, int]) -> bool:
        """A read-merge-CAS, per partition the larger offset wins. True when etcd holds at least
        ``offsets`` (or the queue is gone: nothing to keep)."""
        key = group_key(queue, group)
        for _ in range(3):
            kv = self._meta.get(key)
            parsed = parse_group(kv) if kv is not None else None
            current = parsed[2] if parsed is not None else {}
            merged = dict(current)
            for p, off in offsets.items():
                if off > merged.get(p, -1):
                    merged[p] = off
            if merged == current:
                return True
            value = json.dumps({str(p): o for p, o in sorted(merged.items())}).encode()
            own = Compare.modified_at(key, kv.mod_revision) if kv is not None else Compare.absent(key)
            exists = Compare(queue_key(queue), "create_revision", ">", 0)
            if self._meta.txn([own, exists], [Put(key, value)]).succeeded:
                return True
            if self._meta.get(queue_key(queue)) is None:
                return True  # the queue was deleted: its offsets go with it
        return False
