"""The producer's socket side: sending batches, reading replies, and the background I/O thread.

A mixin of :class:`fabric.client.producer.Producer` (the caller side: send, batching, flush);
the Producer's state is declared here for mypy. Every method but ``_io_loop`` and
``_run_callbacks`` runs with the Producer's lock held.
"""

from __future__ import annotations

import logging
import math
import os
import select
import threading
import time
from itertools import islice
from typing import TYPE_CHECKING, Any, cast

from fabric.client import properties, wire
from fabric.client.batches import Batch, Callback, RecordFuture, RecordMetadata
from fabric.client.inflight import Lane
from fabric.client.recovery import Recovery
from fabric.errors import FabricError, error_for_code
from fabric.protocol import frames as fr
from fabric.protocol.batch import HEADER_SIZE
from fabric.protocol.ops import Op

if TYPE_CHECKING:
    from fabric.client.producer import Producer

log = logging.getLogger("fabric.producer")
COPY_BELOW = 64 * 1024
RETRY_S = 0.01  # how soon to retry sending while the node is unreachable
# Per partition, an idempotent producer's batches numbered and unresolved: at most 16 (the node
# keeps the last 16 batches of each producer), and at most 5 while any of them is small
# (fabric.client.inflight.WIDE_BATCH_BYTES). 5 deep, 256 KiB batches kept a durable node's disk
# idle between fdatasyncs: 16 deep took a 100 B producer from 2.4 M to 3.3 M msg/s.
IDEMPOTENT_IN_FLIGHT_MAX = 16
IDEMPOTENT_IN_FLIGHT_NARROW = 5
HOT_S = 0.02  # after a caller sent, it drains replies itself for this long (the I/O thread sleeps)
PRODUCE = int(Op.PRODUCE)


