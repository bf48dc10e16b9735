"""The federation manager: one elected process that places queues on clusters.

Theory of operation
-------------------
Election, the cluster controller's (``fabric.cluster.election``): every candidate's
``step`` tries, at most every ``retry_ms``, to create ``/federation/manager`` under a fresh lease
with a txn guarded by ``Compare.absent``. The winner's epoch is that key's create_revision; it
keeps the lease alive every ttl/3. A candidate whose keepalive finds the lease gone, or whose
write finds the key not its own, steps down at once and campaigns again like any standby.

Fencing. Every write to the queue table (``/federation/queues/<queue>``) is one txn that checks
``Compare.created_at(MANAGER_KEY, epoch)``: a deposed manager (paused, cut off, its lease gone)
cannot write, whatever it believes.

Placing (``create_queue``). The manager reads every cluster report and the queue table, asks the
planner (``fabric.federation.planner.place``) and writes the placement in one fenced txn that
also checks the queue is absent: two managers, or one asked twice, never place a queue twice.
Requests. While manager, ``step`` also takes the queue requests under ``/federation/requests/``
(at most every ``REQUESTS_MS``): each is placed like ``create_queue`` and, in the same fenced
txn, deleted (guarded by its mod_revision: a request rewritten meanwhile is read again). A
request that cannot be placed (no room, bad parameters) gets its ``error`` written back, and the
asker reports it; one for a queue already in the table is deleted.

Time is passed in (``now_ms``); nothing here sleeps or reads a clock.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from fabric.cluster.election import Election
from fabric.cluster.meta import Compare, Delete, MetaStore, MetaUnavailable, Put, TxnResult
from fabric.errors import FabricError, NotLeader, QueueExists, UnknownQueue
from fabric.federation.directory import (
    CLUSTERS_PREFIX,
    DELETIONS_PREFIX,
    DRAINS_PREFIX,
    MANAGER_KEY,
    QUEUES_PREFIX,
    REQUESTS_PREFIX,
    ClusterReport,
    QueueDeletion,
    QueuePlacement,
    QueueRequest,
    manager_value,
    queue_key,
)
from fabric.federation.planner import DEFAULT_LIMITS, Limits, place

log = logging.getLogger(__name__)
T = TypeVar("T")
REQUESTS_MS = 250  # how often the manager looks for queue requests


def read_reports(meta: MetaStore) -> dict[str, ClusterReport]:
    """Every readable cluster report in the directory (an unreadable one is logged and left out)."""
    reports = _read_documents(meta, CLUSTERS_PREFIX, ClusterReport.from_json)
    return {r.name: r for key, r in reports if key == CLUSTERS_PREFIX + r.name}


def read_table(meta: MetaStore) -> dict[str, QueuePlacement]:
    """The queue table: queue -> placement (unreadable entries logged and left out)."""
    placements = _read_documents(meta, QUEUES_PREFIX, QueuePlacement.from_json)
    return {p.queue: p for key, p in placements if key == queue_key(p.queue)}


def read_draining(meta: MetaStore) -> set[str]:
    """The clusters being drained (``fabric federation drain``): they get no new queue."""
    return {kv.key[len(DRAINS_PREFIX) :] for kv in meta.get_prefix(DRAINS_PREFIX)[0]}


def read_deletions(meta: MetaStore) -> list[QueueDeletion]:
    """The queues asked to be deleted and not yet gone from every cluster."""
    return [
        d for key, d in _read_documents(meta, DELETIONS_PREFIX, QueueDeletion.from_json) if key.endswith("/" + d.queue)
    ]


def _read_documents(meta: MetaStore, prefix: str, parse: Callable[[bytes], T]) -> list[tuple[str, T]]:
    """(key, document) of every key under ``prefix`` that ``parse`` reads; the others are logged."""
    out = []
    for kv in meta.get_prefix(prefix)[0]:
        try:
            out.append((kv.key, parse(kv.value)))
        except (ValueError, TypeError) as e:
            log.warning("cannot read %s: %s", kv.key, e)
    return out


class Manager:
    """One manager candidate. Call ``step(now_ms)`` periodically (every few hundred ms)."""

    def __init__(
        self,
        meta: MetaStore,
        name: str,
        endpoint: str,
        *,
        lease_ttl_s: int = 10,
        retry_ms: int | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self._meta = meta  # un-namespaced: the directory's keys are /federation/...
        self.name = name
        self.endpoint = endpoint
        self.limits = limits
        self._election = Election(
            meta,
            MANAGER_KEY,
            manager_value(name, endpoint),
            role="manager",
            name=name,
            log=log,
            lease_ttl_s=lease_ttl_s,
            retry_ms=retry_ms,
        )
        self._requests_due = 0

    @property
    def is_manager(self) -> bool:
        return self._election.epoch > 0

    @property
    def epoch(self) -> int:
        """The manager epoch (create_revision of ``/federation/manager``); 0 when standby."""
        return self._election.epoch

    def step(self, now_ms: int) -> None:
        """Keep the lease, campaign if standby. Never raises MetaUnavailable: it tries again."""
        try:
            self._election.step(now_ms)
            if self.epoch and now_ms >= self._requests_due:
                self._requests_due = now_ms + REQUESTS_MS
                self._serve_requests(now_ms)
                self._serve_deletions()
        except NotLeader:
            pass  # fenced while serving a request: stepped down already
        except MetaUnavailable as e:
            log.debug("manager candidate %s: metadata unavailable: %s", self.name, e)

    def resign(self) -> None:
        """Give the post up now (a clean stop): the next candidate need not wait out the lease."""
        if self._election.lease:
            try:
                self._meta.lease_revoke(self._election.lease)
            except MetaUnavailable:
                pass
        self._election.step_down("resigned")

    def create_queue(
        self,
        queue: str,
        partitions: int,
        now_ms: int,
        *,
        clusters: int = 1,
        rf: int = 1,
        settings: dict[str, Any] | None = None,
        also: tuple[list[Compare], list[Put | Delete]] | None = None,
    ) -> QueuePlacement:
        """Place ``queue`` and write its placement (see module doc); ``also``: more compares and
        operations for the same txn. Raises NotLeader (not the manager), QueueExists,
        BadParameter, NoRoom, MetaUnavailable (outcome unknown: retrying may answer QueueExists;
        also when a compare of ``also`` failed)."""
        self._require_manager()
        if self._meta.get(queue_key(queue)) is not None:
            raise QueueExists(f"queue {queue!r} is in the federation directory")
        draining = read_draining(self._meta)
        reports = {n: r for n, r in read_reports(self._meta).items() if n not in draining}
        table = read_table(self._meta).values()
        placement = place(queue, partitions, reports, table, now_ms, clusters=clusters, rf=rf, limits=self.limits)
        placement = dataclasses.replace(placement, settings=dict(settings or {}))
        key = queue_key(queue)
        more_compares, more_ops = also or ([], [])
        result = self._fenced_txn([Compare.absent(key), *more_compares], [Put(key, placement.to_json()), *more_ops])
        if not result.succeeded:
            if self._meta.get(key) is not None:
                raise QueueExists(f"queue {queue!r} is in the federation directory")
            raise MetaUnavailable(f"queue {queue!r}: its request changed meanwhile; read again")
        log.info("manager %s: queue %s on %s", self.name, queue, ",".join(placement.clusters))
        return placement

    def delete_queue(self, queue: str) -> None:
        """Drop ``queue`` from the table. Raises NotLeader, UnknownQueue, MetaUnavailable."""
        self._require_manager()
        result = self._fenced_txn([Compare(queue_key(queue), "create_revision", ">", 0)], [Delete(queue_key(queue))])
        if not result.succeeded:
            raise UnknownQueue(f"queue {queue!r} is not in the federation directory")

    # --- internals ----------------------------------------------------------------------------

    def _serve_requests(self, now_ms: int) -> None:
        for kv in self._meta.get_prefix(REQUESTS_PREFIX)[0]:
            try:
                req = QueueRequest.from_json(kv.value)
            except (ValueError, TypeError) as e:
                log.warning("manager %s: dropping unreadable %s: %s", self.name, kv.key, e)
                self._fenced_txn([Compare.modified_at(kv.key, kv.mod_revision)], [Delete(kv.key)])
                continue
            if req.error is not None or kv.key != REQUESTS_PREFIX + req.queue:
                continue  # answered: the asker reads the error and deletes the request
            taken: tuple[list[Compare], list[Put | Delete]] = (
                [Compare.modified_at(kv.key, kv.mod_revision)],
                [Delete(kv.key)],
            )
            try:
                self.create_queue(
                    req.queue,
                    req.partitions,
                    now_ms,
                    clusters=req.clusters,
                    rf=req.rf,
                    settings=req.settings,
                    also=taken,
                )
            except QueueExists:
                self._fenced_txn(*taken)
            except (NotLeader, MetaUnavailable):
                raise
            except FabricError as e:  # NoRoom, BadParameter: the asker is told
                failed = dataclasses.replace(req, error=f"{e.name}: {e.message}")
                self._fenced_txn(taken[0], [Put(kv.key, failed.to_json())])

    def _serve_deletions(self) -> None:
        """Drop from the table each queue asked to be deleted (the asker removes the request once
        every cluster has deleted its share: ``read_deletions``)."""
        deletions = read_deletions(self._meta)
        if not deletions:
            return
        table = read_table(self._meta)
        for deletion in deletions:
            if deletion.queue in table:
                try:
                    self.delete_queue(deletion.queue)
                except UnknownQueue:
                    pass
                log.info("manager %s: queue %s deleted from the table", self.name, deletion.queue)

    def _require_manager(self) -> None:
        if not self.epoch:
            raise NotLeader(f"{self.name} is not the federation manager")

    def _fenced_txn(self, compares: list[Compare], ops: list[Put | Delete]) -> TxnResult:
        """A write guarded by our epoch; steps down (and raises NotLeader) if it is not ours."""
        result = self._election.fenced_txn(compares, ops)
        if not result.succeeded:
            self._require_manager()
        return result
