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
even spread). Every PRODUCE reply names the queue's partition count, so partitions
added while the producer runs (``fabric queue alter --partitions``) take its next
sends; a key then lands where ``crc32c(key) % new_count`` says (docs/architecture.md).

Back-pressure: at most ``buffer_bytes`` (plus the batches still open, one per
partition) may wait in sealed or in-flight batches; a ``send()`` that finds it full
blocks until it has drained to three quarters, up to ``max_block_ms``, then raises
``Timeout`` and the value was not taken. Without idempotence nothing is retried
behind the caller's back (a retry could store a batch twice): a request with no reply
in ``request_timeout_ms`` fails its futures with ``Timeout``, one in flight when the
link is lost with ``ConnectionFailed``. The idempotent producer (the default) retries,
resends after a lost link in sequence order, and recovers from a sequence gap:
:mod:`fabric.client.recovery` and :mod:`fabric.client.inflight`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from fabric import allocator
from fabric.client import properties
from fabric.client.batches import Batch, Callback, Futures, RecordFuture, as_bytes
from fabric.client.direct import DirectSender, check_direct_options
from fabric.client.inflight import Lane
from fabric.client.sending import Sending
from fabric.errors import BadParameter, ConnectionFailed, FabricError, MessageTooLarge, Timeout
from fabric.protocol import frames as fr
from fabric.protocol.batch import CODECS, HEADER_SIZE, crc32c
from fabric.protocol.ops import ACKS, Op
from fabric.transport.connection import BaseConnection, connect

log = logging.getLogger("fabric.producer")
PREFETCH_AFTER_MISSES = 2  # the second queue this producer meets: look up every queue at once
PREFETCH_EVERY_S = 10.0  # at most one such look-up this often
PREFETCH_MAX_AGE_S = 10.0  # its answers are used this long (then a queue is described on its own)
PREFETCH_PAGE = 2000  # queues per METADATA settings page
PREFETCH_PAGES_MAX = 50  # pages per look-up (100,000 queues); past them queues are described one by one
HOT_S = 0.02  # after a caller sent, it drains replies itself for this long (the I/O thread sleeps)
TIMESTAMP_SPAN_MS = 0xFFFFFFFF // 2  # keep a batch's timestamps well inside its u32 delta column


