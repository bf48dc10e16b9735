"""A follower's copy of a partition's log: the leader's batches appended as they are, and the
suffix the leader never had cut off.

The leader's batches are appended byte for byte, keeping the leader's offsets and leader epochs
(the store does not assign offsets on a follower); a batch whose base offset is not this log's
end stops the append (the next fetch asks again from the end). Producer-id state is recorded
from the appended batches, so an idempotent producer carries on after a failover; the epoch
cache learns each batch's epoch and is saved when it changes. A *diverging* answer (KIP-279/320)
truncates the log and the producer states to the offset the leader-epoch rule gives. What this
means for the high watermark, the delayed rows and the fetching is the replication's
(``fabric.node.replication``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fabric.cluster.epochs import LeaderEpochCache
from fabric.protocol.batch import iter_batches, parse_header
from fabric.store.flusher import Flusher
from fabric.store.log import PartitionLog
from fabric.store.store import Store

log = logging.getLogger("fabric.replication")


def truncate_copy(store: Store, plog: PartitionLog, queue: str, p: int, cut: int, now_ms: int) -> None:
    """Cut the log and its producer states back to ``cut`` (below the log end)."""
    log.warning(
        "%s/%d: truncating %d record(s) the leader does not have (from %d)",
        queue,
        p,
        plog.next_offset - cut,
        cut,
    )
    plog.truncate_to(cut)
    store.producer_states(queue, p, now_ms).truncate(cut)


def reset_copy(store: Store, plog: PartitionLog, queue: str, p: int, start: int, now_ms: int) -> None:
    """Empty the log and its producer states and start the log at ``start`` (the leader's log start,
    past this copy's end)."""
    log.warning(
        "%s/%d: this copy ends at %d, below the leader's log start %d: starting it there",
        queue,
        p,
        plog.next_offset,
        start,
    )
    plog.reset_to(start, now_ms)
    store.producer_states(queue, p, now_ms).truncate(0)


def append_copy(
    store: Store,
    flusher: Flusher,
    plog: PartitionLog,
    queue: str,
    p: int,
    data: bytes | bytearray | memoryview,
    epochs: LeaderEpochCache,
    now_ms: int,
    save_epochs: Callable[[PartitionLog, LeaderEpochCache], None],
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Append the batches of a fetch answer; ask for the flush the queue's fsync policy wants.
    Returns each appended batch's (leader epoch, base offset), and (offset, row id) of the
    delayed batches among them (the leader appended them: the follower's rows are done)."""
    batch_epochs: list[tuple[int, int]] = []
    marks: list[tuple[int, int]] = []
    buf = bytearray(data)
    states = None
    for pos, h in iter_batches(buf):
        if h.base_offset != plog.next_offset:
            log.error(
                "%s/%d: leader sent offset %d, log ends at %d; refetching",
                queue,
                p,
                h.base_offset,
                plog.next_offset,
            )
            break
        one = bytearray(buf[pos : pos + h.size])
        plog.append(one, parse_header(one), now_ms=now_ms, leader_epoch=h.leader_epoch)
        if h.producer_id < -1:  # a delayed batch the leader appended: our row of it is done
            marks.append((h.base_offset, -2 - h.producer_id))
        elif h.producer_id >= 0:
            states = states or store.producer_states(queue, p, now_ms)
            states.record(
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.record_count,
                h.base_offset,
                now_ms,
            )
        if epochs.assign(h.leader_epoch, h.base_offset):
            save_epochs(plog, epochs)
        batch_epochs.append((h.leader_epoch, h.base_offset))
    settings = store.settings(queue)
    if settings.fsync == "always":
        flusher.request(plog, background=True)  # the acks wait for our next fetch, not for this
    elif settings.fsync == "interval":
        flusher.request_interval(plog, settings.fsync_interval_ms)
    return batch_epochs, marks
