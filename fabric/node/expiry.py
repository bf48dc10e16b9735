"""Message TTL for queue subscription groups: expired messages are dead-lettered or dropped.

Theory of operation
-------------------
A record batch may carry a ``ttl_ms`` (the batch format's HAS_TTL field, set by
``Producer.send(ttl_ms=...)``); a queue may set ``default_ttl_ms`` for batches
without one. Every record of a batch has expired once ``max_timestamp + ttl`` has
passed (the producer's send time; the whole batch expires together, so a record
lives at least its TTL). Reading that is per-batch work on the header.

Expiry is enforced per ``queue`` and ``key_shared`` group, where messages are settled one by one: a
sweep walks each group's partitions from the floor (the oldest unsettled
message) over the visible log, batch headers only, and settles the expired
messages that nobody holds (:meth:`PartitionLeases.expirable`, settled once written to the DLQ). They go to
the dead-letter queue with ``x-dlq-reason: expired`` (queue setting ``on_expire =
"dead_letter"``, the default) or are dropped (``"drop"``). A leased message that
expires stays with its holder: its ack still counts; if the lease ends, the next
sweep takes it.

Cost is bounded: a sweep reads at most ``SWEEP_BYTES`` per partition per pass,
and after a full pass over ``[floor, end)`` it remembers the earliest expiry it
saw there, so until that time only newly appended batches are read. Expired
messages are taken within ``SWEEP_INTERVAL_MS`` of their expiry (plus the time
to walk a very long backlog); a message may be delivered within that window.

``stream`` subscriptions do not expire messages: the log keeps them until
retention, and a stream reader sees every record (its ``ttl_ms`` included).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fabric.errors import FabricError
from fabric.protocol.batch import HAS_TTL, expires_at_ms, iter_batches

if TYPE_CHECKING:
    from fabric.node.broker import Broker
    from fabric.push.shared import Leases, SharedGroup

log = logging.getLogger("fabric.expiry")
SWEEP_INTERVAL_MS = 50
SWEEP_BYTES = 8 * 1024 * 1024  # read per partition per pass
READ_BYTES = 1024 * 1024
LEASED_RECHECK_MS = 1000  # an expired message still leased: look again this often
NEVER = 2**62


@dataclass(slots=True)
class _Sweep:
    pos: int = -1  # where the pass in progress stands; -1: start a full pass at the floor
    scanned_upto: int = 0  # end of the last full pass
    next_expiry: int = NEVER  # earliest expiry among unsettled messages below scanned_upto
    pass_expiry: int = NEVER  # earliest expiry seen by the pass in progress
    next_check: int = 0


class Expiry:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.sweeps: dict[tuple[str, str, int], _Sweep] = {}
        self.ttl_queues: set[str] = set(broker.store.queue_names())  # sweep these (all, after a start)
        self._confirmed: set[str] = set()  # a TTL batch was appended here while we ran: always swept
        self.expired = 0

    def saw_ttl(self, queue: str) -> None:
        """PRODUCE appended a batch with its own TTL to ``queue``."""
        self.ttl_queues.add(queue)
        self._confirmed.add(queue)

    def tick(self, now_ms: int) -> None:
        b = self.broker
        for group in list(b.shared.groups.values()):
            if group.queue not in self.ttl_queues:
                continue
            try:
                settings = b.store.settings(group.queue)
            except FabricError:
                continue
            found_ttl = settings.default_ttl_ms > 0
            for p, leases in group.leases.items():
                key = (group.queue, group.name, p)
                sweep = self.sweeps.get(key)
                if sweep is None:
                    sweep = self.sweeps[key] = _Sweep()
                if now_ms < sweep.next_check:
                    found_ttl = True
                    continue
                sweep.next_check = now_ms + SWEEP_INTERVAL_MS
                found_ttl |= self._sweep(group, p, leases, sweep, settings.default_ttl_ms, now_ms)
            if (
                not found_ttl
                and group.queue not in self._confirmed
                and all(self.sweeps.get((group.queue, group.name, p), _Sweep()).pos == -1 for p in group.leases)
            ):
                self.ttl_queues.discard(group.queue)  # a queue from before the start, with no TTL in it

    def forget_queue(self, queue: str) -> None:
        for key in [k for k in self.sweeps if k[0] == queue]:
            del self.sweeps[key]
        self.ttl_queues.discard(queue)
        self._confirmed.discard(queue)

    def _sweep(self, group: SharedGroup, p: int, leases: Leases, sweep: _Sweep, default_ttl: int, now_ms: int) -> bool:
        """One bounded pass step; True if it saw any batch with a TTL."""
        b = self.broker
        upto = b.visible(group.queue, p, 0)
        if sweep.pos < 0:
            if now_ms < sweep.next_expiry and sweep.scanned_upto >= upto:
                return sweep.next_expiry < NEVER  # nothing new, nothing due
            # a full pass when something below may have expired, else only what is new
            full = now_ms >= sweep.next_expiry or sweep.scanned_upto < leases.floor
            sweep.pos = leases.floor if full else max(sweep.scanned_upto, leases.floor)
            sweep.pass_expiry = NEVER if full else sweep.next_expiry
        plog = b.store.partition(group.queue, p)
        pos = max(sweep.pos, leases.floor, plog.log_start_offset)
        budget = SWEEP_BYTES
        taken: list[tuple[int, int, int]] = []
        saw_ttl = default_ttl > 0
        try:
            while pos < upto and budget > 0:
                data = plog.read(pos, min(budget, READ_BYTES))
                if not data:
                    break
                budget -= len(data)
                for bpos, h in iter_batches(data, verify=False):
                    if h.base_offset >= upto:
                        pos = upto
                        break
                    pos = h.next_offset
                    if h.attributes & HAS_TTL:
                        saw_ttl = True
                    expires = expires_at_ms(data, h, default_ttl, bpos)
                    if not expires or h.next_offset <= leases.floor:
                        continue
                    if expires > now_ms:
                        sweep.pass_expiry = min(sweep.pass_expiry, expires)
                        continue
                    taken += leases.expirable(max(h.base_offset, leases.floor), h.next_offset)
                    if any(leases.state(o) == "leased" for o in (h.base_offset, h.last_offset)):
                        sweep.pass_expiry = min(sweep.pass_expiry, now_ms + LEASED_RECHECK_MS)
        except FabricError:
            log.exception("TTL sweep of %s/%d for group %s failed at offset %d", group.queue, p, group.name, pos)
            pos = upto
        if pos >= upto:
            sweep.pos = -1
            sweep.scanned_upto = upto
            sweep.next_expiry = sweep.pass_expiry
        else:
            sweep.pos = pos
        if taken:
            settings = b.store.settings(group.queue)
            if settings.on_expire == "dead_letter":
                settled = b.shared.dead_letter(group, p, taken, now_ms, reason="expired")
            else:
                settled = sum(leases.settle(s, e) for s, e, _ in taken)
                group.dirty = True
            self.expired += settled
        return saw_ttl
