"""DirectoryView: the federation directory as one watch on ``/federation/`` keeps it: every
queue's placement and every cluster's router endpoints (what a router's front door needs).

Theory of operation
-------------------
As :class:`~fabric.cluster.mapview.MapView` does for a cluster's map: ``follow()`` applies what
the watch has without waiting; with no watch yet, or one lost (compacted, an etcd outage), it
reads everything under ``/federation/`` once and watches from that read's revision. Cluster
reports are rewritten every ``federation_report_ms``; only a change of a cluster's routers
counts as a change (``version`` moves), so a router rebuilds its front door when placements or
routers change, not on every report. A document that does not parse is logged and left out.
Pure: the ``MetaStore`` is handed in (the real etcd client, or the in-memory one in tests).
"""

from __future__ import annotations

import logging

from fabric.cluster.meta import MetaStore, MetaUnavailable, Watch, WatchEvent, cancel_quietly
from fabric.federation.directory import CLUSTERS_PREFIX, QUEUES_PREFIX, ROOT, ClusterReport, QueuePlacement

log = logging.getLogger(__name__)


class DirectoryView:
    def __init__(self, meta: MetaStore, who: str) -> None:
        self._meta = meta
        self._who = who  # for log lines
        self._watch: Watch | None = None
        self.placements: dict[str, QueuePlacement] = {}
        self.routers: dict[str, tuple[str, ...]] = {}
        self.version = 0  # moves when a placement or a cluster's routers change

    def follow(self) -> None:
        """Apply what the watch has; read everything again when there is no watch. Raises
        MetaUnavailable (the watch is dropped: the next call reads everything)."""
        if self._watch is not None:
            try:
                events = self._watch.poll(0)
            except MetaUnavailable:
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
        placements, routers = self.placements, self.routers
        self.placements, self.routers = {}, {}
        for kv in kvs:
            self._apply(WatchEvent("put", kv), count=False)
        if self.placements != placements or self.routers != routers:
            self.version += 1
        self._watch = self._meta.watch(ROOT, revision + 1)

    def drop_watch(self) -> None:
        cancel_quietly(self._watch)
        self._watch = None

    def _apply(self, event: WatchEvent, *, count: bool = True) -> None:
        key = event.kv.key
        if key.startswith(QUEUES_PREFIX):
            name, table, parse = key[len(QUEUES_PREFIX) :], self.placements, QueuePlacement.from_json
        elif key.startswith(CLUSTERS_PREFIX):
            name, table, parse = key[len(CLUSTERS_PREFIX) :], self.routers, _routers  # type: ignore[assignment]
        else:
            return  # the manager's key, requests
        before = table.get(name)
        if event.type == "delete":
            table.pop(name, None)
        else:
            try:
                table[name] = parse(event.kv.value)
            except (ValueError, TypeError) as e:
                log.warning("%s: cannot read %s: %s", self._who, key, e)
                table.pop(name, None)
        if count and table.get(name) != before:
            self.version += 1


def _routers(value: bytes) -> tuple[str, ...]:
    return ClusterReport.from_json(value).routers
