"""Per-queue deduplication by message id: duplicates from *different* producers.

Theory of operation
-------------------
A queue with ``dedup_window_ms > 0`` accepts PRODUCE requests whose params carry
``dedup_ids``, one entry per record (null for a record without one). A record
whose id the queue has seen within the window is dropped; the reply lists the
dropped records' indexes under ``duplicates``. Only requests with ids pay: one
dict lookup per id, and a re-encode of the batch only when some (not all) of
its records are duplicates.

The window (:class:`fabric.store.dedup.DedupWindow`) lives in memory and is
rebuilt from the log the first time a queue needs it after a start: records
carry their id in the ``x-dedup-id`` header as well (the Producer writes both),
so the node decodes the batches appended in the last ``dedup_window_ms`` and
remembers their ids. Nothing else is persisted, and nothing can disagree with
the log. An id counts as seen once its record is appended (a request that fails
remembers nothing).

Batches with dedup ids are not idempotent-producer batches (a dropped record
would leave a hole in the producer's sequence); the dedup id makes their
retries safe instead.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fabric.errors import BadParameter, FabricError
from fabric.protocol.batch import (
    HAS_HEADERS,
    BatchHeader,
    batch_ttl_ms,
    check_batch,
    decode_records,
    encode_batch,
)
from fabric.settings import QueueSettings
from fabric.store.dedup import DedupWindow

if TYPE_CHECKING:
    from fabric.node.broker import Broker

log = logging.getLogger("fabric.dedup")
DEDUP_HEADER = "x-dedup-id"


class QueueDedup:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.windows: dict[str, DedupWindow] = {}
        self.dropped = 0

    def window(self, queue: str, settings: QueueSettings, now_ms: int) -> DedupWindow:
        window = self.windows.get(queue)
        if window is None or window.window_ms != settings.dedup_window_ms:
            window = self.windows[queue] = self._rebuild(queue, settings, now_ms)
        return window

    def filter(
        self,
        queue: str,
        p: int,
        settings: QueueSettings,
        batches: list[tuple[bytearray, BatchHeader]],
        ids: list[str | None],
        now_ms: int,
    ) -> tuple[list[tuple[bytearray, BatchHeader]], list[int]]:
        """The batches with duplicate records taken out, and the indexes of those records."""
        if not settings.dedup_window_ms:
            raise BadParameter(f"queue {queue!r} has no dedup window: set its dedup_window_ms to use dedup ids")
        if len(batches) != 1:
            raise BadParameter(f"a PRODUCE with dedup_ids carries one batch, not {len(batches)}")
        buf, h = batches[0]
        if len(ids) != h.record_count:
            raise BadParameter(f"dedup_ids lists {len(ids)} ids for a batch of {h.record_count} records")
        if h.producer_id >= 0:
            raise BadParameter("a batch with dedup ids cannot carry a producer id (the dedup id makes retries safe)")
        window = self.window(queue, settings, now_ms)
        duplicates: list[int] = []
        fresh: set[bytes] = set()
        for i, raw in enumerate(ids):
            if raw is None:
                continue
            key = raw.encode()
            if key in fresh or window.contains(key, now_ms):
                duplicates.append(i)
            fresh.add(key)
        if not duplicates:
            return batches, duplicates
        self.dropped += len(duplicates)
        if len(duplicates) == h.record_count:
            return [], duplicates
        return [_without(buf, h, set(duplicates))], duplicates

    def remember(self, queue: str, ids: list[str | None], duplicates: list[int], now_ms: int) -> None:
        window = self.windows.get(queue)
        if window is None:
            return
        skip = set(duplicates)
        for i, raw in enumerate(ids):
            if raw is not None and i not in skip:
                window.seen(raw.encode(), now_ms)

    def forget_queue(self, queue: str) -> None:
        self.windows.pop(queue, None)

    def _rebuild(self, queue: str, settings: QueueSettings, now_ms: int) -> DedupWindow:
        """The window as the log has it: the ids of records appended in the last window_ms."""
        window = DedupWindow(settings.dedup_window_ms)
        seen: list[tuple[int, bytes]] = []
        since = now_ms - settings.dedup_window_ms
        for p in range(settings.log_partitions):
            plog = self.broker.store.partition(queue, p)
            offset = plog.offset_for_timestamp(since)
            try:
                for data, pos, bh in plog.batches(offset, plog.next_offset):
                    offset = bh.next_offset
                    if not bh.attributes & HAS_HEADERS:
                        continue
                    r = decode_records(data, pos)
                    for ts, hdrs in zip(r.timestamps, r.headers or ()):
                        mid = hdrs.get(DEDUP_HEADER)
                        if mid and ts >= since:
                            seen.append((ts, mid))
            except FabricError:
                log.exception("rebuilding the dedup window of %s/%d stopped at offset %d", queue, p, offset)
        for ts, mid in sorted(seen):
            window.seen(mid, ts)
        window.expire(now_ms)
        return window


def _without(buf: bytearray, h: BatchHeader, drop: set[int]) -> tuple[bytearray, BatchHeader]:
    """The batch re-encoded without the records at the ``drop`` indexes."""
    r = decode_records(buf)
    keep = [i for i in range(h.record_count) if i not in drop]
    batch = bytearray(
        encode_batch(
            [r.values[i] for i in keep],
            keys=[r.keys[i] for i in keep] if r.keys else None,
            headers=[r.headers[i] for i in keep] if r.headers else None,
            timestamps=[r.timestamps[i] for i in keep],
            codec=h.codec,
            ttl_ms=batch_ttl_ms(buf, h),
        )
    )
    return batch, check_batch(batch)
