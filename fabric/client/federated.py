"""Following the federation's front door (the client side of docs/federation.md, "One front door").

Theory of operation
-------------------
A router of a federated cluster answers a request for a queue that lives on other clusters, or
is split over several, with QUEUE_ELSEWHERE: the cluster of each of the queue's partitions (the
queue's *global* partitions, as the federation numbers them) and each of those clusters' router
endpoints (:class:`Placement`). Cluster ``c`` holds its share as a queue of the same name whose
local partition ``i`` is the ``i``-th global partition placed on ``c``.

A client follows: it talks to the routers of the clusters named, and every request it sends
there names the cluster (``cluster`` in DESCRIBE_QUEUE and SUBSCRIBE), so that router serves its
share instead of redirecting again. Numbering is the client's: keys hash over *all* global
partitions (``crc32c(key) % partitions``, as for any queue), a global partition is sent as
(cluster, local index), and what comes back names the global partition again.

:class:`ProducerLinks` is a producer's side: one inner ``Producer`` per cluster it sends to
(shared by every federation queue on that cluster), made by a factory the producer hands in so
this module does not import the producer. The consumer's side is
:mod:`fabric.client.split_consumer`; the admin client's is in :mod:`fabric.client.admin`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from fabric.client.batches import Callback, RecordFuture, RecordMetadata
from fabric.errors import ConnectionFailed, FabricError, ProtocolError, QueueElsewhere
from fabric.protocol.batch import crc32c

log = logging.getLogger("fabric.producer")
QueueLimits = tuple[int, int, int, int]  # as fabric.client.catalog: partitions, max message, max batch, levels
FOLLOW_ATTEMPTS = 10  # a cluster's look-up answered QUEUE_ELSEWHERE back: asked this many times in all


class Placement:
    """Where a federation queue's partitions live, as a QUEUE_ELSEWHERE reply says."""

    __slots__ = ("_global", "_local", "clusters", "partitions", "queue", "routers")

    def __init__(self, queue: str, partitions: tuple[str, ...], routers: Mapping[str, tuple[str, ...]]) -> None:
        self.queue = queue
        self.partitions = partitions  # the cluster of each global partition
        self.routers = dict(routers)
        self.clusters = tuple(dict.fromkeys(partitions))
        counts: dict[str, int] = {}
        self._local: list[tuple[str, int]] = []  # global p -> (cluster, local index)
        self._global: dict[tuple[str, int], int] = {}
        for p, c in enumerate(partitions):
            i = counts.get(c, 0)
            counts[c] = i + 1
            self._local.append((c, i))
            self._global[(c, i)] = p

    @classmethod
    def from_details(cls, details: Mapping[str, Any]) -> Placement:
        """From a QUEUE_ELSEWHERE reply's params; ProtocolError names what is wrong."""
        queue, parts, routers = details.get("queue"), details.get("partitions"), details.get("routers")
        if not isinstance(queue, str) or not queue:
            raise ProtocolError(f"QUEUE_ELSEWHERE without a queue name: {details!r}")
        if not isinstance(parts, list) or not parts or not all(isinstance(c, str) and c for c in parts):
            raise ProtocolError(f"QUEUE_ELSEWHERE for {queue!r}: 'partitions' must be a list of cluster names")
        if not isinstance(routers, dict) or not all(
            isinstance(r, list) and all(isinstance(e, str) for e in r) for r in routers.values()
        ):
            raise ProtocolError(f"QUEUE_ELSEWHERE for {queue!r}: 'routers' must map clusters to endpoint lists")
        return cls(queue, tuple(parts), {str(c): tuple(r) for c, r in routers.items()})

    @property
    def split(self) -> bool:
        return len(self.clusters) > 1

    def local(self, partition: int) -> tuple[str, int]:
        """The cluster holding global ``partition`` and its index there."""
        return self._local[partition]

    def global_index(self, cluster: str, local: int) -> int:
        """The global partition that is ``cluster``'s partition ``local`` (itself when not known:
        a partition the cluster added since)."""
        return self._global.get((cluster, local), local)

    def partitions_on(self, cluster: str) -> list[int]:
        return [p for p, c in enumerate(self.partitions) if c == cluster]

    def endpoint(self, cluster: str) -> str:
        """The cluster's routers as one endpoint list; ConnectionFailed when it has none."""
        routers = self.routers.get(cluster, ())
        if not routers:
            raise ConnectionFailed(
                f"queue {self.queue!r}: cluster {cluster!r} holds partitions {self.partitions_on(cluster)} "
                "and has no live router (the federation directory lists none)"
            )
        return ",".join(routers)


class FederatedFuture(RecordFuture, gc=False, eq=False):
    """An inner producer's future whose result names the global partition (a ``RecordFuture``
    struct with the placement and the cluster beside the batch and index)."""

    _placement: Placement
    _cluster: str

    @classmethod
    def of(cls, future: RecordFuture, placement: Placement, cluster: str) -> FederatedFuture:
        return cls(future._batch, future._index, placement, cluster)

    def result(self, timeout: float | None = None) -> RecordMetadata:
        md = super().result(timeout)
        return md._replace(partition=self._placement.global_index(self._cluster, md.partition))


