"""Node side of shared consumption (the `queue` kind): join, ack, nack, visibility,
lease expiry, dead letters, checkpoints and redrive.

The lease arithmetic lives in ``fabric/push/leases.py`` (pure); delivery in
``fabric/push/subscriptions.py``. This module ties them to the store: it reads
records that must be dead-lettered, writes them to the dead-letter queue with
their history in headers, and saves every group's lease table (and its floor as
the group's committed offset) to the metadata store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from fabric.errors import (
    BadParameter,
    FabricError,
    KindMismatch,
    NotLeaseHolder,
    QueueFull,
    UnknownSubscription,
)
from fabric.node.records import records_in
from fabric.protocol.batch import CODEC_NONE, encode_batch
from fabric.protocol.requests import RedriveParams, SubscribeParams
from fabric.push.credit import Credit
from fabric.push.leases import PartitionLeases
from fabric.push.shared import CHECKPOINT_MS, SharedGroup
from fabric.push.subscriptions import Subscription
from fabric.settings import QueueSettings

if TYPE_CHECKING:
    from fabric.node.broker import Broker

log = logging.getLogger("fabric.shared")
DLQ_SUFFIX = ".dlq"
REDRIVE_GROUP = "fabric.redrive"
DEAD_BATCH_RECORDS = 1000


class DeadLetterDeferred(QueueFull):
    """Cluster: the dead-letter (or .late) queue is being created, or is led by another node and
    the caller cannot wait for its answer; the records stay where they are (retriable)."""


class SharedGroups:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.groups: dict[tuple[str, str], SharedGroup] = {}
        # cluster: dead-letter ranges sent to a DLQ leader elsewhere, not yet answered
        self._dead_in_flight: set[tuple[Any, ...]] = set()

    # ------------------------------------------------------------------ membership

    def subscribe(self, client: bytes, params: SubscribeParams, settings: QueueSettings, now_ms: int) -> dict[str, Any]:
        b = self.broker
        queue, name, kind = params["queue"], params["group"], params["kind"]
        if name is None:
            raise BadParameter(f"a {kind!r} subscription needs a group")
        group = self.group(queue, name, kind, settings, params["start"])
        partitions = params["partitions"] or list(range(settings.log_partitions))
        for p in partitions:
            b._partition(queue, p, settings)
        credit = Credit(params["credit_messages"], params["credit_bytes"])
        sub = Subscription(b.subs.new_id(), client, queue, name, dict.fromkeys(partitions, 0), credit, now_ms)
        sub.kind = kind
        sub.shared = group
        group.join(sub.id)
        b.subs.add(sub)
        return {"subscription": sub.id, "partitions": {str(p): group.leases[p].floor for p in partitions}, "kind": kind}

    def group(self, queue: str, name: str, kind: str, settings: QueueSettings, start: Any = "committed") -> SharedGroup:
        key = (queue, name)
        group = self.groups.get(key)
        if group is None:
            state = self.broker.store.meta.group_state(queue, name)
            if state is not None and state.get("kind") not in (None, kind):
                raise KindMismatch(f"group {name!r} on {queue!r} is a {state.get('kind')!r} group, not {kind!r}")
            group = self._restore(queue, name, kind, settings, start, state)
            group.dirty = state is None
            self.groups[key] = group
        elif group.kind != kind:
            raise KindMismatch(f"group {name!r} on {queue!r} is a {group.kind!r} group, not {kind!r}")
        return group

    def _restore(
        self, queue: str, name: str, kind: str, settings: QueueSettings, start: Any, state: dict[str, Any] | None
    ) -> SharedGroup:
        """The group from its saved state (lease tables) and committed offsets, or new from ``start``."""
        b = self.broker
        committed = b.store.meta.committed(queue, name)
        floors = {}
        for p in range(settings.log_partitions):
            plog = b.store.partition(queue, p)
            lo = plog.log_start_offset
            if p in committed:
                floors[p] = min(max(committed[p], lo), plog.next_offset)
            elif start == "latest":
                floors[p] = b.partitions[(queue, p)].visible
            elif isinstance(start, int) and lo <= start <= plog.next_offset:
                floors[p] = start
            else:
                floors[p] = lo
        return SharedGroup.create(
            queue,
            name,
            kind,
            floors=floors,
            state=state,
            visibility_ms=settings.visibility_timeout_ms,
            max_receive_count=settings.max_receive_count,
            levels=settings.priority_levels,
        )

    def member_of(self, client: bytes, sub_id: int) -> tuple[Subscription, SharedGroup]:
        sub = self.broker.subs.by_id.get(sub_id)
        if sub is None or sub.client != client:
            raise UnknownSubscription(f"no subscription {sub_id} for this client")
        if sub.shared is None:
            raise BadParameter(f"subscription {sub_id} is a {sub.kind!r} subscription: it has no leases to ack")
        return sub, sub.shared

    # ------------------------------------------------------------------ acks

    def settle(self, client: bytes, params: Mapping[str, Any], how: str, now_ms: int) -> int:
        """ACK / NACK / CHANGE_VISIBILITY over offset ranges; NotLeaseHolder after doing the rest."""
        sub, group = self.member_of(client, params["subscription"])
        return self._settle_ranges(group, group.member(sub.id), params, how, now_ms)

    def settle_left(self, params: Mapping[str, Any], now_ms: int) -> int:
        """SETTLE: the leases of a member that left its queue group keeping them (UNSUBSCRIBE
        ``keep_leases``), by anyone allowed to consume the group: receipt handles. A live member
        settles its own (ACK / NACK / CHANGE_VISIBILITY); after a restart no lease is held."""
        group = self.groups.get((params["queue"], params["group"]))
        if group is None or group.kind != "queue":
            raise BadParameter(f"queue {params['queue']!r} has no queue group {params['group']!r} holding leases")
        if params["uncount"] and params["action"] != "nack":
            raise BadParameter(f"uncount is for action 'nack', not {params['action']!r}")
        if params["member"] in group.members:
            raise NotLeaseHolder(
                f"subscription {params['member']} is still a member of {params['group']!r}: it settles its own messages"
            )
        return self._settle_ranges(group, group.member(params["member"]), params, params["action"], now_ms)

    def _settle_ranges(self, group: SharedGroup, member: str, params: Mapping[str, Any], how: str, now_ms: int) -> int:
        done = 0
        handed = False  # key_shared: an ack handed a key over to a member that may be idle
        refused: list[str] = []
        for key, ranges in params["ranges"].items():
            p = int(key)
            leases = group.leases.get(p)
            if leases is None:
                raise BadParameter(f"partition {p} is not part of group {group.name!r}")
            for start, end in ranges:
                try:
                    if how == "ack":
                        done += leases.ack(member, start, end, now_ms)
                        handed = handed or leases.handed_over
                    elif how == "nack":
                        done += leases.nack(member, start, end, now_ms, params["delay_ms"], uncount=params["uncount"])
                    else:
                        done += leases.change_visibility(member, start, end, now_ms, params["visibility_ms"])
                except NotLeaseHolder as exc:
                    refused.append(f"{p}:{exc.message}")
        group.dirty = True
        if how != "ack" or handed:
            self.broker.subs.ready.update(group.members)
        if refused:
            raise NotLeaseHolder(f"{len(refused)} range(s) not held by this member: {'; '.join(refused[:5])}")
        return done

    # ------------------------------------------------------------------ timers

    def tick(self, now_ms: int) -> None:
        for group in list(self.groups.values()):
            due = group.next_deadline_ms()
            # a lease that ran out, or a nack's delay that ended (expire counts only the former):
            # either may have made something deliverable
            if group.expire(now_ms) or (due is not None and due <= now_ms):
                self.broker.subs.ready.update(group.members)
            for p, leases in group.leases.items():
                dead = leases.take_dead(now_ms)
                if dead:
                    self.dead_letter(group, p, dead, now_ms)
        self.checkpoint(now_ms)

    def next_deadline_ms(self) -> int | None:
        deadlines = [d for d in (g.next_deadline_ms() for g in self.groups.values()) if d is not None]
        return min(deadlines) if deadlines else None

    def checkpoint(self, now_ms: int, *, force: bool = False) -> bool:
        """Save the groups' states that changed; False if that failed (retried on the next tick)."""
        due = [g for g in self.groups.values() if g.dirty and (force or now_ms - g.checkpointed_ms >= CHECKPOINT_MS)]
        if not due:
            return True
        meta = self.broker.store.meta
        try:
            # forced (a durable ack, redrive): wait until it is written; otherwise in the background
            states = {(g.queue, g.name): g.snapshot() for g in due}
            meta.put_group_states(states, wait=force)
            for g in due:
                self.broker.commit_offsets(g.queue, g.name, g.floors())
                g.dirty = False
                g.checkpointed_ms = now_ms
            for (queue, name), state in states.items():  # a cluster: the next coordinator starts from it
                self.broker.placement.group_checkpointed(queue, name, state)
        except FabricError:
            log.exception("could not checkpoint consumer groups; will retry")
            return False
        return True

    def groups_of(self, queue: str) -> set[str]:
        return {name for (q, name) in self.groups if q == queue}

    def grow(self, queue: str, settings: QueueSettings, new: list[int]) -> None:
        """Partitions ``new`` were added to ``queue``: each queue / key_shared group leases them
        from offset 0, its members included."""
        for (q, _), group in self.groups.items():
            if q == queue:
                group.grow(
                    new, visibility_ms=settings.visibility_timeout_ms, max_receive_count=settings.max_receive_count
                )

    def shrink(self, queue: str, gone: Iterable[int]) -> None:
        """Shrinking removed partitions ``gone`` (every group had settled them): their lease tables go."""
        gone = list(gone)
        for (q, _), group in self.groups.items():
            if q == queue:
                for p in gone:
                    group.leases.pop(p, None)
                group.dirty = True

    def forget_queue(self, queue: str) -> None:
        for key in [k for k in self.groups if k[0] == queue]:
            del self.groups[key]

    def forget_group(self, queue: str, name: str) -> None:
        """The group was deleted (it has no members): drop it without a last checkpoint."""
        self.groups.pop((queue, name), None)

    def describe(
        self, queue: str, high_watermarks: dict[int, int], now_ms: int, saved: Iterable[str] = ()
    ) -> dict[str, Any]:
        """The queue's groups held in memory, and of the ``saved`` groups (names in the metadata)
        not held, those whose saved state says they are queue or key_shared groups: their kind
        and leases are durable, so a node that restarted reports them as they were (backlog,
        in flight) before any member joins again. Stream groups are StreamGroups' to describe."""
        out = {g.name: g.describe(high_watermarks, now_ms) for (q, _), g in self.groups.items() if q == queue}
        settings: QueueSettings | None = None
        for name in saved:
            if name in out:
                continue
            state = self.broker.store.meta.group_state(queue, name)
            kind = state.get("kind") if state is not None else None
            if kind in ("queue", "key_shared"):
                settings = settings or self.broker.store.settings(queue)
                group = self._restore(queue, name, str(kind), settings, "committed", state)
                out[name] = group.describe(high_watermarks, now_ms)
        return out

    # ------------------------------------------------------------------ dead letters

    def dead_letter(
        self,
        group: SharedGroup,
        p: int,
        dead: list[tuple[int, int, int]],
        now_ms: int,
        reason: str = "max_receive_count",
    ) -> int:
        """Copy ``(start, end, receive_count)`` ranges to the DLQ with their history, then settle them.

        Returns how many offsets were settled now; a range that could not be written stays
        unsettled (a dead range is reported again by take_dead; an expired one found again by
        the next sweep). In a cluster whose DLQ is led by another node, a range is settled when
        that leader has stored it (acks=all), not before."""
        b = self.broker
        settled = 0
        settings = b.store.settings(group.queue)
        dlq = settings.dead_letter_queue or group.queue + DLQ_SUFFIX
        plog = b.store.partition(group.queue, p)
        for start, end, receive_count in dead:
            key = (group.queue, group.name, p, start, end)
            if key in self._dead_in_flight:
                continue  # on its way to a DLQ leader elsewhere: settled or given back by its answer
            try:
                records = records_in(plog.read(start, 1 << 26), start, end)
                extra = {
                    "x-dlq-source": group.queue.encode(),
                    "x-dlq-partition": b"%d" % p,
                    "x-dlq-group": group.name.encode(),
                    "x-dlq-reason": reason.encode(),
                    "x-dlq-receive-count": b"%d" % receive_count,
                    "x-dlq-time-ms": b"%d" % now_ms,
                }
                self._dead_in_flight.add(key)

                def answered(err: FabricError | None, key: tuple[Any, ...] = key) -> None:
                    self._dead_in_flight.discard(key)
                    self._dead_lettered(group, key[2], key[3], key[4], reason, dlq, err)

                if self.append_records(dlq, settings, records, extra, now_ms, done=answered):
                    continue
                self._dead_in_flight.discard(key)
            except DeadLetterDeferred as exc:
                self._dead_in_flight.discard(key)
                log.debug("dead letters of %s/%d wait: %s", group.queue, p, exc.message)
                if reason == "max_receive_count":
                    group.leases[p].return_dead(start, end)
                continue
            except FabricError:
                self._dead_in_flight.discard(key)
                log.exception("could not dead-letter %s/%d %d..%d; will retry", group.queue, p, start, end)
                if reason == "max_receive_count":
                    group.leases[p].return_dead(start, end)
                continue
            settled += self._dead_lettered(group, p, start, end, reason, dlq, None)
        return settled

    def _dead_lettered(
        self, group: SharedGroup, p: int, start: int, end: int, reason: str, dlq: str, err: FabricError | None
    ) -> int:
        """A range is in the DLQ (settle it) or could not be put there (give it back)."""
        if err is not None:
            log.warning("could not dead-letter %s/%d %d..%d to %r: %s", group.queue, p, start, end, dlq, err.message)
            if reason == "max_receive_count":
                group.leases[p].return_dead(start, end)
            return 0
        settled = group.leases[p].settle(start, end)
        group.dirty = True
        self.broker.notices.note(
            self.broker._now_ms,
            ("dead-letter", group.queue, reason),
            end - start,
            f"dead-lettered {{n}} message(s) of {group.queue!r} to {dlq!r} (reason {reason}, group {group.name!r})",
        )
        return settled

    def append_records(
        self,
        target: str,
        like: QueueSettings,
        records: list[tuple[int, bytes, bytes | None, dict[str, bytes], int]],
        extra: dict[str, bytes],
        now_ms: int,
        offset_header: str | None = "x-dlq-offset",
        done: Callable[[FabricError | None], None] | None = None,
    ) -> bool:
        """Append records (offset, value, key, headers, timestamp) to ``target`` with ``extra`` headers
        (and each record's old offset under ``offset_header``); creates ``target`` if missing.

        The placement says where (``Placement.internal_target``). In a cluster ``target`` is a
        cluster queue: created through the controller (this node its first leader) and written by
        its leader. When another node leads it, the batches go there with acks=all and True is
        returned: ``done`` gets the outcome later (without ``done``, DeadLetterDeferred).
        DeadLetterDeferred too while ``target`` is being created."""
        b = self.broker
        batches = []
        for i in range(0, len(records), DEAD_BATCH_RECORDS):
            chunk = records[i : i + DEAD_BATCH_RECORDS]
            batches.append(
                encode_batch(
                    [r[1] for r in chunk],
                    keys=[r[2] for r in chunk],
                    headers=[
                        {**r[3], **extra, **({offset_header: b"%d" % r[0]} if offset_header else {})} for r in chunk
                    ],
                    timestamps=[r[4] for r in chunk],
                    codec=CODEC_NONE,
                )
            )
        if b.placement.internal_target(target, like, batches, now_ms, done):
            return True
        for batch in batches:
            b.append_internal(target, 0, bytearray(batch))
        return False

    # ------------------------------------------------------------------ redrive

    def redrive(self, params: RedriveParams, now_ms: int) -> dict[str, int]:
        """Move dead letters back to the queues they came from.

        The DLQ is read through a shared group of its own (``fabric.redrive``): a
        redriven message is settled there, so it is never moved twice, while the ones
        a filter skipped stay for a later redrive. Browsing the DLQ (FETCH, or a
        plain stream subscription) consumes nothing."""
        if params["dry_run"]:
            return self._count_redrivable(params)
        b = self.broker
        dlq = params["queue"]
        settings = b.store.settings(dlq)
        group = self.group(dlq, REDRIVE_GROUP, "queue", settings, "earliest")
        member = f"redrive-{now_ms}"
        limit = params["max_messages"]
        matching = skipped = 0
        try:
            for p, leases in group.leases.items():
                assert isinstance(leases, PartitionLeases)  # the redrive group is a queue group
                plog = b.store.partition(dlq, p)
                upto = b.partitions[(dlq, p)].visible
                while matching < limit:
                    deliveries = leases.deliver(member, now_ms, upto, min(10_000, limit - matching))
                    if not deliveries:
                        break
                    for d in deliveries:
                        for offset, value, key, headers, ts in records_in(plog.read(d.start, 1 << 26), d.start, d.end):
                            source = headers.get("x-dlq-source", b"").decode(errors="replace")
                            reason = headers.get("x-dlq-reason", b"").decode(errors="replace")
                            wanted = params["reason"] is None or reason == params["reason"]
                            if not wanted or source not in b.store.queue_names() or matching >= limit:
                                skipped += 1  # stays leased to this pass, returned below
                                continue
                            matching += 1
                            kept = {k: v for k, v in headers.items() if not k.startswith("x-dlq-")}
                            kept["x-redriven-from"] = dlq.encode()
                            part = int(headers.get("x-dlq-partition", b"0") or 0)
                            part = part if part < b.store.settings(source).log_partitions else 0
                            batch = encode_batch([value], keys=[key], headers=[kept], timestamps=[ts])
                            b.append_internal(source, part, bytearray(batch))
                            leases.ack(member, offset, offset + 1, now_ms)
        finally:
            for leases in group.leases.values():
                leases.drop_member(member, now_ms)
            group.dirty = True
            self.checkpoint(now_ms, force=True)
        return {"redriven": matching, "matching": matching, "skipped": skipped}

    def _count_redrivable(self, params: RedriveParams) -> dict[str, int]:
        """A dry run of redrive: count what it would move without leasing anything, so no
        ``fabric.redrive`` group is made (or changed) on the DLQ. With that group already there,
        only offsets it would deliver (new or given back) count."""
        b = self.broker
        dlq = params["queue"]
        settings = b.store.settings(dlq)
        exists = (dlq, REDRIVE_GROUP) in self.groups or REDRIVE_GROUP in b.store.meta.groups(dlq)
        group = self.group(dlq, REDRIVE_GROUP, "queue", settings, "earliest") if exists else None
        limit = params["max_messages"]
        names = b.store.queue_names()
        matching = skipped = 0
        for p in range(settings.log_partitions):
            plog = b.store.partition(dlq, p)
            upto = b.visible(dlq, p, plog.next_offset)
            leases = group.leases.get(p) if group is not None else None
            pos = max(plog.log_start_offset, leases.floor if isinstance(leases, PartitionLeases) else 0)
            while pos < upto and matching < limit:
                records = records_in(plog.read(pos, 1 << 26), pos, upto)
                if not records:
                    break
                for offset, _value, _key, headers, _ts in records:
                    if isinstance(leases, PartitionLeases) and leases.state(offset) not in ("new", "redeliverable"):
                        continue
                    source = headers.get("x-dlq-source", b"").decode(errors="replace")
                    reason = headers.get("x-dlq-reason", b"").decode(errors="replace")
                    if (params["reason"] is not None and reason != params["reason"]) or source not in names:
                        skipped += 1
                    elif matching < limit:
                        matching += 1
                pos = records[-1][0] + 1
        return {"redriven": 0, "matching": matching, "skipped": skipped}
