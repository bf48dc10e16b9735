"""A cluster's entry in the federation directory: each store's load, and the controller's report.

Theory of operation
-------------------
Load. Every store of a cluster with ``[cluster] federation_report_ms`` set feeds ``LoadMeter``
its cumulative counters (messages and bytes stored by PRODUCE, pushed to consumers) and its
disk figures; the meter turns two samples into rates and the store writes the result to
``/load/<node>`` in its cluster's namespace every period (outside ``/fabric/``: no watcher of the
map is woken by it). A load whose node is not registered (the node is dead) is left out.

Report. The elected controller's ``ClusterReporter.step`` builds the ``ClusterReport`` every
period from what its node already holds (the watched map: live nodes and partition records)
plus the small ``/fabric/routers/`` and ``/load/`` prefixes, and writes
``/federation/clusters/<name>`` in one transaction fenced by the controller epoch
(``Compare.created_at`` on the cluster's controller key): a deposed controller's report never
lands. A failed write is tried again next period; nothing here raises ``MetaUnavailable``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from fabric.cluster.keys import CONTROLLER_KEY, LOAD_PREFIX, ROUTERS_PREFIX, NodeInfo
from fabric.cluster.meta import Compare, MetaStore, MetaUnavailable, Put
from fabric.cluster.namespace import cluster_prefix
from fabric.cluster.partition import PartitionRecord
from fabric.federation.directory import ClusterReport, Health, Utilisation, cluster_key

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Counters:
    """A store's cumulative figures since it started, and its disk now."""

    in_messages: int
    in_bytes: int
    out_messages: int
    out_bytes: int
    disk_used_bytes: int
    disk_free_bytes: int


@dataclass(frozen=True, slots=True)
class NodeLoad:
    in_bytes_per_s: float
    in_messages_per_s: float
    out_bytes_per_s: float
    out_messages_per_s: float
    disk_used_bytes: int
    disk_free_bytes: int

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> NodeLoad:
        raw = json.loads(data)
        rates = [
            float(raw[k]) for k in ("in_bytes_per_s", "in_messages_per_s", "out_bytes_per_s", "out_messages_per_s")
        ]
        disk = [int(raw[k]) for k in ("disk_used_bytes", "disk_free_bytes")]
        if min(*rates, *disk) < 0:
            raise ValueError("a negative load figure")
        return cls(rates[0], rates[1], rates[2], rates[3], disk[0], disk[1])


class LoadMeter:
    """Rates from two samples of cumulative counters (a counter that went back: a restart, 0)."""

    def __init__(self) -> None:
        self._last: tuple[int, Counters] | None = None

    def sample(self, now_ms: int, c: Counters) -> NodeLoad:
        last, self._last = self._last, (now_ms, c)
        if last is None or now_ms <= last[0]:
            return NodeLoad(0.0, 0.0, 0.0, 0.0, c.disk_used_bytes, c.disk_free_bytes)
        s = (now_ms - last[0]) / 1000
        p = last[1]

        def rate(now: int, before: int) -> float:
            return max(0, now - before) / s

        return NodeLoad(
            rate(c.in_bytes, p.in_bytes),
            rate(c.in_messages, p.in_messages),
            rate(c.out_bytes, p.out_bytes),
            rate(c.out_messages, p.out_messages),
            c.disk_used_bytes,
            c.disk_free_bytes,
        )


def build_report(
    name: str,
    nodes: Mapping[str, NodeInfo],
    records: Mapping[tuple[str, int], PartitionRecord],
    routers: list[str],
    loads: Mapping[str, NodeLoad],
    controller: str,
    epoch: int,
    now_ms: int,
) -> ClusterReport:
    """The report of a cluster whose live nodes, partition records, router endpoints and node
    loads are these (loads of nodes not in ``nodes`` are left out)."""
    live = [loads[n] for n in sorted(nodes) if n in loads]
    offline = sum(1 for r in records.values() if r.leader is None or r.leader not in nodes)
    under = sum(1 for r in records.values() if len(r.isr) < len(r.replicas))
    util = Utilisation(
        in_bytes_per_s=sum(x.in_bytes_per_s for x in live),
        in_messages_per_s=sum(x.in_messages_per_s for x in live),
        out_bytes_per_s=sum(x.out_bytes_per_s for x in live),
        out_messages_per_s=sum(x.out_messages_per_s for x in live),
        disk_used_bytes=sum(x.disk_used_bytes for x in live),
        disk_free_bytes=sum(x.disk_free_bytes for x in live),
        partitions=len(records),
    )
    health = Health(len(nodes), under, offline, controller, epoch)
    return ClusterReport(name, tuple(sorted(routers)), health, util, now_ms)


def read_loads(meta: MetaStore) -> dict[str, NodeLoad]:
    """``/load/<node>`` of a cluster (``meta`` in its namespace); unreadable ones left out."""
    loads = {}
    for kv in meta.get_prefix(LOAD_PREFIX)[0]:
        try:
            loads[kv.key[len(LOAD_PREFIX) :]] = NodeLoad.from_json(kv.value)
        except (ValueError, KeyError, TypeError):
            log.warning("cannot read %s", kv.key)
    return loads


def read_routers(meta: MetaStore) -> list[str]:
    """The endpoints of the cluster's live routers (``meta`` in its namespace)."""
    out = []
    for kv in meta.get_prefix(ROUTERS_PREFIX)[0]:
        try:
            out.append(str(json.loads(kv.value)["endpoint"]))
        except (ValueError, KeyError, TypeError):
            continue
    return out


class ClusterReporter:
    """Publishes the cluster's report while its node is the controller (see module doc)."""

    def __init__(self, root: MetaStore, cluster: MetaStore, name: str, period_ms: int) -> None:
        self._root = root  # etcd un-namespaced: /federation/ and /clusters/<name>/...
        self._cluster = cluster  # the same etcd in the cluster's namespace
        self.name = name
        self._period_ms = period_ms
        self._due = 0
        self.published = 0  # reports written (for tests and logs)

    def step(
        self,
        now_ms: int,
        epoch: int,
        controller: str,
        nodes: Mapping[str, NodeInfo],
        records: Mapping[tuple[str, int], PartitionRecord],
    ) -> bool:
        """Publish when due and ``epoch`` (the controller epoch, 0: not the controller) is set.
        True when a report was written."""
        if not epoch or now_ms < self._due:
            return False
        self._due = now_ms + self._period_ms
        try:
            report = build_report(
                self.name,
                nodes,
                records,
                read_routers(self._cluster),
                read_loads(self._cluster),
                controller,
                epoch,
                now_ms,
            )
            fence = Compare.created_at(cluster_prefix(self.name) + CONTROLLER_KEY, epoch)
            done = self._root.txn([fence], [Put(cluster_key(self.name), report.to_json())]).succeeded
        except MetaUnavailable as e:
            log.debug("federation report of %s not written: %s", self.name, e)
            return False
        self.published += done
        return done
