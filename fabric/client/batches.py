"""The producer's unit of work: an open or sealed batch, and the futures that point into it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from typing import Any, NamedTuple, Protocol, overload

import msgspec

from fabric.errors import BadParameter, FabricError, Timeout
from fabric.protocol.batch import HEADER_SIZE

TIMESTAMP_SPAN_MS = 0xFFFFFFFF // 2  # keep a batch's timestamps well inside its u32 delta column


class RecordMetadata(NamedTuple):
    queue: str
    partition: int  # the partition log it went to (with priorities: level * partitions + partition)
    offset: int | None  # None with acks="none", for a delayed message and for a duplicate
    duplicate: bool = False  # dropped: the queue's dedup window had seen its dedup id
    delayed_until_ms: int | None = None  # parked by the node until then (node clock, ms since the epoch)
    late: bool = False  # strict ordering: it arrived after its window; it went to <queue>.late


Callback = Callable[[RecordMetadata | None, FabricError | None], None]


class Owner(Protocol):
    """What a batch asks of the producer it belongs to (the Producer is one)."""

    def await_batch(self, b: Batch, timeout: float | None) -> bool:
        """Block until ``b`` completes; False on timeout."""
        ...

    def partition_count(self, queue: str) -> int:
        """The queue's partitions as the producer knows them now (a log partition of a
        priority level is ``level * partitions + partition``)."""
        ...


class Batch:
    __slots__ = (
        "attempts",
        "callbacks",
        "created",
        "dedup_ids",
        "delayed_until",
        "duplicates",
        "eager",
        "encoded",
        "error",
        "finished",
        "gen",
        "headers",
        "ident",
        "inflight",
        "keys",
        "last_index",
        "limit",
        "max_message",
        "nbytes",
        "offset",
        "owner",
        "partition",
        "props",
        "queue",
        "record_offsets",
        "refused_at",
        "retry_at",
        "sent_at",
        "sent_no",
        "sequence",
        "serial",
        "settled",
        "strict",
        "timestamps",
        "tries",
        "unknown",
        "values",
    )

    def __init__(self, owner: Owner, queue: str, partition: int, created: float, limit: int, max_message: int) -> None:
        self.owner = owner
        self.queue = queue
        self.limit = limit
        self.max_message = max_message
        self.last_index = 0
        self.partition = partition
        self.values: list[bytes] = []
        self.keys: list[bytes | None] | None = None
        self.headers: list[dict[str, bytes] | None] | None = None
        self.timestamps: list[int] | None = None
        self.callbacks: list[tuple[int, int, Callback]] | None = None  # (first index, values, callback)
        self.nbytes = HEADER_SIZE
        self.created = created
        self.encoded: bytes | bytearray | None = None  # kept for retries of an idempotent producer
        self.eager = False  # due to be sent, but its partition's window is full: it keeps filling
        self.attempts = 0  # times sent
        self.tries = 0  # retries counted against the producer's ``retries`` (refusals, request timeouts)
        self.serial = 0  # order of sealing: batches go (and go again) in this order
        self.sent_at = 0.0
        self.gen = 0  # the connection generation it was last sent on
        # the idempotent producer's sequence bookkeeping (fabric.client.inflight.Entry)
        self.ident: tuple[int, int] | None = None
        self.sequence = -1
        self.inflight = False
        self.settled = False
        self.unknown = False
        self.sent_no = 0
        self.refused_at = -1
        self.retry_at = 0.0
        self.offset: int | None = None
        self.error: FabricError | None = None
        self.finished = False
        # message properties: (delay_ms, deliver_at_ms, ttl_ms, priority) shared by every record, or None
        self.props: tuple[int | None, int | None, int | None, int | None] | None = None
        self.dedup_ids: list[str | None] | None = None
        self.duplicates: list[int] = []  # record indexes the node dropped as duplicates
        self.delayed_until: int | None = None
        self.strict = False  # to a queue ordered by the producers' clocks
        self.record_offsets: list[int] | None = None  # strict: each record's offset (-1: late)

    @property
    def unsequenced(self) -> bool:
        """Sent without a producer id: delayed, strictly ordered and dedup-id batches."""
        if self.strict or self.dedup_ids is not None:
            return True
        return self.props is not None and (self.props[0], self.props[1]) != (None, None)

    @property
    def log_partition(self) -> int:
        if self.props is not None and self.props[3] is not None:
            return self.props[3] * self.owner.partition_count(self.queue) + self.partition
        return self.partition


class RecordFuture(msgspec.Struct, gc=False, eq=False):
    """The outcome of one ``send()``: ``result()`` gives its RecordMetadata or raises.

    A ``msgspec.Struct`` (two fields, made in C: ~60 ns against ~170-260 ns for a ``__slots__``
    class with an ``__init__``; one is made per ``send()``), not tracked by the cyclic collector
    (its batch never refers back to it)."""

    _batch: Batch
    _index: int

    def __eq__(self, other: object) -> bool:
        """Two futures of the same record are equal (``send_many``'s are made when asked for)."""
        if type(other) is not RecordFuture:
            return NotImplemented
        return self._batch is other._batch and self._index == other._index

    def __hash__(self) -> int:
        return hash((id(self._batch), self._index))

    def __repr__(self) -> str:
        b = self._batch
        return f"<RecordFuture {b.queue}/{b.partition} #{self._index} {'done' if b.finished else 'pending'}>"

    def done(self) -> bool:
        return self._batch.finished

    def result(self, timeout: float | None = None) -> RecordMetadata:
        b = self._batch
        if not b.finished and not b.owner.await_batch(b, timeout):
            raise Timeout(f"send to {b.queue}/{b.partition} not acknowledged within {timeout} s")
        if b.error is not None:
            raise b.error
        if b.props is None and b.dedup_ids is None and not b.strict:
            return RecordMetadata(b.queue, b.partition, None if b.offset is None else b.offset + self._index)
        i = self._index
        if b.record_offsets is not None:
            off = b.record_offsets[i]
            return RecordMetadata(b.queue, b.log_partition, off if off >= 0 else None, late=off < 0)
        if i in b.duplicates:
            return RecordMetadata(b.queue, b.log_partition, None, duplicate=True)
        if b.offset is None or b.offset < 0:
            return RecordMetadata(b.queue, b.log_partition, None, delayed_until_ms=b.delayed_until)
        offset = b.offset + i - sum(1 for d in b.duplicates if d < i)
        return RecordMetadata(b.queue, b.log_partition, offset)


class Futures(Sequence[RecordFuture]):
    """``send_many``'s futures, one per value in order: a read-only sequence (index, slice,
    iterate, ``len``) whose RecordFutures are made when asked for. It holds one (batch, first
    index, count) run per batch the values went into, so a bulk send does no per-value work for
    futures its caller never looks at. Equal to a list of the same futures."""

    __slots__ = ("_len", "_runs")

    def __init__(self) -> None:
        self._runs: list[tuple[Batch, int, int]] = []  # (batch, index in it of the first, count)
        self._len = 0

    def _add(self, batch: Batch, first: int, count: int) -> None:
        runs = self._runs
        if runs and runs[-1][0] is batch and runs[-1][1] + runs[-1][2] == first:
            runs[-1] = (batch, runs[-1][1], runs[-1][2] + count)
        else:
            runs.append((batch, first, count))
        self._len += count

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[RecordFuture]:
        for b, first, k in self._runs:
            yield from map(RecordFuture, repeat(b, k), range(first, first + k))

    @overload
    def __getitem__(self, i: int) -> RecordFuture: ...

    @overload
    def __getitem__(self, i: slice) -> list[RecordFuture]: ...

    def __getitem__(self, i: int | slice) -> RecordFuture | list[RecordFuture]:
        if isinstance(i, slice):
            return list(self)[i]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError("send_many future index out of range")
        for b, first, k in self._runs:
            if i < k:
                return RecordFuture(b, first + i)
            i -= k
        raise AssertionError("unreachable")  # pragma: no cover

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Futures | list | tuple):
            return len(other) == self._len and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Futures of {self._len} sends>"


def as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise BadParameter(f"{what} must be bytes or str, got {type(value).__name__}")


def fits_span(b: Batch, timestamp_ms: int | None) -> bool:
    """Whether a record stamped ``timestamp_ms`` (None: now) keeps ``b``'s timestamps within
    TIMESTAMP_SPAN_MS of each other."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    stamps = b.timestamps or [int(time.time() * 1000)]
    return max(stamps[-1], ts) - min(stamps[0], ts) < TIMESTAMP_SPAN_MS and abs(ts - stamps[0]) < TIMESTAMP_SPAN_MS
