"""The producer's socket side: the in-flight window, writing PRODUCE requests, reading replies,
throttling, moving to another entry point, and the sleep of the background I/O thread.

Theory of operation
-------------------
The connection is used under the Producer's lock by whichever thread gets there: a caller whose
send() sealed a batch sends it at once (no hand-off between threads: on a VM each wake-up of
another thread costs ~100 us), and the background thread sends what linger released or what
waited for an in-flight slot. The background thread sleeps on the socket's ZMQ_FD with an OS
poll (``sleep``), which is safe while another thread uses the socket. The FD is edge-like: any
socket operation may consume its signal, so every thread that touched the socket drains the
replies waiting (``read_replies``) before it lets go of the lock.

What a reply means for a batch is not decided here: a stored batch is handed to ``complete``,
a refused one to ``refused`` (the Producer's recovery), any other reply to ``other_reply``.
Every method but ``wake``, ``sleep`` and the two ``close`` runs with the Producer's lock held.
"""

from __future__ import annotations

import logging
import os
import select
import time
from collections.abc import Callable
from typing import Any

from fabric.client import properties, wire
from fabric.client.batches import Batch
from fabric.client.sequencer import Sequencer
from fabric.errors import FabricError, NotLeader, error_for_code
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from fabric.transport.connection import BaseConnection

log = logging.getLogger("fabric.producer")
COPY_BELOW = 64 * 1024
MOVE_EVERY_S = 1.0  # a node that says to try elsewhere is left at most this often
PRODUCE = int(Op.PRODUCE)

Complete = Callable[[Batch, "int | None", "FabricError | None"], None]


