"""Placing a new queue on the clusters of the federation: the manager's decisions, pure.

Theory of operation
-------------------
A cluster may take a new queue when it is *healthy*: its report is fresh (published within
``Limits.stale_ms`` of ``now_ms``), it has a controller, at least ``rf`` live stores, no offline
and no under-replicated partition. It may not when it is *full*: its utilisation is at or above
``Limits.full_fraction``. ``problems`` names every reason a cluster is out, for status and errors.

Three fractions measure a cluster, each of what its live stores can hold: disk used / disk total;
traffic (bytes per second in plus out) / (stores x ``store_bytes_per_s``); partitions / (stores x
``store_partitions``). The partition count is the report's plus those of the directory's queue
table placed on the cluster after the report was published, so queues the manager placed since
the last report count at once: twenty queues created in one second do not all land on the cluster that looked
emptiest a second ago. *Utilisation* is the largest fraction (what decides "full"); the *load*
is their sum (what ranks clusters: two clusters with equal disks still differ in traffic and
partitions, so equal clusters take queues in turn, not the first by name every time).

``place`` puts a queue of ``partitions`` partitions on the ``clusters`` eligible clusters with the
least load, i.e. the most room (ties: by name), and spreads the partitions over them round robin
in that order, so partition p is on cluster p mod N (N clamped to the partition count). Too few
eligible clusters: ``NoRoom``, naming why each is out. Utilisation decides, never the order of
earlier requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fabric.errors import BadParameter, NotEnoughReplicas
from fabric.federation.directory import ClusterReport, QueuePlacement


class NoRoom(NotEnoughReplicas):
    """Fewer healthy clusters with room than the queue asks for (retriable: clusters recover)."""


@dataclass(frozen=True, slots=True)
class Limits:
    stale_ms: int = 15_000  # a report older than this: the cluster's controller is not publishing
    full_fraction: float = 0.9  # utilisation at or above this: no new queues
    store_bytes_per_s: float = 100e6  # what one store is taken to carry, in plus out
    store_partitions: int = 2000  # partition replicas one store is taken to hold


DEFAULT_LIMITS = Limits()


def partitions_placed(table: Iterable[QueuePlacement], reports: Mapping[str, ClusterReport]) -> dict[str, int]:
    """Partitions per cluster in the queue table placed after the cluster's report was published
    (the report does not count them yet)."""
    counts: dict[str, int] = {}
    for placement in table:
        for c in placement.partitions:
            report = reports.get(c)
            if report is not None and placement.created_ms >= report.published_ms:
                counts[c] = counts.get(c, 0) + 1
    return counts


def fractions(report: ClusterReport, placed: int = 0, limits: Limits = DEFAULT_LIMITS) -> tuple[float, float, float]:
    """Disk, traffic and partitions, each as a fraction of what the cluster's live stores hold."""
    u, stores = report.utilisation, max(1, report.health.stores)
    traffic = (u.in_bytes_per_s + u.out_bytes_per_s) / (stores * limits.store_bytes_per_s)
    partitions = (u.partitions + placed) / (stores * limits.store_partitions)
    return u.disk_fraction_used, traffic, partitions


def utilisation(report: ClusterReport, placed: int = 0, limits: Limits = DEFAULT_LIMITS) -> float:
    """The largest fraction: at ``limits.full_fraction`` the cluster is full."""
    return max(fractions(report, placed, limits))


def load(report: ClusterReport, placed: int = 0, limits: Limits = DEFAULT_LIMITS) -> float:
    """The sum of the fractions: the least loaded eligible cluster gets a new queue."""
    return sum(fractions(report, placed, limits))


def problems(
    report: ClusterReport, now_ms: int, rf: int = 1, placed: int = 0, limits: Limits = DEFAULT_LIMITS
) -> list[str]:
    """Why the cluster takes no new queue (empty: it may)."""
    h = report.health
    out = []
    age = now_ms - report.published_ms
    if age > limits.stale_ms:
        out.append(f"report {age} ms old")
    if h.controller is None:
        out.append("no controller")
    if h.stores < rf:
        out.append(f"{h.stores} live stores, fewer than {rf}")
    if h.offline:
        out.append(f"{h.offline} partitions offline")
    if h.under_replicated:
        out.append(f"{h.under_replicated} partitions under-replicated")
    used = utilisation(report, placed, limits)
    if used >= limits.full_fraction:
        out.append(f"full ({used:.0%} used)")
    return out


def place(
    queue: str,
    partitions: int,
    reports: Mapping[str, ClusterReport],
    table: Iterable[QueuePlacement],
    now_ms: int,
    *,
    clusters: int = 1,
    rf: int = 1,
    limits: Limits = DEFAULT_LIMITS,
) -> QueuePlacement:
    """The placement of a new queue (see module doc). Raises BadParameter, NoRoom."""
    if partitions < 1 or clusters < 1:
        raise BadParameter(f"queue {queue!r}: partitions and clusters must be at least 1")
    placed = partitions_placed(table, reports)
    eligible, refused = [], []
    for name in sorted(reports):
        report = reports[name]
        why = problems(report, now_ms, rf, placed.get(name, 0), limits)
        if why:
            refused.append(f"{name}: {', '.join(why)}")
        else:
            eligible.append((load(report, placed.get(name, 0), limits), name))
    n = min(clusters, partitions)
    if len(eligible) < n:
        detail = "; ".join(refused) or "no cluster has reported"
        raise NoRoom(f"queue {queue!r} needs {n} healthy clusters with room, {len(eligible)} have: {detail}")
    chosen = [name for _, name in sorted(eligible)[:n]]
    return QueuePlacement(queue, tuple(chosen[p % n] for p in range(partitions)), now_ms)
