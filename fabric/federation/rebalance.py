"""Which queues to move between clusters: evening out utilisation (``fabric federation rebalance``)
and emptying a cluster before it is retired (``fabric federation drain CLUSTER``).

Theory of operation
-------------------
A cluster's report gives its load (``planner.load``: disk, traffic and partition fractions
summed), not each queue's. A queue's *weight* on its cluster is therefore estimated: its share
of the cluster's partitions times the cluster's disk and traffic fractions, plus its own
partitions' fraction. Moving it takes that weight off the source and (approximately) puts it
on the destination.

Rebalance: while the most loaded cluster that holds a movable queue and the least loaded cluster
that may take queues (``planner.problems`` empty, not draining) differ by more than ``GAP``, move
from the first to the second the queue that leaves them closest (the weight nearest half the
gap; one that would leave them further apart, the two swapping places, is never taken), up to
``MAX_MOVES`` proposals. A queue is movable when it is wholly on one cluster, of a kind that
moves (``moves.unmovable``: not priority, direct or encrypted), and no move of it is under way.

Drain: every queue on the cluster goes, each to the least loaded cluster that may take queues
(its load raised by each queue given to it); a split queue, or one already moving, is reported
as staying, with the reason. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from fabric.federation.directory import ClusterReport, QueuePlacement
from fabric.federation.moves import unmovable
from fabric.federation.planner import DEFAULT_LIMITS, Limits, load, partitions_placed, problems

GAP = 0.1  # loads (sums of fractions) closer than this are even enough
MAX_MOVES = 10  # proposals per rebalance


@dataclass(frozen=True, slots=True)
class Proposal:
    queue: str
    source: str
    destination: str | None  # None: it stays (``why`` says why)
    weight: float
    why: str


def weight(placement: QueuePlacement, report: ClusterReport, placed: int = 0, limits: Limits = DEFAULT_LIMITS) -> float:
    """The estimated share of ``report``'s cluster load that ``placement``'s queue carries."""
    u, stores = report.utilisation, max(1, report.health.stores)
    parts = len(placement.partitions)
    share = parts / max(parts, u.partitions + placed)
    traffic = (u.in_bytes_per_s + u.out_bytes_per_s) / (stores * limits.store_bytes_per_s)
    return share * (u.disk_fraction_used + traffic) + parts / (stores * limits.store_partitions)


def _loads(
    reports: Mapping[str, ClusterReport], table: Iterable[QueuePlacement], limits: Limits
) -> tuple[dict[str, float], dict[str, int]]:
    placed = partitions_placed(table, reports)
    return {n: load(r, placed.get(n, 0), limits) for n, r in reports.items()}, placed


def _takers(
    reports: Mapping[str, ClusterReport],
    placed: Mapping[str, int],
    now_ms: int,
    draining: Collection[str],
    limits: Limits,
) -> list[str]:
    return sorted(
        n for n, r in reports.items() if n not in draining and not problems(r, now_ms, 1, placed.get(n, 0), limits)
    )


def _movable(placement: QueuePlacement, moving: Collection[str]) -> str | None:
    if placement.queue in moving:
        return "a move of it is under way"
    return unmovable(placement)


def rebalance(
    reports: Mapping[str, ClusterReport],
    table: Mapping[str, QueuePlacement],
    now_ms: int,
    *,
    moving: Collection[str] = (),
    draining: Collection[str] = (),
    limits: Limits = DEFAULT_LIMITS,
) -> list[Proposal]:
    """Moves that even out the clusters' loads (see module doc), best first."""
    loads, placed = _loads(reports, table.values(), limits)
    takers = _takers(reports, placed, now_ms, draining, limits)
    candidates = {q: p for q, p in table.items() if _movable(p, moving) is None and p.clusters[0] in reports}
    out: list[Proposal] = []
    while len(out) < MAX_MOVES and candidates and takers:
        holders = sorted({p.clusters[0] for p in candidates.values()}, key=lambda n: (-loads[n], n))
        src = holders[0]
        dst = min((n for n in takers if n != src), key=lambda n: (loads[n], n), default=None)
        if dst is None:
            break
        gap = loads[src] - loads[dst]
        if gap <= GAP:
            break
        weighed = sorted(
            (abs(gap - 2 * w), q, w)
            for q, p in candidates.items()
            if p.clusters[0] == src and (w := weight(p, reports[src], placed.get(src, 0), limits)) > 0
        )
        if not weighed or weighed[0][0] >= gap:
            break  # no queue narrows the gap
        _, q, w = weighed[0]
        loads[src] -= w
        loads[dst] += w
        del candidates[q]
        out.append(
            Proposal(
                q,
                src,
                dst,
                round(w, 4),
                f"load {src} {loads[src] + w:.2f} -> {loads[src]:.2f}, {dst} {loads[dst] - w:.2f} -> {loads[dst]:.2f}",
            )
        )
    return out


def drain(
    cluster: str,
    reports: Mapping[str, ClusterReport],
    table: Mapping[str, QueuePlacement],
    now_ms: int,
    *,
    moving: Collection[str] = (),
    draining: Collection[str] = (),
    limits: Limits = DEFAULT_LIMITS,
) -> list[Proposal]:
    """Where each queue on ``cluster`` goes (destination None: it stays, ``why`` says why)."""
    loads, placed = _loads(reports, table.values(), limits)
    takers = [n for n in _takers(reports, placed, now_ms, {*draining, cluster}, limits)]
    out = []
    report = reports.get(cluster)
    for q, p in sorted(table.items()):
        if cluster not in p.clusters:
            continue
        why = _movable(p, moving)
        w = weight(p, report, placed.get(cluster, 0), limits) if report is not None else 0.0
        if why is None and not takers:
            why = "no other cluster may take queues"
        if why is not None:
            out.append(Proposal(q, cluster, None, round(w, 4), why))
            continue
        dst = min(takers, key=lambda n: (loads[n], n))
        loads[dst] += w
        out.append(Proposal(q, cluster, dst, round(w, 4), f"drain {cluster}"))
    return out
