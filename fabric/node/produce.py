"""The PRODUCE hot path: per-batch work only.

One CRC check, one size check (the length column is read as an array only for
batches larger than the message limit), idempotence checks for producer-id
batches, one stamped write per batch, and the reply: at once, or (fsync =
"always") when the flusher reports the fdatasync that covers it. A request is
all or nothing: if an append fails, the partition is truncated back.

Message properties ride in the params and apply to the whole request:
``priority`` picks the priority level's log of the partition (level ``l`` of
partition ``p`` is log ``l * partitions + p``); ``delay_ms`` / ``deliver_at_ms``
park the batches in the node's delay store until due (``fabric.node.delayed``);
``dedup_ids`` (one per record) drop records whose id the queue's dedup window
has seen. Only requests that use them pay for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fabric.errors import (
    BadParameter,
    CorruptBatch,
    FabricError,
    MessageTooLarge,
    PartitionRetired,
    ProtocolError,
    QueueFull,
    RequestTooLarge,
    UnknownPartition,
)
from fabric.node.purgatory import Deferred
from fabric.node.records import records_of
from fabric.protocol import frames as fr
from fabric.protocol.batch import ENCRYPTED, HAS_TTL, HEADER_SIZE, check_batch, iter_batches, max_record_bytes
from fabric.protocol.requests import ProduceParams
from fabric.settings import QueueSettings, was_retired

if TYPE_CHECKING:
    from fabric.node.broker import Broker


def produce(
    broker: Broker,
    client: bytes,
    header: fr.Header,
    params: ProduceParams,
    data: Sequence[Any],
    *,
    created: bool = False,
    throttle_ms: int = 0,
) -> dict | None:
    """PRODUCE: per-batch checks, idempotence, one append per batch, reply now or after the fsync."""
    queue, p = params["queue"], params["partition"]
    settings = broker.store.settings(queue)
    if params["priority"] is not None:
        p = priority_partition(queue, settings, p, params["priority"])
    if settings.auto_partitions_max and broker.config.cluster is None:
        retired_check(broker, queue, settings, p)  # shrinking: a retiring or removed partition takes no writes
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
        if h.attributes & (HAS_TTL | ENCRYPTED):  # one test per batch for both
            if h.attributes & ENCRYPTED:
                raise CorruptBatch("attribute 0x0080 (encrypted at rest) is set by nodes only, never by a producer")
            broker.expiry.saw_ttl(queue)
        if h.producer_id < -1:  # a delay id (fabric.protocol.batch.delay_id_of): set by nodes only
            raise BadParameter(f"producer_id {h.producer_id}: below -1 is reserved for the nodes' delayed batches")
        limit = settings.max_message_bytes
        if len(buf) - HEADER_SIZE > limit and max_record_bytes(buf, h) > limit:
            raise MessageTooLarge(f"a message in the batch exceeds queue {queue!r} max_message_bytes {limit}")
        batches.append((buf, h))
        records += h.record_count
        nbytes += len(buf)
    check_capacity(broker, queue, settings, records, nbytes)
    now = broker._now_ms
    due = due_ms(params, now)
    if due is not None:
        if settings.ordering == "strict":
            raise BadParameter(f"queue {queue!r} orders strictly by the producers' clocks: it takes no delays")
        # cluster, acks=all: NOT_ENOUGH_REPLICAS before anything is stored
        acks_all = broker.placement.delay_acks_all(queue, p, params["acks"])
        delayed, row_id = broker.delayed.delay(queue, p, settings, batches, due, params)
        if not acks_all or header.flags & fr.FLAG_NO_REPLY:
            return delayed
        # the reply waits until every in-sync replica holds the rows (fabric.node.delay_replication)
        broker.placement.reply_delayed(queue, p, row_id, client, header, delayed)
        raise Deferred
    duplicates: list[int] = []
    if params["dedup_ids"] is not None:
        batches, duplicates = broker.dedup.filter(queue, p, settings, batches, params["dedup_ids"], now)
        if not batches:
            return {"offsets": [-1], "duplicates": duplicates}
    if settings.ordering == "strict":
        want_reply = not header.flags & fr.FLAG_NO_REPLY and params["acks"] != "none"
        broker.ordering.hold(client, header, queue, p, settings, batches, want_reply)
        if params["dedup_ids"] is not None:
            broker.dedup.remember(queue, params["dedup_ids"], duplicates, now)
        raise Deferred  # the reply comes when the window has passed and the records are appended
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
    counted = broker.queue_in.get(queue)
    if counted is None:
        counted = broker.queue_in[queue] = [0, 0]
    counted[0] += records
    counted[1] += sum(len(buf) for buf, _ in batches)
    end = plog.next_offset
    if params["dedup_ids"] is not None:
        broker.dedup.remember(queue, params["dedup_ids"], duplicates, now)
    reply = None
    if (duplicates or created or throttle_ms) and not header.flags & fr.FLAG_NO_REPLY and params["acks"] != "none":
        answer: dict[str, Any] = {"offsets": offsets, "duplicates": duplicates, "partitions": settings.partitions}
        if created:
            answer["created"] = True  # this send created the queue ([node] auto_create_queues)
        if throttle_ms:
            answer["throttle_ms"] = throttle_ms  # over a quota: the client waits this long (fabric/node/quotas.py)
        reply = fr.encode(fr.Header(header.op, header.request_id, fr.FLAG_REPLY), answer)
    elif not header.flags & fr.FLAG_NO_REPLY and params["acks"] != "none":
        # preformatted: the same bytes as encode(Header(...), {"offsets": offsets, "partitions": n});
        # the partition count tells producers of partitions added since they looked
        reply = [
            fr.Header(header.op, header.request_id, fr.FLAG_REPLY).encode(),
            b'{"offsets":[%s],"partitions":%d}' % (b",".join(b"%d" % o for o in offsets), settings.partitions),
        ]
    broker.after_append(
        queue, p, plog, settings, end, client if reply else None, reply, acks_all=params["acks"] == "all"
    )
    raise Deferred  # replied above, or after the covering fdatasync


def retired_check(broker: Broker, queue: str, settings: QueueSettings, p: int) -> None:
    """PARTITION_RETIRED for a write to a partition that shrinking retires (``retiring``: the
    producer retries, the keys keep their order) or removed (it goes to ``p % partitions``)."""
    live = broker.store.live_partitions(queue)
    if p < live:
        return
    if p < settings.partitions:
        raise PartitionRetired(
            f"partition {p} of {queue!r} is retiring (the queue shrinks to {live} partitions): it takes no "
            "new writes until every group has consumed it; retry",
            partitions=live,
            retiring=True,
        )
    if was_retired(settings, p):
        raise PartitionRetired(
            f"partition {p} of {queue!r} was removed by shrinking: the queue has {live} partitions, "
            f"its keys go to {p % live}",
            partitions=live,
            retiring=False,
        )


def priority_partition(queue: str, settings: QueueSettings, p: int, priority: int) -> int:
    """The log of partition ``p`` at priority level ``priority``."""
    if priority >= settings.priority_levels:
        raise BadParameter(f"queue {queue!r} has priority levels 0..{settings.priority_levels - 1}, not {priority}")
    if p >= settings.partitions:
        raise UnknownPartition(f"queue {queue!r} has partitions 0..{settings.partitions - 1}, not {p}")
    return priority * settings.partitions + p


def due_ms(params: Mapping[str, Any], now_ms: int) -> int | None:
    """When a delayed request is due, or None to append it now (no delay, or one already past)."""
    delay, at = params["delay_ms"], params["deliver_at_ms"]
    if delay is None and at is None:
        return None
    if delay is not None and at is not None:
        raise BadParameter("PRODUCE takes delay_ms or deliver_at_ms, not both")
    due = now_ms + delay if delay is not None else at
    return due if due > now_ms else None


def check_capacity(broker: Broker, queue: str, settings: QueueSettings, records: int, nbytes: int) -> None:
    if not settings.max_messages and not settings.max_bytes:
        return
    logs = [broker.store.partition(queue, i) for i in range(settings.log_partitions)]
    held = sum(pl.next_offset - pl.log_start_offset for pl in logs)
    size = sum(pl.size_bytes for pl in logs)
    if settings.max_messages and held + records > settings.max_messages:
        if settings.overflow != "dead_letter_oldest":
            raise QueueFull(full_message(queue, "max_messages", settings.max_messages, held, records, "message"))
        if records > settings.max_messages:
            raise QueueFull(
                f"queue {queue!r}: this request has {records} messages, more than its max_messages "
                f"{settings.max_messages} even with every older one dead-lettered"
            )
        make_room(broker, queue, settings, held + records - settings.max_messages)
    if settings.max_bytes and size + nbytes > settings.max_bytes:
        raise QueueFull(full_message(queue, "max_bytes", settings.max_bytes, size, nbytes, "byte"))


def full_message(queue: str, limit: str, most: int, held: int, wanted: int, unit: str) -> str:
    """QUEUE_FULL's text: the limit, what is stored, the room left and what the request needs."""
    room = max(0, most - held)
    return (
        f"queue {queue!r} is full: {limit} {most}, {held} {unit}s stored, room for {room}, "
        f"this request has {wanted} (overflow = reject; see --overflow dead_letter_oldest)"
    )


