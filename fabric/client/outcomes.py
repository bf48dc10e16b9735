"""The producer's unfinished batches: how many bytes wait (back-pressure), who waits for them
(``result()``, ``flush()``, a full buffer), and the callbacks due when they finish.

Theory of operation
-------------------
A batch counts from the moment it is sealed (``admit``) until it is acknowledged or failed
(``complete``, lock held). Completing one wakes the threads waiting on the shared condition
when any of them waits for a result or a flush, or when the buffer has drained to
``space_low`` (a full buffer lets senders go again at three quarters, not at the first batch
acknowledged: one wake-up per quarter of the buffer instead of one per batch). Callbacks are
collected under the lock and run outside it (``run_callbacks``) by whichever thread gets there;
a run holds ``callback_lock`` so that ``flush()`` waits for a run another thread has under way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from fabric.client.batches import Batch, RecordFuture, RecordMetadata
from fabric.errors import FabricError, Timeout

log = logging.getLogger("fabric.producer")


class Outcomes:
    def __init__(
        self, lock: threading.Lock, *, buffer_bytes: int, max_block_s: float, wake: Callable[[], None]
    ) -> None:
        self._lock = lock  # the Producer's
        self.space = threading.Condition(lock)
        self.buffer_bytes = buffer_bytes
        self.max_block_s = max_block_s
        self._wake = wake  # the I/O thread: someone waits, so replies must be read
        self.buffered = 0  # bytes of sealed batches not yet finished
        self.unfinished = 0  # sealed batches not yet finished
        self.completions = 0  # batches finished so far, acknowledged or failed
        self.callbacks: list[Batch] = []  # finished batches whose callbacks are due (run unlocked)
        # held while callbacks run, so that flush() waits for a run another thread has under way
        self.callback_lock = threading.RLock()
        self.waiters = 0  # threads blocked in result(), flush() or on buffer space
        self._space_waiters = 0  # of those, the ones blocked on buffer space
        self._space_low = buffer_bytes * 3 // 4

    def admit(self, b: Batch) -> None:
        """Lock held: ``b`` was sealed; it counts until it finishes."""
        self.buffered += b.nbytes
        self.unfinished += 1

    def complete(self, b: Batch, offset: int | None, error: FabricError | None) -> None:
        """Lock held. Callbacks run later, outside the lock (run_callbacks)."""
        b.offset = offset
        b.error = error
        b.finished = True
        self.completions += 1
        b.inflight = False
        # its futures need only the outcome: let the payload go even while the caller keeps them
        b.values, b.keys, b.headers, b.timestamps, b.encoded = [], None, None, None, None
        self.buffered -= b.nbytes
        self.unfinished -= 1
        if self.waiters > self._space_waiters or self.buffered <= self._space_low:
            self.space.notify_all()  # result() and flush() waiters look at every batch finished
        if b.callbacks:
            self.callbacks.append(b)

    def wait_for_space(self) -> None:
        """Lock held, on a caller's thread, before a new batch takes a value: block while the sealed
        batches not yet acknowledged pass ``buffer_bytes`` (until they drain to ``space_low``, or
        ``max_block_ms``, then Timeout: the value was not taken). A batch already open keeps
        filling until it seals, so a full buffer is passed by at most one batch per partition."""
        deadline = time.monotonic() + self.max_block_s
        self.waiters += 1
        self._space_waiters += 1
        self._wake()
        try:
            while self.buffered > self.buffer_bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(f"producer buffer full ({self.buffered} bytes) for {self.max_block_s} s")
                self.space.wait(left)
        finally:
            self.waiters -= 1
            self._space_waiters -= 1

    def wait_all(self, timeout: float | None) -> None:
        """Lock held (flush): until every sealed batch has finished, or Timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.waiters += 1
        self._wake()
        try:
            while self.unfinished:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise Timeout(f"flush: {self.unfinished} batches not acknowledged within {timeout} s")
                self.space.wait(left if left is not None else 0.5)
        finally:
            self.waiters -= 1

    def await_batch(self, b: Batch, timeout: float | None) -> bool:
        """Block until ``b`` completes (result()); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if b.finished:
                return True
            self.waiters += 1
            self._wake()
            try:
                while not b.finished:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self.space.wait(left if left is not None else 1.0)
            finally:
                self.waiters -= 1
            return True

    def run_callbacks(self) -> None:
        """Unlocked: run the callbacks of the batches finished so far."""
        with self.callback_lock:  # a flush() waits here for a run another thread has under way
            with self._lock:
                due = self.callbacks[:]
                self.callbacks.clear()  # the same list: the send path tests it without the lock
            _run(due)


def _run(due: list[Batch]) -> None:
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