class Sending(Recovery):
    acks: str
    codec: int
    max_in_flight: int
    buffer_bytes: int
    _lock: threading.Lock
    _space: threading.Condition
    _open: dict[tuple[str, int], Batch]
    _plain: dict[str, Batch]
    _sticky: dict[str, int]
    _queues: dict[str, tuple[int, int, int, int]]
    _strict: set[str]
    _direct: dict[str, Any]
    _throttle_until: float
    throttled_ms: int
    _closed: bool
    _buffered: int
    _unfinished: int
    _serial: int
    _replies_seen: int
    _completions: int
    _stuck: tuple[tuple[int, ...], int, float] | None
    _hot_until: float
    _waiters: int
    _space_waiters: int
    _space_low: int
    _flags: int
    _params_bytes: dict[tuple[str, int], bytes]
    _callbacks: list[Batch]
    _callback_lock: threading.RLock
    _wake_r: int
    _wake_w: int

    def _seal(self, b: Batch, *, force: bool = False, pump: bool = True) -> None:
        raise NotImplementedError

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
        while ready and len(self._inflight) < self.max_in_flight and now >= self._throttle_until:
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

    def _send_direct(self, queue: str, value: bytes, callback: Callback | None = None) -> Batch | None:
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
            or queue in self._direct
            or (self._throttle_until and time.monotonic() < self._throttle_until)
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
        b = Batch(cast("Producer", self), queue, partition, time.monotonic(), 0, meta[1])
        b.values.append(value)
        b.nbytes += 4 + len(value)
        if callback is not None:
            b.callbacks = [(0, 1, callback)]
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
        if not conn.send_frames(
            [header, wire.params(b, self.acks, self._params_bytes), batch], len(batch) < COPY_BELOW
        ):
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
            self._replies_seen += 1
            done = inflight.pop(msg.header.request_id, None)
            if done is None:
                if msg.header.request_id == self._ident_rid:
                    self._identity_reply(msg)
                    released = True
                continue
            if msg.header.status:
                err = error_for_code(msg.header.status, str(msg.params.get("message", "")))
                err.details = {k: v for k, v in msg.params.items() if k not in ("error", "message")}
                self._refused(done, err)
            else:
                if done.props is not None or done.dedup_ids is not None or done.strict:
                    properties.note_reply(done, msg.params)
                if done.ident is not None:
                    self._lane(done).acked(done)
                parts = msg.params.get("partitions")
                if parts is not None:
                    self._note_partitions(done.queue, parts)
                throttle = msg.params.get("throttle_ms")
                if throttle:  # over a quota: send nothing more until it is repaid (fabric/node/quotas.py)
                    self._throttle_until = max(self._throttle_until, time.monotonic() + throttle / 1000)
                    self.throttled_ms += throttle
                self._complete(done, msg.params["offsets"][0], None)
            released = True
        if released and self.idempotent and self._open:
            self._release_eager()
        return released

    def _note_partitions(self, queue: str, partitions: Any) -> None:
        """A PRODUCE reply names the queue's partition count: partitions added since this producer
        looked (``fabric queue alter --partitions``) take its sends from now on."""
        known = self._queues.get(queue)
        if known is not None and type(partitions) is int and partitions > known[0]:
            self._queues[queue] = (partitions, *known[1:])

    def _lane(self, b: Batch) -> Lane[Batch]:
        key = (b.queue, b.log_partition)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(
                (self.producer_id, self.epoch), IDEMPOTENT_IN_FLIGHT_MAX, IDEMPOTENT_IN_FLIGHT_NARROW
            )
        return lane

    def _sendable(self, b: Batch, now: float) -> bool:
        """Idempotent producers send a batch in its partition's sequence order, at most 16 batches
        from the oldest unresolved one (the node remembers the last 16 batches of each producer,
        so a retry of any unresolved batch is always recognised), 5 while any of them is small:
        see fabric.client.inflight."""
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
        """Lock held: the first ready batch that may go now, or None.

        Whether a ready batch may go changes only with a reply, a send, a lost link, a finished
        batch, a retry or a new identity (all in ``stamp``) or when its retry time comes. So the
        head of the queue found stuck is not asked again until one of those happens: only the
        batches sealed since are. Asking every batch on every seal was quadratic behind a full
        window (a producer of 1 KiB records ahead of its node: 30% of its CPU)."""
        ready = self._ready
        stamp = (
            self._replies_seen,
            self._completions,
            len(self._inflight),
            self._gen,
            self.retried,
            self.identity_resets,
            self._ident_rid or 0,
        )
        skip, until = 0, math.inf
        stuck = self._stuck
        if stuck is not None and stuck[0] == stamp and now < stuck[2] and stuck[1] <= len(ready):
            skip, until = stuck[1], stuck[2]
        for b in islice(ready, skip, None) if skip else ready:
            if self._sendable(b, now):
                return b
            if now < b.retry_at < until:
                until = b.retry_at
        self._stuck = (stamp, len(ready), until)
        return None

    def _complete(self, b: Batch, offset: int | None, error: FabricError | None) -> None:
        """Lock held. Callbacks run later, outside the lock (_run_callbacks)."""
        b.offset = offset
        b.error = error
        b.finished = True
        self._completions += 1
        b.inflight = False
        # its futures need only the outcome: let the payload go even while the caller keeps them
        b.values, b.keys, b.headers, b.timestamps, b.encoded = [], None, None, None, None
        self._buffered -= b.nbytes
        self._unfinished -= 1
        if self._waiters > self._space_waiters or self._buffered <= self._space_low:
            self._space.notify_all()  # result() and flush() waiters look at every batch finished
        if b.callbacks:
            self._callbacks.append(b)

    def _run_callbacks(self) -> None:
        with self._callback_lock:  # a flush() waits here for a run another thread has under way
            self._run_callbacks_locked()

    def _run_callbacks_locked(self) -> None:
        with self._lock:
            due, self._callbacks = self._callbacks, []
        new, meta_type = tuple.__new__, RecordMetadata  # the NamedTuple without its keyword handling
        for b in due:
            err, q, p, base = b.error, b.queue, b.partition, b.offset
            plain = err is None and b.props is None and b.dedup_ids is None and not b.strict
            for first, k, cb in b.callbacks or ():  # runs: (first index, values, callback)
                for i in range(first, first + k):
                    meta: RecordMetadata | None
                    if plain:
                        meta = new(meta_type, (q, p, None if base is None else base + i, False, None, False))
                    else:  # failed, or what its future says (a duplicate, delayed, late, strict offsets)
                        meta = None if err else RecordFuture(b, i).result(0)
                    try:
                        cb(meta, err)
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
                self._fail_unfinished(in_flight=err, unsent=err)
            self._run_callbacks()
        finally:
            conn.close()
            os.close(self._wake_r)

    def _fail_unfinished(self, *, in_flight: FabricError, unsent: FabricError) -> None:
        """Lock held, the producer ending: complete every batch not yet acknowledged with an
        error (one for those on the wire, one for those never sent); the I/O thread then ends."""
        for b in list(self._open.values()):
            self._seal_quietly(b)
        for b in self._inflight.values():
            self._complete(b, None, in_flight)
        for b in self._ready:
            self._complete(b, None, unsent)
        self._inflight.clear()
        self._lanes.clear()
        self._ready.clear()

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
        if self._ready and now < self._throttle_until:
            due.append(self._throttle_until)
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
