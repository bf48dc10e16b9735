"""The federation directory: what etcd holds under ``/federation/`` beside ``/clusters/<name>/``.

Theory of operation
-------------------
One etcd holds several clusters, each under ``/clusters/<name>/`` (``fabric.cluster.namespace``).
The directory sits beside them and has these kinds of key, each one JSON document:

* ``/federation/clusters/<name>``: a ``ClusterReport``, written every few seconds by that
  cluster's elected controller (``fabric.federation.report``): its routers' endpoints, its health
  (live and registered stores, under-replicated and offline partitions, the controller and its
  epoch) and its utilisation (bytes and messages per second in and out, disk used and free,
  partitions), stamped with the controller's clock (``published_ms``). No lease: a cluster whose
  controller is gone keeps its last report, which the planner sees growing old.
* ``/federation/manager``: the elected manager (``fabric.federation.manager``), under its lease;
  the key's create_revision is the manager epoch.
* ``/federation/queues/<queue>``: a ``QueuePlacement``, written by the manager only: the clusters
  the queue lives on and, per partition, the cluster that holds it (the tables queue -> clusters
  and partition -> cluster), and the settings it was asked with. Each cluster's controller
  creates the partitions placed on its cluster as a queue of its own (``report.materialise``).
* ``/federation/requests/<queue>``: a ``QueueRequest``, written by whoever asks for a queue
  (``fabric queue create Q --clusters N``), taken by the manager.
* ``/federation/deletions/<queue>``: a ``QueueDeletion``, written by whoever asks for a queue's
  deletion (``fabric queue delete Q --etcd``): the manager drops the placement, each cluster
  holding a share deletes it, the asker removes the request.

Everything here is pure: parsing checks every field and raises ``ValueError`` naming it, so a
bad value written by hand or by an older version is reported, never trusted.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

ROOT = "/federation/"
MANAGER_KEY = "/federation/manager"
CLUSTERS_PREFIX = "/federation/clusters/"
QUEUES_PREFIX = "/federation/queues/"
REQUESTS_PREFIX = "/federation/requests/"  # queues asked for, not yet placed (QueueRequest)
DRAINS_PREFIX = "/federation/drains/"  # <cluster> -> {}: being drained (fabric federation drain): no new queues
DELETIONS_PREFIX = "/federation/deletions/"  # queues asked to be deleted (QueueDeletion)
VERSION = 1  # of the documents below; a reader refuses a newer one

NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")  # cluster and queue names (fabric.protocol.ops.QUEUE_NAME)


def cluster_key(name: str) -> str:
    return CLUSTERS_PREFIX + name


def queue_key(queue: str) -> str:
    return QUEUES_PREFIX + queue


def request_key(queue: str) -> str:
    return REQUESTS_PREFIX + queue


def drain_key(cluster: str) -> str:
    return DRAINS_PREFIX + cluster


def deletion_key(queue: str) -> str:
    return DELETIONS_PREFIX + queue


def _int(raw: dict[str, Any], key: str, where: str) -> int:
    v = raw.get(key)
    if type(v) is not int or v < 0:
        raise ValueError(f"{where}: {key!r} must be a non-negative integer, got {v!r}")
    return v


def _rate(raw: dict[str, Any], key: str, where: str) -> float:
    v = raw.get(key)
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v < float("inf"):
        raise ValueError(f"{where}: {key!r} must be a non-negative number, got {v!r}")
    return float(v)


def _name(v: Any, where: str) -> str:
    if not isinstance(v, str) or not NAME.match(v):
        raise ValueError(f"{where}: {v!r} is not a valid name")
    return v


def _obj(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a JSON object")
    version = raw.get("version", VERSION)
    if type(version) is not int or version > VERSION:
        raise ValueError(f"{where}: version {version!r} is newer than this reader's ({VERSION})")
    return raw


@dataclass(frozen=True, slots=True)
class Health:
    stores: int  # registered stores (live ones: registration is under a lease)
    under_replicated: int  # partitions whose ISR is shorter than their replica list
    offline: int  # partitions with no leader
    controller: str | None  # the controller's name (None in a report: it is written by the controller)
    controller_epoch: int


@dataclass(frozen=True, slots=True)
class Utilisation:
    in_bytes_per_s: float
    in_messages_per_s: float
    out_bytes_per_s: float
    out_messages_per_s: float
    disk_used_bytes: int
    disk_free_bytes: int
    partitions: int

    @property
    def disk_fraction_used(self) -> float:
        total = self.disk_used_bytes + self.disk_free_bytes
        return self.disk_used_bytes / total if total else 0.0


@dataclass(frozen=True, slots=True)
class ClusterReport:
    """One cluster as its controller saw it at ``published_ms``."""

    name: str
    routers: tuple[str, ...]  # endpoints of its live routers
    health: Health
    utilisation: Utilisation
    published_ms: int

    def to_json(self) -> bytes:
        doc = {"version": VERSION, **asdict(self)}
        doc["routers"] = list(self.routers)
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> ClusterReport:
        where = "cluster report"
        raw = _obj(json.loads(data), where)
        name = _name(raw.get("name"), f"{where} 'name'")
        where = f"cluster report {name!r}"
        routers = raw.get("routers")
        if not isinstance(routers, list) or not all(isinstance(r, str) and r for r in routers):
            raise ValueError(f"{where}: 'routers' must be a list of endpoints")
        h, u = raw.get("health"), raw.get("utilisation")
        if not isinstance(h, dict) or not isinstance(u, dict):
            raise ValueError(f"{where}: 'health' and 'utilisation' must be objects")
        ctl = h.get("controller")
        if ctl is not None and not isinstance(ctl, str):
            raise ValueError(f"{where}: 'health.controller' must be a name or null")
        health = Health(
            stores=_int(h, "stores", f"{where} health"),
            under_replicated=_int(h, "under_replicated", f"{where} health"),
            offline=_int(h, "offline", f"{where} health"),
            controller=ctl,
            controller_epoch=_int(h, "controller_epoch", f"{where} health"),
        )
        w = f"{where} utilisation"
        util = Utilisation(
            in_bytes_per_s=_rate(u, "in_bytes_per_s", w),
            in_messages_per_s=_rate(u, "in_messages_per_s", w),
            out_bytes_per_s=_rate(u, "out_bytes_per_s", w),
            out_messages_per_s=_rate(u, "out_messages_per_s", w),
            disk_used_bytes=_int(u, "disk_used_bytes", w),
            disk_free_bytes=_int(u, "disk_free_bytes", w),
            partitions=_int(u, "partitions", w),
        )
        return cls(name, tuple(routers), health, util, _int(raw, "published_ms", where))


@dataclass(frozen=True, slots=True)
class QueuePlacement:
    """Where a queue's partitions live: ``partitions[p]`` is the cluster holding partition p."""

    queue: str
    partitions: tuple[str, ...]
    created_ms: int
    settings: dict[str, Any] = field(default_factory=dict)  # the queue's settings as asked (each cluster checks them)

    def __post_init__(self) -> None:
        _name(self.queue, "queue placement 'queue'")
        if not self.partitions:
            raise ValueError(f"queue placement {self.queue!r}: no partitions")
        for c in self.partitions:
            _name(c, f"queue placement {self.queue!r} cluster")

    @property
    def clusters(self) -> tuple[str, ...]:
        """The clusters the queue lives on, in the order of their first partition."""
        return tuple(dict.fromkeys(self.partitions))

    def partitions_on(self, cluster: str) -> tuple[int, ...]:
        return tuple(p for p, c in enumerate(self.partitions) if c == cluster)

    def to_json(self) -> bytes:
        doc = {
            "version": VERSION,
            "queue": self.queue,
            "clusters": list(self.clusters),
            "partitions": list(self.partitions),
            "created_ms": self.created_ms,
            "settings": self.settings,
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> QueuePlacement:
        raw = _obj(json.loads(data), "queue placement")
        parts = raw.get("partitions")
        if not isinstance(parts, list):
            raise ValueError("queue placement: 'partitions' must be a list of cluster names")
        settings = raw.get("settings", {})
        if not isinstance(settings, dict):
            raise ValueError("queue placement: 'settings' must be an object")
        created = _int(raw, "created_ms", "queue placement")
        placement = cls(raw.get("queue"), tuple(parts), created, settings)  # type: ignore[arg-type]
        if raw.get("clusters", list(placement.clusters)) != list(placement.clusters):
            raise ValueError(f"queue placement {placement.queue!r}: 'clusters' disagrees with 'partitions'")
        return placement


@dataclass(frozen=True, slots=True)
class QueueRequest:
    """A queue asked of the manager (``fabric queue create Q --clusters N``): written by the
    asker, taken by the manager, which places it and deletes the request in one txn, or writes
    ``error`` back when it cannot place it."""

    queue: str
    partitions: int
    clusters: int
    rf: int
    settings: dict[str, Any]
    error: str | None = None

    def __post_init__(self) -> None:
        _name(self.queue, "queue request 'queue'")
        for key, low in (("partitions", 1), ("clusters", 1), ("rf", 1)):
            v = getattr(self, key)
            if type(v) is not int or v < low:
                raise ValueError(f"queue request {self.queue!r}: {key!r} must be an integer >= {low}, got {v!r}")
        if not isinstance(self.settings, dict):
            raise ValueError(f"queue request {self.queue!r}: 'settings' must be an object")

    def to_json(self) -> bytes:
        return json.dumps({"version": VERSION, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> QueueRequest:
        raw = _obj(json.loads(data), "queue request")
        error = raw.get("error")
        if error is not None and not isinstance(error, str):
            raise ValueError("queue request: 'error' must be a string or null")
        fields: dict[str, Any] = {k: raw.get(k) for k in ("queue", "partitions", "clusters", "rf")}
        return cls(**fields, settings=raw.get("settings", {}), error=error)  # __post_init__ checks each


@dataclass(frozen=True, slots=True)
class QueueDeletion:
    """A federation queue asked to be deleted (``fabric queue delete Q --etcd``): written by the
    asker with the clusters holding it; the manager drops the queue from the table, each of those
    clusters' controllers then deletes its share, and the asker deletes this key once none holds
    one."""

    queue: str
    clusters: tuple[str, ...]

    def __post_init__(self) -> None:
        _name(self.queue, "queue deletion 'queue'")
        for c in self.clusters:
            _name(c, f"queue deletion {self.queue!r} cluster")

    def to_json(self) -> bytes:
        return json.dumps({"version": VERSION, "queue": self.queue, "clusters": list(self.clusters)}).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> QueueDeletion:
        raw = _obj(json.loads(data), "queue deletion")
        clusters = raw.get("clusters")
        if not isinstance(clusters, list):
            raise ValueError("queue deletion: 'clusters' must be a list of cluster names")
        return cls(raw.get("queue"), tuple(clusters))  # type: ignore[arg-type]


def manager_value(name: str, endpoint: str) -> bytes:
    return json.dumps({"name": name, "endpoint": endpoint}, sort_keys=True).encode()
