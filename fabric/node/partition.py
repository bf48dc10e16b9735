"""One partition a node holds: its log, what its consumers may see of it, its ordering state.

Theory of operation
-------------------
``Broker.partitions[(queue, p)]`` holds one ``NodePartition`` per partition log of every queue
the node's store holds (a queue with priority levels has one per level's log). It is made when
the queue is created or grows and closed when the queue is deleted.

The *visible* offset bounds what FETCH, the pusher and LIST_OFFSETS give consumers: records
below it are durable as the queue's fsync policy asks (and, on a replicated partition, below the
high watermark of its in-sync replicas). It moves in two places only, each checking its rule:

* :meth:`advance` moves it forward, never backwards and never past the log end;
* :meth:`truncate` sets it at or below the log end: a follower whose log was cut back to the
  leader's, or a replica starting from its checkpointed high watermark.

A rule broken is a bug in the node, not bad input: an ``AssertionError`` names the partition
and both offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fabric.protocol import frames as fr
    from fabric.store.log import PartitionLog


@dataclass(slots=True)
class HeldRequest:
    """A PRODUCE to a strict-ordering partition whose records are held (``fabric.node.ordering``)."""

    client: bytes
    header: fr.Header
    reply: bool
    offsets: list[list[int]]  # per batch, per record: offset, or -1 (late)
    left: int  # records not placed yet


@dataclass(order=True, slots=True)
class HeldRecord:
    hlc: int
    arrival: int
    record: tuple[bytes, bytes | None, dict[str, bytes], int] = field(compare=False)  # value, key, headers, ts
    request: HeldRequest = field(compare=False)
    batch: int = field(compare=False)
    index: int = field(compare=False)


@dataclass(slots=True)
class PartitionOrdering:
    """A strict-ordering partition's state: records held until their clock's window has passed."""

    held: list[HeldRecord] = field(default_factory=list)  # a heap by (clock, arrival)
    last: int = -1  # the clock of the last record appended
    retry_at_ms: int = 0  # its .late queue was not ready: look again then


class NodePartition:
    __slots__ = ("log", "ordering", "partition", "queue", "visible")

    def __init__(self, queue: str, partition: int, log: PartitionLog, visible: int) -> None:
        self.queue = queue
        self.partition = partition
        self.log = log
        self.ordering: PartitionOrdering | None = None  # a strict-ordering queue's held records
        assert 0 <= visible <= log.next_offset, f"{queue}/{partition}: visible {visible} past the log end"
        self.visible = visible

    def __repr__(self) -> str:
        return f"NodePartition({self.queue!r}, {self.partition}, visible={self.visible}, end={self.log.next_offset})"

    def advance(self, upto: int) -> None:
        """Consumers may now see the records below ``upto``: at or past what they saw, at most
        the log end."""
        assert self.visible <= upto <= self.log.next_offset, (
            f"{self.queue}/{self.partition}: visible offset {self.visible} cannot advance to {upto} "
            f"(log end {self.log.next_offset})"
        )
        self.visible = upto

    def advance_to(self, upto: int) -> bool:
        """:meth:`advance` if ``upto`` is past the visible offset; True if it moved."""
        if upto <= self.visible:
            return False
        self.advance(upto)
        return True

    def truncate(self, upto: int) -> None:
        """Consumers see the records below ``upto`` only, at most the log end (a follower's log
        cut back, a replica starting from its checkpointed high watermark)."""
        assert 0 <= upto <= self.log.next_offset, (
            f"{self.queue}/{self.partition}: visible offset cannot be {upto}, past the log end {self.log.next_offset}"
        )
        self.visible = upto
