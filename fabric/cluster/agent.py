"""NodeAgent: a storage node's side of the cluster metadata (registration, liveness, roles).

Theory of operation
-------------------
Registration. ``step`` grants a lease and creates ``/fabric/nodes/<name>`` under it only if the
key is absent (:mod:`fabric.cluster.registration`, as a router registers); the key's
create_revision is this incarnation's *node epoch*. If the key is
still there (an earlier incarnation whose lease has not lapsed yet, or another process wrongly
using this name) the agent waits and tries again every ``retry_ms``: a node never steals a live
registration. The lease is kept alive every ttl/3.

Fencing. When etcd says the lease is gone (keepalive answers 0) the agent is ``fenced``: it
reports every partition it led as no longer led, and the node must stop serving as leader. It
registers again, with a new node epoch, as soon as etcd lets it. While etcd cannot be reached
the agent does not know whether its lease lives; it keeps its state and the node keeps serving
with the map it has (writes that need etcd, such as ISR changes, fail and fence a deposed leader),
but only for so long: once etcd has not confirmed the lease for its TTL plus ``fence_grace_ms``
the lease is surely gone at etcd too (a leader change there extends leases by its election
timeout, 1 s with fabric's members), and the agent fences itself as if etcd had said so. A node
cut off from the etcd majority therefore stops leading on its own; a node that merely waits out
an etcd election (members answer "no leader" for up to ~2 s) does not.

The map. One watch on ``/fabric/`` keeps ``partitions`` and ``nodes`` current; when the watch is
lost (compacted, outage) the agent re-reads everything with ``get_prefix`` and watches again from
that read's revision. From the map it derives this node's role in every partition that names it
(in ``replicas``, ``isr`` or as ``leader``) and reports a ``RoleChange`` whenever the record or
the role changes, and one with ``record=None`` when the partition is deleted (or re-created: a
key with a new create_revision is a new partition, reported as a deletion then a creation).

``is_leader`` is true only if the record names this node as leader, the node is registered and
not fenced, and the record was written after this incarnation registered (mod_revision > node
epoch). A leadership granted to an earlier incarnation (the node restarted within its lease) is
therefore not taken up: the controller sees the node as restarted and elects again, with a new
leader epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from fabric.cluster.keys import NodeInfo, node_key, node_value, partition_key
from fabric.cluster.mapview import MapEntry, MapView
from fabric.cluster.meta import Compare, MetaStore, MetaUnavailable, Put
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.registration import register, release

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RoleChange:
    """This node's view of one partition changed. ``record`` None: the partition is gone."""

    queue: str
    partition: int
    record: PartitionRecord | None
    is_leader: bool
    mod_revision: int


