"""The producer: batching by linger_ms and batch_bytes, optional lz4, async sends.

Theory of operation
-------------------
``send()`` appends the message to the open batch of its (queue, partition) and
returns a :class:`RecordFuture` at once. A batch is sealed when it reaches
``batch_bytes`` (or ``batch_messages``), when it is ``linger_ms`` old, or on
``flush()``. Sealed batches go to one background I/O thread that owns the DEALER
socket: it encodes each batch once (columnar record batch, lz4 if asked), keeps
at most ``max_in_flight`` PRODUCE requests outstanding, and completes futures and
callbacks from the replies. With ``acks="none"`` nothing is awaited and futures
complete as soon as the batch is written to the socket.

Partitioning: a keyed message goes to ``crc32c(key) % partitions`` (stable across
clients and restarts); unkeyed messages stick to one partition until its batch
seals, then move round-robin to the next (sticky partitioning: full batches,
even spread).

Back-pressure: at most ``buffer_bytes`` may wait in sealed or in-flight batches;
a ``send()`` that would exceed it blocks up to ``max_block_ms``, then raises
``Timeout``. Nothing is retried behind the caller's back (a retry without the
idempotent producer could store a batch twice); a request with no reply in
``request_timeout_ms`` fails its futures with ``Timeout``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

import zmq

from fabric.client.connection import Connection
from fabric.errors import BadParameter, FabricError, MessageTooLarge, Timeout, error_for_code
from fabric.protocol import frames as fr
from fabric.protocol.batch import CODECS, HEADER_SIZE, crc32c, encode_batch
from fabric.protocol.ops import ACKS, Op

log = logging.getLogger("fabric.producer")
NOBLOCK, EVENTS, POLLIN = int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)
TIMESTAMP_SPAN_MS = 0xFFFFFFFF // 2  # keep a batch's timestamps well inside its u32 delta column


class RecordMetadata(NamedTuple):
    queue: str
    partition: int
    offset: int | None  # None with acks="none"


Callback = Callable[[RecordMetadata | None, FabricError | None], None]


class _Batch:
    __slots__ = (
        "callbacks",
        "created",
        "done",
        "error",
        "headers",
        "keys",
        "last_index",
        "limit",
        "max_message",
        "nbytes",
        "offset",
        "partition",
        "queue",
        "sent_at",
        "timestamps",
        "values",
    )

    def __init__(self, queue: str, partition: int, created: float, limit: int, max_message: int) -> None:
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
        self.sent_at = 0.0
        self.offset: int | None = None
        self.error: FabricError | None = None
        self.done = threading.Event()


class RecordFuture:
    """The outcome of one ``send()``: ``result()`` gives its RecordMetadata or raises."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: _Batch, index: int) -> None:
        self._batch = batch
        self._index = index

    def done(self) -> bool:
        return self._batch.done.is_set()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        b = self._batch
        if not b.done.wait(timeout):
            raise Timeout(f"send to {b.queue}/{b.partition} not acknowledged within {timeout} s")
        if b.error is not None:
            raise b.error
        offset = None if b.offset is None else b.offset + self._index
        return RecordMetadata(b.queue, b.partition, offset)


def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise BadParameter(f"{what} must be bytes or str, got {type(value).__name__}")


