"""Replica placement: rendezvous (highest random weight) hashing, zone-aware.

Theory of operation
-------------------
For partition ``p`` of ``queue`` every node gets a score, the first 8 bytes of
``blake2b(f"{queue}/{p}/{node}")`` (stable across processes and Python versions; never
``hash()``). Nodes are ranked by score (ties by name). The replica list is built in two passes
over that ranking: first the best node of each zone not used yet, until every zone holds a
replica or the list is full, then the remaining nodes in rank order. The first replica is the
highest-ranked node of all and is the partition's preferred leader, so leaders spread as evenly
as the hash does.

Adding a node only changes the partitions in which the new node ranks high enough to be chosen,
and removing one only those that used it: about ``rf / N`` of the replica slots move, which is
what the property test in tests/cluster/test_placement.py checks. A node without a zone (or no
``zones`` at all) counts as a zone of its own, which makes the first pass plain rendezvous.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from fabric.errors import BadParameter, NotEnoughReplicas


def score(queue: str, partition: int, node: str) -> int:
    """The node's weight for this partition: a stable 64-bit hash."""
    digest = hashlib.blake2b(f"{queue}/{partition}/{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank(queue: str, partition: int, nodes: Sequence[str]) -> list[str]:
    """Every node, best first."""
    return sorted(nodes, key=lambda n: (-score(queue, partition, n), n))


def replicas_for(
    queue: str, partition: int, nodes: Sequence[str], rf: int, zones: Mapping[str, str | None] | None = None
) -> tuple[str, ...]:
    """The replica list of one partition (first = preferred leader)."""
    ranked = rank(queue, partition, nodes)
    chosen: list[str] = []
    used_zones: set[str] = set()
    for node in ranked:  # pass 1: one replica per zone, best node of each
        if len(chosen) == rf:
            break
        zone = zones.get(node) if zones else None
        if zone is None:
            chosen.append(node)  # no zone: a zone of its own
        elif zone not in used_zones:
            used_zones.add(zone)
            chosen.append(node)
    for node in ranked:  # pass 2: fill by rank
        if len(chosen) == rf:
            break
        if node not in chosen:
            chosen.append(node)
    return tuple(chosen)


def place(
    queue: str,
    partitions: int,
    nodes: Sequence[str],
    rf: int,
    zones: Mapping[str, str | None] | None = None,
) -> list[tuple[str, ...]]:
    """One replica list per partition, ``rf`` distinct nodes each, independent of the order of
    ``nodes``. Raises BadParameter for rf < 1 or partitions < 1, NotEnoughReplicas when there are
    fewer than ``rf`` distinct nodes."""
    if rf < 1:
        raise BadParameter(f"replication_factor must be >= 1, got {rf}")
    if partitions < 1:
        raise BadParameter(f"partitions must be >= 1, got {partitions}")
    unique = sorted(set(nodes))
    if len(unique) < rf:
        raise NotEnoughReplicas(f"replication_factor {rf} needs {rf} live nodes, the cluster has {len(unique)}")
    return [replicas_for(queue, p, unique, rf, zones) for p in range(partitions)]
