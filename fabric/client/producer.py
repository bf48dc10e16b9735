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
resends after a lost link in sequence order, and recovers from a sequence gap.

The parts it owns, each with its own state, all used under the Producer's one lock:

* :class:`~fabric.client.catalog.QueueCatalog`: what it knows of each queue (looked up on the
  caller's thread before the first send to it);
* :class:`~fabric.client.sequencer.Sequencer`: the open batches per partition, the sealed ones
  in order, and the idempotent sequence numbers (:mod:`fabric.client.inflight`);
* :class:`~fabric.client.sender.Sender`: the connection, the in-flight window, replies,
  throttling, moving to another entry point, the I/O thread's sleep;
* :class:`~fabric.client.recovery.Recovery`: refusals, lost links, timeouts and new identities;
* :class:`~fabric.client.outcomes.Outcomes`: unfinished batches, back-pressure, waiters and
  callbacks.

The Producer itself is the caller's API and the glue: the send paths, sealing, ``_pump`` (send
what may go, read what came back) and the background thread's loop.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from fabric import allocator
from fabric.client import properties
from fabric.client.batches import Batch, Callback, Futures, RecordFuture, as_bytes, fits_span
from fabric.client.catalog import QueueCatalog
from fabric.client.deadlines import next_deadline
from fabric.client.direct import send_peer
from fabric.client.federated import ProducerLinks
from fabric.client.outcomes import Outcomes
from fabric.client.recovery import Recovery
from fabric.client.sender import Sender
from fabric.client.sequencer import Sequencer
from fabric.errors import BadParameter, ConnectionFailed, FabricError, MessageTooLarge, QueueElsewhere
from fabric.protocol.batch import CODECS, HEADER_SIZE, crc32c
from fabric.protocol.ops import ACKS, Op
from fabric.transport.connection import connect