class ProducerLinks:
    """A producer's sends to federation queues that live on other clusters (or split over several):
    an inner producer per cluster, made by ``make(endpoint, cluster)``."""

    def __init__(self, make: Callable[[str, str], Any]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self.queues: dict[str, Placement] = {}  # read without the lock on the send path
        self._whole: dict[str, Any] = {}  # a queue wholly on one cluster -> that cluster's inner producer
        self._producers: dict[str, Any] = {}  # cluster -> its inner Producer
        self._turn = itertools.count()  # unkeyed sends to a split queue: round robin over its clusters

    def _describe_on(self, cluster: str, placement: Placement) -> QueueLimits:
        """The queue described by ``cluster``'s inner producer. A router whose directory is a moment
        behind the one that redirected here (a queue just moved: the source's router already names
        the destination, the destination's not yet) answers QUEUE_ELSEWHERE back: asked again after
        a short wait, a few times (about 2.5 s in all), before that answer is raised."""
        for attempt in range(FOLLOW_ATTEMPTS):
            try:
                return self.producer(cluster, placement)._describe(placement.queue)
            except QueueElsewhere:
                if attempt == FOLLOW_ATTEMPTS - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    def follow(self, details: Mapping[str, Any]) -> tuple[str, QueueLimits]:
        """Take a QUEUE_ELSEWHERE reply: the queue is described on each cluster holding it, and its
        limits are the tightest of theirs over all its global partitions. A cluster that does not
        answer (every store of it down) is left out of the limits; its partitions' sends fail
        by the inner producer's own retries, the others' go on. None answering: its error."""
        placement = Placement.from_details(details)
        limits, failed = [], None
        for c in placement.clusters:
            try:
                limits.append(self._describe_on(c, placement))
            except FabricError as exc:  # a cluster down: its partitions' sends fail, the others' go
                log.warning("queue %r: cluster %r does not answer (%s)", placement.queue, c, exc.message)
                failed = failed or exc
        if not limits:
            assert failed is not None
            raise failed
        self.queues[placement.queue] = placement
        if placement.split:
            self._whole.pop(placement.queue, None)
        else:  # its numbering is the cluster's: sends go straight to that cluster's producer
            self._whole[placement.queue] = self.producer(placement.clusters[0], placement)
        levels = min(lim[3] for lim in limits)
        return placement.queue, (
            len(placement.partitions),
            min(x[1] for x in limits),
            min(x[2] for x in limits),
            levels,
        )

    def producer(self, cluster: str, placement: Placement) -> Any:
        with self._lock:
            inner = self._producers.get(cluster)
            if inner is None:
                inner = self._producers[cluster] = self._make(placement.endpoint(cluster), cluster)
            return inner

    def send(
        self,
        queue: str,
        value: bytes,
        key: bytes | str | None,
        headers: dict[str, bytes | str] | None,
        partition: int | None,
        timestamp_ms: int | None,
        callback: Callback | None,
        props: tuple[int | None, int | None, int | None, int | None] | None,
        dedup_id: str | None,
    ) -> RecordFuture:
        """One message of a federation queue through the inner producer of the cluster holding its
        partition. An inner producer that finds the queue gone from its cluster (moved: its
        look-up answered QUEUE_ELSEWHERE, raised here) makes the table be followed again, once."""
        # Handed to the inner producer's general path as the outer one took it (the properties
        # checked, the dedup id in the headers): one layer of calls per message, not two.
        whole = self._whole.get(queue)
        if whole is not None:
            try:
                if key is None and headers is None and partition is None and timestamp_ms is None and props is None:
                    return whole.send(queue, value, None, None, None, None, callback)  # its fast path
                return whole._send_general(
                    queue, value, key, headers, partition, timestamp_ms, callback, props, dedup_id
                )
            except QueueElsewhere as exc:
                self.follow(exc.details)  # the queue moved (fabric queue move): its table again
        if isinstance(key, str):
            key = key.encode()
        for attempt in range(2):
            placement = self.queues[queue]
            p = crc32c(key) % len(placement.partitions) if partition is None and key is not None else partition
            if p is not None:
                cluster, local = placement.local(p)
            else:  # unkeyed: the cluster's own sticky partition, clusters taken in turn
                cluster, local = placement.clusters[next(self._turn) % len(placement.clusters)], None
            cb = (
                _global_callback(callback, placement, cluster) if callback is not None and placement.split else callback
            )
            try:
                future = self.producer(cluster, placement)._send_general(
                    queue, value, key, headers, local, timestamp_ms, cb, props, dedup_id
                )
            except QueueElsewhere as exc:
                if attempt:
                    raise
                self.follow(exc.details)  # the queue moved (fabric queue move): its table again
                continue
            return _global_future(future, placement, cluster)
        raise AssertionError("unreachable")

    def send_batch(
        self,
        queue: str,
        values: list[bytes],
        partition: int,
        keys: list[bytes | None] | None,
        headers: list[dict[str, bytes] | None] | None,
    ) -> RecordFuture:
        placement = self.queues[queue]
        cluster, local = placement.local(partition)
        future = self.producer(cluster, placement).send_batch(
            queue, values, partition=local, keys=keys, headers=headers
        )
        return _global_future(future, placement, cluster)

    def flush(self, timeout: float | None) -> None:
        for inner in list(self._producers.values()):
            inner.flush(timeout)

    def close(self, timeout: float | None) -> None:
        with self._lock:
            inners, self._producers = list(self._producers.values()), {}
        for inner in inners:
            inner.close(timeout)


def _global_future(future: RecordFuture, placement: Placement, cluster: str) -> RecordFuture:
    if not placement.split:
        return future  # wholly on one cluster: its numbering is the queue's
    return FederatedFuture.of(future, placement, cluster)


def _global_callback(callback: Callback, placement: Placement, cluster: str) -> Callback:
    def global_partition(md: RecordMetadata | None, err: Any) -> None:
        if md is not None:
            md = md._replace(partition=placement.global_index(cluster, md.partition))
        callback(md, err)

    return global_partition
