"""Which store a cluster could do without (`fabric cluster status`, `fabric cluster shrink`), and
the replica moves that empty it. Pure: no etcd, no sockets, no clocks.

Theory of operation
-------------------
A live store is *removable* when every replica it holds could move to another live store
within headroom:

* **replication factor**: each of its partitions has another live store that does not hold it
  yet (a partition with as many replicas as there are other live stores cannot leave);
* **replica count**: no receiving store ends above ``replicas_max`` replicas (0: no cap);
* **disk**: a receiving store keeps at least ``headroom`` of its disk free after taking the bytes
  sent to it (disk from its ``/load/<node>`` report; a store without one is not checked; the
  bytes are each partition's size on its leader, 0 when unknown).

Each of its replicas goes, largest first, to the eligible store with the fewest replicas, then
the most free disk, then the smallest name (so the receivers stay balanced and the plan is
deterministic). `fabric cluster shrink` drains the removable store that frees the most: the most
bytes, then the most replicas. The moves are ordinary replica moves (:mod:`fabric.cluster.moves`:
copy, catch up, join the ISR, then drop the old replica), so nothing acknowledged is lost; once
they are carried out the store holds no replica and can be stopped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from fabric.cluster.moves import Move, keep_leader_first
from fabric.cluster.partition import PartitionRecord

HEADROOM = 0.2  # default: a receiving store keeps a fifth of its disk free


@dataclass(frozen=True, slots=True)
class Disk:
    """A store's file system, from its load report."""

    used_bytes: int
    free_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.used_bytes + self.free_bytes

    @classmethod
    def from_load(cls, raw: bytes) -> Disk | None:
        """The disk figures of a ``/load/<node>`` value (None if unreadable)."""
        try:
            d = json.loads(raw)
            used, free = int(d["disk_used_bytes"]), int(d["disk_free_bytes"])
        except (ValueError, KeyError, TypeError):
            return None
        return cls(used, free) if used >= 0 and free >= 0 else None


@dataclass(frozen=True, slots=True)
class Drain:
    """What emptying one store takes: its moves, or why it cannot be emptied."""

    store: str
    moves: tuple[Move, ...]
    replicas: int  # replicas it holds
    bytes: int  # what they hold (the partitions' sizes; 0 where unknown)
    problem: str | None = None  # None: removable

    @property
    def removable(self) -> bool:
        return self.problem is None


def plan_drain(
    store: str,
    partitions: Mapping[tuple[str, int], PartitionRecord],
    live: Sequence[str],
    *,
    disks: Mapping[str, Disk] | None = None,
    sizes: Mapping[tuple[str, int], int] | None = None,
    busy: Set[tuple[str, int]] = frozenset(),
    headroom: float = HEADROOM,
    replicas_max: int = 0,
) -> Drain:
    """The moves that take every replica off ``store`` within headroom, or the first reason they
    cannot. ``busy``: partitions with a move under way (they cannot be planned now)."""
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom must be 0 <= headroom < 1, not {headroom!r}")
    if replicas_max < 0:
        raise ValueError(f"replicas_max must be >= 0 (0: no cap), not {replicas_max!r}")
    disks = disks or {}
    sizes = sizes or {}
    others = sorted(set(live) - {store})
    count = {n: 0 for n in others}
    for rec in partitions.values():
        for n in rec.replicas:
            if n in count:
                count[n] += 1
    taken = {n: 0 for n in others}  # bytes each receiver takes
    mine = sorted(
        (k for k, rec in partitions.items() if store in rec.replicas), key=lambda k: (-max(0, sizes.get(k, 0)), k)
    )
    total = sum(max(0, sizes.get(k, 0)) for k in mine)
    moves: list[Move] = []

    def refuse(problem: str) -> Drain:
        return Drain(store, (), len(mine), total, problem)

    if store not in live:
        return refuse("not live")
    if mine and not others:
        return refuse("the only live store")
    for key in mine:
        queue, p = key
        rec = partitions[key]
        if key in busy:
            return refuse(f"a move of {queue}/{p} is under way")
        size = max(0, sizes.get(key, 0))
        eligible = [n for n in others if n not in rec.replicas]
        if not eligible:
            return refuse(f"{queue}/{p} has {len(rec.replicas)} replicas and there are {len(others)} other live stores")
        if replicas_max:
            eligible = [n for n in eligible if count[n] < replicas_max]
            if not eligible:
                return refuse(f"no other store has room for {queue}/{p} under {replicas_max} replicas each")
        eligible = [n for n in eligible if _fits(disks.get(n), taken[n] + size, headroom)]
        if not eligible:
            return refuse(
                f"no other store keeps {headroom:.0%} of its disk free after taking {queue}/{p} ({size} bytes)"
            )
        to = min(eligible, key=lambda n: (count[n], -_free(disks.get(n), taken[n]), n))
        count[to] += 1
        taken[to] += size
        target = tuple(to if n == store else n for n in rec.replicas)
        moves.append(Move(queue, p, tuple(rec.replicas), keep_leader_first(target, rec)))
    return Drain(store, tuple(moves), len(mine), total)


def plan_drains(
    partitions: Mapping[tuple[str, int], PartitionRecord],
    live: Sequence[str],
    *,
    disks: Mapping[str, Disk] | None = None,
    sizes: Mapping[tuple[str, int], int] | None = None,
    busy: Set[tuple[str, int]] = frozenset(),
    headroom: float = HEADROOM,
    replicas_max: int = 0,
) -> list[Drain]:
    """``plan_drain`` for every live store, by name."""
    return [
        plan_drain(
            s, partitions, live, disks=disks, sizes=sizes, busy=busy, headroom=headroom, replicas_max=replicas_max
        )
        for s in sorted(set(live))
    ]


def choose(drains: Sequence[Drain]) -> Drain | None:
    """The removable store whose removal frees the most (bytes, then replicas; then the smallest
    name), among those holding anything; None when there is none."""
    fit = [d for d in drains if d.removable and d.replicas]
    if not fit:
        return None
    return min(fit, key=lambda d: (-d.bytes, -d.replicas, d.store))


def _fits(disk: Disk | None, bytes_in: int, headroom: float) -> bool:
    if disk is None:
        return True
    return disk.free_bytes - bytes_in >= headroom * disk.total_bytes


def _free(disk: Disk | None, bytes_in: int) -> int:
    return 0 if disk is None else disk.free_bytes - bytes_in
