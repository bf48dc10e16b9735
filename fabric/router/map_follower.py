"""A router's link to etcd, on a thread of its own: registration and the watched cluster map.

Theory of operation
-------------------
Every ``STEP_MS`` the thread keeps the router's registration alive (``/fabric/routers/<name>``
under a lease, made as a node's is: :mod:`fabric.cluster.registration`; ``fabric cluster
status`` lists the live routers) and follows the map with a
:class:`~fabric.cluster.mapview.MapView`. When a partition or a node changed it builds a new
:class:`~fabric.router.routing.RouteMap`, swaps it in (one reference assignment: the loop reads
``route_map`` without a lock) and wakes the loop. ``refresh()``, called by the loop when a node
refused a request as not its own (NOT_LEADER, NOT_COORDINATOR), makes the next step read the
whole map again instead of trusting the watch: the router never routes by a map older than one
it has seen refused. The loop never waits for etcd; while etcd cannot be reached the router
routes by its last map, and the storage nodes pass on what is no longer theirs.

A router of a federated cluster (``federation_report_ms`` > 0) also follows the federation
directory (:class:`~fabric.federation.directory_view.DirectoryView`, one more watch, outside the
cluster's namespace) and publishes a new :class:`~fabric.federation.front_door.FrontDoor` when a
queue's placement or a cluster's routers change: the rule by which the loop answers requests for
queues that live on other clusters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from fabric.cluster.etcd import EtcdClient
from fabric.cluster.keys import controller_value, router_key
from fabric.cluster.mapview import MapView
from fabric.cluster.meta import MetaUnavailable
from fabric.cluster.namespace import Namespaced
from fabric.cluster.registration import register, release
from fabric.federation.directory_view import DirectoryView
from fabric.federation.front_door import FrontDoor
from fabric.router.routing import RouteMap
from fabric.settings import ClusterConfig

log = logging.getLogger("fabric.router.map")
STEP_MS = 100


class MapFollower(threading.Thread):
    def __init__(self, name: str, endpoint: str, cluster: ClusterConfig, wake: Callable[[], None]) -> None:
        super().__init__(name=f"fabric-router-map-{name}", daemon=True)
        self.router_name = name
        self.endpoint = endpoint
        self._wake = wake
        self._ttl_s = cluster.node_lease_ttl_s
        self.meta = Namespaced(EtcdClient(list(cluster.etcd)), cluster.name)
        self.view = MapView(self.meta, f"router {name}")
        self.route_map = RouteMap()
        # a federated cluster's router: the directory, and the front door built from it
        self.directory: DirectoryView | None = None
        self.front_door: FrontDoor | None = None
        self._door_version = -1
        self._fed_meta: EtcdClient | None = None  # the directory is outside the cluster's namespace
        if cluster.federation_report_ms > 0:
            self._fed_meta = EtcdClient(list(cluster.etcd))
            self.directory = DirectoryView(self._fed_meta, f"router {name}")
            self.front_door = FrontDoor(cluster.name)
        self.cluster_name = cluster.name
        self.maps = 0  # how many route maps were published
        self._halt = threading.Event()
        self._refresh = threading.Event()
        self._lease = 0
        self._keepalive_due = 0.0
        self.registered = False  # the registration is in etcd under a live lease (read by other threads)

    def refresh(self) -> None:
        self._refresh.set()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self._step()
            except Exception:  # keep following through any bug in one step
                log.exception("router map step failed")
            self._halt.wait(STEP_MS / 1000)
        self.view.drop_watch()
        release(self.meta, self._lease)
        self.meta.close()
        if self.directory is not None and self._fed_meta is not None:
            self.directory.drop_watch()
            self._fed_meta.close()

    def _step(self) -> None:
        now = time.monotonic()
        try:
            if now >= self._keepalive_due:
                self._register()
                self._keepalive_due = now + max(0.2, self._ttl_s / 3)
        except MetaUnavailable as e:
            log.debug("router %s: registration not renewed: %s", self.router_name, e)
        if self._refresh.is_set():
            self._refresh.clear()
            self.view.drop_watch()
        if self.directory is not None:
            self._follow_directory()
        try:
            self.view.follow()
        except MetaUnavailable as e:
            log.debug("router %s: map not refreshed: %s", self.router_name, e)
            return
        if self.view.nodes_changed:  # who is live decides every leader entry: built whole (rare)
            self.view.dirty.clear()
            self.view.nodes_changed = False
            nodes = {n.name: n.endpoint for n in self.view.nodes.values()}
            rows = [(q, p, e.record.leader, e.record.replicas) for (q, p), e in self.view.partitions.items()]
            self.route_map = RouteMap.build(nodes, rows)
            self.maps += 1
            self._wake()
        elif self.view.dirty:  # partitions changed (a queue created, a leader or ISR moved): just those
            changes: dict[tuple[str, int], tuple[str | None, tuple[str, ...]] | None] = {}
            for key in self.view.dirty:
                entry = self.view.partitions.get(key)
                changes[key] = None if entry is None else (entry.record.leader, entry.record.replicas)
            self.view.dirty.clear()
            self.route_map = self.route_map.with_changes(changes)
            self.maps += 1
            self._wake()

    def _follow_directory(self) -> None:
        assert self.directory is not None
        try:
            self.directory.follow()
        except MetaUnavailable as e:
            log.debug("router %s: federation directory not refreshed: %s", self.router_name, e)
            return
        if self.directory.version != self._door_version:
            self._door_version = self.directory.version
            self.front_door = FrontDoor(
                self.cluster_name, dict(self.directory.placements), dict(self.directory.routers)
            )
            self._wake()

    def _register(self) -> None:
        if self._lease and self.meta.lease_keepalive(self._lease) != 0:
            return
        self.registered = False
        key = router_key(self.router_name)
        value = controller_value(self.router_name, self.endpoint)
        self._lease, _ = register(self.meta, key, value, 0, self._ttl_s)  # a new lease: the old one is gone
        if not self._lease:
            # an earlier incarnation's key waits for its lease to lapse; take the name over then
            log.info("router %s: %s is still registered by an earlier lease; retrying", self.router_name, key)
            self._keepalive_due = 0.0
            return
        self.registered = True
        log.info("router %s: registered at %s", self.router_name, self.endpoint)
