"""What `fabric cluster rebalance`, `drain` and `add-node` do in etcd: read the map, write moves.

The plans are :mod:`fabric.cluster.moves` (pure); the controller carries the moves out. This
module only reads ``/fabric/`` and writes ``/fabric/moves/<queue>/<partition>`` keys, each only if
no move of that partition is under way (a txn guarded by ``Compare.absent``), or marks every move
under way as cancelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from fabric.cluster.keys import (
    NODES_PREFIX,
    PARTITIONS_PREFIX,
    ROOT,
    NodeInfo,
    move_key,
    parse_move_key,
    parse_node,
    parse_partition_key,
)
from fabric.cluster.meta import Compare, KeyValue, MetaStore, Put
from fabric.cluster.moves import Move
from fabric.cluster.partition import PartitionRecord


@dataclass
class ClusterMap:
    partitions: dict[tuple[str, int], PartitionRecord]
    nodes: dict[str, NodeInfo]  # live (registered) nodes
    moves: dict[tuple[str, int], tuple[Move, KeyValue]]


def read_map(meta: MetaStore) -> ClusterMap:
    kvs, _ = meta.get_prefix(ROOT)
    partitions: dict[tuple[str, int], PartitionRecord] = {}
    nodes: dict[str, NodeInfo] = {}
    moves: dict[tuple[str, int], tuple[Move, KeyValue]] = {}
    for kv in kvs:
        if kv.key.startswith(NODES_PREFIX):
            info = parse_node(kv)
            if info is not None:
                nodes[info.name] = info
        elif kv.key.startswith(PARTITIONS_PREFIX):
            where = parse_partition_key(kv.key)
            if where is not None:
                partitions[where] = PartitionRecord.from_json(kv.value)
        else:
            mw = parse_move_key(kv.key)
            if mw is not None:
                try:
                    moves[mw] = (Move.from_json(mw[0], mw[1], kv.value), kv)
                except (ValueError, KeyError, TypeError):
                    continue
    return ClusterMap(partitions, nodes, moves)


def submit(meta: MetaStore, moves: Sequence[Move], now_ms: int) -> tuple[list[Move], list[Move]]:
    """Write each move unless one of its partition is under way: ``(written, skipped)``."""
    written, skipped = [], []
    for m in moves:
        m = replace(m, created_ms=now_ms)
        key = move_key(m.queue, m.partition)
        if meta.txn([Compare.absent(key)], [Put(key, m.to_json())]).succeeded:
            written.append(m)
        else:
            skipped.append(m)
    return written, skipped


def cancel_all(meta: MetaStore) -> list[Move]:
    """Mark every move under way cancelled (the controller puts their replicas back)."""
    cancelled = []
    for m, kv in read_map(meta).moves.values():
        if m.cancel:
            continue
        m = replace(m, cancel=True)
        if meta.txn([Compare.modified_at(kv.key, kv.mod_revision)], [Put(kv.key, m.to_json())]).succeeded:
            cancelled.append(m)
    return cancelled