class Producer(Sending):
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
        spread: bool = True,
    ) -> None:
        """``endpoint``: a node, or a list of routers or nodes (comma-separated) used one at a time:
        with ``spread`` (the default) starting at a random one, so that clients spread over them,
        else at the first (the others are the fallbacks)."""
        allocator.tune()
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
        self._spread = spread
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
        self._direct: dict[str, DirectSender] = {}  # brokerless queues: sent straight to their consumers
        self._meta_lock = threading.Lock()
        self._direct_lock = threading.Lock()  # PUSH sockets are used by one thread at a time
        self._throttle_until = 0.0  # over a quota: nothing is sent before this (monotonic seconds)
        self._moved_at = 0.0  # when the connection last left a node that said to try elsewhere
        self.throttled_ms = 0  # throttle time the node asked for so far
        self._meta_conn: BaseConnection | None = None
        self._misses = 0  # queues looked up so far (their first send)
        self._prefetch_cache: dict[str, dict[str, Any]] = {}  # queue -> settings (METADATA settings)
        self._prefetched_at = -PREFETCH_EVERY_S - PREFETCH_MAX_AGE_S  # monotonic time of that answer
        self._prefetch_ok = True  # the node answers METADATA settings
        self._flags = fr.FLAG_NO_REPLY if acks == "none" else 0
        self._inflight: dict[int, Batch] = {}
        self._lanes: dict[tuple[str, int], Lane[Batch]] = {}  # idempotent: sequence state per (queue, log partition)
        self._serial = 0  # batches sealed so far: their order in _ready
        self._replies_seen = 0  # replies read so far (a window may have room now)
        self._completions = 0  # batches finished so far, acknowledged or failed
        # _next_sendable's memo: the first ``count`` ready batches could not go while ``stamp``
        # (what could let them) stays the same, until ``until`` (their earliest retry time)
        self._stuck: tuple[tuple[int, ...], int, float] | None = None
        self._callbacks: list[Batch] = []
        # held while callbacks run, so that flush() waits for a run another thread has under way
        self._callback_lock = threading.RLock()
        self._waiters = 0  # threads blocked in result(), flush() or on buffer space
        self._space_waiters = 0  # of those, the ones blocked on buffer space
        # a full buffer lets senders go again once it has drained to here, not at the first
        # batch acknowledged: one wake-up per quarter of the buffer instead of one per batch
        self._space_low = self.buffer_bytes * 3 // 4
        self._hot_until = 0.0  # callers are sending: their own sends drain replies until then
        self._params_bytes: dict[
            tuple[str, int], bytes
        ] = {}  # completed batches whose callbacks are due (run unlocked)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._conn = connect(endpoint, timeout_ms=request_timeout_ms, heartbeat_ms=heartbeat_ms, spread=spread)
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
            and delay_ms is None
            and deliver_at_ms is None
            and ttl_ms is None
            and priority is None
            and dedup_id is None
        ):
            # Fast path: a plain value into the open batch of the queue's sticky partition.
            # Per message: one lock, one append, one addition, one comparison (and with a
            # callback, one more append: callbacks are the cheap way to count acknowledgements).
            # acquire/release, not ``with``: the context protocol cost this path ~10%
            lock = self._lock
            lock.acquire()
            try:
                b = self._plain.get(queue)
                if b is not None and type(value) is bytes and len(value) <= b.max_message:
                    values = b.values
                    i = len(values)
                    values.append(value)
                    b.nbytes += len(value) + 4
                    if callback is not None:
                        if b.callbacks is None:
                            b.callbacks = []
                        b.callbacks.append((i, 1, callback))
                    if b.nbytes < b.limit and i < b.last_index:
                        return RecordFuture(b, i)
                    self._seal(b)
                elif not self.linger_s and type(value) is bytes:
                    b, i = self._send_direct(queue, value, callback), 0
                else:
                    b = None
            finally:
                lock.release()
            if b is not None:
                if self._callbacks:
                    self._run_callbacks()
                return RecordFuture(b, i)
            return self._send_general(queue, value, None, None, None, None, callback)
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
        if queue in self._direct:
            return self._send_peer(queue, value, key, headers, timestamp_ms, callback, props, dedup_id)
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
            if self._buffered > self.buffer_bytes:
                self._wait_for_space()  # before the value is taken: a Timeout here means not sent
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
                b.callbacks.append((i, 1, callback))
            if self._plain.get(queue) is b and (
                b.keys is not None or b.headers is not None or b.timestamps is not None
            ):
                del self._plain[queue]  # columns beyond values: only the general path may add to it now
            if b.nbytes >= b.limit or i >= b.last_index:
                self._seal(b)
        if self._callbacks:
            self._run_callbacks()
        return RecordFuture(b, i)

    def send_many(self, queue: str, values: Sequence[bytes], *, callback: Callback | None = None) -> Futures:
        """Queue many plain values (no key, headers or properties) for ``queue``, in order: the
        bulk form of ``send(queue, value)`` for loaders and pipelines (as Redis pipelines XADD).
        They go into the queue's batches exactly as one ``send`` per value would put them (the
        sticky partition, ``linger_ms``, ``batch_bytes``, the same acknowledgements), with one
        lock and one list extension per batch they fill instead of one call per value. There is
        no all-or-nothing promise across them (that is ``send_batch``). Returns one future per
        value, in a read-only sequence (``Futures``) that makes each when it is asked for;
        ``callback``, if given, is called once per value as with ``send``. A value that is not
        bytes, or one over the queue's ``max_message_bytes``, and ``linger_ms=0`` take the
        ``send`` path value by value (with its errors, raised at that value)."""
        vals = values if type(values) is list else list(values)
        futures = Futures()
        if not vals:
            return futures
        if not self.linger_s or set(map(type, vals)) != {bytes}:
            for v in vals:
                f = self.send(queue, v, callback=callback)
                futures._add(f._batch, f._index, 1)
            return futures
        # Per call, not per value, wherever it can: the total length (a batch that would pass its
        # byte limit needs the running lengths, once per batch), and no per-value size check when
        # the whole run is within max_message_bytes.
        start, n = 0, len(vals)
        total = sum(map(len, vals))
        while start < n:
            with self._lock:
                b = self._plain.get(queue)
                if b is not None:
                    held = b.values
                    first = len(held)
                    # as send: a batch kept open while its partition's window is full (eager) fills
                    # up to its byte limit, past batch_messages
                    k = n - start if b.eager else min(b.last_index - first + 1, n - start)
                    run = vals if k == n else vals[start : start + k]
                    size = total if k == n else sum(map(len, run))
                    room = b.limit - b.nbytes
                    if size + 4 * k >= room:
                        # the value that reaches the byte limit goes in, then the batch is sealed (as in send)
                        acc = list(accumulate(map(len, run)))
                        cut = bisect_left(range(k), room, key=lambda j: acc[j] + 4 * (j + 1))
                        if cut < k:
                            k = cut + 1
                            run = run[:k]
                        size = acc[k - 1]
                    if k > 0 and (size <= b.max_message or max(map(len, run)) <= b.max_message):
                        held.extend(run)
                        b.nbytes += size + 4 * k
                        if callback is not None:
                            if b.callbacks is None:
                                b.callbacks = []
                            b.callbacks.append((first, k, callback))
                        futures._add(b, first, k)
                        start += k
                        if b.nbytes >= b.limit or len(held) > b.last_index:
                            self._seal(b)
                        continue
            # no open plain batch for the queue (or a value too large for it): one value through
            # send, which opens the next batch (or raises for that value)
            f = self.send(queue, vals[start], callback=callback)
            futures._add(f._batch, f._index, 1)
            start += 1
        if self._callbacks:
            self._run_callbacks()
        return futures

    def send_batch(
        self,
        queue: str,
        values: list[bytes],
        *,
        partition: int,
        keys: list[bytes | None] | None = None,
        headers: list[dict[str, bytes] | None] | None = None,
    ) -> RecordFuture:
        """Send ``values`` (with ``keys`` and ``headers``: lists of the same length, or None) to one
        partition as one record batch of their own, so the node stores them all or none,
        contiguous and in order; what was sent to that partition before goes first. Returns the
        last record's future. Raises MessageTooLarge when the batch would pass the queue's
        ``max_batch_bytes``. Per batch, not per record: for bulk writers that need atomic groups."""
        n = len(values)
        if not n or (keys is not None and len(keys) != n) or (headers is not None and len(headers) != n):
            raise BadParameter("send_batch needs at least one value, and keys/headers of the same length")
        nparts, max_msg, max_batch, _ = self._queues.get(queue) or self._describe(queue)
        if not 0 <= partition < nparts:
            raise BadParameter(f"queue {queue!r} has partitions 0..{nparts - 1}, not {partition}")
        size = HEADER_SIZE + 4 * n + sum(map(len, values))
        if keys is not None:
            size += 4 * n + sum(len(k) for k in keys if k is not None)
        if headers is not None:
            size += 4 * n + sum(2 + sum(len(k) + len(v) + 6 for k, v in h.items()) if h else 2 for h in headers)
        if size > max_batch:
            raise MessageTooLarge(f"batch of {size} bytes exceeds queue {queue!r} max_batch_bytes {max_batch}")
        with self._lock:
            if self._buffered > self.buffer_bytes:
                self._wait_for_space()  # before the batch is taken: a Timeout here means not sent
            if self._closed:
                raise FabricError("producer is closed")
            before = self._open.get((queue, partition))
            if before is not None:
                self._seal(before, force=True)
            b = self._open[(queue, partition)] = Batch(self, queue, partition, time.monotonic(), max_batch, max_msg)
            b.values = list(values)
            b.keys = list(keys) if keys is not None else None
            b.headers = list(headers) if headers is not None else None
            b.nbytes = size
            b.strict = queue in self._strict
            self._seal(b, force=True)
        if self._callbacks:
            self._run_callbacks()
        return RecordFuture(b, n - 1)

    @staticmethod
    def _fits_span(b: Batch, timestamp_ms: int | None) -> bool:
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        stamps = b.timestamps or [int(time.time() * 1000)]
        return max(stamps[-1], ts) - min(stamps[0], ts) < TIMESTAMP_SPAN_MS and abs(ts - stamps[0]) < TIMESTAMP_SPAN_MS

    def flush(self, timeout: float | None = None) -> None:
        """Send every open batch and wait until all sent so far are acknowledged (and their
        callbacks have run)."""
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
        # completed but not yet called back (the I/O thread may be asleep), or being called back by
        # another thread right now: it took them off the list, so wait for its run to end
        self._run_callbacks()

    @property
    def connected_to(self) -> str:
        """The endpoint this producer's connection uses now (of a list of routers or nodes: one)."""
        return self._conn.current_endpoint()

    def close(self, timeout: float | None = 30) -> None:
        """Flush (up to ``timeout`` seconds), then stop. What is still unacknowledged then, the
        node unreachable or slow, fails at once: a message never sent with ``FabricError`` "not
        stored", one in flight with ``ConnectionFailed`` "may or may not be stored"; its future
        raises that and its callback gets it. close() then raises the flush's Timeout."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            with self._lock:
                self._closed = True
                self._fail_unfinished(
                    in_flight=ConnectionFailed(
                        "producer closed before the node acknowledged: the message may or may not be stored"
                    ),
                    unsent=FabricError("producer closed before the message was sent: not stored"),
                )
            self._wake()
            self._thread.join(5)
            if self._callbacks:
                self._run_callbacks()
            os.close(self._wake_w)
            if self._meta_conn is not None:
                self._meta_conn.close()
            for sender in self._direct.values():
                sender.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _meta_request(self, op: Op, params: dict[str, Any]) -> dict[str, Any]:
        """A metadata request, retried on a retriable refusal (a cluster electing a leader, its
        etcd electing one) for as long as the connection's timeout; waits already spent in
        full (no link, no answer) are not repeated. Each is safe to send again when its link is
        lost in flight (METADATA and DESCRIBE_QUEUE read, auto_create creates once; a repeated
        INIT_PRODUCER only leaves an id unused), so the connection does."""
        assert self._meta_conn is not None
        deadline = time.monotonic() + self._meta_conn.timeout_ms / 1000
        backoff = 0.05
        while True:
            try:
                return self._meta_conn.request(op, params, resend=True).params
            except (ConnectionFailed, Timeout):
                raise
            except FabricError as exc:
                if not exc.retriable or time.monotonic() + backoff > deadline:
                    raise
                time.sleep(backoff)
                backoff = min(1.0, backoff * 2)

    def _describe(self, queue: str) -> tuple[int, int, int, int]:
        """A queue's partitions and limits, looked up on the caller's thread before its first send.

        One queue: a DESCRIBE_QUEUE round trip. A producer that keeps meeting new queues (the
        second miss on) asks once for every queue the node holds (METADATA ``settings``) and
        takes the next ones from that answer while it is at most PREFETCH_MAX_AGE_S old, so
        sending to thousands of queues costs one round trip, not one per queue. A queue the
        answer does not name (created since, held elsewhere, to be auto-created) is described
        on its own, as before."""
        with self._meta_lock:
            if queue not in self._queues:
                if self._meta_conn is None:
                    # metadata lookups are rare and synchronous: never shorter than 10 s
                    self._meta_conn = connect(
                        self.endpoint, timeout_ms=max(10_000, int(self.request_timeout_s * 1000)), spread=self._spread
                    )
                info = self._prefetched(queue)
                if info is None:
                    self._misses += 1
                    if self._misses >= PREFETCH_AFTER_MISSES and self._may_prefetch():
                        self._prefetch()
                        info = self._prefetched(queue)
                if info is None:
                    # the node creates the queue here if its auto_create_queues is on (the reply says "created")
                    d = self._meta_request(Op.DESCRIBE_QUEUE, {"name": queue, "auto_create": True})
                    info = {**d["settings"], "partitions": d["partitions"]}
                if self.idempotent and self.producer_id < 0:
                    ident = self._meta_request(Op.INIT_PRODUCER, {"name": self.name})
                    self.producer_id, self.epoch = ident["producer_id"], ident["epoch"]
                self._queues[queue] = (
                    info["partitions"],
                    info["max_message_bytes"],
                    info["max_batch_bytes"],
                    info.get("priority_levels", 1),
                )
                if info.get("ordering") == "strict":
                    self._strict.add(queue)
                if info.get("mode") == "direct":
                    self._direct[queue] = DirectSender(queue, lambda: self._direct_consumers(queue))
            return self._queues[queue]

    def _prefetched(self, queue: str) -> dict[str, Any] | None:
        if time.monotonic() - self._prefetched_at > PREFETCH_MAX_AGE_S:
            return None
        return self._prefetch_cache.get(queue)

    def _may_prefetch(self) -> bool:
        return self._prefetch_ok and time.monotonic() - self._prefetched_at >= PREFETCH_EVERY_S

    def _prefetch(self) -> None:
        """METADATA with ``settings``: what this producer needs of every queue the node holds."""
        cache: dict[str, dict[str, Any]] = {}
        start = None
        for _ in range(PREFETCH_PAGES_MAX):
            params: dict[str, Any] = {
                "queues": [],
                "settings": True,
                "settings_from": start,
                "settings_limit": PREFETCH_PAGE,
            }
            try:
                reply = self._meta_request(Op.METADATA, params)
            except (ConnectionFailed, Timeout):
                raise
            except FabricError as exc:  # a node from before METADATA settings: describe one by one
                log.info("no bulk queue look-up (%s): describing queues one by one", exc)
                self._prefetch_ok = False
                return
            cache.update(reply.get("settings") or {})
            start = reply.get("settings_next")
            if start is None:
                break
        self._prefetch_cache = cache
        self._prefetched_at = time.monotonic()

    def _direct_consumers(self, queue: str) -> list[str]:
        with self._meta_lock:
            d = self._meta_request(Op.DESCRIBE_QUEUE, {"name": queue})
        return list(d.get("direct_consumers", []))

    def _send_peer(
        self,
        queue: str,
        value: bytes | str,
        key: bytes | str | None,
        headers: dict[str, bytes | str] | None,
        timestamp_ms: int | None,
        callback: Callback | None,
        props: Any,
        dedup_id: str | None,
    ) -> Any:
        """A send to a direct queue: straight to a consumer, at most once (fabric/client/direct.py)."""
        check_direct_options(self.acks, props, dedup_id)
        hdrs = {k: as_bytes(v, "header value") for k, v in headers.items()} if headers else None
        sender = self._direct[queue]
        if type(value) is not bytes:
            value = as_bytes(value, "value")
        with self._direct_lock:
            return sender.send(value, None if key is None else as_bytes(key, "key"), hdrs, timestamp_ms, callback)

    # called with the lock held
    def _seal(self, b: Batch, *, force: bool = False, pump: bool = True) -> None:
        if self._open.get((b.queue, b.partition)) is not b:
            # sealed already: a caller's list of open batches went stale while a reply it pumped
            # released eager batches (seen as KeyError(('grow', 5)) under leader moves)
            return
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

    def _wait_for_space(self) -> None:
        """Lock held, on a caller's thread, before a new batch takes a value: block while the sealed
        batches not yet acknowledged pass ``buffer_bytes`` (until they drain to ``_space_low``, or
        ``max_block_ms``, then Timeout: the value was not taken). A batch already open keeps
        filling until it seals, so a full buffer is passed by at most one batch per partition."""
        deadline = time.monotonic() + self.max_block_s
        self._waiters += 1
        self._space_waiters += 1
        self._wake()
        try:
            while self._buffered > self.buffer_bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(f"producer buffer full ({self._buffered} bytes) for {self.max_block_s} s")
                self._space.wait(left)
        finally:
            self._waiters -= 1
            self._space_waiters -= 1

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
