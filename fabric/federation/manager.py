"""The federation manager: one elected process that places queues on clusters.

Theory of operation
-------------------
Election, as the cluster controller's (``fabric.cluster.controller``): every candidate's
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
Time is passed in (``now_ms``); nothing here sleeps or reads a clock.
"""

from __future__ import annotations

import logging

from fabric.cluster.meta import Compare, Delete, Get, MetaStore, MetaUnavailable, Put, TxnResult
from fabric.errors import NotLeader, QueueExists, UnknownQueue
from fabric.federation.directory import (
    CLUSTERS_PREFIX,
    MANAGER_KEY,
    QUEUES_PREFIX,
    ClusterReport,
    QueuePlacement,
    manager_value,
    queue_key,
)
from fabric.federation.planner import DEFAULT_LIMITS, Limits, place

log = logging.getLogger(__name__)


def read_reports(meta: MetaStore) -> dict[str, ClusterReport]:
    """Every readable cluster report in the directory (an unreadable one is logged and left out)."""
    out = {}
    for kv in meta.get_prefix(CLUSTERS_PREFIX)[0]:
        try:
            report = ClusterReport.from_json(kv.value)
        except (ValueError, TypeError) as e:
            log.warning("cannot read %s: %s", kv.key, e)
            continue
        if kv.key == CLUSTERS_PREFIX + report.name:
            out[report.name] = report
    return out


def read_table(meta: MetaStore) -> dict[str, QueuePlacement]:
    """The queue table: queue -> placement (unreadable entries logged and left out)."""
    out = {}
    for kv in meta.get_prefix(QUEUES_PREFIX)[0]:
        try:
            placement = QueuePlacement.from_json(kv.value)
        except (ValueError, TypeError) as e:
            log.warning("cannot read %s: %s", kv.key, e)
            continue
        if kv.key == queue_key(placement.queue):
            out[placement.queue] = placement
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
        self._ttl_s = lease_ttl_s
        self._keepalive_ms = max(1, lease_ttl_s * 1000 // 3)
        self._retry_ms = retry_ms if retry_ms is not None else max(1, lease_ttl_s * 1000 // 4)
        self._lease = 0
        self._epoch = 0
        self._keepalive_due = 0
        self._campaign_due = 0

    @property
    def is_manager(self) -> bool:
        return self._epoch > 0

    @property
    def epoch(self) -> int:
        """The manager epoch (create_revision of ``/federation/manager``); 0 when standby."""
        return self._epoch

    def step(self, now_ms: int) -> None:
        """Keep the lease, campaign if standby. Never raises MetaUnavailable: it tries again."""
        try:
            if self._epoch and now_ms >= self._keepalive_due:
                if self._meta.lease_keepalive(self._lease) == 0:
                    self._step_down("lease lost")
                else:
                    self._keepalive_due = now_ms + self._keepalive_ms
            if not self._epoch and now_ms >= self._campaign_due:
                self._campaign_due = now_ms + self._retry_ms
                self._campaign(now_ms)
        except MetaUnavailable as e:
            log.debug("manager candidate %s: metadata unavailable: %s", self.name, e)

    def resign(self) -> None:
        """Give the post up now (a clean stop): the next candidate need not wait out the lease."""
        if self._lease:
            try:
                self._meta.lease_revoke(self._lease)
            except MetaUnavailable:
                pass
        self._step_down("resigned")

    def create_queue(
        self, queue: str, partitions: int, now_ms: int, *, clusters: int = 1, rf: int = 1
    ) -> QueuePlacement:
        """Place ``queue`` and write its placement (see module doc). Raises NotLeader (not the
        manager), QueueExists, BadParameter, NoRoom, MetaUnavailable (outcome unknown: retrying
        may answer QueueExists)."""
        self._require_manager()
        if self._meta.get(queue_key(queue)) is not None:
            raise QueueExists(f"queue {queue!r} is in the federation directory")
        reports = read_reports(self._meta)
        table = read_table(self._meta).values()
        placement = place(queue, partitions, reports, table, now_ms, clusters=clusters, rf=rf, limits=self.limits)
        result = self._fenced_txn([Compare.absent(queue_key(queue))], [Put(queue_key(queue), placement.to_json())])
        if not result.succeeded:
            raise QueueExists(f"queue {queue!r} is in the federation directory")
        log.info("manager %s: queue %s on %s", self.name, queue, ",".join(placement.clusters))
        return placement

    def delete_queue(self, queue: str) -> None:
        """Drop ``queue`` from the table. Raises NotLeader, UnknownQueue, MetaUnavailable."""
        self._require_manager()
        result = self._fenced_txn([Compare(queue_key(queue), "create_revision", ">", 0)], [Delete(queue_key(queue))])
        if not result.succeeded:
            raise UnknownQueue(f"queue {queue!r} is not in the federation directory")

    # --- internals ----------------------------------------------------------------------------

    def _campaign(self, now_ms: int) -> None:
        current = self._meta.get(MANAGER_KEY)
        if current is not None:
            if self._lease and current.lease == self._lease:  # an earlier try won after all
                self._won(current.create_revision, now_ms)
            return
        if self._lease and self._meta.lease_keepalive(self._lease) == 0:
            self._lease = 0
        if not self._lease:
            self._lease = self._meta.lease_grant(self._ttl_s)
        result = self._meta.txn(
            [Compare.absent(MANAGER_KEY)], [Put(MANAGER_KEY, manager_value(self.name, self.endpoint), self._lease)]
        )
        if result.succeeded:
            self._won(result.revision, now_ms)
        else:
            self._meta.lease_revoke(self._lease)
            self._lease = 0

    def _won(self, epoch: int, now_ms: int) -> None:
        self._epoch = epoch
        self._keepalive_due = now_ms + self._keepalive_ms
        log.info("manager %s: elected, epoch %d", self.name, epoch)

    def _step_down(self, why: str) -> None:
        if self._epoch:
            log.info("manager %s: stepping down from epoch %d (%s)", self.name, self._epoch, why)
        self._epoch = 0
        self._lease = 0

    def _require_manager(self) -> None:
        if not self._epoch:
            raise NotLeader(f"{self.name} is not the federation manager")

    def _fenced_txn(self, compares: list[Compare], ops: list[Put | Delete]) -> TxnResult:
        """A write guarded by our epoch; steps down (and raises NotLeader) if it is not ours."""
        epoch = self._epoch
        result = self._meta.txn([Compare.created_at(MANAGER_KEY, epoch), *compares], ops, [Get(MANAGER_KEY)])
        if not result.succeeded:
            held = result.responses[0] if result.responses else []
            if not held or held[0].create_revision != epoch:
                self._step_down("fenced: the manager key is not ours")
            self._require_manager()
        return result
