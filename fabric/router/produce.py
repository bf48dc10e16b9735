"""The PRODUCE hot path: per-batch work only.

One CRC check, one size check (the length column is read as an array only for
batches larger than the message limit), idempotence checks for producer-id
batches, one stamped write per batch, and the reply: at once, or (fsync =
"always") when the flusher reports the fdatasync that covers it. A request is
all or nothing: if an append fails, the partition is truncated back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fabric.errors import BadParameter, FabricError, MessageTooLarge, ProtocolError, QueueFull, RequestTooLarge
from fabric.protocol import frames as fr
from fabric.protocol.batch import HEADER_SIZE, check_batch, max_record_bytes
from fabric.settings import QueueSettings

if TYPE_CHECKING:
    from fabric.router.broker import Broker


class Deferred(Exception):
    """Raised by a handler that will reply later (long poll, fsync before ack)."""


def produce(
    broker: Broker, client: bytes, header: fr.Header, params: dict[str, Any], data: Sequence[Any]
) -> dict | None:
    """PRODUCE: per-batch checks, idempotence, one append per batch, reply now or after the fsync."""
    queue, p = params["queue"], params["partition"]
    settings = broker.store.settings(queue)
    plog = broker._partition(queue, p, settings)
    if not data:
        raise BadParameter("PRODUCE carries no record batch frame")
    if len(data) > broker.config.limits.max_batches_per_request:
        raise RequestTooLarge(
            f"{len(data)} batches in one request; the limit is {broker.config.limits.max_batches_per_request}"
        )
    batches = []
    records = nbytes = 0
    for frame in data:
        buf = bytearray(frame)
        if len(buf) > settings.max_batch_bytes:
            raise MessageTooLarge(
                f"batch of {len(buf)} bytes exceeds queue {queue!r} max_batch_bytes {settings.max_batch_bytes}"
            )
        h = check_batch(buf)
        if h.size != len(buf):
            raise ProtocolError(f"batch frame holds {len(buf) - h.size} bytes after its batch")
        limit = settings.max_message_bytes
        if len(buf) - HEADER_SIZE > limit and max_record_bytes(buf, h) > limit:
            raise MessageTooLarge(f"a message in the batch exceeds queue {queue!r} max_message_bytes {limit}")
        batches.append((buf, h))
        records += h.record_count
        nbytes += len(buf)
    check_capacity(broker, queue, settings, records, nbytes)
    now = broker._now_ms
    start = plog.next_offset
    states = broker.store.producer_states(queue, p, now) if batches[0][1].producer_id >= 0 else None
    offsets = []
    try:
        for buf, h in batches:
            if states is not None and h.producer_id >= 0:
                # idempotent producer: a retried batch is stored once (its first offsets come
                # back), a gap or a fenced epoch is refused
                dup = states.check(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, now)
                if dup is not None:
                    offsets.append(dup)
                    continue
            base = plog.append(buf, h, now_ms=now)
            offsets.append(base)
            if states is not None and h.producer_id >= 0:
                states.record(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, base, now)
    except FabricError:
        if plog.next_offset != start:  # all of a request or none of it
            plog.truncate_to(start)
            if states is not None:
                states.truncate(start)
        raise
    broker.stats["batches_in"] += len(batches)
    broker.stats["records_in"] += records
    end = plog.next_offset
    reply = None
    if not header.flags & fr.FLAG_NO_REPLY and params["acks"] != "none":
        # preformatted: the same bytes as encode(Header(...), {"offsets": offsets})
        reply = [
            fr.Header(header.op, header.request_id, fr.FLAG_REPLY).encode(),
            b'{"offsets":[%s]}' % b",".join(b"%d" % o for o in offsets),
        ]
    broker.after_append(queue, p, plog, settings, end, client if reply else None, reply)
    raise Deferred  # replied above, or after the covering fdatasync


def check_capacity(broker: Broker, queue: str, settings: QueueSettings, records: int, nbytes: int) -> None:
    if not settings.max_messages and not settings.max_bytes:
        return
    logs = [broker.store.partition(queue, i) for i in range(settings.partitions)]
    held = sum(pl.next_offset - pl.log_start_offset for pl in logs)
    size = sum(pl.size_bytes for pl in logs)
    if settings.max_messages and held + records > settings.max_messages:
        raise QueueFull(f"queue {queue!r} holds {held} messages; max_messages is {settings.max_messages}")
    if settings.max_bytes and size + nbytes > settings.max_bytes:
        raise QueueFull(f"queue {queue!r} holds {size} bytes; max_bytes is {settings.max_bytes}")
