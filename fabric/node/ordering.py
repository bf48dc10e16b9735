"""Strict ordering: records appended in the order of their producers' clocks, never silently out of it.

Theory of operation
-------------------
A queue with ``ordering = "strict"`` orders each partition by the producers'
hybrid logical clocks (``fabric.client.hlc``) rather than by arrival. Each record
carries its clock as the header ``x-hlc`` (20 decimal digits of ``ms << 16 |
logical``, so byte order is clock order); a record without one counts as its
timestamp with logical 0.

The partition leader holds what arrives for ``ordering_window_ms`` past each
record's clock time (by the node's clock), then appends every record whose time
has come, sorted by ``(clock, arrival)``, as one batch. A record whose
clock is below the last one already appended to its partition arrived later than
the window allowed: it goes to the queue's ``<queue>.late`` side queue (header
``x-late-partition``, ``x-late-by-ms``) instead, so the partition never goes out
of clock order and nothing is dropped.

Costs, paid only by strict queues: the node decodes and re-encodes records
(per-message work), every ack waits for the window (the reply comes when the
request's last record is appended, durable as the queue's fsync says), and
held records live in memory (at most ``HELD_MAX`` per partition; past that PRODUCE
is ``QUEUE_FULL``). Held records are not durable until appended: a crash loses
them unacknowledged. Strict batches carry no producer id (their order comes from
the clock, not a sequence).
"""

from __future__ import annotations

import heapq
import logging
from typing import TYPE_CHECKING

from fabric.errors import BadParameter, FabricError, QueueFull, UnknownQueue
from fabric.node.partition import HeldRecord, HeldRequest, PartitionOrdering
from fabric.protocol import frames as fr
from fabric.protocol.batch import CODEC_NONE, BatchHeader, decode_records, encode_batch
from fabric.settings import QueueSettings

if TYPE_CHECKING:
    from fabric.node.broker import Broker

log = logging.getLogger("fabric.ordering")
LATE_RETRY_MS = 200  # a .late queue not ready (a cluster creating it): look again after this

HLC_HEADER = "x-hlc"
LATE_SUFFIX = ".late"
HELD_MAX = 100_000  # records held per partition
APPEND_RECORDS_MAX = 10_000  # records per appended batch


def hlc_of(headers: dict[str, bytes] | None, timestamp_ms: int) -> int:
    raw = (headers or {}).get(HLC_HEADER)
    if raw is not None and raw.isdigit():
        return int(raw)
    return max(0, timestamp_ms) << 16