def make_room(broker: Broker, queue: str, settings: QueueSettings, need: int) -> None:
    """Overflow policy ``dead_letter_oldest``: move the oldest ``need`` messages (by append order per
    partition, the fullest partition first) to the dead-letter queue with reason ``overflow``, no
    more: the log start may stop inside a batch (readers skip the records before it).
    Consumers past them skip ahead."""
    dlq = settings.dead_letter_queue or queue + ".dlq"
    if dlq == queue:
        raise QueueFull(f"queue {queue!r} is full and is its own dead-letter queue")
    now = broker._now_ms
    while need > 0:
        p = max(range(settings.log_partitions), key=lambda i: broker.store.partition(queue, i).message_count)
        plog = broker.store.partition(queue, p)
        start = plog.log_start_offset
        upto = broker.visible(queue, p, start)
        data = plog.read(start, 4 * 1024 * 1024) if start < upto else b""
        records: list[tuple[int, bytes, bytes | None, dict[str, bytes], int]] = []
        end = start
        for pos, h in iter_batches(data):
            if h.base_offset >= upto or need <= 0:
                break
            taken = [r for r in records_of(data, pos) if r[0] >= start][:need]  # the log may start mid-batch
            if taken:
                records += taken
                end = taken[-1][0] + 1
                need -= len(taken)
        if end == start:
            raise QueueFull(f"queue {queue!r} is full and its oldest messages are not durable yet; retry")
        extra = {
            "x-dlq-source": queue.encode(),
            "x-dlq-partition": b"%d" % p,
            "x-dlq-reason": b"overflow",
            "x-dlq-receive-count": b"0",
            "x-dlq-time-ms": b"%d" % now,
        }
        broker.shared.append_records(dlq, settings, records, extra, now)
        broker.notices.note(
            now,
            ("dead-letter", queue, "overflow"),
            len(records),
            f"dead-lettered {{n}} message(s) of {queue!r} to {dlq!r} (reason overflow: max_messages)",
        )
        plog.advance_start(end)
        broker.on_trimmed(queue, p, end)
