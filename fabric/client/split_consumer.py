"""A consumer of a federation queue split over several clusters: one consumer per cluster, merged.

Theory of operation
-------------------
A ``Consumer`` whose SUBSCRIBE a federated router answers QUEUE_ELSEWHERE with a queue split over
several clusters (``fabric/client/federated.py``) becomes a ``SplitConsumer``
(:meth:`SplitConsumer.take_over`: its class is switched, so the caller's object and every
``isinstance`` check stay as they were). It holds an inner ``Consumer`` per cluster holding a
share, each subscribed through that cluster's routers and naming the cluster, with the same
group, kind and settings: a consumer group over a split queue is that group in every cluster, and
each cluster's coordinator shares out its partitions among the group's members as it does for
any queue. So a group reads every partition, wherever it lives.

What the caller sees is numbered globally: ``Message.partition`` (and a batch's) is the global
partition, and whatever takes a partition (``partitions=``, ``offsets=``, ``ack_offset``,
``seek``, ``fetch``, ``commit(offsets)``) takes a global one and is sent, as the cluster's local
index, to the consumer of the cluster holding it. ``poll`` and ``poll_batch`` take the clusters
in turn: each is asked without waiting, then one at a time for at most ``WAIT_SLICE_MS`` until
the timeout, so a quiet cluster delays another's messages by at most a slice. Iteration hands
out what ``poll`` returns (each poll counts as given when it returns, as ``poll`` does).

A cluster that loses every store (its router answers CLUSTER_UNAVAILABLE when its consumer
subscribes again) is left out of the polls for ``DOWN_RETRY_S`` at a time, logged, and tried
again: the other clusters' partitions keep being delivered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from fabric.client.consumer import Consumer
from fabric.client.federated import Placement
from fabric.client.messages import Message, ReceivedBatch
from fabric.errors import BadParameter, ClusterUnavailable

log = logging.getLogger("fabric.consumer")
WAIT_SLICE_MS = 20  # while waiting, each cluster's consumer is waited on this long in turn
DOWN_RETRY_S = 1.0  # a cluster without a store is asked again this often


def placement_of(details: Mapping[str, Any]) -> Placement:
    return Placement.from_details(details)


class SplitConsumer(Consumer):
    """A Consumer over a split federation queue (made by ``Consumer`` itself, never directly)."""

    _placement: Placement
    _inner: dict[str, Consumer]
    _turn: int
    _down: dict[str, float]  # cluster -> when to try its consumer again (it has no live store)

    @classmethod
    def take_over(
        cls,
        consumer: Consumer,
        placement: Placement,
        partitions: list[int] | None,
        offsets: Mapping[int, int],
    ) -> None:
        """Turn ``consumer`` (its SUBSCRIBE answered QUEUE_ELSEWHERE, its connection closed) into a
        SplitConsumer with a consumer per cluster of ``placement``."""
        settings = consumer._inner_settings
        inner: dict[str, Consumer] = {}
        try:
            for cluster in placement.clusters:
                mine = placement.partitions_on(cluster)
                wanted = mine if partitions is None else [p for p in partitions if p in mine]
                if not wanted:
                    continue
                local_parts = None if partitions is None else [placement.local(p)[1] for p in wanted]
                local_offsets = {placement.local(p)[1]: o for p, o in offsets.items() if p in mine} or None
                inner[cluster] = Consumer(
                    consumer.queue,
                    placement.endpoint(cluster),
                    cluster=cluster,
                    partitions=local_parts,
                    offsets=local_offsets,
                    **settings,
                )
        except BaseException:
            for c in inner.values():
                c.close()
            raise
        consumer.__class__ = cls
        assert isinstance(consumer, SplitConsumer)
        consumer._placement = placement
        consumer._inner = inner
        consumer._turn = 0
        consumer._down = {}
        consumer.positions = {}

    # ------------------------------------------------------------------ numbering

    def _local(self, partition: int) -> tuple[Consumer, int]:
        if not 0 <= partition < len(self._placement.partitions):
            raise BadParameter(f"queue {self.queue!r} has partitions 0..{len(self._placement.partitions) - 1}")
        cluster, local = self._placement.local(partition)
        inner = self._inner.get(cluster)
        if inner is None:
            raise BadParameter(f"this consumer does not receive partition {partition} of {self.queue!r}")
        return inner, local

    def _to_global(self, cluster: str, items: list[Any]) -> list[Any]:
        g = self._placement.global_index
        return [msgspec.structs.replace(m, partition=g(cluster, m.partition)) for m in items]

    def _by_cluster(self, messages: Message | ReceivedBatch | list[Message]) -> dict[Consumer, list[Any]]:
        items = messages if isinstance(messages, list) else [messages]
        out: dict[Consumer, list[Any]] = {}
        for m in items:
            inner, local = self._local(m.partition)
            out.setdefault(inner, []).append(msgspec.structs.replace(m, partition=local))
        return out

    def _rotation(self) -> list[tuple[str, Consumer]]:
        if self._down:
            now = time.monotonic()
            for c in [c for c, due in self._down.items() if now >= due]:
                del self._down[c]
        items = [(c, inner) for c, inner in self._inner.items() if c not in self._down]
        self._turn = (self._turn + 1) % max(1, len(items))
        return items[self._turn :] + items[: self._turn]

    # ------------------------------------------------------------------ receiving

    def _ask(self, cluster: str, inner: Consumer, batch: bool, timeout_ms: int) -> list[Any]:
        """One cluster's consumer asked for what it has (a list: messages, or one batch)."""
        try:
            if batch:
                b = inner.poll_batch(timeout_ms)
                return [] if b is None else [b]
            return inner.poll(timeout_ms)
        except ClusterUnavailable as exc:
            log.warning("queue %s: %s; its partitions are left out for now", self.queue, exc.message)
            self._down[cluster] = time.monotonic() + DOWN_RETRY_S
            return []

    def _take(self, timeout_ms: int, batch: bool) -> list[Any]:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            for cluster, inner in self._rotation():
                got = self._ask(cluster, inner, batch, 0)
                if got:
                    return self._to_global(cluster, got)
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or self._closed:
                return []
            turn = self._rotation()
            if not turn:  # every cluster down: wait out the slice
                time.sleep(min(WAIT_SLICE_MS, left_ms) / 1000)
                continue
            cluster, inner = turn[0]
            got = self._ask(cluster, inner, batch, min(WAIT_SLICE_MS, left_ms))
            if got:
                return self._to_global(cluster, got)

    def poll(self, timeout_ms: int = 1000) -> list[Message]:
        return self._take(timeout_ms, batch=False)

    def poll_batch(self, timeout_ms: int = 1000) -> ReceivedBatch | None:
        got = self._take(timeout_ms, batch=True)
        return got[0] if got else None

    def __iter__(self) -> Iterator[Message]:
        while not self._closed:
            yield from self.poll(1000)

    @property
    def connected_to(self) -> str:
        return ",".join(inner.connected_to for inner in self._inner.values())

    def assignment(self) -> list[int]:
        g = self._placement.global_index
        return sorted(g(c, p) for c, inner in self._inner.items() for p in inner.assignment())

    # ------------------------------------------------------------------ settling

    @property
    def ack_errors(self) -> int:
        return sum(inner.ack_errors for inner in self._inner.values())

    def receipt_handle(self, message: Message) -> str:
        inner, local = self._local(message.partition)
        return inner.receipt_handle(msgspec.structs.replace(message, partition=local))

    def ack(self, messages: Message | ReceivedBatch | list[Message], *, wait: bool = False) -> None:
        for inner, local in self._by_cluster(messages).items():
            inner.ack(local, wait=wait)

    def ack_offset(self, partition: int, offset: int) -> None:
        inner, local = self._local(partition)
        inner.ack_offset(local, offset)

    def nack(self, messages: Message | ReceivedBatch | list[Message], delay_ms: int = 0) -> int:
        return sum(inner.nack(local, delay_ms) for inner, local in self._by_cluster(messages).items())

    def change_visibility(self, messages: Message | ReceivedBatch | list[Message], visibility_ms: int) -> int:
        return sum(inner.change_visibility(local, visibility_ms) for inner, local in self._by_cluster(messages).items())

    def flush_acks(self) -> None:
        for inner in self._inner.values():
            inner.flush_acks()

    # ------------------------------------------------------------------ offsets

    def commit(self, offsets: dict[int, int] | None = None, *, wait: bool = False) -> None:
        if offsets is None:
            for inner in self._inner.values():
                inner.commit(wait=wait)
            return
        per: dict[Consumer, dict[int, int]] = {}
        for p, off in offsets.items():
            inner, local = self._local(p)
            per.setdefault(inner, {})[local] = off
        for inner, local_offsets in per.items():
            inner.commit(local_offsets)

    def committed(self) -> dict[int, int]:
        g = self._placement.global_index
        return {g(c, p): o for c, inner in self._inner.items() for p, o in inner.committed().items()}

    def seek(self, partition: int, to: int | str, *, timestamp_ms: int | None = None) -> int:
        inner, local = self._local(partition)
        return inner.seek(local, to, timestamp_ms=timestamp_ms)

    def fetch(self, partition: int, offset: int, *, max_bytes: int = 1 << 20, wait_ms: int = 0) -> list[Message]:
        inner, local = self._local(partition)
        cluster = self._placement.local(partition)[0]
        return self._to_global(cluster, inner.fetch(local, offset, max_bytes=max_bytes, wait_ms=wait_ms))

    # ------------------------------------------------------------------ lifecycle

    def close(self, *, keep_leases: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        for inner in self._inner.values():
            inner.close(keep_leases=keep_leases)
