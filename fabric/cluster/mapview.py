"""MapView: the cluster map as one watch on ``/fabric/`` keeps it (partition records, live nodes).

Theory of operation
-------------------
``follow()`` polls the watch without waiting and applies its events; when there is no watch yet,
or it was lost (compacted, an etcd outage), it reads everything under ``/fabric/`` with one
``get_prefix`` and watches again from that read's revision. Every partition whose record may
have changed since the caller last looked is added to ``dirty`` (the caller clears it). Keys it
does not know (the controller's, routers') are ignored; with ``queues``, a queue key's value is
kept in ``queues_put`` until the caller takes it (a node applies changed settings from it). A storage node's agent and a
router both keep their map this way; neither writes through it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fabric.cluster.keys import NODES_PREFIX, QUEUES_PREFIX, ROOT, NodeInfo, parse_node, parse_partition_key
from fabric.cluster.meta import KeyValue, MetaStore, MetaUnavailable, Watch, WatchEvent, cancel_quietly
from fabric.cluster.partition import PartitionRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MapEntry:
    """A partition's record and the revisions of its key (create: which partition; mod: which write)."""

    record: PartitionRecord
    create_revision: int
    mod_revision: int


class MapView:
    """The last known record of every partition and every registered node."""

    def __init__(self, meta: MetaStore, who: str, *, queues: bool = False) -> None:
        self._meta = meta
        self._who = who  # for log lines
        self._watch: Watch | None = None
        self.partitions: dict[tuple[str, int], MapEntry] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self.dirty: set[tuple[str, int]] = set()  # partitions whose record may have changed
        self.touched: set[tuple[str, int]] = set()  # the same, for a second reader (its own to clear)
        self.nodes_changed = False  # set when a node registers or goes; the caller clears it
        self._queues = queues  # keep queue keys' values for the caller (a node; a router does not)
        self.queues_put: dict[str, bytes] = {}  # queue keys written since the caller last took them
        self.version = 0  # counts the changes applied: a caller rebuilds what it derives only when it moved

    def follow(self) -> None:
        """Apply what the watch has; read everything again when there is no watch. Raises
        MetaUnavailable (the watch is dropped: the next call reads everything)."""
        if self._watch is not None:
            try:
                events = self._watch.poll(0)
            except MetaUnavailable:  # WatchCompacted too: read everything again
                self.drop_watch()
            else:
                for event in events:
                    self._apply(event)
                return
        try:
            kvs, revision = self._meta.get_prefix(ROOT)
        except MetaUnavailable:
            self.drop_watch()
            raise
        self.dirty.update(self.partitions)
        self.touched.update(self.partitions)
        self.partitions.clear()
        self.nodes.clear()
        self.nodes_changed = True
        for kv in kvs:
            self._apply(WatchEvent("put", kv))
        self._watch = self._meta.watch(ROOT, revision + 1)

    def drop_watch(self) -> None:
        cancel_quietly(self._watch)
        self._watch = None

    def _apply(self, event: WatchEvent) -> None:
        kv: KeyValue = event.kv
        self.version += 1
        if kv.key.startswith(NODES_PREFIX):
            name = kv.key[len(NODES_PREFIX) :]
            node = parse_node(kv) if event.type == "put" else None
            if node is None:
                self.nodes.pop(name, None)
            else:
                self.nodes[name] = node
            self.nodes_changed = True
            return
        if kv.key.startswith(QUEUES_PREFIX):
            if self._queues and event.type == "put":  # a queue's settings (fabric queue alter --set) or partition count
                self.queues_put[kv.key[len(QUEUES_PREFIX) :]] = kv.value
            return
        where = parse_partition_key(kv.key)
        if where is None:
            return
        self.dirty.add(where)
        self.touched.add(where)
        if event.type == "delete":
            self.partitions.pop(where, None)
            return
        try:
            record = PartitionRecord.from_json(kv.value)
        except (ValueError, KeyError, TypeError) as e:
            log.warning("%s: cannot read %s: %s", self._who, kv.key, e)
            return
        self.partitions[where] = MapEntry(record, kv.create_revision, kv.mod_revision)
