"""What `fabric federation status` shows, read straight from the directory in etcd, and asking
the federation manager for a queue (`fabric queue create Q --clusters N`)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from fabric.cluster.etcd import EtcdClient
from fabric.cluster.keys import QUEUES_PREFIX as CLUSTER_QUEUES_PREFIX
from fabric.cluster.meta import Compare, Delete, MetaStore, Put
from fabric.cluster.namespace import cluster_prefix
from fabric.errors import BadParameter, MetaUnavailable, NotEnoughReplicas, QueueExists, Timeout, UnknownQueue
from fabric.federation.directory import (
    MANAGER_KEY,
    QueueDeletion,
    QueuePlacement,
    QueueRequest,
    deletion_key,
    queue_key,
    request_key,
)
from fabric.federation.manager import read_draining, read_reports, read_table
from fabric.federation.move_local import read_moves
from fabric.federation.planner import DEFAULT_LIMITS, Limits, partitions_placed, problems, utilisation
from fabric.settings import QueueSettings


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
    draining = read_draining(meta)
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
                "accepts_queues": not why and name not in draining,
                "draining": name in draining,
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
    moves = [
        {"queue": m.queue, "source": m.source, "destination": m.destination, "phase": m.phase, "error": m.error}
        for _, m in read_moves(meta)
    ]
    return {"manager": manager, "clusters": clusters, "queues": queues, "moves": moves}


def request_queue(
    etcd: Sequence[str], queue: str, settings: dict[str, Any], clusters: int, timeout_s: float
) -> dict[str, Any]:
    """``fabric queue create QUEUE --clusters N``: ask the federation manager for a queue (a
    request under ``/federation/requests/``) and wait until it is placed and every cluster it was
    placed on holds its share; the placement as a JSON-ready dict. Raises QueueExists,
    BadParameter or NotEnoughReplicas (the manager's answer), Timeout (nothing placed in time:
    the request is withdrawn; or placed, but not yet created everywhere), MetaUnavailable."""
    qs = QueueSettings.from_dict(settings, where=f"queue {queue!r} settings")  # BadParameter: said before asking
    req = QueueRequest(queue, qs.partitions, clusters, qs.replication_factor or 1, dict(settings))
    rkey, qkey = request_key(queue), queue_key(queue)
    meta = EtcdClient(list(etcd))
    try:
        if not meta.txn([Compare.absent(rkey), Compare.absent(qkey)], [Put(rkey, req.to_json())]).succeeded:
            raise QueueExists(f"queue {queue!r} is in the federation directory (or asked for already)")
        deadline = time.monotonic() + timeout_s
        placement: QueuePlacement | None = None
        while time.monotonic() < deadline:
            kv = meta.get(rkey)
            if kv is not None:
                answer = QueueRequest.from_json(kv.value)
                if answer.error is not None:
                    meta.txn([Compare.modified_at(rkey, kv.mod_revision)], [Delete(rkey)])
                    error = NotEnoughReplicas if answer.error.startswith(NotEnoughReplicas.name) else BadParameter
                    raise error(answer.error)
            else:
                pkv = meta.get(qkey)
                placement = QueuePlacement.from_json(pkv.value) if pkv is not None else None
                if placement is not None and all(
                    meta.get(f"{cluster_prefix(c)}{CLUSTER_QUEUES_PREFIX}{queue}") is not None
                    for c in placement.clusters
                ):
                    return {
                        "name": queue,
                        "partitions": len(placement.partitions),
                        "clusters": list(placement.clusters),
                        "placement": list(placement.partitions),
                        "settings": placement.settings,
                    }
            time.sleep(0.1)
        if placement is not None:
            raise Timeout(f"queue {queue!r} is placed on {','.join(placement.clusters)} but not created everywhere yet")
        kv = meta.get(rkey)
        if kv is not None:  # never taken: withdrawn, so that it is not placed after we gave up
            meta.txn([Compare.modified_at(rkey, kv.mod_revision)], [Delete(rkey)])
        who = "no federation manager is elected" if meta.get(MANAGER_KEY) is None else "the manager did not answer"
        raise Timeout(f"queue {queue!r} not placed in {timeout_s:g} s: {who}")
    finally:
        meta.close()


def delete_queue(etcd: Sequence[str], queue: str, timeout_s: float) -> dict[str, Any]:
    """``fabric queue delete QUEUE --etcd``: ask for a federation queue to be deleted (a request
    under ``/federation/deletions/``) and wait until the manager has dropped it from the table and
    every cluster that held a share has deleted it; then the request is removed. Raises
    UnknownQueue (not in the table), Timeout (the manager did not take it: the request is
    withdrawn; or a cluster has not deleted its share yet: the request stays, and it does so
    within its ``federation_report_ms``), MetaUnavailable."""
    qkey, dkey = queue_key(queue), deletion_key(queue)
    meta = EtcdClient(list(etcd))
    try:
        pkv = meta.get(qkey)
        if pkv is None:
            raise UnknownQueue(f"queue {queue!r} is not in the federation directory")
        clusters = QueuePlacement.from_json(pkv.value).clusters
        asked = QueueDeletion(queue, clusters).to_json()
        written = meta.txn([Compare.modified_at(qkey, pkv.mod_revision), Compare.absent(dkey)], [Put(dkey, asked)])
        if not written.succeeded and meta.get(dkey) is None:  # else: asked already (another asker)
            raise MetaUnavailable(f"queue {queue!r} changed in the directory meanwhile; ask again")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            holding = [
                c for c in clusters if meta.get(f"{cluster_prefix(c)}{CLUSTER_QUEUES_PREFIX}{queue}") is not None
            ]
            if meta.get(qkey) is None and not holding:
                meta.delete(dkey)
                return {"queue": queue, "deleted": True, "clusters": list(clusters)}
            time.sleep(0.1)
        if meta.get(qkey) is not None:
            meta.delete(dkey)  # never taken: withdrawn, so that it is not done after we gave up
            who = "no federation manager is elected" if meta.get(MANAGER_KEY) is None else "the manager did not answer"
            raise Timeout(f"queue {queue!r} not deleted in {timeout_s:g} s: {who}")
        raise Timeout(
            f"queue {queue!r} is out of the federation directory; {', '.join(holding)} still hold their share "
            "(each cluster's controller deletes it within its federation_report_ms)"
        )
    finally:
        meta.close()
