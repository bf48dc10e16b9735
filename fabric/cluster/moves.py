"""Replica moves: the rebalance and drain plans, and the controller's step of a move in progress.
Pure: no etcd, no sockets, no clocks.

Theory of operation
-------------------
Placement is proposed by rendezvous hashing (:mod:`fabric.cluster.placement`) and then *stored*:
a node that dies changes leaders, never placement. Placement changes only through a **move**,
one etcd key per partition being moved, ``/fabric/moves/<queue>/<partition>`` (``keys.move_key``)::

    {"target": [nodes], "original": [nodes], "cancel": false, "created_ms": ...}

written by ``fabric cluster rebalance`` / ``drain`` / ``add-node`` (only if no move of that
partition is under way), and carried out by the controller, one step per reconcile, each step
one fenced txn on the partition record (so a controller failover resumes where it stood):

1. **Grow**: ``replicas`` becomes the current replicas followed by the target nodes not yet in
   it. The new replicas start fetching from the leader (the leader throttles what it sends to
   replicas outside the ISR: ``[cluster] move_throttle_bytes_per_s``).
2. **Wait** until every target node is in the ISR (the leader admits a replica that caught up,
   as it does any follower).
3. **Shrink**: ``replicas`` becomes the target (its order: the preferred leader first), the ISR
   its members in the target; a leader that is not in the target hands over to the first target
   member in the ISR (``leader_epoch`` bumped). The move key is deleted in the same txn.

Cancelling (``cancel: true``) before step 3 puts ``replicas`` back to ``original`` the same way
(what a grown replica copied is dropped). A move whose target names a node that is not live
waits; ``fabric cluster status`` shows every move and its phase.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from fabric.cluster.partition import PartitionRecord
from fabric.cluster.placement import rank, replicas_for


@dataclass(frozen=True)
class Move:
    """One partition's move: from ``original`` to ``target`` replica lists."""

    queue: str
    partition: int
    original: tuple[str, ...]
    target: tuple[str, ...]
    cancel: bool = False
    created_ms: int = 0

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "target": list(self.target),
                "original": list(self.original),
                "cancel": self.cancel,
                "created_ms": self.created_ms,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, queue: str, partition: int, raw: bytes) -> Move:
        d = json.loads(raw)
        target, original = tuple(d["target"]), tuple(d["original"])
        if not target or not original or not all(isinstance(n, str) and n for n in (*target, *original)):
            raise ValueError("a move names nodes in 'target' and 'original'")
        if len(set(target)) != len(target):
            raise ValueError("a move's target repeats a node")
        return cls(queue, partition, original, target, bool(d.get("cancel", False)), int(d.get("created_ms", 0)))

    @property
    def adds(self) -> tuple[str, ...]:
        return tuple(n for n in self.target if n not in self.original)

    @property
    def drops(self) -> tuple[str, ...]:
        return tuple(n for n in self.original if n not in self.target)


def phase(move: Move, record: PartitionRecord) -> str:
    """Where a move stands against the partition's record: growing, catching-up, finishing,
    cancelling."""
    if move.cancel:
        return "cancelling"
    if not set(move.target) <= set(record.replicas):
        return "growing"
    if not set(move.target) <= set(record.isr):
        return "catching-up"
    return "finishing"


def step_move(move: Move, record: PartitionRecord, live: Set[str]) -> tuple[PartitionRecord | None, bool]:
    """The controller's next write for a move: ``(new record or None, done)``. ``done`` True:
    delete the move key (with the record write, when there is one)."""
    final = move.original if move.cancel else move.target
    if not move.cancel and not set(move.target) <= set(record.replicas):
        if not all(n in live for n in move.adds):
            return None, False  # a node to copy to is not live: wait
        grown = tuple(record.replicas) + tuple(n for n in move.target if n not in record.replicas)
        return dataclasses.replace(record, replicas=grown, partition_epoch=record.partition_epoch + 1), False
    if not move.cancel and not set(move.target) <= set(record.isr):
        return None, False  # the new replicas are catching up
    return shrink(record, final, live), True


def shrink(record: PartitionRecord, final: Sequence[str], live: Set[str]) -> PartitionRecord | None:
    """``record`` with ``replicas`` = ``final``: the ISR cut to its members, the leader handed to
    the first of ``final`` in the ISR (and live) when it is not one of them. None when the record
    is that already. A partition whose ISR holds none of ``final`` keeps its leader (the move
    waits: ``final`` must contain an in-sync replica first)."""
    final = tuple(final)
    isr = tuple(n for n in record.isr if n in final)
    leader = record.leader
    epoch = record.leader_epoch
    if leader not in final:
        candidates = [n for n in final if n in isr and n in live]
        if not candidates:
            return None
        leader, epoch = candidates[0], epoch + 1
    if not isr:
        return None
    new = PartitionRecord(final, leader, epoch, isr, record.partition_epoch + 1)
    if (new.replicas, new.leader, new.isr) == (record.replicas, record.leader, record.isr):
        return None
    return new


def rebalance_plan(
    partitions: Mapping[tuple[str, int], PartitionRecord],
    live: Sequence[str],
    zones: Mapping[str, str | None] | None = None,
    *,
    exclude: Set[str] = frozenset(),
) -> list[Move]:
    """Moves that bring every partition to its rendezvous placement over the ``live`` nodes
    (minus ``exclude``), keeping each partition's replication factor. A partition whose replica
    set already matches is left alone (its order too: no needless leader change)."""
    nodes = sorted(n for n in set(live) if n not in exclude)
    moves = []
    for (queue, p), rec in sorted(partitions.items()):
        rf = len(rec.replicas)
        if rf > len(nodes):
            continue
        target = replicas_for(queue, p, nodes, rf, zones)
        if set(target) == set(rec.replicas):
            continue
        moves.append(Move(queue, p, tuple(rec.replicas), keep_leader_first(target, rec)))
    return moves


def drain_plan(partitions: Mapping[tuple[str, int], PartitionRecord], node: str, live: Sequence[str]) -> list[Move]:
    """Moves that take every replica off ``node``, each to the best-ranked live node the
    partition is not on yet (only the partitions on ``node`` move)."""
    moves = []
    others = sorted(n for n in set(live) if n != node)
    for (queue, p), rec in sorted(partitions.items()):
        if node not in rec.replicas:
            continue
        spare = [n for n in rank(queue, p, others) if n not in rec.replicas]
        if not spare:
            continue  # nowhere to go: as many replicas as nodes
        target = tuple(spare[0] if n == node else n for n in rec.replicas)
        moves.append(Move(queue, p, tuple(rec.replicas), keep_leader_first(target, rec)))
    return moves


def keep_leader_first(target: Sequence[str], rec: PartitionRecord) -> tuple[str, ...]:
    """The current leader stays the preferred leader when it stays a replica."""
    leader = rec.leader
    if leader is not None and leader in target:
        return (leader, *(n for n in target if n != leader))
    return tuple(target)