class Sender:
    def __init__(
        self,
        conn: BaseConnection,
        sequencer: Sequencer,
        *,
        acks: str,
        codec: int,
        max_in_flight: int,
        complete: Complete,
        refused: Callable[[Batch, FabricError], None],
        other_reply: Callable[[fr.Message], bool],
        partitions_seen: Callable[[str, Any], None],
        progress: Callable[[], tuple[int, ...]],
    ) -> None:
        self.conn = conn
        self._seq = sequencer
        self.acks = acks
        self.codec = codec
        self.max_in_flight = max_in_flight
        self._complete = complete
        self._refused = refused
        self._other_reply = other_reply
        self._partitions_seen = partitions_seen
        self._progress = progress  # what could let a stuck ready batch go (Sequencer.next_sendable)
        self.flags = fr.FLAG_NO_REPLY if acks == "none" else 0
        self.inflight: dict[int, Batch] = {}  # request id -> batch
        self.gen = conn.generation()  # links lost so far: in-flight requests before a change are lost
        self.throttle_until = 0.0  # over a quota: nothing is sent before this (monotonic seconds)
        self.throttled_ms = 0  # throttle time the node asked for so far
        self.moved_at = 0.0  # when the connection last left a node that said to try elsewhere
        self.replies_seen = 0  # replies read so far (a window may have room now)
        self.hot_until = 0.0  # callers are sending: their own sends drain replies until then
        self._params_bytes: dict[tuple[str, int], bytes] = {}  # PRODUCE params per partition, encoded once
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._eager = select.poll()  # the socket, the link watch and the wake pipe
        self._polled = conn.fileno()  # a stream connection changes descriptor when it reconnects
        if self._polled is not None:
            self._eager.register(self._polled, select.POLLIN)
        for watched in conn.watch_fds():
            self._eager.register(watched, select.POLLIN)
        self._eager.register(self._wake_r, select.POLLIN)
        self._lazy = select.poll()  # the wake pipe only: callers are sending and drain replies themselves
        self._lazy.register(self._wake_r, select.POLLIN)

    # ------------------------------------------------------------------ sending

    def link_changed(self) -> bool:
        """Write what the transport held back, then: has the connection lost its link since we
        last looked (nothing in flight will be answered)?"""
        conn = self.conn
        conn.flush()
        gen = conn.generation()
        if gen == self.gen:
            return False
        self.gen = gen
        return True

    def has_slot(self) -> bool:
        """A request may be sent now: a slot is free and no throttle holds."""
        if len(self.inflight) >= self.max_in_flight:
            return False
        return not self.throttle_until or time.monotonic() >= self.throttle_until

    def send_ready(self, now: float) -> bool:
        """Send ready batches, in order, while in-flight slots and their lanes allow. True when
        the transport could not take one (not connected yet): a timer must retry."""
        seq = self._seq
        ready = seq.ready
        idempotent = seq.idempotent
        while ready and len(self.inflight) < self.max_in_flight and now >= self.throttle_until:
            b = ready[0]
            if (idempotent or b.retry_at) and not seq.sendable(b, now):
                found = seq.next_sendable(now, self._progress())
                if found is None:
                    return False
                b = found
            try:
                sent = self.transmit(b)
            except FabricError as exc:
                ready.remove(b)
                self._complete(b, None, exc)
                continue
            if not sent:
                return True  # not connected (yet): the I/O thread retries, the delivery timeout bounds the wait
            if b is ready[0]:
                ready.popleft()
            else:
                ready.remove(b)
        return False

    def transmit(self, b: Batch) -> bool:
        """Encode ``b`` (once; an idempotent producer numbers it first) and write it as one
        PRODUCE request; False when the transport cannot take it now. A batch that cannot be
        encoded raises FabricError."""
        lane = self._seq.numbered_lane(b)
        try:
            batch = b.encoded or wire.encode(b, self.codec)
        except FabricError:
            if lane is not None:
                lane.take_back(b)
            raise
        conn = self.conn
        rid = conn.next_id()
        header = fr.HEADER.pack(fr.MAGIC, fr.VERSION, PRODUCE, self.flags, 0, 0, rid)
        if not conn.send_frames(
            [header, wire.params(b, self.acks, self._params_bytes), batch], len(batch) < COPY_BELOW
        ):
            if lane is not None:
                lane.take_back(b)  # numbered for nothing: the next number goes to whatever goes first
            return False
        b.sent_at = time.monotonic()
        b.attempts += 1
        b.gen = self.gen
        if self.acks == "none":
            self._complete(b, None, None)
        else:
            self.inflight[rid] = b
            if lane is not None:
                lane.sent(b)
        return True

    def read_replies(self) -> bool:
        """Settle the batches whose replies can be read now. True when any did, and batches that
        waited for their partition's window may now be ready."""
        released = False
        inflight = self.inflight
        for msg in self.conn.drain():
            self.replies_seen += 1
            done = inflight.pop(msg.header.request_id, None)
            if done is None:
                if self._other_reply(msg):
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
                    self._seq.lane(done).acked(done)
                parts = msg.params.get("partitions")
                if parts is not None:
                    self._partitions_seen(done.queue, parts)
                throttle = msg.params.get("throttle_ms")
                if throttle:  # over a quota: send nothing more until it is repaid (fabric/node/quotas.py)
                    self.throttle(time.monotonic() + throttle / 1000)
                    self.throttled_ms += throttle
                self._complete(done, msg.params["offsets"][0], None)
            released = True
        return released

    def throttle(self, until: float) -> None:
        """Send nothing before ``until`` (monotonic seconds)."""
        self.throttle_until = max(self.throttle_until, until)

    def try_elsewhere(self, err: FabricError, now: float) -> None:
        """The node in use said it can neither serve nor pass on (cut off from its peers, or
        fenced): move to another entry point (at most every MOVE_EVERY_S); what was in flight
        on this link is resent there."""
        if not (isinstance(err, NotLeader) and err.details.get("try_elsewhere")) or now - self.moved_at < MOVE_EVERY_S:
            return
        self.moved_at = now
        was = self.conn.current_endpoint()
        if self.conn.move_on():
            log.info("%s: moving from %s to %s", err.message, was, self.conn.current_endpoint())

    def take_lost(self) -> list[Batch]:
        """Everything in flight, in the order sealed: no reply will come for it."""
        lost = sorted(self.inflight.values(), key=lambda b: b.serial)
        self.inflight.clear()
        return lost

    # ------------------------------------------------------------------ the I/O thread's sleep

    def wake(self) -> None:
        """Wake the I/O thread (any thread)."""
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # already awake, or closing

    def may_doze(self, now: float) -> bool:
        """Callers are sending and drain replies themselves (and no callback waits on a reply):
        the I/O thread need not wake for replies."""
        return now < self.hot_until and not any(b.callbacks for b in self.inflight.values())

    def watch_socket(self) -> None:
        """A stream connection changes descriptor when it reconnects: sleep on the new one."""
        fd = self.conn.fileno()
        if fd != self._polled:
            if self._polled is not None:
                self._eager.unregister(self._polled)
            if fd is not None:
                self._eager.register(fd, select.POLLIN)
            self._polled = fd

    def sleep(self, timeout_ms: int, doze: bool) -> None:
        """Unlocked, the I/O thread: until a reply (unless ``doze``), a wake-up or the timeout."""
        for fd, _ in (self._lazy if doze else self._eager).poll(timeout_ms):
            if fd == self._wake_r:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass

    def close_wake(self) -> None:
        """The caller's end of the wake pipe (close)."""
        os.close(self._wake_w)

    def close(self) -> None:
        """The I/O thread's end: the connection and the wake pipe."""
        self.conn.close()
        os.close(self._wake_r)
