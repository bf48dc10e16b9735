"""What a Producer does when things go wrong: a refusal from the node, a request with no reply,
a lost connection, a batch past its delivery timeout, and the new producer identity a sequence
gap calls for. The sequence rules themselves are in :mod:`fabric.client.inflight` (pure); the
Recovery applies their outcomes to the Sequencer's ready queue and the Sender's in-flight
table, and hands each batch it gives up to the Producer's ``complete``. Every method runs with
the Producer's lock held.

* **Lost connection.** The connection counts the links it lost (``generation``: ZeroMQ socket
  monitor events, with heartbeats catching a peer that vanished without closing; the stream
  transport's own drops). When it moves, every request in flight is lost: an idempotent
  producer sends those batches again, in sequence order ahead of anything newer, as soon as a
  link is back (no retry is counted: the delivery timeout bounds them); a producer without
  idempotence fails them at once with ``ConnectionFailed`` (they may or may not be stored).
* **Refusals.** Retriable errors are retried after ``retry_backoff_ms`` (doubling, at most 1 s),
  up to ``retries`` times within ``delivery_timeout_ms`` (``NOT_LEADER`` and
  ``FENCED_LEADER_EPOCH``, a leadership in motion, until the delivery timeout without counting,
  as Kafka's unbounded retries do: an election takes a lease TTL or two). ``OutOfOrderSequence`` is decided by
  the lane: early (wait for the predecessors), or a gap that cannot close (that batch fails).
  ``UNKNOWN_PARTITION`` and ``UNKNOWN_QUEUE`` are retried the same way (counted): the node stored
  nothing, and in a cluster they can come from a node or router whose map has not caught up with a
  queue just created or a partition just added (the producer learned the new count from a node
  that had); the node waits for its map before it answers so (fabric/node/cluster_queues.py), and
  the retry covers a wait that ran out. A queue really deleted fails after the retries' backoff.
* **Shrinking.** ``PARTITION_RETIRED`` (docs/architecture.md "Shrinking"): a batch with keys for
  a partition that is ``retiring`` is retried until the delivery timeout without counting (its
  keys must not move before every group has read the partition); a batch without keys, or any
  batch for a partition already removed, goes to ``partition % partitions`` (where its keys
  hash now), numbered again there. Once no batch is left for a removed partition, the producer
  hashes over the new count.
* **New identity.** A lane that gave up its identity gets a new one with one INIT_PRODUCER
  request on the producer's own connection (a fresh producer id; for a named producer the next
  epoch of its name). Its waiting batches are then numbered from 0. If the node refuses (a full
  disk cannot record the id), those batches fail with that error and the next ones try again.
* **Fenced.** ``ProducerFenced`` means a newer instance of a named producer has written: this one
  must stop, so it is fatal. Every batch after it fails with it (no new epoch is asked for: that
  would fence the newer instance in turn).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fabric.client.batches import Batch
from fabric.client.inflight import FAIL_GAP, RENUMBER, RETRY, WAIT, Lane
from fabric.client.sender import Complete, Sender
from fabric.client.sequencer import Sequencer
from fabric.errors import (
    ConnectionFailed,
    FabricError,
    FencedLeaderEpoch,
    NotLeader,
    OutOfOrderSequence,
    PartitionRetired,
    ProducerFenced,
    Throttled,
    Timeout,
    UnknownPartition,
    UnknownQueue,
    error_for_code,
)
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op

BACKOFF_MAX_S = 1.0
RETRY_S = 0.01  # how soon to ask again for an identity


class Recovery:
    def __init__(
        self,
        sequencer: Sequencer,
        sender: Sender,
        *,
        complete: Complete,
        wake: Callable[[], None],
        name: str | None,
        retries: int,
        retry_backoff_s: float,
        request_timeout_s: float,
        delivery_timeout_s: float,
        linger_s: float,
        partitions_shrunk: Callable[[str, int], None] | None = None,
    ) -> None:
        self._seq = sequencer
        self._partitions_shrunk = partitions_shrunk  # the catalog's count of a queue that shrank
        # (queue, removed partition) -> its batches refused, held until none of it is in flight
        self._parked: dict[tuple[str, int], tuple[int, list[Batch]]] = {}  # with the count to go to
        self._sender = sender
        self._complete = complete
        self._wake = wake  # the I/O thread, when a batch is requeued from another thread
        self.idempotent = sequencer.idempotent
        self.name = name
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.request_timeout_s = request_timeout_s
        self.delivery_timeout_s = delivery_timeout_s
        self.linger_s = linger_s
        self.retried = 0  # batches sent again (idempotent: the node stores them once)
        self.connection_losses = 0  # links lost while this producer ran (observability, tests)
        self.identity_resets = 0  # partitions that moved to a new producer identity after a gap
        self.fenced: FabricError | None = None
        self.resetting: set[Lane[Batch]] = set()  # lanes that gave up their identity
        self.ident_rid: int | None = None  # an INIT_PRODUCER request in flight
        self._ident_sent = 0.0
        self.ident_retry_at = 0.0

    # ------------------------------------------------------------------ events

    def before_send(self, now: float) -> None:
        """Fenced: nothing more goes. A lane waiting for a new identity: ask for one."""
        if self.fenced is not None:
            self._fail_ready(self.fenced)
        if self.resetting:
            self._request_identity(now)

    def link_lost(self) -> None:
        """The connection lost its link: no reply will come for what is in flight."""
        self.connection_losses += 1
        self.ident_rid = None
        again = []
        for b in self._sender.take_lost():
            if b.ident is not None:
                self._seq.lane(b).lost(b)
                again.append(b)
            elif b.encoded is not None and self.idempotent:  # dedup ids: the node drops a repeat
                again.append(b)
            else:
                self._complete(
                    b,
                    None,
                    ConnectionFailed(
                        f"connection to {self._sender.conn.endpoint} lost with a batch to {b.queue}/{b.partition} "
                        "in flight: it may or may not have been stored"
                    ),
                )
        self._requeue(again)

    def refused(self, b: Batch, err: FabricError) -> None:
        """The node answered ``b`` with an error: retry, wait, renumber or fail it."""
        now = time.monotonic()
        if isinstance(err, PartitionRetired) and self._retired(b, err):
            return
        if isinstance(err, Throttled):  # far over a quota: wait it out; it does not use up retries
            wait = err.details.get("retry_after_ms", 1000)
            self._sender.throttle(now + (wait if isinstance(wait, int) else 1000) / 1000)
            b.tries = max(0, b.tries - 1)
        elif isinstance(err, NotLeader | FencedLeaderEpoch) and self.idempotent:
            # a partition's leadership in motion (a leader died, an election takes a lease TTL or
            # two): retried until the delivery timeout, not counted against ``retries`` (Kafka's
            # retries are unbounded for the same reason); the idempotent producer makes it safe
            b.tries = max(0, b.tries - 1)
        self._sender.try_elsewhere(err, now)
        retriable = err.retriable or isinstance(err, UnknownPartition | UnknownQueue)  # a map catching up
        may_retry = retriable and b.tries < self.retries and now - b.created < self.delivery_timeout_s
        if b.ident is None:  # not sequenced: only a dedup-id batch is safe to send again
            if may_retry and b.encoded is not None and self.idempotent:
                self._retry_later(b, now)
                self._requeue([b])
            else:
                self._complete(b, None, err)
            return
        lane = self._seq.lane(b)
        if isinstance(err, ProducerFenced):
            self.fenced = err
            lane.reset()  # never used again: every later batch fails with the same error
            self._complete(b, None, err)
            return
        action = lane.refused(b, isinstance(err, OutOfOrderSequence), may_retry, now, self._backoff(b))
        if action == RETRY:
            self._retry_later(b, now)
            self._requeue([b])
        elif action in (WAIT, RENUMBER):
            self._requeue([b])
            self._note_lane(lane)
        else:
            if action == FAIL_GAP:
                err = OutOfOrderSequence(
                    f"{b.queue}/{b.partition}: the node is missing this producer's records before sequence "
                    f"{b.sequence} (it lost or forgot them); this batch was not stored, and the partition "
                    f"continues under a new producer identity. Node: {err}"
                )
            self._give_up(b, err)

    def _retired(self, b: Batch, err: PartitionRetired) -> bool:
        """``b``'s partition retires or was removed by shrinking: True when ``b`` was sent on to
        the partition its records hash to now; False to retry it where it is (it has keys and
        its partition is still read: uncounted, until the delivery timeout)."""
        live, retiring = err.details.get("partitions"), err.details.get("retiring")
        if type(live) is not int or live < 1 or b.partition < live:
            return False
        if retiring and b.keys is not None and any(k is not None for k in b.keys):
            b.tries = max(0, b.tries - 1)
            return False
        old = b.partition
        if retiring:  # b has no keys: it goes now; the keyed batches of its partition wait
            self._move_on(b.queue, old, live, [b])
            return True
        # a removed partition: every batch of it goes on together, in the order sealed, once
        # none is in flight any more (one sent on before an earlier one comes back refused
        # would put a key's newer records first)
        parked = self._parked.setdefault((b.queue, old), (live, []))[1]
        parked.append(b)
        ready = self._seq.ready
        for x in [x for x in ready if x.queue == b.queue and x.partition == old]:
            ready.remove(x)
            parked.append(x)
        for x in parked:
            x.inflight = False
            if x.ident is not None:
                self._seq.lane(x).forget(x)
        self._flush_parked()
        return True

    def _flush_parked(self) -> None:
        """Send on the batches of each removed partition none of whose batches is in flight."""
        if not self._parked:
            return
        busy = {(x.queue, x.partition) for x in self._sender.inflight.values()}
        for key in [k for k in self._parked if k not in busy]:
            live, parked = self._parked.pop(key)
            self._move_on(key[0], key[1], live, parked)
            if self._partitions_shrunk is not None and not self._pending_beyond(key[0], live):
                self._partitions_shrunk(key[0], live)

    def _move_on(self, queue: str, old: int, live: int, batches: list[Batch]) -> None:
        """Send ``batches`` of partition ``old`` to ``old % live`` (numbered again there)."""
        for x in batches:
            x.inflight = False
            if x.ident is not None:
                self._seq.lane(x).forget(x)
            x.partition = old % live
            x.retry_at = 0.0
        lane = self._seq.lanes.get((queue, old))
        if lane is not None and lane.idle():
            del self._seq.lanes[(queue, old)]
        if self._seq.sticky.get(queue, 0) >= live:
            self._seq.sticky[queue] = 0
        self._requeue(batches)

    def _pending_beyond(self, queue: str, live: int) -> bool:
        """A batch of ``queue`` for a partition ``live`` or above is open, ready or in flight."""
        batches = [*self._seq.open.values(), *self._seq.ready, *self._sender.inflight.values()]
        batches += [x for _, parked in self._parked.values() for x in parked]
        return any(b.queue == queue and b.partition >= live for b in batches)

    def other_reply(self, msg: fr.Message) -> bool:
        """A reply that is not a batch's: True when it was the identity asked for."""
        if msg.header.request_id != self.ident_rid:
            return False
        self._identity_reply(msg)
        return True

    def _retry_later(self, b: Batch, now: float) -> None:
        b.retry_at = now + self._backoff(b)
        b.tries += 1
        self.retried += 1

    def _backoff(self, b: Batch) -> float:
        return min(self.retry_backoff_s * 2**b.tries, max(BACKOFF_MAX_S, self.retry_backoff_s))

    def _give_up(self, b: Batch, err: FabricError) -> None:
        """Fail ``b``; a hole it leaves in its partition's sequence resets the partition's lane."""
        ready = self._seq.ready
        if b.ident is not None:
            lane = self._seq.lane(b)
            if b.ident == lane.ident:
                self.identity_resets += 1
            self._requeue(lane.failed(b))  # already waiting in ready: only their order matters
            self._note_lane(lane)
        if b in ready:
            ready.remove(b)
        self._complete(b, None, err)

    def _note_lane(self, lane: Lane[Batch]) -> None:
        if lane.ident is None:
            self.resetting.add(lane)

    def _requeue(self, batches: list[Batch]) -> None:
        if batches:
            self._seq.requeue(batches)
            self._wake()

    def _fail_ready(self, err: FabricError) -> None:
        ready = self._seq.ready
        while ready:
            b = ready.popleft()
            if b.ident is not None:
                self._seq.lane(b).failed(b)
            self._complete(b, None, err)

    # ------------------------------------------------------------------ a new identity

    def _request_identity(self, now: float) -> None:
        """Ask the node for a new producer identity for the lanes that gave theirs up."""
        if self.ident_rid is not None or now < self.ident_retry_at or self.fenced is not None:
            return
        if not any(lane.needs_identity() for lane in self.resetting):
            return
        conn = self._sender.conn
        rid = conn.next_id()
        frames = fr.encode(fr.Header(int(Op.INIT_PRODUCER), rid, 0), {"name": self.name})
        if conn.send_frames(frames):
            self.ident_rid = rid
            self._ident_sent = now

    def _identity_reply(self, msg: fr.Message) -> None:
        self.ident_rid = None
        now = time.monotonic()
        waiting = [lane for lane in self.resetting if lane.needs_identity()]
        if msg.header.status:
            err = error_for_code(msg.header.status, str(msg.params.get("message", "")))
            self.ident_retry_at = now + max(self.retry_backoff_s, 0.1)
            lanes = set(waiting)
            ready = self._seq.ready
            for b in [b for b in ready if b.ident is None and not b.unsequenced and self._seq.lane(b) in lanes]:
                ready.remove(b)
                self._complete(b, None, err)
            return
        self._seq.adopt((msg.params["producer_id"], msg.params["epoch"]), waiting)
        self.resetting.difference_update(waiting)

    # ------------------------------------------------------------------ time

    def expire(self, now: float) -> None:
        """Requests with no reply in request_timeout_ms go again (idempotent) or fail; batches
        that could not be delivered in time fail."""
        cutoff = now - self.request_timeout_s
        if self.ident_rid is not None and self._ident_sent < cutoff:
            self.ident_rid = None  # asked again on the next pump
        inflight = self._sender.inflight
        if inflight:
            late = sorted((b.serial, r) for r, b in inflight.items() if b.sent_at < cutoff)
            again = []
            for _, rid in late:
                b = inflight.pop(rid)
                err = Timeout(f"no reply for a batch to {b.queue}/{b.partition} in {self.request_timeout_s} s")
                resend = b.encoded is not None and self.idempotent
                if resend and b.tries < self.retries and now - b.created < self.delivery_timeout_s:
                    if b.ident is not None:
                        self._seq.lane(b).lost(b)
                    b.tries += 1
                    self.retried += 1
                    again.append(b)
                elif b.ident is not None:
                    self._seq.lane(b).lost(b)
                    self._give_up(b, err)
                else:
                    self._complete(b, None, err)
            self._requeue(again)
        self._flush_parked()  # (what they waited for in flight may have failed)
        give_up = now - self.delivery_timeout_s if self.idempotent else cutoff - self.linger_s
        for b in [b for b in self._seq.ready if b.created < give_up]:
            what = "no connection to " + self._sender.conn.endpoint if not b.attempts else "not acknowledged"
            self._give_up(
                b,
                Timeout(
                    f"could not deliver a batch to {b.queue}/{b.partition} in {round(now - b.created, 1)} s: {what}"
                ),
            )

    def next_deadline(self, now: float) -> float | None:
        """When a lane waiting for an identity asks again, if one is waiting."""
        return max(now + RETRY_S, self.ident_retry_at) if self.resetting else None
