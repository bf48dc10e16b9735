"""Push subscriptions: who wants which partitions, where each stands, how much credit.

Theory of operation
-------------------
A subscription belongs to one client session and covers some partitions of one
queue, with a cursor (the next offset to push) per partition and one credit
window. Subscriptions become *ready* when new data lands in one of their
partitions, when the durable watermark moves, or when credit comes back; the
server's loop calls :meth:`Pusher.deliver` with the ready set once per turn.
A delivery pass sends at most ``pass_bytes_max`` per subscription, round-robin
over its partitions, so one busy subscription cannot starve the others; one that
still has data and credit stays ready for the next turn.

This module holds no sockets and no files: reading the log and sending a frame
are functions handed in by the server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fabric.push.credit import Credit, take

# read(queue, partition, offset, max_bytes) -> (batches laid end to end, upto_offset)
ReadFn = Callable[[str, int, int, int], tuple[bytes, int]]
# send(client, subscription_id, partition, upto_offset, chunk) -> False if the client is gone
SendFn = Callable[[bytes, int, int, int, memoryview], bool]


@dataclass(slots=True)
class Subscription:
    id: int
    client: bytes
    queue: str
    group: str | None
    cursors: dict[int, int]
    credit: Credit
    created_ms: int
    sent_messages: int = 0
    sent_bytes: int = 0
    rr: int = 0

    def describe(self) -> dict[str, object]:
        return {
            "subscription": self.id,
            "queue": self.queue,
            "group": self.group,
            "partitions": {str(p): off for p, off in self.cursors.items()},
            "credit_messages": self.credit.messages,
            "credit_bytes": self.credit.bytes,
            "sent_messages": self.sent_messages,
        }


@dataclass(slots=True)
class Subscriptions:
    """The registry: by id, by partition and by client, plus the ready set."""

    by_id: dict[int, Subscription] = field(default_factory=dict)
    by_partition: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    by_client: dict[bytes, set[int]] = field(default_factory=dict)
    ready: set[int] = field(default_factory=set)
    next_id: int = 1

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def add(self, sub: Subscription) -> None:
        self.by_id[sub.id] = sub
        for p in sub.cursors:
            self.by_partition.setdefault((sub.queue, p), set()).add(sub.id)
        self.by_client.setdefault(sub.client, set()).add(sub.id)
        self.ready.add(sub.id)

    def remove(self, sub_id: int) -> Subscription | None:
        sub = self.by_id.pop(sub_id, None)
        if sub is None:
            return None
        for p in sub.cursors:
            ids = self.by_partition.get((sub.queue, p))
            if ids is not None:
                ids.discard(sub_id)
                if not ids:
                    del self.by_partition[(sub.queue, p)]
        ids = self.by_client.get(sub.client)
        if ids is not None:
            ids.discard(sub_id)
            if not ids:
                del self.by_client[sub.client]
        self.ready.discard(sub_id)
        return sub

    def remove_client(self, client: bytes) -> list[Subscription]:
        return [s for s in (self.remove(i) for i in list(self.by_client.get(client, ()))) if s]

    def remove_queue(self, queue: str) -> list[Subscription]:
        ids = [s.id for s in self.by_id.values() if s.queue == queue]
        return [s for s in (self.remove(i) for i in ids) if s]

    def on_data(self, queue: str, partition: int) -> None:
        ids = self.by_partition.get((queue, partition))
        if ids:
            self.ready.update(ids)

    def grant(self, sub_id: int, messages: int, nbytes: int) -> bool:
        sub = self.by_id.get(sub_id)
        if sub is None:
            return False
        sub.credit.grant(messages, nbytes)
        self.ready.add(sub_id)
        return True

    def of_client(self, client: bytes) -> Iterable[Subscription]:
        return [self.by_id[i] for i in self.by_client.get(client, ())]


class Pusher:
    """Sends what ready subscriptions may receive, within their credit."""

    def __init__(self, subs: Subscriptions, read: ReadFn, send: SendFn, *, pass_bytes_max: int = 4 << 20) -> None:
        self.subs = subs
        self._read = read
        self._send = send
        self._pass_bytes_max = pass_bytes_max

    def deliver(self) -> None:
        ready, self.subs.ready = self.subs.ready, set()
        for sub_id in ready:
            sub = self.subs.by_id.get(sub_id)
            if sub is not None and self._deliver_one(sub):
                self.subs.ready.add(sub_id)

    def _deliver_one(self, sub: Subscription) -> bool:
        """One pass for one subscription; True if it should stay ready."""
        parts = list(sub.cursors)
        sent = 0
        progress = True
        while progress and sent < self._pass_bytes_max and not sub.credit.exhausted:
            progress = False
            for i in range(len(parts)):
                p = parts[(sub.rr + i) % len(parts)]
                want = max(1, min(sub.credit.bytes, self._pass_bytes_max - sent))
                data, upto = self._read(sub.queue, p, sub.cursors[p], want)
                if not data:
                    continue
                chunk = take(data, sub.credit, upto)
                if chunk is None:
                    continue
                if not self._send(sub.client, sub.id, p, upto, memoryview(data)[: chunk.nbytes]):
                    self.subs.remove(sub.id)
                    return False
                sub.credit.spend(chunk.records, chunk.nbytes)
                sub.cursors[p] = chunk.next_offset
                sub.sent_messages += chunk.records
                sub.sent_bytes += chunk.nbytes
                sent += chunk.nbytes
                progress = True
                if sub.credit.exhausted:
                    break
            sub.rr += 1
        return progress and not sub.credit.exhausted
