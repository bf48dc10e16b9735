"""The producer's unit of work: an open or sealed batch, and the futures that point into it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from fabric.errors import BadParameter, FabricError, Timeout
from fabric.protocol.batch import HEADER_SIZE

if TYPE_CHECKING:
    from fabric.client.producer import Producer


class RecordMetadata(NamedTuple):
    queue: str
    partition: int
    offset: int | None  # None with acks="none"


Callback = Callable[[RecordMetadata | None, FabricError | None], None]


class Batch:
    __slots__ = (
        "attempts",
        "callbacks",
        "created",
        "eager",
        "encoded",
        "error",
        "finished",
        "headers",
        "keys",
        "last_index",
        "limit",
        "max_message",
        "nbytes",
        "offset",
        "owner",
        "partition",
        "queue",
        "sent_at",
        "sequence",
        "timestamps",
        "values",
    )

    def __init__(
        self, owner: Producer, queue: str, partition: int, created: float, limit: int, max_message: int
    ) -> None:
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
        self.callbacks: list[tuple[int, Callback]] | None = None
        self.nbytes = HEADER_SIZE
        self.created = created
        self.encoded: bytes | None = None  # kept for retries of an idempotent producer
        self.eager = False  # due to be sent, but its partition's window is full: it keeps filling
        self.attempts = 0
        self.sequence = -1
        self.sent_at = 0.0
        self.offset: int | None = None
        self.error: FabricError | None = None
        self.finished = False


class RecordFuture:
    """The outcome of one ``send()``: ``result()`` gives its RecordMetadata or raises."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: Batch, index: int) -> None:
        self._batch = batch
        self._index = index

    def done(self) -> bool:
        return self._batch.finished

    def result(self, timeout: float | None = None) -> RecordMetadata:
        b = self._batch
        if not b.finished and not b.owner._await(b, timeout):
            raise Timeout(f"send to {b.queue}/{b.partition} not acknowledged within {timeout} s")
        if b.error is not None:
            raise b.error
        offset = None if b.offset is None else b.offset + self._index
        return RecordMetadata(b.queue, b.partition, offset)


def as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise BadParameter(f"{what} must be bytes or str, got {type(value).__name__}")