log = logging.getLogger("fabric.producer")
HOT_S = 0.02  # after a caller sent, it drains replies itself for this long (the I/O thread sleeps)


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
        idempotent: bool = True,
        retries: int = 5,
        delivery_timeout_ms: int = 120_000,
        name: str | None = None,
        retry_backoff_ms: int = 100,
        heartbeat_ms: int = 1000,
        spread: bool = True,
        cluster: str | None = None,
    ) -> None:
        """``endpoint``: a node, or a list of routers or nodes (comma-separated) used one at a time:
        with ``spread`` (the default) starting at a random one, so that clients spread over them,
        else at the first (the others are the fallbacks). A federation queue that lives on other
        clusters is sent through their routers by a producer per cluster (``fabric/client/
        federated.py``), each made with ``cluster``: it sends to that one cluster's share."""
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
        self.max_in_flight = max_in_flight
        self.buffer_bytes = buffer_bytes
        self.request_timeout_s = request_timeout_ms / 1000
        # Idempotence needs replies; without it a retry could store a batch twice, so no retries.
        self.idempotent = idempotent and acks != "none"
        self.retries = retries if self.idempotent else 0
        self.delivery_timeout_s = max(delivery_timeout_ms, request_timeout_ms) / 1000
        self.heartbeat_ms = heartbeat_ms
        self.name = name
        self._closed = False
        self._lock = threading.Lock()
        self._direct_lock = threading.Lock()  # PUSH sockets are used by one thread at a time
        self._thread = threading.Thread(target=self._io_loop, name="fabric-producer-io", daemon=True)
        # what an inner producer for another federation cluster is made with (fabric/client/federated.py)
        inner: dict[str, Any] = dict(
            acks=acks,
            linger_ms=linger_ms,
            batch_bytes=batch_bytes,
            batch_messages=batch_messages,
            compression=compression,
            max_in_flight=max_in_flight,
            buffer_bytes=buffer_bytes,
            max_block_ms=max_block_ms,
            request_timeout_ms=request_timeout_ms,
            idempotent=idempotent,
            retries=retries,
            delivery_timeout_ms=delivery_timeout_ms,
            name=name,
            retry_backoff_ms=retry_backoff_ms,
            heartbeat_ms=heartbeat_ms,
            spread=spread,
        )
        links = None if cluster is not None else ProducerLinks(lambda e, c: Producer(e, cluster=c, **inner))
        self._catalog = QueueCatalog(
            endpoint, timeout_ms=request_timeout_ms, spread=spread, cluster=cluster, links=links
        )
        self._seq = Sequencer(self.idempotent)
        self._outcomes = Outcomes(
            self._lock, buffer_bytes=buffer_bytes, max_block_s=max_block_ms / 1000, wake=self._wake
        )
        complete = self._outcomes.complete
        self._sender = Sender(
            connect(endpoint, timeout_ms=request_timeout_ms, heartbeat_ms=heartbeat_ms, spread=spread),
            self._seq,
            acks=acks,
            codec=CODECS[compression],
            max_in_flight=max_in_flight,
            complete=complete,
            refused=self._refused,
            other_reply=self._other_reply,
            partitions_seen=self._catalog.partitions_seen,
            progress=self._progress,
        )
        self._recovery = Recovery(
            self._seq,
            self._sender,
            complete=complete,
            wake=self._wake_from_caller,
            name=name,
            retries=self.retries,
            retry_backoff_s=retry_backoff_ms / 1000,
            request_timeout_s=self.request_timeout_s,
            delivery_timeout_s=self.delivery_timeout_s,
            linger_s=self.linger_s,
            partitions_shrunk=self._catalog.partitions_shrunk,
        )
        # the send path's own references to the parts' tables (the same objects, never replaced):
        # an attribute lookup less per message
        self._plain = self._seq.plain
        self._open = self._seq.open
        self._queues = self._catalog.queues
        self._callbacks = self._outcomes.callbacks
        self._run_callbacks = self._outcomes.run_callbacks
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
                if b is not None and type(value) is bytes and (n := len(value)) <= b.max_message:
                    values = b.values
                    i = len(values)
                    values.append(value)
                    b.nbytes += n + 4
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
        if queue in self._catalog.elsewhere:  # a federation queue on other clusters: through their routers
            if partition is not None and not 0 <= partition < nparts:
                raise BadParameter(f"queue {queue!r} has partitions 0..{nparts - 1}, not {partition}")
            links = self._catalog.links
            assert links is not None
            return links.send(queue, value, key, headers, partition, timestamp_ms, callback, props, dedup_id)
        if queue in self._catalog.direct:
            peer = self._catalog.direct[queue]
            return send_peer(
                peer, self._direct_lock, self.acks, value, key, headers, timestamp_ms, callback, props, dedup_id
            )
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
            if self._outcomes.buffered > self.buffer_bytes:
                self._outcomes.wait_for_space()  # before the value is taken: a Timeout here means not sent
            if self._closed:
                raise FabricError("producer is closed")
            sticky = partition is None and key is None
            if partition is None:
                partition = crc32c(key) % nparts if key is not None else self._seq.sticky.setdefault(queue, 0)
            b = self._open.get((queue, partition))
            if b is not None and (b.props != props or (b.dedup_ids is None) != (dedup_id is None)):
                self._seal(b, force=True)  # one batch, one set of message properties
                b = None
            if (
                b is not None
                and (timestamp_ms is not None or b.timestamps is not None)
                and not fits_span(b, timestamp_ms)
            ):
                self._seal(b)  # the batch's u32 timestamp-delta column cannot span this one
                b = None
            if b is None:
                limit = min(self.batch_bytes, max_batch - 4096)
                b = self._open[(queue, partition)] = Batch(self, queue, partition, time.monotonic(), limit, max_msg)
                b.last_index = self.batch_messages - 1 if self.linger_s else 0
                b.props = props
                b.strict = queue in self._catalog.strict
                if dedup_id is not None:
                    b.dedup_ids = []
                if sticky and props is None and dedup_id is None and not b.strict:
                    self._plain[queue] = b
                if self.linger_s:
                    self._sender.wake()  # a new linger deadline for the I/O thread to watch
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
        if queue in self._catalog.elsewhere and self._catalog.links is not None:
            return self._catalog.links.send_batch(queue, values, partition, keys, headers)
        size = HEADER_SIZE + 4 * n + sum(map(len, values))
        if keys is not None:
            size += 4 * n + sum(len(k) for k in keys if k is not None)
        if headers is not None:
            size += 4 * n + sum(2 + sum(len(k) + len(v) + 6 for k, v in h.items()) if h else 2 for h in headers)
        if size > max_batch:
            raise MessageTooLarge(f"batch of {size} bytes exceeds queue {queue!r} max_batch_bytes {max_batch}")
        with self._lock:
            if self._outcomes.buffered > self.buffer_bytes:
                self._outcomes.wait_for_space()  # before the batch is taken: a Timeout here means not sent
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
            b.strict = queue in self._catalog.strict
            self._seal(b, force=True)
        if self._callbacks:
            self._run_callbacks()
        return RecordFuture(b, n - 1)

    def flush(self, timeout: float | None = None) -> None:
        """Send every open batch and wait until all sent so far are acknowledged (and their
        callbacks have run)."""
        with self._lock:
            for b in list(self._open.values()):
                self._seal(b, force=True)
            self._outcomes.wait_all(timeout)
        # completed but not yet called back (the I/O thread may be asleep), or being called back by
        # another thread right now: it took them off the list, so wait for its run to end
        self._run_callbacks()
        if self._catalog.elsewhere and self._catalog.links is not None:
            self._catalog.links.flush(timeout)  # federation queues sent through other clusters' routers

    @property
    def connected_to(self) -> str:
        """The endpoint this producer's connection uses now (of a list of routers or nodes: one)."""
        return self._sender.conn.current_endpoint()

    @property
    def max_block_s(self) -> float:
        """How long a send() waits for buffer space (``max_block_ms``), in seconds; settable."""
        return self._outcomes.max_block_s

    @max_block_s.setter
    def max_block_s(self, seconds: float) -> None:
        self._outcomes.max_block_s = seconds

    @property
    def codec(self) -> int:
        return self._sender.codec

    @property
    def retry_backoff_s(self) -> float:
        return self._recovery.retry_backoff_s

    @property
    def producer_id(self) -> int:
        """The producer id its idempotent sends carry now (-1 before the first send)."""
        return self._seq.ident[0]

    @property
    def epoch(self) -> int:
        return self._seq.ident[1]

    @property
    def retried(self) -> int:
        """Batches sent again (idempotent: the node stores them once)."""
        return self._recovery.retried

    @property
    def connection_losses(self) -> int:
        """Links lost while this producer ran."""
        return self._recovery.connection_losses

    @property
    def identity_resets(self) -> int:
        """Partitions that moved to a new producer identity after a gap."""
        return self._recovery.identity_resets

    @property
    def throttled_ms(self) -> int:
        """Throttle time the node asked for so far."""
        return self._sender.throttled_ms

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
            self._sender.close_wake()
            self._catalog.close()
            if self._catalog.links is not None:
                self._catalog.links.close(timeout)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ what batches ask (batches.Owner)

    def await_batch(self, b: Batch, timeout: float | None) -> bool:
        return self._outcomes.await_batch(b, timeout)

    def partition_count(self, queue: str) -> int:
        return self._queues[queue][0]

    # ------------------------------------------------------------------ queues

    def _describe(self, queue: str) -> tuple[int, int, int, int]:
        """A queue's partitions and limits, looked up on the caller's thread before its first send."""
        return self._catalog.describe(queue, self._ensure_identity)

    def _ensure_identity(self) -> None:
        """An idempotent producer's first identity, before anything is sent."""
        if self.idempotent and self._seq.ident[0] < 0:
            ident = self._catalog.request(Op.INIT_PRODUCER, {"name": self.name})
            self._seq.ident = (ident["producer_id"], ident["epoch"])

    def _meta_request(self, op: Op, params: dict[str, Any]) -> dict[str, Any]:
        return self._catalog.request(op, params)

    # called with the lock held

    # ------------------------------------------------------------------ batching (lock held)

    def _seal(self, b: Batch, *, force: bool = False, pump: bool = True) -> None:
        seq = self._seq
        if seq.open.get((b.queue, b.partition)) is not b:
            # sealed already: a caller's list of open batches went stale while a reply it pumped
            # released eager batches (seen as KeyError(('grow', 5)) under leader moves)
            return
        if not force and seq.keeps_filling(b):
            b.eager = True
            if pump:
                self._pump()  # replies waiting may open the window, and then this batch goes at once
            return
        seq.take(b, self._count_for(b))
        self._outcomes.admit(b)
        if not pump:
            return
        self._pump()
        if threading.current_thread() is not self._thread:
            self._sender.hot_until = time.monotonic() + HOT_S

    def _count_for(self, b: Batch) -> int:
        """The partition count of ``b``'s queue, for sealing it. A queue forgotten meanwhile (it
        moved to another cluster: a batch answered QUEUE_ELSEWHERE, on the application's thread)
        still has its open batches sealed and sent, to be refused the same way."""
        known = self._queues.get(b.queue)
        return known[0] if known is not None else b.partition + 1

    def _release_eager(self) -> None:
        """Seal the batches that waited for their partition's window, now that it has room."""
        for b in self._seq.eager_with_room():
            self._seal(b, force=True, pump=False)

    # ------------------------------------------------------------------ sending (lock held)

    def _pump(self) -> None:
        """Send ready batches while in-flight slots allow, then read every reply waiting."""
        sender, recovery, seq = self._sender, self._recovery, self._seq
        while True:
            if sender.link_changed():
                recovery.link_lost()
            now = time.monotonic()
            recovery.before_send(now)
            refused = sender.send_ready(now)
            if not (self._read_replies() and seq.ready and not refused):
                break
        if refused and threading.current_thread() is not self._thread:
            sender.wake()  # left unsent: let the I/O thread retry (a closed window waits for replies instead)

    def _read_replies(self) -> bool:
        """Settle what the replies waiting say; True when any did (a window may have room now)."""
        released = self._sender.read_replies()
        if released and self.idempotent and self._open:
            self._release_eager()
        return released

    def _send_direct(self, queue: str, value: bytes, callback: Callback | None = None) -> Batch | None:
        """``linger_ms=0``: one plain value, nothing else waiting, a slot free: write it now as a
        batch of one, without the open/sealed/ready queues. None: the general path takes it."""
        meta = self._queues.get(queue)
        seq, sender, outcomes = self._seq, self._sender, self._outcomes
        if (
            meta is None
            or len(value) > meta[1]
            or seq.open
            or seq.ready
            or self._closed
            or queue in self._catalog.strict
            or queue in self._catalog.direct
            or queue in self._catalog.elsewhere
            or not sender.has_slot()
            or outcomes.buffered + HEADER_SIZE + 4 + len(value) > self.buffer_bytes
            or sender.conn.pending_output()
            or self._recovery.fenced is not None
        ):
            return None
        partition = seq.sticky.get(queue, 0)
        if self.idempotent and not seq.may_number(queue, partition):
            return None
        b = Batch(self, queue, partition, time.monotonic(), 0, meta[1])
        b.values.append(value)
        b.nbytes += 4 + len(value)
        if callback is not None:
            b.callbacks = [(0, 1, callback)]
        outcomes.admit(b)
        seq.take_direct(b, meta[0])
        try:
            sent = sender.transmit(b)
        except FabricError as exc:
            outcomes.complete(b, None, exc)
            return b
        if not sent:
            seq.ready.append(b)  # not connected: the I/O thread retries it
            sender.wake()
            return b
        if self._read_replies() and seq.ready:
            self._pump()
        if threading.current_thread() is not self._thread:
            sender.hot_until = b.sent_at + HOT_S
        return b

    def _refused(self, b: Batch, err: FabricError) -> None:
        if isinstance(err, QueueElsewhere):  # the queue moved to another cluster: its next sends look it up
            self._catalog.forget(b.queue)
            self._plain.pop(b.queue, None)
        self._recovery.refused(b, err)

    def _other_reply(self, msg: Any) -> bool:
        return self._recovery.other_reply(msg)

    def _progress(self) -> tuple[int, ...]:
        """What could let a ready batch that may not go now go (Sequencer.next_sendable)."""
        sender, recovery = self._sender, self._recovery
        return (
            sender.replies_seen,
            self._outcomes.completions,
            len(sender.inflight),
            sender.gen,
            recovery.retried,
            recovery.identity_resets,
            recovery.ident_rid or 0,
        )

    def _wake(self) -> None:
        self._sender.wake()

    def _wake_from_caller(self) -> None:
        """Wake the I/O thread unless this is it."""
        if threading.current_thread() is not self._thread:
            self._sender.wake()

    # ------------------------------------------------------------------ the I/O thread

    def _io_loop(self) -> None:
        sender, seq = self._sender, self._seq
        try:
            while True:
                with self._lock:
                    now = time.monotonic()
                    for b in [b for b in seq.open.values() if not b.eager and now - b.created >= self.linger_s]:
                        self._seal(b)
                    self._pump()
                    self._recovery.expire(now)
                    if self._closed and not seq.open and not seq.ready and not sender.inflight:
                        return
                    timeout = self._next_deadline(now)
                    sender.watch_socket()
                    doze = not self._outcomes.waiters and not self._closed and sender.may_doze(now)
                    if doze:
                        timeout = min(timeout, int((sender.hot_until - now) * 1000) + 1)
                if self._callbacks:
                    self._run_callbacks()
                sender.sleep(timeout, doze)
        except Exception as exc:  # never leave callers waiting forever
            log.exception("producer I/O thread failed")
            err = exc if isinstance(exc, FabricError) else FabricError(f"producer I/O failed: {exc}")
            with self._lock:
                self._closed = True
                self._fail_unfinished(in_flight=err, unsent=err)
            self._run_callbacks()
        finally:
            sender.close()

    def _fail_unfinished(self, *, in_flight: FabricError, unsent: FabricError) -> None:
        """Lock held, the producer ending: complete every batch not yet acknowledged with an
        error (one for those on the wire, one for those never sent); the I/O thread then ends."""
        seq, complete = self._seq, self._outcomes.complete
        for b in list(seq.open.values()):
            seq.take(b, self._count_for(b))
            self._outcomes.admit(b)
        for b in self._sender.take_lost():
            complete(b, None, in_flight)
        for b in seq.ready:
            complete(b, None, unsent)
        seq.clear()

    def _next_deadline(self, now: float) -> int:
        """Lock held: ms until the next linger expiry, request timeout, send retry or backoff."""
        return next_deadline(
            now,
            self._seq,
            self._sender,
            self._recovery,
            self._progress,
            linger_s=self.linger_s,
            max_in_flight=self.max_in_flight,
            request_timeout_s=self.request_timeout_s,
            delivery_timeout_s=self.delivery_timeout_s,
        )
