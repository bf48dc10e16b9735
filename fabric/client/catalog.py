"""What a producer knows of each queue it sends to: partitions, size limits, priority levels,
ordering and mode, looked up on the caller's thread before its first send.

One queue: a DESCRIBE_QUEUE round trip (which creates the queue where the node auto-creates). A
producer that keeps meeting new queues (the second miss on) asks once for every queue the node
holds (METADATA ``settings``) and takes the next ones from that answer while it is at most
PREFETCH_MAX_AGE_S old, so sending to thousands of queues costs one round trip, not one per
queue. A queue the answer does not name (created since, held elsewhere, to be auto-created) is
described on its own. Lookups use a connection of their own, opened at the first one.

A federation queue that lives on other clusters, or is split over several, is answered
QUEUE_ELSEWHERE by a federated cluster's router; the catalog hands the reply to ``links``
(:class:`fabric.client.federated.ProducerLinks`), which sends that queue's messages through the
routers of the clusters holding it. A producer made for one cluster's share (``cluster``) names
it in its look-ups and does not follow.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fabric.client.direct import DirectSender
from fabric.client.federated import ProducerLinks
from fabric.errors import ClusterUnavailable, ConnectionFailed, FabricError, QueueElsewhere, Timeout
from fabric.protocol.ops import Op
from fabric.transport.connection import BaseConnection, connect

log = logging.getLogger("fabric.producer")
PREFETCH_AFTER_MISSES = 2  # the second queue this producer meets: look up every queue at once
PREFETCH_EVERY_S = 10.0  # at most one such look-up this often
PREFETCH_MAX_AGE_S = 10.0  # its answers are used this long (then a queue is described on its own)
PREFETCH_PAGE = 2000  # queues per METADATA settings page
PREFETCH_PAGES_MAX = 50  # pages per look-up (100,000 queues); past them queues are described one by one

QueueLimits = tuple[int, int, int, int]  # (partitions, max message bytes, max batch bytes, priority levels)


class QueueCatalog:
    def __init__(
        self,
        endpoint: str | None,
        *,
        timeout_ms: int,
        spread: bool,
        cluster: str | None = None,
        links: ProducerLinks | None = None,
    ) -> None:
        self._endpoint = endpoint
        self._cluster = cluster  # the federation cluster whose share this producer sends to
        self.links = links  # federation queues elsewhere (None: a producer of one cluster's share)
        # federation queues sent through other clusters' routers (the links' table; empty without links)
        self.elsewhere: dict[str, Any] = links.queues if links is not None else {}
        self._timeout_ms = max(10_000, timeout_ms)  # lookups are rare and synchronous: never shorter than 10 s
        self._spread = spread
        self.queues: dict[str, QueueLimits] = {}  # read without the lock on the send path
        self.strict: set[str] = set()  # queues ordered by the producers' clocks: every record stamped
        self.direct: dict[str, DirectSender] = {}  # brokerless queues: sent straight to their consumers
        self._lock = threading.Lock()
        self._conn: BaseConnection | None = None
        self._misses = 0  # queues looked up so far (their first send)
        self._prefetch_cache: dict[str, dict[str, Any]] = {}  # queue -> settings (METADATA settings)
        self._prefetched_at = -PREFETCH_EVERY_S - PREFETCH_MAX_AGE_S  # monotonic time of that answer
        self._prefetch_ok = True  # the node answers METADATA settings

    def describe(self, queue: str, before_first: Callable[[], None]) -> QueueLimits:
        """The queue's limits, looked up if not known yet; ``before_first`` runs (under the
        catalog's lock) before a queue is first recorded: what must be in place before anything
        is sent to it (the producer's identity)."""
        with self._lock:
            if queue not in self.queues:
                info = self._prefetched(queue)
                if info is None:
                    self._misses += 1
                    if self._misses >= PREFETCH_AFTER_MISSES and self._may_prefetch():
                        self._prefetch()
                        info = self._prefetched(queue)
                if info is None:
                    # the node creates the queue here if its auto_create_queues is on (the reply says "created")
                    params: dict[str, Any] = {"name": queue, "auto_create": True}
                    if self._cluster is not None:
                        params["cluster"] = self._cluster
                    try:
                        d = self.request(Op.DESCRIBE_QUEUE, params)
                    except QueueElsewhere as exc:
                        if self.links is None:
                            raise
                        _, limits = self.links.follow(exc.details)  # fabric/client/federated.py
                        self.queues[queue] = limits
                        return limits
                    info = {**d["settings"], "partitions": d["partitions"]}
                before_first()
                self.queues[queue] = (
                    info["partitions"],
                    info["max_message_bytes"],
                    info["max_batch_bytes"],
                    info.get("priority_levels", 1),
                )
                if info.get("ordering") == "strict":
                    self.strict.add(queue)
                if info.get("mode") == "direct":
                    self.direct[queue] = DirectSender(queue, lambda: self._direct_consumers(queue))
            return self.queues[queue]

    def forget(self, queue: str) -> None:
        """A batch to ``queue`` was answered QUEUE_ELSEWHERE (the queue moved to another cluster):
        the next send looks it up again, and follows the redirect. What was refused fails."""
        self.queues.pop(queue, None)
        self.strict.discard(queue)
        self._prefetch_cache.pop(queue, None)

    def partitions_seen(self, queue: str, partitions: Any) -> None:
        """A PRODUCE reply names the queue's partition count: partitions added since this producer
        looked (``fabric queue alter --partitions``) take its sends from now on."""
        known = self.queues.get(queue)
        if known is not None and type(partitions) is int and partitions > known[0]:
            self.queues[queue] = (partitions, *known[1:])

    def partitions_shrunk(self, queue: str, partitions: int) -> None:
        """Shrinking removed the queue's partitions from ``partitions`` on, and no batch of this
        producer is left for them: keys hash over the new count from now on."""
        known = self.queues.get(queue)
        if known is not None and 1 <= partitions < known[0]:
            self.queues[queue] = (partitions, *known[1:])

    def request(self, op: Op, params: dict[str, Any]) -> dict[str, Any]:
        """A metadata request, retried on a retriable refusal (a cluster electing a leader, its
        etcd electing one) for as long as the connection's timeout; waits already spent in
        full (no link, no answer) are not repeated. Each is safe to send again when its link is
        lost in flight (METADATA and DESCRIBE_QUEUE read, auto_create creates once; a repeated
        INIT_PRODUCER only leaves an id unused), so the connection does."""
        if self._conn is None:
            self._conn = connect(self._endpoint, timeout_ms=self._timeout_ms, spread=self._spread)
        conn = self._conn
        deadline = time.monotonic() + conn.timeout_ms / 1000
        backoff = 0.05
        while True:
            try:
                return conn.request(op, params, resend=True).params
            except (ConnectionFailed, Timeout):
                raise
            except FabricError as exc:
                if not exc.retriable or isinstance(exc, ClusterUnavailable) or time.monotonic() + backoff > deadline:
                    raise
                time.sleep(backoff)
                backoff = min(1.0, backoff * 2)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        for sender in self.direct.values():
            sender.close()

    def _prefetched(self, queue: str) -> dict[str, Any] | None:
        if time.monotonic() - self._prefetched_at > PREFETCH_MAX_AGE_S:
            return None
        return self._prefetch_cache.get(queue)

    def _may_prefetch(self) -> bool:
        return self._prefetch_ok and time.monotonic() - self._prefetched_at >= PREFETCH_EVERY_S

    def _prefetch(self) -> None:
        """METADATA with ``settings``: what this producer needs of every queue the node holds."""
        cache: dict[str, dict[str, Any]] = {}
        start = None
        for _ in range(PREFETCH_PAGES_MAX):
            params: dict[str, Any] = {
                "queues": [],
                "settings": True,
                "settings_from": start,
                "settings_limit": PREFETCH_PAGE,
            }
            try:
                reply = self.request(Op.METADATA, params)
            except (ConnectionFailed, Timeout):
                raise
            except FabricError as exc:  # a node from before METADATA settings: describe one by one
                log.info("no bulk queue look-up (%s): describing queues one by one", exc)
                self._prefetch_ok = False
                return
            cache.update(reply.get("settings") or {})
            start = reply.get("settings_next")
            if start is None:
                break
        self._prefetch_cache = cache
        self._prefetched_at = time.monotonic()

    def _direct_consumers(self, queue: str) -> list[str]:
        with self._lock:
            d = self.request(Op.DESCRIBE_QUEUE, {"name": queue})
        return list(d.get("direct_consumers", []))
