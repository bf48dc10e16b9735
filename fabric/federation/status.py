"""What `fabric federation status` shows, read straight from the directory in etcd."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from fabric.cluster.etcd import EtcdClient
from fabric.cluster.meta import MetaStore
from fabric.federation.directory import MANAGER_KEY
from fabric.federation.manager import read_reports, read_table
from fabric.federation.planner import DEFAULT_LIMITS, Limits, partitions_placed, problems, utilisation


def read_federation(etcd: Sequence[str], now_ms: int, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The directory as one JSON-ready document (see ``federation_from``)."""
    meta = EtcdClient(list(etcd))
    try:
        return federation_from(meta, now_ms, limits)
    finally:
        meta.close()


def federation_from(meta: MetaStore, now_ms: int, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Clusters (report, age, utilisation 0..1, whether the planner would give them a new queue
    and why not, their queues), the manager and its epoch, and the queue table."""
    manager_kv = meta.get(MANAGER_KEY)
    reports = read_reports(meta)
    table = read_table(meta)
    placed = partitions_placed(table.values(), reports)
    clusters = []
    for name in sorted(reports):
        r = reports[name]
        why = problems(r, now_ms, 1, placed.get(name, 0), limits)
        clusters.append(
            {
                "name": name,
                "routers": list(r.routers),
                "health": asdict(r.health),
                "utilisation": {
                    **asdict(r.utilisation),
                    "fraction": round(utilisation(r, placed.get(name, 0), limits), 4),
                },
                "published_ms": r.published_ms,
                "age_ms": now_ms - r.published_ms,
                "accepts_queues": not why,
                "problems": why,
                "queues": sorted(q for q, p in table.items() if name in p.clusters),
            }
        )
    manager = None
    if manager_kv is not None:
        manager = {**json.loads(manager_kv.value), "epoch": manager_kv.create_revision}
    queues = [
        {"queue": q, "clusters": list(p.clusters), "partitions": list(p.partitions), "created_ms": p.created_ms}
        for q, p in sorted(table.items())
    ]
    return {"manager": manager, "clusters": clusters, "queues": queues}