class NodeAgent:
    """One storage node's metadata agent. Call ``step(now_ms)`` periodically."""

    def __init__(
        self,
        meta: MetaStore,
        name: str,
        endpoint: str,
        *,
        lease_ttl_s: int = 10,
        zone: str | None = None,
        retry_ms: int | None = None,
        fence_grace_ms: int = 2000,
    ) -> None:
        self._meta = meta
        self.name = name
        self.endpoint = endpoint
        self.zone = zone
        self._ttl_s = lease_ttl_s
        self._keepalive_ms = max(1, lease_ttl_s * 1000 // 3)
        self._fence_after_ms = lease_ttl_s * 1000 + fence_grace_ms
        self._retry_ms = retry_ms if retry_ms is not None else max(1, lease_ttl_s * 1000 // 4)
        self._lease = 0
        self._epoch = 0
        self._fenced = False
        self._keepalive_due = 0
        self._register_due = 0
        self._confirmed_ms: int | None = None
        self._view = MapView(meta, f"node {name}", queues=True)
        self._roles: dict[tuple[str, int], tuple[int, PartitionRecord, bool]] = {}  # as last reported
        self._reported_epoch = 0  # the node epoch the roles were last derived with

    # --- state --------------------------------------------------------------------------------

    @property
    def registered(self) -> bool:
        return self._epoch > 0

    @property
    def fenced(self) -> bool:
        """The lease lapsed (etcd said so) and the node has not registered again: stop leading."""
        return self._fenced

    @property
    def epoch(self) -> int:
        """This incarnation's node epoch (create_revision of its node key); 0 when unregistered."""
        return self._epoch

    @property
    def lease_confirmed_ms(self) -> int | None:
        """When etcd last confirmed this registration's lease (registration or keepalive); None
        before the first. A node that wants to stop leading *before* etcd can tell it that the
        lease lapsed (cut off from etcd) compares ``now_ms - lease_confirmed_ms`` with the TTL."""
        return self._confirmed_ms if self._epoch else None

    @property
    def partitions(self) -> Mapping[tuple[str, int], PartitionRecord]:
        """The last known record of every partition in the cluster."""
        return {k: e.record for k, e in self._view.partitions.items()}

    def take_touched(self) -> set[tuple[str, int]]:
        """The partitions whose record may have changed since the last call (then forgotten)."""
        touched, self._view.touched = self._view.touched, set()
        return touched

    def take_queues_put(self) -> dict[str, bytes]:
        """Queue keys written since the last call, by queue name (then forgotten)."""
        put, self._view.queues_put = self._view.queues_put, {}
        return put

    def record(self, queue: str, partition: int) -> PartitionRecord | None:
        entry = self._view.partitions.get((queue, partition))
        return entry.record if entry is not None else None

    def knows(self, queue: str, partition: int) -> bool:
        """Does the map hold a record of ``queue/partition`` (without copying the map)?"""
        return (queue, partition) in self._view.partitions

    @property
    def map_version(self) -> int:
        """Moves whenever the map changed (a partition record, a node, a full re-read)."""
        return self._view.version

    @property
    def nodes(self) -> Mapping[str, NodeInfo]:
        """The last known registered nodes (endpoint, zone, node epoch)."""
        return dict(self._view.nodes)

    # --- driving ------------------------------------------------------------------------------

    def step(self, now_ms: int) -> list[RoleChange]:
        """Keep the registration alive (or make one), follow the map; returns the role changes.
        Never raises MetaUnavailable: the agent keeps its last map and tries again next step."""
        try:
            if self._epoch and now_ms >= self._keepalive_due:
                if self._meta.lease_keepalive(self._lease) == 0:
                    log.warning("node %s: lease lost (epoch %d): fenced", self.name, self._epoch)
                    self._epoch, self._lease, self._fenced = 0, 0, True
                else:
                    self._keepalive_due = now_ms + self._keepalive_ms
                    self._confirmed_ms = now_ms
            if not self._epoch and now_ms >= self._register_due:
                self._register_due = now_ms + self._retry_ms
                self._register(now_ms)
        except MetaUnavailable as e:
            log.debug("node %s: metadata unavailable: %s", self.name, e)
            if self._epoch and self._confirmed_ms is not None and now_ms - self._confirmed_ms > self._fence_after_ms:
                log.warning(
                    "node %s: etcd has not confirmed the lease for %d ms (epoch %d): fenced",
                    self.name,
                    now_ms - self._confirmed_ms,
                    self._epoch,
                )
                self._epoch, self._lease, self._fenced = 0, 0, True
        try:
            self._view.follow()
        except MetaUnavailable as e:
            log.debug("node %s: map not refreshed: %s", self.name, e)
        return self._role_changes()

    def cas_partition(self, queue: str, partition: int, old: PartitionRecord, new: PartitionRecord) -> bool:
        """Replace the record ``old`` by ``new`` if it is still ``old`` (an ISR change by the
        leader). False when it is not, or when this node is not registered (fenced). Raises
        MetaUnavailable when etcd cannot be reached (outcome unknown: read the record again)."""
        if not self._epoch:
            return False
        key = partition_key(queue, partition)
        return self._meta.txn([Compare.value_is(key, old.to_json())], [Put(key, new.to_json())]).succeeded

    def read_partition(self, queue: str, partition: int) -> PartitionRecord | None:
        """The record as the store holds it now, not the watched copy (None: no such partition):
        how an ISR swap whose outcome was unknown is settled. Raises MetaUnavailable."""
        kv = self._meta.get(partition_key(queue, partition))
        return PartitionRecord.from_json(kv.value) if kv is not None else None

    def close(self) -> None:
        """Graceful shutdown: give up the registration now instead of letting the lease lapse."""
        self._view.drop_watch()
        release(self._meta, self._lease)
        self._epoch, self._lease = 0, 0

    # --- internals ----------------------------------------------------------------------------

    def _register(self, now_ms: int) -> None:
        key = node_key(self.name)
        value = node_value(self.name, self.endpoint, self.zone)
        self._lease, epoch = register(self._meta, key, value, self._lease, self._ttl_s)
        if not self._lease:
            log.info("node %s: %s still registered by another lease; waiting", self.name, key)
            return
        self._epoch, self._fenced = epoch, False
        self._keepalive_due = now_ms + self._keepalive_ms
        self._confirmed_ms = now_ms
        log.info("node %s: registered, node epoch %d", self.name, epoch)

    def _leads(self, entry: MapEntry) -> bool:
        return entry.record.leader == self.name and self._epoch > 0 and entry.mod_revision > self._epoch

    def _names_me(self, record: PartitionRecord) -> bool:
        return self.name in record.replicas or self.name in record.isr or record.leader == self.name

    def _role_changes(self) -> list[RoleChange]:
        if self._epoch != self._reported_epoch:  # registered, fenced or registered again
            self._reported_epoch = self._epoch
            self._view.dirty.update(self._roles)
        changes: list[RoleChange] = []
        dirty = sorted(self._view.dirty)
        self._view.dirty.clear()
        for where in dirty:
            entry = self._view.partitions.get(where)
            last = self._roles.get(where)
            if entry is None:
                if last is not None:
                    self._roles.pop(where)
                    changes.append(RoleChange(where[0], where[1], None, False, 0))
                continue
            if last is None and not self._names_me(entry.record):
                continue
            leads = self._leads(entry)
            if last is not None and last[0] != entry.create_revision:  # deleted and created again
                changes.append(RoleChange(where[0], where[1], None, False, 0))
                last = None
            if last is not None and last[1] == entry.record and last[2] == leads:
                continue
            changes.append(RoleChange(where[0], where[1], entry.record, leads, entry.mod_revision))
            if self._names_me(entry.record):
                self._roles[where] = (entry.create_revision, entry.record, leads)
            else:
                self._roles.pop(where, None)  # reported once as not naming us, then forgotten
        return changes
