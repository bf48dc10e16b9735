"""The producer: batching by linger_ms and batch_bytes, optional lz4, async sends.

Theory of operation
-------------------
``send()`` appends the message to the open batch of its (queue, partition) and
returns a :class:`RecordFuture` at once. A batch is sealed when it reaches
``batch_bytes`` (or ``batch_messages``), when it is ``linger_ms`` old, or on
``flush()``. A sealed batch is encoded once (columnar record batch, lz4 if
asked) and sent at once by the thread that sealed it, when one of the
``max_in_flight`` request slots is free; a background thread handles what
linger releases, replies, and retries while the node is unreachable. With
``acks="none"`` nothing is awaited and futures complete as soon as the batch is
written to the socket.

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
import os
import select
import threading
import time
from collections import deque

import zmq

from fabric.client import properties, wire
from fabric.client.batches import Batch, Callback, RecordFuture, RecordMetadata, as_bytes
from fabric.client.connection import BaseConnection, connect
from fabric.client.inflight import Lane
from fabric.client.recovery import Recovery
from fabric.errors import BadParameter, FabricError, MessageTooLarge, Timeout, error_for_code
from fabric.protocol import frames as fr
from fabric.protocol.batch import CODECS, HEADER_SIZE, crc32c
from fabric.protocol.ops import ACKS, Op

log = logging.getLogger("fabric.producer")
NOBLOCK, EVENTS, POLLIN = int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)
COPY_BELOW = 64 * 1024
RETRY_S = 0.01  # how soon to retry sending while the node is unreachable
IDEMPOTENT_IN_FLIGHT_MAX = 5  # per partition; the node keeps the last 5 batches of each producer
HOT_S = 0.02  # after a caller sent, it drains replies itself for this long (the I/O thread sleeps)
TIMESTAMP_SPAN_MS = 0xFFFFFFFF // 2  # keep a batch's timestamps well inside its u32 delta column
PRODUCE = int(Op.PRODUCE)


class Producer(Recovery):
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
        idempotent: bool = True,
        retries: int = 5,
        delivery_timeout_ms: int = 120_000,
        name: str | None = None,
        retry_backoff_ms: int = 100,
        heartbeat_ms: int = 1000,
    ) -> None:
        if acks not in ACKS:
            raise BadParameter(f"acks must be one of {', '.join(ACKS)}, got {acks!r}")
        if compression not in CODECS:
            raise BadParameter(f"compression must be one of {', '.join(CODECS)}, got {compression!r}")
        if linger_ms < 0 or batch_bytes < 1 or max_in_flight < 1 or batch_messages < 1:
            raise BadParameter("linger_ms >= 0, batch_bytes >= 1, batch_messages >= 1 and max_in_flight >= 1")
        if retry_backoff_ms < 0 or heartbeat_ms < 1:
            raise BadParameter("retry_backoff_ms >= 0 and heartbeat_ms >= 1")
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
        # Idempotence needs replies; without it a retry could store a batch twice, so no retries.
        self.idempotent = idempotent and acks != "none"
        self.retries = retries if self.idempotent else 0
        self.delivery_timeout_s = max(delivery_timeout_ms, request_timeout_ms) / 1000
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.heartbeat_ms = heartbeat_ms
        self.name = name
        self.producer_id, self.epoch = -1, -1
        self.retried = 0  # batches sent again (idempotent: the node stores them once)
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._open: dict[tuple[str, int], Batch] = {}
        self._plain: dict[str, Batch] = {}  # queue -> open batch of its sticky partition, values only
        self._sticky: dict[str, int] = {}
        self._ready: deque[Batch] = deque()
        self._buffered = 0
        self._unfinished = 0
        self._closed = False
        self._queues: dict[str, tuple[int, int, int, int]] = {}  # name -> (partitions, max msg, max batch, levels)
        self._strict: set[str] = set()  # queues ordered by the producers' clocks: every record stamped
        self._meta_lock = threading.Lock()
        self._meta_conn: BaseConnection | None = None
        self._flags = fr.FLAG_NO_REPLY if acks == "none" else 0
        self._inflight: dict[int, Batch] = {}
        self._lanes: dict[tuple[str, int], Lane[Batch]] = {}  # idempotent: sequence state per (queue, log partition)
        self._serial = 0  # batches sealed so far: their order in _ready
        self._callbacks: list[Batch] = []
        self._waiters = 0  # threads blocked in result(), flush() or on buffer space
        self._hot_until = 0.0  # callers are sending: their own sends drain replies until then
        self._params_bytes: dict[
            tuple[str, int], bytes
        ] = {}  # completed batches whose callbacks are due (run unlocked)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._conn = connect(endpoint, timeout_ms=request_timeout_ms, heartbeat_ms=heartbeat_ms)
        self._init_recovery()
        self._thread = threading.Thread(target=self._io_loop, name="fabric-producer-io", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ caller side

    def send(
        self,
        queue: str,
        value: bytes | str,
        # not keyword-only: CPython fills positional defaults from a tuple, keyword-only ones by
        # a dict lookup each, which costs this hot path ~15%; pass them by keyword all the same
        key: bytes | str | None = None,
        headers: dict[str, bytes | str] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        callback: Callback | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        ttl_ms: int | None = None,
        priority: int | None = None,
        dedup_id: str | None = None,
    ) -> RecordFuture:
        """Queue one message for sending; returns at once with a future.

        ``delay_ms``/``deliver_at_ms``, ``ttl_ms``, ``priority`` and ``dedup_id`` are
        message properties: see :mod:`fabric.client.properties` for what each does.
        """
        if (
            key is None
            and headers is None
            and partition is None
            and timestamp_ms is None
            and callback is None
            and delay_ms is None
            and deliver_at_ms is None
            and ttl_ms is None
            and priority is None
            and dedup_id is None
        ):
            # Fast path: a plain value into the open batch of the queue's sticky partition.
            # Per message: one lock, one append, one addition, one comparison.
            with self._lock:
                b = self._plain.get(queue)
                if b is not None and type(value) is bytes and len(value) <= b.max_message:
                    values = b.values
                    i = len(values)
                    values.append(value)
                    b.nbytes += len(value) + 4
                    if b.nbytes < b.limit and i < b.last_index:
                        return RecordFuture(b, i)
                    self._seal(b)
                elif not self.linger_s and type(value) is bytes:
                    b, i = self._send_direct(queue, value), 0
                else:
                    b = None
            if b is not None:
                if self._callbacks:
                    self._run_callbacks()
                return RecordFuture(b, i)
            return self._send_general(queue, value, None, None, None, None, None)
        props, headers = properties.check(delay_ms, deliver_at_ms, ttl_ms, priority, dedup_id, headers)
        return self._send_general(queue, value, key, headers, partition, timestamp_ms, callback, props, dedup_id)

    def _send_general(
        self,
        queue: str,
        value: bytes | str,
        key: bytes | str | None,
        headers: dict[str, bytes | str] | None,
        partition: int | None,
        timestamp_ms: int | None,
        callback: Callback | None,
        props: tuple[int | None, int | None, int | None, int | None] | None = None,
        dedup_id: str | None = None,
    ) -> RecordFuture:
        if type(value) is not bytes:
            value = as_bytes(value, "value")
        nparts, max_msg, max_batch, levels = self._queues.get(queue) or self._describe(queue)
        size = len(value)
        if key is not None:
            key = as_bytes(key, "key")
            size += len(key)
        hdrs = None
        if headers:
            hdrs = {str(k): as_bytes(v, f"header {k!r}") for k, v in headers.items()}
            size += sum(len(k) + len(v) + 6 for k, v in hdrs.items())
        if size > max_msg:
            raise MessageTooLarge(f"message of {size} bytes exceeds queue {queue!r} max_message_bytes {max_msg}")
        if partition is not None and not 0 <= partition < nparts:
            raise BadParameter(f"queue {queue!r} has partitions 0..{nparts - 1}, not {partition}")
        if props is not None and props[3] is not None and props[3] >= levels:
            raise BadParameter(f"queue {queue!r} has priority levels 0..{levels - 1}, not {props[3]}")
        with self._lock:
            if self._closed:
                raise FabricError("producer is closed")
            sticky = partition is None and key is None
            if partition is None:
                partition = crc32c(key) % nparts if key is not None else self._sticky.setdefault(queue, 0)
            b = self._open.get((queue, partition))
            if b is not None and (b.props != props or (b.dedup_ids is None) != (dedup_id is None)):
                self._seal(b, force=True)  # one batch, one set of message properties
                b = None
            if (
                b is not None
                and (timestamp_ms is not None or b.timestamps is not None)
                and not self._fits_span(b, timestamp_ms)
            ):
                self._seal(b)  # the batch's u32 timestamp-delta column cannot span this one
                b = None
            if b is None:
                limit = min(self.batch_bytes, max_batch - 4096)
                b = self._open[(queue, partition)] = Batch(self, queue, partition, time.monotonic(), limit, max_msg)
                b.last_index = self.batch_messages - 1 if self.linger_s else 0
                b.props = props
                b.strict = queue in self._strict
                if dedup_id is not None:
                    b.dedup_ids = []
                if sticky and props is None and dedup_id is None and not b.strict:
                    self._plain[queue] = b
                if self.linger_s:
                    self._wake()  # a new linger deadline for the I/O thread to watch
            i = len(b.values)
            b.values.append(value)
            b.nbytes += 4 + size
            if b.dedup_ids is not None:
                b.dedup_ids.append(dedup_id)
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
        if self._callbacks:
            self._run_callbacks()
        return RecordFuture(b, i)

    @staticmethod
    def _fits_span(b: Batch, timestamp_ms: int | None) -> bool:
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        stamps = b.timestamps or [int(time.time() * 1000)]
        return max(stamps[-1], ts) - min(stamps[0], ts) < TIMESTAMP_SPAN_MS and abs(ts - stamps[0]) < TIMESTAMP_SPAN_MS

    def flush(self, timeout: float | None = None) -> None:
        """Send every open batch and wait until all sent so far are acknowledged."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            for b in list(self._open.values()):
                self._seal(b, force=True)
            self._waiters += 1
            self._wake()
            try:
                while self._unfinished:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise Timeout(f"flush: {self._unfinished} batches not acknowledged within {timeout} s")
                    self._space.wait(left if left is not None else 0.5)
            finally:
                self._waiters -= 1

    def close(self, timeout: float | None = 30) -> None:
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            with self._lock:
                self._closed = True
            self._wake()
            self._thread.join(5)
            os.close(self._wake_w)
            if self._meta_conn is not None:
                self._meta_conn.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _describe(self, queue: str) -> tuple[int, int, int, int]:
        with self._meta_lock:
            if queue not in self._queues:
                if self._meta_conn is None:
                    # metadata lookups are rare and synchronous: never shorter than 10 s
                    self._meta_conn = connect(self.endpoint, timeout_ms=max(10_000, int(self.request_timeout_s * 1000)))
                d = self._meta_conn.request(Op.DESCRIBE_QUEUE, {"name": queue}).params
                if self.idempotent and self.producer_id < 0:
                    ident = self._meta_conn.request(Op.INIT_PRODUCER, {"name": self.name}).params
                    self.producer_id, self.epoch = ident["producer_id"], ident["epoch"]
                s = d["settings"]
                self._queues[queue] = (
                    d["partitions"],
                    s["max_message_bytes"],
                    s["max_batch_bytes"],
                    s.get("priority_levels", 1),
                )
                if s.get("ordering") == "strict":
                    self._strict.add(queue)
            return self._queues[queue]

    # called with the lock held
    def _seal(self, b: Batch, *, force: bool = False, pump: bool = True) -> None:
        if (
            self.idempotent
            and not force
            and b.nbytes < b.limit
            and not b.unsequenced
            and not self._window_room(b.queue, b.log_partition)
        ):
            # Its partition already has a full window in flight: rather than queue a string of tiny
            # batches, keep this one open and filling; a reply that opens the window sends it.
            b.eager = True
            if pump:
                self._pump()  # replies waiting may open the window, and then this batch goes at once
            return
        del self._open[(b.queue, b.partition)]
        if self._plain.get(b.queue) is b:
            del self._plain[b.queue]
        if b.keys is None and self._sticky.get(b.queue) == b.partition:
            self._sticky[b.queue] = (b.partition + 1) % self._queues[b.queue][0]
        self._serial += 1
        b.serial = self._serial
        self._ready.append(b)
        self._buffered += b.nbytes
        self._unfinished += 1
        if not pump:
            return
        self._pump()
        if threading.current_thread() is not self._thread:
            self._hot_until = time.monotonic() + HOT_S
            if self._buffered > self.buffer_bytes:
                self._wait_for_space()

    def _wait_for_space(self) -> None:
        deadline = time.monotonic() + self.max_block_s
        self._waiters += 1
        self._wake()
        try:
            while self._buffered > self.buffer_bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(f"producer buffer full ({self._buffered} bytes) for {self.max_block_s} s")
                self._space.wait(left)
        finally:
            self._waiters -= 1

    def _await(self, b: Batch, timeout: float | None) -> bool:
        """Block until ``b`` completes (result()); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if b.finished:
                return True
            self._waiters += 1
            self._wake()
            try:
                while not b.finished:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._space.wait(left if left is not None else 1.0)
            finally:
                self._waiters -= 1
            return True

    # ------------------------------------------------------------------ socket I/O
    #
    # The DEALER socket is used under ``self._lock`` by whichever thread gets there:
    # a caller whose send() sealed a batch sends it at once (no hand-off between
    # threads: on a VM each wake-up of another thread costs ~100 us), and the
    # background thread sends what linger released or what waited for an in-flight
    # slot. The background thread sleeps on the socket's ZMQ_FD with an OS poll, which
    # is safe while another thread uses the socket. The FD is edge-like: any socket
    # operation may consume its signal, so every thread that touched the socket
    # checks ZMQ_EVENTS and drains replies before it lets go of the lock (_pump).

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # already awake, or closing

    def _pump(self) -> None:
        """Send ready batches while in-flight slots allow, then read every reply waiting. Lock held."""
        ready = self._ready
        conn = self._conn
        conn.flush()  # bytes a transport could not write at once go first
        if conn.generation() != self._gen:
            self._link_lost()
        if self._fenced is not None:
            self._fail_ready(self._fenced)
        now = time.monotonic()
        if self._resetting:
            self._request_identity(now)
        refused = False  # the transport could not take a batch (not connected): retry on a timer
        while ready and len(self._inflight) < self.max_in_flight:
            b = ready[0]
            if (self.idempotent or b.retry_at) and not self._sendable(b, now):
                found = self._next_sendable(now)
                if found is None:
                    break
                b = found
            try:
                sent = self._transmit(b)
            except FabricError as exc:
                ready.remove(b)
                self._complete(b, None, exc)
                continue
            if not sent:
                refused = True  # not connected (yet): the I/O thread retries, the delivery timeout bounds the wait
                break
            if b is ready[0]:
                ready.popleft()
            else:
                ready.remove(b)
        if self._read_replies() and self._ready and not refused:
            self._pump()
            return
        if refused and threading.current_thread() is not self._thread:
            self._wake()  # left unsent: let the I/O thread retry (a closed window waits for replies instead)

    def _send_direct(self, queue: str, value: bytes) -> Batch | None:
        """Lock held. ``linger_ms=0``: one plain value, nothing else waiting, a slot free: write it
        now as a batch of one, without the open/sealed/ready queues. None: the general path takes it."""
        meta = self._queues.get(queue)
        if (
            meta is None
            or len(value) > meta[1]
            or self._open
            or self._ready
            or self._closed
            or queue in self._strict
            or len(self._inflight) >= self.max_in_flight
            or self._buffered + HEADER_SIZE + 4 + len(value) > self.buffer_bytes
            or self._conn.pending_output()
            or self._fenced is not None
        ):
            return None
        partition = self._sticky.get(queue, 0)
        if self.idempotent:
            lane = self._lanes.get((queue, partition))
            if lane is not None and not lane.may_number():
                return None
        b = Batch(self, queue, partition, time.monotonic(), 0, meta[1])
        b.values.append(value)
        b.nbytes += 4 + len(value)
        self._buffered += b.nbytes
        self._unfinished += 1
        self._serial += 1
        b.serial = self._serial
        if meta[0] > 1:
            self._sticky[queue] = (partition + 1) % meta[0]
        try:
            sent = self._transmit(b)
        except FabricError as exc:
            self._complete(b, None, exc)
            return b
        if not sent:
            self._ready.append(b)  # not connected: the I/O thread retries it
            self._wake()
            return b
        if self._read_replies() and self._ready:
            self._pump()
        if threading.current_thread() is not self._thread:
            self._hot_until = b.sent_at + HOT_S
        return b

    def _transmit(self, b: Batch) -> bool:
        """Lock held: encode ``b`` (once; an idempotent producer numbers it first) and write it as
        one PRODUCE request; False when the transport cannot take it now. A batch that cannot be
        encoded raises FabricError."""
        lane = None
        if self.idempotent and not b.unsequenced:
            lane = self._lane(b)
            if b.ident is None:
                lane.number(b, len(b.values))
        try:
            batch = b.encoded or wire.encode(b, self.codec)
        except FabricError:
            if lane is not None:
                lane.take_back(b)
            raise
        conn = self._conn
        rid = conn.next_id()
        header = fr.HEADER.pack(fr.MAGIC, fr.VERSION, PRODUCE, self._flags, 0, 0, rid)
        if not conn.send_frames([header, wire.params(b, self.acks, self._params_bytes), batch], len(batch) < COPY_BELOW):
            if lane is not None:
                lane.take_back(b)  # numbered for nothing: the next number goes to whatever goes first
            return False
        b.sent_at = time.monotonic()
        b.attempts += 1
        b.gen = self._gen
        if self.acks == "none":
            self._complete(b, None, None)
        else:
            self._inflight[rid] = b
            if lane is not None:
                lane.sent(b)
        return True

    def _read_replies(self) -> bool:
        """Lock held: settle the batches whose replies can be read now. True when any did, and
        batches that waited for their partition's window may now be ready."""
        released = False
        inflight = self._inflight
        for msg in self._conn.drain():
            done = inflight.pop(msg.header.request_id, None)
            if done is None:
                if msg.header.request_id == self._ident_rid:
                    self._identity_reply(msg)
                    released = True
                continue
            if msg.header.status:
                self._refused(done, error_for_code(msg.header.status, str(msg.params.get("message", ""))))
            else:
                if done.props is not None or done.dedup_ids is not None or done.strict:
                    properties.note_reply(done, msg.params)
                if done.ident is not None:
                    self._lane(done).acked(done)
                self._complete(done, msg.params["offsets"][0], None)
            released = True
        if released and self.idempotent and self._open:
            self._release_eager()
        return released

    def _lane(self, b: Batch) -> Lane[Batch]:
        key = (b.queue, b.log_partition)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane((self.producer_id, self.epoch), IDEMPOTENT_IN_FLIGHT_MAX)
        return lane

    def _sendable(self, b: Batch, now: float) -> bool:
        """Idempotent producers send a batch in its partition's sequence order, at most 5 batches
        from the oldest unresolved one (the node remembers the last 5 batches of each producer,
        so a retry of any unresolved batch is always recognised): see fabric.client.inflight."""
        if not self.idempotent or b.unsequenced:
            return b.retry_at <= now
        return self._lane(b).may_send(b, now)

    def _window_room(self, queue: str, partition: int) -> bool:
        lane = self._lanes.get((queue, partition))
        return lane is None or lane.room()

    def _release_eager(self) -> None:
        """Lock held: seal the batches that waited for their partition's window, now that it has room."""
        for b in [b for b in self._open.values() if b.eager and self._window_room(b.queue, b.log_partition)]:
            self._seal(b, force=True, pump=False)

    def _next_sendable(self, now: float) -> Batch | None:
        for b in self._ready:
            if self._sendable(b, now):
                return b
        return None

    def _complete(self, b: Batch, offset: int | None, error: FabricError | None) -> None:
        """Lock held. Callbacks run later, outside the lock (_run_callbacks)."""
        b.offset = offset
        b.error = error
        b.finished = True
        b.inflight = False
        self._buffered -= b.nbytes
        self._unfinished -= 1
        self._space.notify_all()
        if b.callbacks:
            self._callbacks.append(b)

    def _run_callbacks(self) -> None:
        with self._lock:
            due, self._callbacks = self._callbacks, []
        for b in due:
            for i, cb in b.callbacks or ():
                meta = (
                    None
                    if b.error
                    else RecordMetadata(b.queue, b.partition, None if b.offset is None else b.offset + i)
                )
                try:
                    cb(meta, b.error)
                except Exception:
                    log.exception("producer callback raised")

    def _io_loop(self) -> None:
        conn = self._conn
        eager = select.poll()  # the socket, the link watch and the wake pipe
        polled = conn.fileno()  # a stream connection changes descriptor when it reconnects
        if polled is not None:
            eager.register(polled, select.POLLIN)
        for watched in conn.watch_fds():
            eager.register(watched, select.POLLIN)
        eager.register(self._wake_r, select.POLLIN)
        lazy = select.poll()  # the wake pipe only: callers are sending and drain replies themselves
        lazy.register(self._wake_r, select.POLLIN)
        try:
            while True:
                with self._lock:
                    now = time.monotonic()
                    for b in [b for b in self._open.values() if not b.eager and now - b.created >= self.linger_s]:
                        self._seal(b)
                    self._pump()
                    self._expire(now)
                    if self._closed and not self._open and not self._ready and not self._inflight:
                        return
                    timeout = self._next_deadline(now)
                    fd = conn.fileno()
                    if fd != polled:
                        if polled is not None:
                            eager.unregister(polled)
                        if fd is not None:
                            eager.register(fd, select.POLLIN)
                        polled = fd
                    poller = eager
                    hot = now < self._hot_until and not self._waiters and not self._closed
                    if hot and not any(b.callbacks for b in self._inflight.values()):
                        poller = lazy
                        timeout = min(timeout, int((self._hot_until - now) * 1000) + 1)
                if self._callbacks:
                    self._run_callbacks()
                for fd, _ in poller.poll(timeout):
                    if fd == self._wake_r:
                        try:
                            os.read(self._wake_r, 4096)
                        except BlockingIOError:
                            pass
        except Exception as exc:  # never leave callers waiting forever
            log.exception("producer I/O thread failed")
            err = exc if isinstance(exc, FabricError) else FabricError(f"producer I/O failed: {exc}")
            with self._lock:
                self._closed = True
                for b in list(self._open.values()):
                    self._seal_quietly(b)
                for b in [*self._inflight.values(), *self._ready]:
                    self._complete(b, None, err)
                self._inflight.clear()
                self._lanes.clear()
                self._ready.clear()
            self._run_callbacks()
        finally:
            conn.close()
            os.close(self._wake_r)

    def _seal_quietly(self, b: Batch) -> None:
        del self._open[(b.queue, b.partition)]
        self._plain.pop(b.queue, None)
        self._serial += 1
        b.serial = self._serial
        self._ready.append(b)
        self._buffered += b.nbytes
        self._unfinished += 1

    def _next_deadline(self, now: float) -> int:
        """Lock held: ms until the next linger expiry, request timeout, send retry or backoff."""
        due = [b.created + self.linger_s for b in self._open.values() if not b.eager]
        if self._ready and len(self._inflight) < self.max_in_flight:
            if self._next_sendable(now) is not None:
                due.append(now + RETRY_S)
            else:
                later = [b.retry_at for b in self._ready if b.retry_at > now]
                if later:
                    due.append(min(later))
        if self._conn.pending_output():
            due.append(now + RETRY_S)
        if self._inflight:
            due.append(min(b.sent_at for b in self._inflight.values()) + self.request_timeout_s)
        if self._resetting:
            due.append(max(now + RETRY_S, self._ident_retry_at))
        if self._ready:
            due.append(min(b.created for b in self._ready) + self.delivery_timeout_s)
        if not due:
            return 1000
        return max(0, int((min(due) - now) * 1000) + 1)
