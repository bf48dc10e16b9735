"""Delayed batches on replicated partitions: delay ids, and what a follower may drop. Pure.

Theory of operation
-------------------
In a cluster a delayed batch waits in the delay store of **every** replica of its partition,
not only in the leader's. The leader that takes it gives it a *delay id* unique in the
partition (``make_delay_id``: its leader epoch in the high 31 bits, a counter of the batches
it took in that epoch below; one process leads an epoch, so ids never repeat), stamps the id
into the batch (``fabric.protocol.batch.stamp_delay_id``: ``producer_id = -2 - id``) and
sends the row to its followers with their REPLICA_FETCH replies. Only the leader appends a
due batch; the appended batch carries the id in its header, and the followers, copying the
log byte for byte, learn from it that the batch is delivered.

A follower must not drop its row at that moment: the append may still be truncated away (the
leader dies before the ISR has it, and a new leader never had it). ``AppendedDelays`` keeps,
per partition, the rows whose append the follower has in its log, with the offset, and says
which to drop once the high watermark passes them (every in-sync replica has the append, so
every later leader does) and which to keep again when the log is truncated below them. A
follower that becomes leader drops every marked row below its log end (a leader never
truncates) and keeps the others as waiting rows.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable

EPOCH_SHIFT = 32
_COUNTER_MASK = 2**EPOCH_SHIFT - 1
COUNTER_MAX = _COUNTER_MASK - 1  # so that the largest id fits a batch header (batch.DELAY_ID_MAX)
EPOCH_MAX = 2**31 - 1


def make_delay_id(leader_epoch: int, n: int) -> int:
    """The ``n``-th delay id of ``leader_epoch`` (both non-negative, within range)."""
    if not 0 <= leader_epoch <= EPOCH_MAX or not 0 <= n <= COUNTER_MAX:
        raise ValueError(f"delay id of epoch {leader_epoch}, counter {n}: out of range")
    return leader_epoch << EPOCH_SHIFT | n


def split_delay_id(delay_id: int) -> tuple[int, int]:
    """(leader epoch, counter) of a delay id."""
    return delay_id >> EPOCH_SHIFT, delay_id & _COUNTER_MASK


class DelayIds:
    """The delay ids one leader gives out in one leader epoch, for one partition.

    ``highest`` is the largest delay id the partition's delay store holds (None: none); when it
    belongs to this epoch (the same node leading again in one epoch cannot happen, but the
    store is the truth), counting goes on after it."""

    def __init__(self, leader_epoch: int, highest: int | None = None) -> None:
        make_delay_id(leader_epoch, 0)  # range check
        self.leader_epoch = leader_epoch
        self._next = 0
        if highest is not None:
            epoch, n = split_delay_id(highest)
            if epoch == leader_epoch:
                self._next = n + 1

    def take(self, count: int) -> list[int]:
        """``count`` fresh ids in increasing order; ValueError when the epoch has no more."""
        if count < 0 or self._next + count - 1 > COUNTER_MAX:
            raise ValueError(
                f"leader epoch {self.leader_epoch} has given out {self._next} delay ids; no room for {count} more"
            )
        first = self._next
        self._next += count
        return [make_delay_id(self.leader_epoch, n) for n in range(first, first + count)]


class AppendedDelays:
    """A follower's rows whose append it has replicated: ``(offset, delay id)``, kept until the
    high watermark passes the offset (then the row goes) or the log is truncated below it (then
    the row waits again)."""

    def __init__(self, marks: Iterable[tuple[int, int]] = ()) -> None:
        self._marks: list[tuple[int, int]] = sorted(marks)

    def __len__(self) -> int:
        return len(self._marks)

    def __bool__(self) -> bool:
        return bool(self._marks)

    @property
    def lowest(self) -> int | None:
        """The lowest offset marked (None: nothing marked)."""
        return self._marks[0][0] if self._marks else None

    def add(self, offset: int, delay_id: int) -> None:
        """The batch at ``offset`` in this replica's log is the append of row ``delay_id``."""
        if offset < 0:
            raise ValueError(f"offset {offset} < 0")
        insort(self._marks, (offset, delay_id))

    def committed(self, high_watermark: int) -> list[int]:
        """Rows whose append is below ``high_watermark`` (on every in-sync replica): to drop."""
        n = 0
        while n < len(self._marks) and self._marks[n][0] < high_watermark:
            n += 1
        done, self._marks = self._marks[:n], self._marks[n:]
        return [d for _, d in done]

    def truncated(self, cut: int) -> list[int]:
        """The log was cut back to ``cut``: rows appended at or after it wait again."""
        n = len(self._marks)
        while n > 0 and self._marks[n - 1][0] >= cut:
            n -= 1
        undone, self._marks = self._marks[n:], self._marks[:n]
        return [d for _, d in undone]
