"""What `fabric cluster status` shows: read straight from etcd (no node needs to answer), or by a
node from its own etcd client for a CLUSTER_STATUS request; a single node's one-node answer has
the same shape."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fabric.cluster.etcd import EtcdClient
from fabric.cluster.keys import (
    CONTROLLER_KEY,
    LOAD_PREFIX,
    NODES_PREFIX,
    PARTITIONS_PREFIX,
    ROUTERS_PREFIX,
    parse_move_key,
    parse_node,
    parse_partition_key,
)
from fabric.cluster.meta import MetaStore
from fabric.cluster.moves import Move, phase
from fabric.cluster.namespace import Namespaced
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.removal import Disk, plan_drains


def read_status(
    etcd: Sequence[str], name: str = "default", expected_nodes: Sequence[str] = (), expected_routers: Sequence[str] = ()
) -> dict[str, Any]:
    """Nodes (registered ones are live; configured ones that are not, dead), the controller and
    its epoch, and every partition with its leader, epochs, ISR and replicas."""
    meta = Namespaced(EtcdClient(list(etcd)), name)
    try:
        return status_from(meta, name, expected_nodes, expected_routers)
    finally:
        meta.close()


def status_from(
    meta: MetaStore, name: str, expected_nodes: Sequence[str] = (), expected_routers: Sequence[str] = ()
) -> dict[str, Any]:
    """``read_status`` through an open (namespaced) metadata client: a node's own, for CLUSTER_STATUS."""
    ctl = meta.get(CONTROLLER_KEY)
    kvs, revision = meta.get_prefix("/fabric/")
    nodes: dict[str, dict[str, Any]] = {}
    for kv in kvs:
        if kv.key.startswith(NODES_PREFIX):
            info = parse_node(kv)
            if info is not None:
                nodes[info.name] = {"name": info.name, "live": True, "endpoint": info.endpoint, "epoch": info.epoch}
    routers: dict[str, dict[str, Any]] = {}
    for kv in kvs:
        if kv.key.startswith(ROUTERS_PREFIX):
            try:
                endpoint = str(json.loads(kv.value)["endpoint"])
            except (ValueError, KeyError, TypeError):
                continue
            rname = kv.key[len(ROUTERS_PREFIX) :]
            routers[rname] = {"name": rname, "live": True, "endpoint": endpoint}
    for r in expected_routers:
        routers.setdefault(r, {"name": r, "live": False, "endpoint": None})
    for node in expected_nodes:
        nodes.setdefault(node, {"name": node, "live": False, "endpoint": None, "epoch": None})
    partitions = []
    for kv in kvs:
        if kv.key.startswith(PARTITIONS_PREFIX):
            where = parse_partition_key(kv.key)
            if where is None:
                continue
            rec = PartitionRecord.from_json(kv.value)
            partitions.append(
                {
                    "queue": where[0],
                    "partition": where[1],
                    "leader": rec.leader if rec.leader in nodes and nodes[rec.leader]["live"] else None,
                    "leader_epoch": rec.leader_epoch,
                    "partition_epoch": rec.partition_epoch,
                    "isr": list(rec.isr),
                    "replicas": list(rec.replicas),
                    "under_replicated": len(rec.isr) < len(rec.replicas),
                }
            )
    partitions.sort(key=lambda p: (p["queue"], p["partition"]))
    records = {
        w: PartitionRecord.from_json(kv.value)
        for kv in kvs
        if kv.key.startswith(PARTITIONS_PREFIX) and (w := parse_partition_key(kv.key)) is not None
    }
    moves = []
    for kv in kvs:
        where = parse_move_key(kv.key)
        if where is None:
            continue
        try:
            m = Move.from_json(where[0], where[1], kv.value)
        except (ValueError, KeyError, TypeError):
            continue
        found = records.get(where)
        moves.append(
            {
                "queue": where[0],
                "partition": where[1],
                "original": list(m.original),
                "target": list(m.target),
                "phase": phase(m, found) if found is not None else "orphaned",
                "created_ms": m.created_ms,
            }
        )
    _mark_removable(meta, nodes, records, {w for kv in kvs if (w := parse_move_key(kv.key)) is not None})
    controller = None
    if ctl is not None:
        controller = {**json.loads(ctl.value), "epoch": ctl.create_revision}
    return {
        "cluster": name,
        "revision": revision,
        "controller": controller,
        "nodes": sorted(nodes.values(), key=lambda n: n["name"]),
        "routers": sorted(routers.values(), key=lambda r: r["name"]),
        "partitions": partitions,
        "moves": moves,
    }


def _mark_removable(
    meta: MetaStore,
    nodes: dict[str, dict[str, Any]],
    records: dict[tuple[str, int], PartitionRecord],
    busy: set[tuple[str, int]],
) -> None:
    """Each live node's ``removable`` (its replicas could move to the other live nodes within
    headroom: fabric.cluster.removal) and ``removal`` (how many replicas, or why not). Partition
    sizes are not in etcd: the disk check here counts replicas only; `fabric cluster shrink`
    asks the leaders for sizes."""
    disks = {}
    for kv in meta.get_prefix(LOAD_PREFIX)[0]:
        disk = Disk.from_load(kv.value)
        if disk is not None:
            disks[kv.key[len(LOAD_PREFIX) :]] = disk
    live = [n for n, info in nodes.items() if info["live"]]
    for d in plan_drains(records, live, disks=disks, busy=busy):
        nodes[d.store]["removable"] = d.removable
        nodes[d.store]["removal"] = d.problem or f"{d.replicas} replica(s) could move to the others"
    for info in nodes.values():
        info.setdefault("removable", False)
        info.setdefault("removal", "not live")


def single_node_status(node: str, endpoint: str, queues: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """The embedded single node's answer in the same shape: no cluster name (null), the node its
    own controller (epoch 0), every partition led by it alone. ``queues``: (name, partitions)."""
    partitions = [
        {
            "queue": q,
            "partition": p,
            "leader": node,
            "leader_epoch": 0,
            "partition_epoch": 0,
            "isr": [node],
            "replicas": [node],
            "under_replicated": False,
        }
        for q, n in sorted(queues)
        for p in range(n)
    ]
    return {
        "cluster": None,
        "revision": None,
        "controller": {"name": node, "endpoint": endpoint, "epoch": 0},
        "nodes": [
            {
                "name": node,
                "live": True,
                "endpoint": endpoint,
                "epoch": 0,
                "removable": False,
                "removal": "the only store",
            }
        ],
        "routers": [],
        "partitions": partitions,
        "moves": [],
    }
