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
from typing import Any

from fabric.protocol.batch import HAS_KEYS, HEADER_SIZE, decode_records, parse_header, whole_prefix
from fabric.push.credit import Credit, take
from fabric.push.shared import KeySharedTable, SharedGroup

# read(queue, partition, offset, max_bytes) -> (batches laid end to end, upto_offset)
ReadFn = Callable[[str, int, int, int], tuple[bytes, int]]
# send(client, subscription_id, partition, upto_offset, chunk, leases) -> False if the client is gone;
# leases: [[start, end, receive_count], ...] for shared subscriptions, else None
SendFn = Callable[[bytes, int, int, int, memoryview, "list[list[int]] | None"], bool]
UNBOUNDED = 1 << 62
OFFER_PENDING_MAX = 100_000  # key_shared: records offered ahead of delivery, per group partition
OFFER_BYTES_MAX = 4 * 1024 * 1024  # read per offer pass
READ_SLACK_BYTES = 64 * 1024  # a push reads this much beyond its message credit's estimated bytes


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
    kind: str = "stream"
    shared: SharedGroup | None = None  # queue / key_shared: the group whose leases this member draws from
    session_timeout_ms: int = 0  # the client's: silent this long, it loses this subscription (0: the node's)

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
    on_remove: Callable[[Subscription], None] | None = None  # group membership ends with the subscription
    retired: dict[str, list[int]] = field(default_factory=dict)  # queue -> [messages, bytes] of removed ones

    def sent_by_queue(self) -> dict[str, list[int]]:
        """Messages and bytes pushed per queue since the node started (metrics)."""
        out = {q: list(v) for q, v in self.retired.items()}
        for sub in self.by_id.values():
            pair = out.setdefault(sub.queue, [0, 0])
            pair[0] += sub.sent_messages
            pair[1] += sub.sent_bytes
        return out

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def add(self, sub: Subscription) -> None:
        self.by_id[sub.id] = sub
        for p in sub.cursors:
            self.by_partition.setdefault((sub.queue, p), set()).add(sub.id)
        self.by_client.setdefault(sub.client, set()).add(sub.id)
        self.ready.add(sub.id)

    def remove(self, sub_id: int, *, keep_leases: bool = False) -> Subscription | None:
        """End a subscription. A queue member's leases go back to its group at once, unless
        ``keep_leases``: then they stay until their visibility timeout, for SETTLE by handle."""
        sub = self.by_id.pop(sub_id, None)
        if sub is None:
            return None
        pair = self.retired.setdefault(sub.queue, [0, 0])
        pair[0] += sub.sent_messages
        pair[1] += sub.sent_bytes
        if sub.shared is not None and keep_leases:
            sub.shared.members.discard(sub.id)
        elif sub.shared is not None:
            # its leases go back at once; its keys (key_shared) are free even when it held no lease:
            # wake every remaining member either way, or the keys it held would wait for new data
            sub.shared.drop_member(sub.id, 0)
            self.ready.update(sub.shared.members)
        if self.on_remove is not None:
            self.on_remove(sub)
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

    def assign(self, sub: Subscription, partition: int, offset: int) -> None:
        """Start pushing ``partition`` to ``sub`` from ``offset`` (a stream group assignment)."""
        sub.cursors[partition] = offset
        self.by_partition.setdefault((sub.queue, partition), set()).add(sub.id)
        self.ready.add(sub.id)

    def unassign(self, sub: Subscription, partition: int) -> None:
        """Stop pushing ``partition`` to ``sub`` at once (revoked or released)."""
        sub.cursors.pop(partition, None)
        ids = self.by_partition.get((sub.queue, partition))
        if ids is not None:
            ids.discard(sub.id)
            if not ids:
                del self.by_partition[(sub.queue, partition)]

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

    def deliver(self, now_ms: int = 0) -> None:
        ready, self.subs.ready = self.subs.ready, set()
        for sub_id in ready:
            sub = self.subs.by_id.get(sub_id)
            if sub is None:
                continue
            keep = self._deliver_shared(sub, now_ms) if sub.shared is not None else self._deliver_one(sub)
            if keep:
                self.subs.ready.add(sub_id)

    def _deliver_shared(self, sub: Subscription, now_ms: int) -> bool:
        """One pass for a member of a shared group: lease what credit allows, push the batches."""
        group = sub.shared
        assert group is not None
        member = group.member(sub.id)
        sent = 0
        for p in group.pass_order(list(sub.cursors), sub.rr):
            if sub.credit.exhausted:
                return False  # a CREDIT grant makes it ready again
            if sent >= self._pass_bytes_max:
                return True
            leases = group.leases[p]
            if isinstance(leases, KeySharedTable):
                if not self._deliver_keyed(sub, member, p, leases, now_ms):
                    return False
                continue
            # fresh offsets: whole batches from the cursor that fit the byte credit
            data, upto = self._read(sub.queue, p, leases.cursor, max(1, sub.credit.bytes))
            chunk = take(data, Credit(UNBOUNDED, max(1, sub.credit.bytes)), upto) if data else None
            fresh_end = chunk.next_offset if chunk is not None else leases.cursor
            deliveries = leases.deliver(member, now_ms, fresh_end, sub.credit.messages)
            if not deliveries:
                continue
            group.dirty = True
            for start, end, spans in _merge(deliveries):
                payload = self._read_range(sub.queue, p, start, end)
                if not payload:
                    continue
                if not self._send(sub.client, sub.id, p, upto, memoryview(payload), spans):
                    self.subs.remove(sub.id)
                    return False
                records = end - start
                sub.credit.spend(records, len(payload))
                sub.sent_messages += records
                sub.sent_bytes += len(payload)
                sent += len(payload)
        sub.rr += 1
        return False

    def _deliver_keyed(self, sub: Subscription, member: str, p: int, leases: KeySharedTable, now_ms: int) -> bool:
        """key_shared: offer what is new (keys read per record), lease what this member may take,
        push the batches holding it with the member's spans. False if the client is gone."""
        group = sub.shared
        assert group is not None
        upto = self._offer_keys(sub.queue, p, leases)
        deliveries = leases.deliver(member, now_ms, sub.credit.messages)
        if not deliveries:
            return True
        group.dirty = True
        spans = sorted([d.start, d.end, d.receive_count] for d in deliveries)
        pos, i = spans[0][0], 0
        while i < len(spans):
            data, _ = self._read(sub.queue, p, pos, self._pass_bytes_max)
            cut, nxt = whole_prefix(data, spans[-1][1])
            if not cut:
                break
            mine = []
            while i < len(spans) and spans[i][0] < nxt:
                s, e, rc = spans[i]
                mine.append([s, min(e, nxt), rc])
                if e > nxt:
                    spans[i] = [nxt, e, rc]  # the rest is in the next piece
                    break
                i += 1
            if not self._send(sub.client, sub.id, p, upto, memoryview(data)[:cut], mine):
                self.subs.remove(sub.id)
                return False
            records = sum(e - s for s, e, _ in mine)
            sub.credit.spend(records, cut)
            sub.sent_messages += records
            sub.sent_bytes += cut
            if i < len(spans):
                pos = max(nxt, spans[i][0])  # skip batches with nothing for this member
        return True

    def _offer_keys(self, queue: str, p: int, leases: KeySharedTable) -> int:
        """Offer the visible records past ``offered_upto`` (keys decoded per record), bounded."""
        upto = 0
        budget = OFFER_BYTES_MAX
        while leases.pending < OFFER_PENDING_MAX and budget > 0:
            start = leases.offered_upto
            data, upto = self._read(queue, p, start, min(budget, self._pass_bytes_max))
            if not data:
                break
            budget -= len(data)
            pos = 0
            while len(data) - pos >= HEADER_SIZE:
                h = parse_header(data, pos)
                if h.base_offset >= upto or pos + h.size > len(data):
                    break
                keys = decode_records(data, pos).keys if h.attributes & HAS_KEYS else None
                run: list[tuple[int, bytes | None]] = []
                for o in range(max(start, h.base_offset), h.next_offset):
                    if o < start + len(run) or (not run and o < leases.offered_upto):
                        continue
                    if leases.state(o) == "settled":
                        # settled before it was offered (expired or purged): the table jumps over
                        # such a span once what comes before it is offered
                        leases.offer(run)
                        run = []
                        start = leases.offered_upto
                        continue
                    run.append((o, keys[o - h.base_offset] if keys else None))
                leases.offer(run)
                start = leases.offered_upto
                pos += h.size
            if pos == 0:
                break
        return upto

    def _read_range(self, queue: str, p: int, start: int, end: int) -> bytes:
        """Whole batches covering offsets [start, end), laid end to end."""
        parts: list[bytes] = []
        offset = start
        while offset < end:
            data, _ = self._read(queue, p, offset, self._pass_bytes_max)
            if not data:
                break
            pos, nxt = whole_prefix(data, end)
            if pos == 0:
                break
            parts.append(data[:pos] if pos < len(data) else data)
            offset = nxt
        return b"".join(parts) if len(parts) != 1 else parts[0]

    def _deliver_one(self, sub: Subscription) -> bool:
        """One pass for one subscription; True if it should stay ready."""
        parts = list(sub.cursors)
        if not parts:
            return False
        sent = 0
        progress = True
        while progress and sent < self._pass_bytes_max and not sub.credit.exhausted:
            progress = False
            for i in range(len(parts)):
                p = parts[(sub.rr + i) % len(parts)]
                want = max(1, min(sub.credit.bytes, self._pass_bytes_max - sent))
                if sub.sent_messages:
                    # no more than the message credit can take, at the sizes sent so far: a read is
                    # a copy (from the tail cache or a segment), and a consumer that grants credit
                    # in steps of a few thousand small messages must not cost 4 MiB per push
                    want = min(want, sub.credit.messages * (sub.sent_bytes // sub.sent_messages) + READ_SLACK_BYTES)
                data, upto = self._read(sub.queue, p, sub.cursors[p], want)
                if not data:
                    continue
                chunk = take(data, sub.credit, upto)
                if chunk is None:
                    continue
                if not self._send(sub.client, sub.id, p, upto, memoryview(data)[: chunk.nbytes], None):
                    self.subs.remove(sub.id)
                    return False
                sub.credit.spend(chunk.records, chunk.nbytes)
                sub.cursors[p] = chunk.next_offset
                sub.sent_messages += chunk.records
                sub.sent_bytes += chunk.nbytes
                sent += chunk.nbytes
                # another pass only for a partition left with visible records: one that sent all it
                # had has nothing more until new data makes the subscription ready again
                progress = progress or chunk.next_offset < upto
                if sub.credit.exhausted:
                    break
            sub.rr += 1
        return progress and not sub.credit.exhausted


def _merge(deliveries: list[Any]) -> list[tuple[int, int, list[list[int]]]]:
    """Group leased ranges into contiguous runs: (start, end, [[s, e, receive_count], ...])."""
    out: list[tuple[int, int, list[list[int]]]] = []
    for d in sorted(deliveries, key=lambda d: d.start):
        span = [d.start, d.end, d.receive_count]
        if out and out[-1][1] == d.start:
            start, _, spans = out[-1]
            spans.append(span)
            out[-1] = (start, d.end, spans)
        else:
            out.append((d.start, d.end, [span]))
    return out