class StrictOrdering:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        # partitions that held records (their NodePartition.ordering); one whose queue is gone
        # leaves at the next tick
        self.held: set[tuple[str, int]] = set()
        self._arrivals = 0
        self.late = 0

    def hold(
        self,
        client: bytes,
        header: fr.Header,
        queue: str,
        p: int,
        settings: QueueSettings,
        batches: list[tuple[bytearray, BatchHeader]],
        want_reply: bool,
    ) -> None:
        part = self.broker.partitions[(queue, p)]
        if part.ordering is None:
            part.ordering = PartitionOrdering()
        heap = part.ordering.held
        self.held.add((queue, p))
        count = sum(h.record_count for _, h in batches)
        if len(heap) + count > HELD_MAX:
            raise QueueFull(f"strict ordering holds {len(heap)} records of {queue}/{p}; retry shortly")
        request = HeldRequest(client, header, want_reply, [], count)
        for b, (buf, h) in enumerate(batches):
            if h.producer_id >= 0:
                raise BadParameter("a strict-ordering queue takes batches without a producer id (ordered by clock)")
            r = decode_records(buf)
            keys = r.keys or [None] * len(r.values)
            hdrs = r.headers or [{} for _ in r.values]
            request.offsets.append([-1] * len(r.values))
            for i, value in enumerate(r.values):
                self._arrivals += 1
                rec = (value, keys[i], dict(hdrs[i]), r.timestamps[i])
                heapq.heappush(heap, HeldRecord(hlc_of(hdrs[i], r.timestamps[i]), self._arrivals, rec, request, b, i))

    def next_due_ms(self) -> int | None:
        due = None
        partitions = self.broker.partitions
        for key in self.held:
            part = partitions.get(key)
            state = part.ordering if part is not None else None
            if state is not None and state.held:
                t = max((state.held[0].hlc >> 16) + self._window(key[0]), state.retry_at_ms)
                due = t if due is None or t < due else due
        return due

    def _window(self, queue: str) -> int:
        try:
            return self.broker.store.settings(queue).ordering_window_ms
        except UnknownQueue:
            return 0

    def tick(self, now_ms: int) -> None:
        partitions = self.broker.partitions
        for key in list(self.held):
            part = partitions.get(key)
            state = part.ordering if part is not None else None
            if state is None:
                self.held.discard(key)  # the queue is gone: its held records (unacknowledged) with it
                continue
            heap = state.held
            if not heap or state.retry_at_ms > now_ms:
                continue
            queue, p = key
            try:
                settings = self.broker.store.settings(queue)
            except UnknownQueue:
                self.held.discard(key)
                continue
            cutoff = (now_ms - settings.ordering_window_ms) << 16 | 0xFFFF
            due: list[HeldRecord] = []
            while heap and heap[0].hlc <= cutoff and len(due) < APPEND_RECORDS_MAX:
                due.append(heapq.heappop(heap))
            if due:
                self._place(queue, p, settings, due, now_ms)

    def _place(self, queue: str, p: int, settings: QueueSettings, due: list[HeldRecord], now_ms: int) -> None:
        b = self.broker
        state = b.partitions[(queue, p)].ordering
        assert state is not None
        last = state.last
        on_time = [h for h in due if h.hlc >= last]
        late = [h for h in due if h.hlc < last]
        plog = b.store.partition(queue, p)
        if late:  # first: while the .late queue is not ready (a cluster creating it) nothing is placed
            lag = (last >> 16) - min(h.hlc >> 16 for h in late)
            extra = {"x-late-partition": b"%d" % p, "x-late-by-ms": b"%d" % max(0, lag)}
            records = [(-1, h.record[0], h.record[1], h.record[2], h.record[3]) for h in late]
            target = queue + LATE_SUFFIX

            def sent(err: FabricError | None, n: int = len(records)) -> None:  # a .late led by another node
                if err is not None:
                    log.error("%d late record(s) of %s/%d could not be set aside in %r: %s", n, queue, p, target, err)

            try:
                b.shared.append_records(target, settings, records, extra, now_ms, offset_header=None, done=sent)
            except QueueFull as exc:
                log.debug("late records of %s/%d wait: %s", queue, p, exc.message)
                for h in due:
                    heapq.heappush(state.held, h)
                state.retry_at_ms = now_ms + LATE_RETRY_MS
                return
            state.retry_at_ms = 0
            self.late += len(late)
        if on_time:
            batch = bytearray(
                encode_batch(
                    [h.record[0] for h in on_time],
                    keys=[h.record[1] for h in on_time],
                    headers=[h.record[2] for h in on_time],
                    timestamps=[h.record[3] for h in on_time],
                    codec=CODEC_NONE,
                )
            )
            base = b.append_internal(queue, p, batch)
            for i, h in enumerate(on_time):
                h.request.offsets[h.batch][h.index] = base + i
            state.last = on_time[-1].hlc
        for h in due:
            h.request.left -= 1
        done = {id(h.request): h.request for h in due if h.request.left == 0}
        end = plog.next_offset
        for request in done.values():
            reply = None
            if request.reply:
                params = {"offsets": [-1] * len(request.offsets), "record_offsets": request.offsets}
                reply = fr.encode(fr.Header(request.header.op, request.header.request_id, fr.FLAG_REPLY), params)
            b.after_append(queue, p, plog, settings, end, request.client if reply else None, reply)
