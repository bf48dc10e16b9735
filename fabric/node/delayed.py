"""Durable delayed delivery: batches that wait in the delay store until they are due.

Theory of operation
-------------------
A PRODUCE with ``delay_ms`` or ``deliver_at_ms`` in the future is checked like any
other (CRC, sizes, queue capacity) and then, instead of the partition log, goes
to the node's :class:`~fabric.store.delays.DelayStore`: one SQLite row per batch
(due time, queue, partition log, the batch bytes as received), committed before
the reply (synchronously to disk for ``fsync = "always"`` queues). Memory holds
nothing per delayed message: the store's index on due time finds what is due,
and the node keeps only the earliest due time to set its timer.

When a batch is due (checked on every tick and at the earliest due time), it is
appended to its partition log like a dead letter or a redriven message: same
checks, same durability, new offsets, the producer's timestamps unchanged (a
message's TTL counts from when it was sent). The row is deleted once the append
is durable: at once for ``interval``/``never`` queues, after the covering
fdatasync for ``always`` queues (until then the row is *moving* and not moved
again).

Guarantees and limits:
- A delayed batch survives ``kill -9`` and restarts; one that fell due while the
  node was down is appended at the next start, at once.
- Moving a due batch is at-least-once: a crash between its append and the row's
  delete appends it again at the next start. A dedup id on the message lets the
  queue's dedup window drop the second copy.
- Delayed batches are not idempotent-producer batches (the node refuses a delayed
  batch with a producer id: its sequence would have no place in the log).
- The delay is per request; the node's clock decides. ``deliver_at_ms`` in the
  past, or a delay of 0, appends at once.
- Cluster: every replica of the partition holds the batch (``fabric.node.delay_replication``):
  the leader stamps a delay id into it and its followers fetch the row; only the leader
  appends it when due, and the followers drop their rows once they replicated that append.
  A follower's rows are *held* (never due here) until it leads. Rows without a delay id (kept
  by a node before delays were replicated) still go to the partition's leader with acks=all
  when they fall due while another node leads it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fabric.errors import BadParameter, FabricError, NotLeader, StorageError, UnknownQueue
from fabric.protocol.batch import ENCRYPTED, BatchHeader, parse_header
from fabric.protocol.requests import ProduceParams
from fabric.settings import QueueSettings
from fabric.store.delays import DelayStore

if TYPE_CHECKING:
    from fabric.node.broker import Broker

log = logging.getLogger("fabric.timers")
DELAYS_FILE = "delays.sqlite3"
MOVE_BATCHES_MAX = 1000  # due batches moved per tick
RETRY_MS = 1000  # after a failed move
MOVING_RECHECK_MS = 5


class DelayedDelivery:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = DelayStore(broker.store.data_dir / DELAYS_FILE)
        self._next_due: int | None = self.store.next_due_ms()
        self._moving: set[int] = set()  # appended, waiting for the fdatasync before the row goes
        self._pending: list[tuple[int, list[int]]] = []  # (flusher generation, row ids)
        self.moved = 0  # batches appended to their queue when due
        self._forwarding: set[int] = set()  # rows sent to the partition's leader on another node

    def delay(
        self,
        queue: str,
        p: int,
        settings: QueueSettings,
        batches: list[tuple[bytearray, BatchHeader]],
        due: int,
        params: ProduceParams,
    ) -> tuple[dict[str, Any], int]:
        """Park checked batches until ``due``; the reply says so (offsets come when they are
        appended). Also returns the last row id stored."""
        if params["dedup_ids"] is not None:
            raise BadParameter("a delayed PRODUCE cannot carry dedup_ids; send the dedup id without a delay")
        for _, h in batches:
            if h.producer_id >= 0:
                raise BadParameter(
                    "a delayed batch cannot carry a producer id (idempotent producers send delayed "
                    "messages as plain batches)"
                )
        placement = self.broker.placement
        # cluster: each batch gets its delay id (in its header) and the followers fetch the rows
        delay_ids = placement.stamp_delays(queue, p, batches)
        if settings.encrypt:  # an encrypted queue's delayed batches are sealed too
            at_rest = self.broker.store.at_rest
            if at_rest is None:
                raise StorageError(f"queue {queue!r} is encrypted at rest and this node has no at-rest key file")
            now = self.broker._now_ms
            rows = [(due, queue, p, at_rest.seal(buf, h, now)) for buf, h in batches]
        else:
            rows = [(due, queue, p, bytes(buf)) for buf, _ in batches]
        ids = self.store.add(rows, durable=settings.fsync == "always", delay_ids=delay_ids)
        self.broker.stats["delayed_batches_in"] = self.broker.stats.get("delayed_batches_in", 0) + len(batches)
        if self._next_due is None or due < self._next_due:
            self._next_due = due
        if delay_ids is not None:
            placement.delays_stored(queue, p, ids[-1])
        return {"offsets": [-1] * len(batches), "delayed_until": due}, ids[-1]

    def next_due_ms(self) -> int | None:
        return self._next_due

    def refresh(self) -> None:
        """Rows were held or released (a role changed): look at the store's earliest due time again."""
        self._next_due = self.store.next_due_ms()

    @property
    def in_flight(self) -> set[int]:
        """Rows appended and waiting for their fsync, or sent to another leader: not to be sent again."""
        return self._moving | self._forwarding

    @property
    def moving(self) -> bool:
        return bool(self._pending)

    def tick(self, now_ms: int) -> None:
        """Append every batch that is due (at most MOVE_BATCHES_MAX per call; the rest next tick)."""
        if self._next_due is None or self._next_due > now_ms:
            return
        b = self.broker
        try:
            due = self.store.due(now_ms, limit=MOVE_BATCHES_MAX + len(self._moving))
        except FabricError:
            log.exception("could not read the delay store; will retry")
            self._next_due = now_ms + RETRY_MS
            return
        done: list[int] = []
        synced_later: list[int] = []
        failed = False
        for row in due:
            if row.id in self._moving or row.id in self._forwarding:
                continue
            try:
                batch = self._plain(row.batch)
                settings = b.store.settings(row.queue)
                b.append_internal(row.queue, row.partition, bytearray(batch))
            except (UnknownQueue, NotLeader) as exc:
                if row.delay_id is not None:  # a replicated row: the partition's leader has its own copy
                    if self._replica_elsewhere(row.queue, row.partition, isinstance(exc, UnknownQueue)):
                        done.append(row.id)
                    continue
                if isinstance(exc, NotLeader):
                    # cluster: the partition is led elsewhere now (a failover, a replica move): the
                    # batch goes to that leader with acks=all, and its row goes once it is stored there
                    if self._forward(row.id, row.queue, row.partition, batch) != "sent":
                        failed = True
                    continue
                outcome = self._forward(row.id, row.queue, row.partition, batch)
                if outcome == "gone":
                    done.append(row.id)  # the queue was deleted meanwhile: its delayed messages go with it
                elif outcome == "wait":
                    failed = True
                continue
            except FabricError:
                log.exception("could not append a due batch to %s/%d; will retry", row.queue, row.partition)
                failed = True
                continue
            (synced_later if settings.fsync == "always" else done).append(row.id)
        self.moved += len(done) + len(synced_later)
        if synced_later:
            self._moving.update(synced_later)
            self._pending.append((b.flusher.generation, synced_later))
        if done:
            self._remove(done)
        self._next_due = self.store.next_due_ms()
        if self._next_due is not None and (failed or self._moving):
            # moving rows are still in the store until their fdatasync; look again shortly
            self._next_due = max(self._next_due, now_ms + (RETRY_MS if failed else MOVING_RECHECK_MS))

    def _replica_elsewhere(self, queue: str, partition: int, unknown: bool) -> bool:
        """A due replicated row of a partition this node does not lead (any more): held until it
        does. True when the row is to go (its queue was deleted)."""
        if unknown and self.broker.placement.replicas_of(queue) is None:
            return True
        try:
            self.store.hold(queue, partition, True)
        except FabricError:
            log.exception("could not hold the delayed rows of %s/%d", queue, partition)
        return False

    def _plain(self, batch: bytes) -> bytes:
        """A delayed batch of an encrypted queue is stored sealed: opened here, on its way to its log."""
        if not parse_header(batch).attributes & ENCRYPTED:
            return batch
        at_rest = self.broker.store.at_rest
        if at_rest is None:
            raise StorageError("a delayed batch is encrypted at rest and this node has no [security] at_rest_key_file")
        return at_rest.open_all(batch)

    def _forward(self, row_id: int, queue: str, partition: int, batch: bytes) -> str:
        """Cluster: send a due batch to the node leading its partition. "sent" (its row goes when
        that node has stored it), "wait" (no leader reachable now: try again later) or "gone" (the
        map names no such queue: it was deleted)."""
        placement = self.broker.placement
        replicas = placement.replicas_of(queue)
        if replicas is None:  # also a single node's: it has no map
            return "gone"
        if partition >= len(replicas):  # a priority level's log: kept for when this node leads it
            return "wait"

        def stored(err: FabricError | None) -> None:
            self._forwarding.discard(row_id)
            if err is None:
                self._remove([row_id])
                self.moved += 1
            else:
                log.warning("a due batch for %s/%d was refused by its leader: %s; will retry", queue, partition, err)
                retry = self.broker._now_ms + RETRY_MS
                self._next_due = retry if self._next_due is None else min(self._next_due, retry)

        if not placement.produce_elsewhere(queue, partition, bytes(batch), stored):
            return "wait"
        self._forwarding.add(row_id)
        return "sent"

    def on_synced(self, generation: int) -> None:
        """The flusher made everything up to ``generation`` durable: the moved rows can go."""
        removed = False
        while self._pending and self._pending[0][0] <= generation:
            _, ids = self._pending.pop(0)
            self._remove(ids)
            self._moving.difference_update(ids)
            removed = True
        if removed and not self._moving:
            self._next_due = self.store.next_due_ms()

    def on_sync_failed(self, generation: int) -> None:
        """The appends may not be durable: their rows stay and are moved again (at-least-once)."""
        while self._pending and self._pending[0][0] <= generation:
            _, ids = self._pending.pop(0)
            self._moving.difference_update(ids)
        self._next_due = self.store.next_due_ms()

    def _remove(self, ids: list[int]) -> None:
        try:
            self.store.remove(ids)
        except FabricError:
            log.exception("could not remove %d moved rows from the delay store", len(ids))

    def forget_queue(self, queue: str) -> None:
        """The queue was deleted: its delayed messages go with it. (A queue this node merely stops
        holding, moved elsewhere, keeps them: they go to its leader when due.)"""
        self.store.drop_queue(queue)
        self._next_due = self.store.next_due_ms()

    def describe(self, queue: str) -> dict[str, int]:
        stats = self.store.stats().get(queue)
        if not stats:
            return {"batches": 0, "bytes": 0}
        return stats

    def close(self) -> None:
        self.store.close()