class Producer:
    def __init__(
        self,
        endpoint: str | None = None,
        *,
        acks: str = "leader",
        linger_ms: float = 5,
        batch_bytes: int = 256 * 1024,
        batch_messages: int = 100_000,
        compression: str = "none",
        max_in_flight: int = 32,
        buffer_bytes: int = 64 * 1024 * 1024,
        max_block_ms: int = 60_000,
        request_timeout_ms: int = 30_000,
    ) -> None:
        if acks not in ACKS:
            raise BadParameter(f"acks must be one of {', '.join(ACKS)}, got {acks!r}")
        if compression not in CODECS:
            raise BadParameter(f"compression must be one of {', '.join(CODECS)}, got {compression!r}")
        if linger_ms < 0 or batch_bytes < 1 or max_in_flight < 1 or batch_messages < 1:
            raise BadParameter("linger_ms >= 0, batch_bytes >= 1, batch_messages >= 1 and max_in_flight >= 1")
        self.endpoint = endpoint
        self.acks = acks
        self.linger_s = linger_ms / 1000
        self.batch_bytes = batch_bytes
        self.batch_messages = batch_messages
        self.codec = CODECS[compression]
        self.max_in_flight = max_in_flight
        self.buffer_bytes = buffer_bytes
        self.max_block_s = max_block_ms / 1000
        self.request_timeout_s = request_timeout_ms / 1000
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._open: dict[tuple[str, int], _Batch] = {}
        self._plain: dict[str, _Batch] = {}  # queue -> open batch of its sticky partition, values only
        self._sticky: dict[str, int] = {}
        self._ready: deque[_Batch] = deque()
        self._buffered = 0
        self._unfinished = 0
        self._closed = False
        self._queues: dict[str, tuple[int, int, int]] = {}  # name -> (partitions, max msg, max batch)
        self._meta_lock = threading.Lock()
        self._meta_conn: Connection | None = None
        self._flags = fr.FLAG_NO_REPLY if acks == "none" else 0
        ctx: zmq.Context = zmq.Context.instance()
        addr = f"inproc://fabric-producer-{id(self)}"
        self._wake_rx = ctx.socket(zmq.PAIR)
        self._wake_rx.bind(addr)
        self._wake_tx = ctx.socket(zmq.PAIR)
        self._wake_tx.connect(addr)
        self._conn = Connection(endpoint, timeout_ms=request_timeout_ms)
        self._thread = threading.Thread(target=self._io_loop, name="fabric-producer-io", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ caller side

    def send(
        self,
        queue: str,
        value: bytes | str,
        *,
        key: bytes | str | None = None,
        headers: dict[str, bytes | str] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        callback: Callback | None = None,
    ) -> RecordFuture:
        """Queue one message for sending; returns at once with a future."""
        if key is None and headers is None and partition is None and timestamp_ms is None and callback is None:
            # Fast path: a plain value into the open batch of the queue's sticky partition.
            # Per message: one lock, one append, one addition, one comparison.
            with self._lock:
                b = self._plain.get(queue)
                if b is not None and type(value) is bytes and len(value) <= b.max_message:
                    values = b.values
                    i = len(values)
                    values.append(value)
                    b.nbytes += len(value) + 4
                    if b.nbytes >= b.limit or i >= b.last_index:
                        self._seal(b)
                    return RecordFuture(b, i)
        return self._send_general(queue, value, key, headers, partition, timestamp_ms, callback)

    def _send_general(
        self,
        queue: str,
        value: bytes | str,
        key: bytes | str | None,
        headers: dict[str, bytes | str] | None,
        partition: int | None,
        timestamp_ms: int | None,
        callback: Callback | None,
    ) -> RecordFuture:
        if type(value) is not bytes:
            value = _as_bytes(value, "value")
        nparts, max_msg, max_batch = self._queues.get(queue) or self._describe(queue)
        size = len(value)
        if key is not None:
            key = _as_bytes(key, "key")
            size += len(key)
        hdrs = None
        if headers:
            hdrs = {str(k): _as_bytes(v, f"header {k!r}") for k, v in headers.items()}
            size += sum(len(k) + len(v) + 6 for k, v in hdrs.items())
        if size > max_msg:
            raise MessageTooLarge(f"message of {size} bytes exceeds queue {queue!r} max_message_bytes {max_msg}")
        if partition is not None and not 0 <= partition < nparts:
            raise BadParameter(f"queue {queue!r} has partitions 0..{nparts - 1}, not {partition}")
        with self._lock:
            if self._closed:
                raise FabricError("producer is closed")
            sticky = partition is None and key is None
            if partition is None:
                partition = crc32c(key) % nparts if key is not None else self._sticky.setdefault(queue, 0)
            b = self._open.get((queue, partition))
            if (
                b is not None
                and (timestamp_ms is not None or b.timestamps is not None)
                and not self._fits_span(b, timestamp_ms)
            ):
                self._seal(b)  # the batch's u32 timestamp-delta column cannot span this one
                b = None
            if b is None:
                limit = min(self.batch_bytes, max_batch - 4096)
                b = self._open[(queue, partition)] = _Batch(queue, partition, time.monotonic(), limit, max_msg)
                b.last_index = self.batch_messages - 1 if self.linger_s else 0
                if sticky:
                    self._plain[queue] = b
                if len(self._open) == 1:
                    self._wake_tx.send(b"")  # a linger deadline to watch
            i = len(b.values)
            b.values.append(value)
            b.nbytes += 4 + size
            if key is not None or b.keys is not None:
                if b.keys is None:
                    b.keys = [None] * i
                b.keys.append(key)
            if hdrs is not None or b.headers is not None:
                if b.headers is None:
                    b.headers = [None] * i
                b.headers.append(hdrs)
            if timestamp_ms is not None or b.timestamps is not None:
                if b.timestamps is None:
                    b.timestamps = [int(time.time() * 1000)] * i
                b.timestamps.append(timestamp_ms if timestamp_ms is not None else int(time.time() * 1000))
            if callback is not None:
                if b.callbacks is None:
                    b.callbacks = []
                b.callbacks.append((i, callback))
            if self._plain.get(queue) is b and (
                b.keys is not None or b.headers is not None or b.timestamps is not None
            ):
                del self._plain[queue]  # columns beyond values: only the general path may add to it now
            if b.nbytes >= b.limit or i >= b.last_index:
                self._seal(b)
        return RecordFuture(b, i)

    @staticmethod
    def _fits_span(b: _Batch, timestamp_ms: int | None) -> bool:
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        stamps = b.timestamps or [int(time.time() * 1000)]
        return max(stamps[-1], ts) - min(stamps[0], ts) < TIMESTAMP_SPAN_MS and abs(ts - stamps[0]) < TIMESTAMP_SPAN_MS

    def flush(self, timeout: float | None = None) -> None:
        """Send every open batch and wait until all sent so far are acknowledged."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            for b in list(self._open.values()):
                self._seal(b)
            while self._unfinished:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise Timeout(f"flush: {self._unfinished} batches not acknowledged within {timeout} s")
                self._space.wait(left if left is not None else 0.5)

    def close(self, timeout: float | None = 30) -> None:
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            with self._lock:
                self._closed = True
                self._wake_tx.send(b"")
            self._thread.join(5)
            self._wake_tx.close(0)
            if self._meta_conn is not None:
                self._meta_conn.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _describe(self, queue: str) -> tuple[int, int, int]:
        with self._meta_lock:
            if queue not in self._queues:
                if self._meta_conn is None:
                    self._meta_conn = Connection(self.endpoint, timeout_ms=int(self.request_timeout_s * 1000))
                d = self._meta_conn.request(Op.DESCRIBE_QUEUE, {"name": queue}).params
                s = d["settings"]
                self._queues[queue] = (d["partitions"], s["max_message_bytes"], s["max_batch_bytes"])
            return self._queues[queue]

    # called with the lock held
    def _seal(self, b: _Batch) -> None:
        del self._open[(b.queue, b.partition)]
        if self._plain.get(b.queue) is b:
            del self._plain[b.queue]
        if b.keys is None and self._sticky.get(b.queue) == b.partition:
            self._sticky[b.queue] = (b.partition + 1) % self._queues[b.queue][0]
        self._ready.append(b)
        self._buffered += b.nbytes
        self._unfinished += 1
        self._wake_tx.send(b"")
        if self._buffered > self.buffer_bytes and threading.current_thread() is not self._thread:
            self._wait_for_space()

    def _wait_for_space(self) -> None:
        deadline = time.monotonic() + self.max_block_s
        while self._buffered > self.buffer_bytes:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"producer buffer full ({self._buffered} bytes) for {self.max_block_s} s")
            self._space.wait(left)

    # ------------------------------------------------------------------ I/O thread

    def _io_loop(self) -> None:
        conn = self._conn
        poller = zmq.Poller()
        poller.register(conn.sock, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        inflight: dict[int, _Batch] = {}
        try:
            while True:
                now = time.monotonic()
                timeout = self._next_deadline(now, inflight)
                events = dict(poller.poll(timeout))
                if self._wake_rx in events:
                    try:
                        while True:
                            self._wake_rx.recv(NOBLOCK)
                    except zmq.Again:
                        pass
                if conn.sock in events:
                    self._read_replies(conn, inflight)
                self._send_ready(conn, inflight)
                self._expire(inflight)
                with self._lock:
                    if self._closed and not self._open and not self._ready and not inflight:
                        return
        except Exception as exc:  # never leave callers waiting forever
            log.exception("producer I/O thread failed")
            err = exc if isinstance(exc, FabricError) else FabricError(f"producer I/O failed: {exc}")
            with self._lock:
                for b in list(self._open.values()):
                    self._seal(b)
                pending = list(inflight.values()) + list(self._ready)
                self._ready.clear()
                self._closed = True
            for b in pending:
                self._complete(b, None, err)
        finally:
            conn.close()
            self._wake_rx.close(0)

    def _next_deadline(self, now: float, inflight: dict[int, _Batch]) -> int:
        with self._lock:
            if self._ready and len(inflight) < self.max_in_flight:
                return 0
            due = [b.created + self.linger_s for b in self._open.values()]
        if inflight:
            due.append(min(b.sent_at for b in inflight.values()) + self.request_timeout_s)
        if not due:
            return 1000
        return max(0, int((min(due) - now) * 1000) + 1)

    def _send_ready(self, conn: Connection, inflight: dict[int, _Batch]) -> None:
        now = time.monotonic()
        with self._lock:
            for b in [b for b in self._open.values() if now - b.created >= self.linger_s]:
                self._seal(b)
        while len(inflight) < self.max_in_flight:
            with self._lock:
                if not self._ready:
                    return
                b = self._ready.popleft()
            try:
                batch = encode_batch(
                    b.values,
                    keys=b.keys,
                    headers=b.headers,
                    timestamps=b.timestamps,
                    first_timestamp=int((time.time() - (time.monotonic() - b.created)) * 1000),
                    max_timestamp=int(time.time() * 1000),
                    codec=self.codec,
                )
                params = {"queue": b.queue, "partition": b.partition, "acks": self.acks}
                rid = conn.send(Op.PRODUCE, params, [batch], flags=self._flags)
            except FabricError as exc:
                self._complete(b, None, exc)
                continue
            b.sent_at = time.monotonic()
            if self.acks == "none":
                self._complete(b, None, None)
            else:
                inflight[rid] = b

    def _read_replies(self, conn: Connection, inflight: dict[int, _Batch]) -> None:
        while conn.sock.getsockopt(EVENTS) & POLLIN:
            msg = conn.recv_nowait()
            if msg is None:
                return
            b = inflight.pop(msg.header.request_id, None)
            if b is None:
                continue
            if msg.header.status:
                self._complete(b, None, error_for_code(msg.header.status, str(msg.params.get("message", ""))))
            else:
                self._complete(b, msg.params["offsets"][0], None)

    def _expire(self, inflight: dict[int, _Batch]) -> None:
        if not inflight:
            return
        cutoff = time.monotonic() - self.request_timeout_s
        for rid in [r for r, b in inflight.items() if b.sent_at < cutoff]:
            b = inflight.pop(rid)
            self._complete(
                b, None, Timeout(f"no reply for a batch to {b.queue}/{b.partition} in {self.request_timeout_s} s")
            )

    def _complete(self, b: _Batch, offset: int | None, error: FabricError | None) -> None:
        b.offset = offset
        b.error = error
        b.done.set()
        with self._lock:
            self._buffered -= b.nbytes
            self._unfinished -= 1
            self._space.notify_all()
        if b.callbacks:
            for i, cb in b.callbacks:
                meta = None if error else RecordMetadata(b.queue, b.partition, None if offset is None else offset + i)
                try:
                    cb(meta, error)
                except Exception:
                    log.exception("producer callback raised")
