"""The flusher: one thread that makes appends durable, many appends per fdatasync (group commit).

Theory of operation
-------------------
The writer appends to a ``PartitionLog`` (page cache only) and then calls
``request(log)``, which marks the log dirty and returns a *generation* ``g``, a
number that grows by one per request. The flusher thread loops: take every
dirty log and the newest generation ``G`` issued so far, ``fdatasync`` each of
those logs, then call ``on_synced(G)``: every append whose request returned a
generation ``<= G`` is now on disk. Requests that arrive during an fdatasync
are picked up by the next round, which starts as soon as the current one
ends, so under load each fdatasync covers everything appended while the
previous one ran. ``on_synced`` runs on the flusher thread with generations
strictly increasing; the caller hands them to its own event loop.

For ``fsync = "interval"`` a log is registered with ``request_interval``; the
thread syncs it every ``interval_ms`` if anything was appended since its last
sync. ``fsync = "never"`` logs are simply never given to the flusher.

A failed fdatasync is not reported as synced: ``on_error(generation, exc)`` is
called instead (the appends of that round are not known to be durable; the
caller should fail them), and the thread carries on.

Inline rounds (``inline_max_logs > 0``, the node's setting)
-----------------------------------------------------------
A hand-off to the thread costs two thread wake-ups per round (the writer wakes
the flusher, the flusher wakes the writer's loop), and on a busy 2-core machine
each wake-up waits for a CPU: measured, the hand-offs cost more than the
fdatasync itself (p50 130 us each against 250 us). So the owner may sync on its
own thread: ``request`` then does not wake the thread, and the owner calls
``sync_pending(consumed)`` once per turn of its loop, after it has read every
request that was waiting; that one fdatasync covers them all, and the owner
replies at once from the result. Requests that arrive during it wait in the
sockets and share the next one, so group commit still forms. When more than
``inline_max_logs`` logs are dirty at once the round goes to the thread
instead (their fdatasyncs overlap the owner's work, as before), and so does a
round of more than ``inline_max_bytes`` (a long fdatasync: the hand-off is
small beside it, and the owner appends the next writes meanwhile); the thread
keeps them until it finds nothing dirty. Rounds never overlap (``_busy``), so
generations complete in order; ``consumed`` (the newest generation the owner
has taken from the callbacks) keeps an inline round from overtaking a thread
round whose result the owner has not seen yet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from fabric.histogram import COUNT_BUCKETS, LATENCY_BUCKETS, Histogram
from fabric.store.log import PartitionLog

log = logging.getLogger("fabric.store.flusher")

INTERVAL_MS_MIN = 1
INTERVAL_MS_MAX = 60_000
IDLE_WAIT_S = 1.0


def _log_error(generation: int, exc: BaseException) -> None:
    log.error("fdatasync failed; generation %d is not durable: %s", generation, exc)


class Flusher:
    def __init__(
        self,
        on_synced: Callable[[int], None],
        *,
        on_error: Callable[[int, BaseException], None] = _log_error,
        clock: Callable[[], float] = time.monotonic,
        name: str = "fabric-flusher",
        inline_max_logs: int = 0,
        inline_max_bytes: int = 64 * 1024,
    ) -> None:
        self._on_synced = on_synced
        self._on_error = on_error
        self._clock = clock
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._dirty: dict[int, PartitionLog] = {}
        self._generation = 0  # last generation handed out
        self._completed = 0  # last generation reported synced (or failed)
        self._intervals: dict[int, tuple[PartitionLog, float, float]] = {}  # id -> (log, period_s, due)
        self._stopping = False
        self.inline_max_logs = inline_max_logs  # 0: every round on the thread
        self.inline_max_bytes = inline_max_bytes
        self._busy = False  # a round that reports a generation is running (thread or inline)
        self._handoff = inline_max_logs == 0  # the thread takes the dirty logs
        self._thread_done = 0  # generation of the thread's newest finished round
        self._thread: threading.Thread | None = None
        self.fsyncs = 0  # fdatasync calls made (for tests and metrics)
        self.rounds = 0  # group-commit rounds completed
        self.fsync_seconds = Histogram(LATENCY_BUCKETS)  # each fdatasync of a round (metrics)
        self.round_requests = Histogram(COUNT_BUCKETS)  # requests one round made durable (metrics)

    # -------------------------------------------------------------- control

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the pending round (every request made before stop is synced) and end the thread."""
        with self._cond:
            self._stopping = True
            self._handoff = True  # what is still dirty is the thread's final round
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def completed(self) -> int:
        return self._completed

    # ------------------------------------------------------------- requests

    def request(self, partition_log: PartitionLog, *, background: bool = False) -> int:
        """Mark ``partition_log`` dirty; return the generation that ``on_synced`` will confirm.
        ``background``: nothing waits for it on the owner's loop (a follower's copy: the leader
        counts its fetches, not its fsyncs), so the round goes to the thread, never inline: an
        inline fdatasync would hold up the owner's next fetch answer for its whole length."""
        with self._cond:
            self._generation += 1
            if background and self.inline_max_logs and not self._handoff:
                self._handoff = True
                self._cond.notify()
            elif not self._dirty and self._handoff:
                self._cond.notify()
            self._dirty[id(partition_log)] = partition_log
            return self._generation

    def request_interval(self, partition_log: PartitionLog, interval_ms: int) -> None:
        """Sync ``partition_log`` every ``interval_ms`` while it has unsynced appends (fsync = "interval")."""
        key = id(partition_log)
        if key in self._intervals:  # already scheduled: keep its due time (called on every append)
            return
        interval_ms = min(max(interval_ms, INTERVAL_MS_MIN), INTERVAL_MS_MAX)
        with self._cond:
            period = interval_ms / 1000
            self._intervals[key] = (partition_log, period, self._clock() + period)
            self._cond.notify()

    def track(self, partition_log: PartitionLog) -> None:
        """Follow the log's own fsync policy: register ``interval`` logs; ``always`` logs use ``request``."""
        if partition_log.settings.fsync == "interval":
            self.request_interval(partition_log, partition_log.settings.fsync_interval_ms)

    def forget(self, partition_log: PartitionLog) -> None:
        """Stop syncing a log (before closing or deleting it)."""
        with self._cond:
            self._intervals.pop(id(partition_log), None)
            self._dirty.pop(id(partition_log), None)

    @property
    def pending(self) -> bool:
        """Requests not yet synced (with inline rounds: the owner should call ``sync_pending``)."""
        return bool(self._dirty)

    def sync_pending(self, consumed: int) -> tuple[int, BaseException | None] | None:
        """An inline round on the owner's thread: fdatasync every log requested since the last
        round and return ``(generation, failure)``; every request up to ``generation`` is durable
        when ``failure`` is None. The callbacks are not called: the owner acts on the result.
        None when there is nothing to do here: nothing requested, a thread round running or
        owning the dirty logs (its callback will come), or its last result not yet ``consumed``.
        More than ``inline_max_logs`` dirty logs, or more than ``inline_max_bytes`` to write back,
        go to the thread."""
        with self._cond:
            if not self._dirty or self._busy or self._handoff or self._thread_done > consumed:
                return None
            if len(self._dirty) > self.inline_max_logs or (
                sum(pl.unsynced_bytes for pl in self._dirty.values()) > self.inline_max_bytes
            ):
                self._handoff = True
                self._cond.notify()
                return None
            batch = list(self._dirty.values())
            self._dirty.clear()
            generation = self._generation
            self._busy = True
        failure: BaseException | None = None
        try:
            failure = self._sync_all(batch)
        finally:
            with self._cond:
                self._busy = False
                self.round_requests.observe(generation - self._completed)
                self._completed = generation
                self.rounds += 1
        return generation, failure

    # --------------------------------------------------------------- thread

    def _next_work(self) -> tuple[list[PartitionLog], int, list[PartitionLog]] | None:
        """Wait for dirty logs or due intervals; None when stopping with nothing left."""
        with self._cond:
            while True:
                now = self._clock()
                due = [pl for pl, _period, at in self._intervals.values() if at <= now]
                takes = bool(self._dirty) and self._handoff and not self._busy
                if takes or due:
                    for key, (pl, period, at) in list(self._intervals.items()):
                        if at <= now:
                            self._intervals[key] = (pl, period, now + period)
                    if not takes:
                        return [], 0, due
                    batch = list(self._dirty.values())
                    self._dirty.clear()
                    self._busy = True
                    return batch, self._generation, due
                if self._handoff and not self._dirty and self.inline_max_logs and not self._stopping:
                    self._handoff = False  # caught up: the owner's inline rounds again
                if self._stopping and not self._busy:
                    return None
                wait = min((at for _pl, _p, at in self._intervals.values()), default=now + IDLE_WAIT_S) - now
                self._cond.wait(max(wait, 0.0))

    def _sync_all(self, batch: list[PartitionLog]) -> BaseException | None:
        """fdatasync each log of a round (timed for the metrics); the last failure, if any."""
        failure: BaseException | None = None
        for partition_log in batch:
            try:
                started = time.perf_counter()
                partition_log.sync()
                self.fsync_seconds.observe(time.perf_counter() - started)
                self.fsyncs += 1
            except Exception as exc:
                failure = exc
        return failure

    def _run(self) -> None:
        while True:
            work = self._next_work()
            if work is None:
                return
            batch, generation, due = work
            failure = self._sync_all(batch)  # reported below; the thread carries on
            for partition_log in due:
                if partition_log.dirty:
                    try:
                        partition_log.sync()
                        self.fsyncs += 1
                    except Exception as exc:
                        _log_error(0, exc)
            if not generation:
                continue
            with self._cond:
                self._busy = False
                self._thread_done = generation
                self.round_requests.observe(generation - self._completed)
                self._completed = generation
                self.rounds += 1
            try:
                if failure is None:
                    self._on_synced(generation)
                else:
                    self._on_error(generation, failure)
            except Exception:
                log.exception("flusher callback failed")
