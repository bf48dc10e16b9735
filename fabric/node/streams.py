"""Node side of `stream` consumer groups: the coordinator's changes applied to push delivery.

``fabric/push/groups.py`` decides who owns which partition (pure). Here its
changes become actions: an *Assign* starts pushing the partition to the member
from the group's committed offset and tells the member (ASSIGNMENT event, with
the start offsets); a *Revoke* stops pushing at once and asks the member to give
the partition back. The member commits its positions and confirms (REVOKED);
only then, or when it leaves or its session expires, is the partition assigned
to someone else, so no two members ever hold one partition at once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fabric.errors import BadParameter, KindMismatch, UnknownMember, UnknownSubscription
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from fabric.protocol.requests import RevokedParams, SubscribeParams
from fabric.push.credit import Credit
from fabric.push.groups import Assign, Change, Revoke, StreamGroup
from fabric.push.subscriptions import Subscription
from fabric.settings import QueueSettings

if TYPE_CHECKING:
    from fabric.node.broker import Broker

log = logging.getLogger("fabric.streams")


class StreamGroups:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.groups: dict[tuple[str, str], StreamGroup] = {}
        self.members: dict[tuple[str, str], dict[str, int]] = {}  # member id -> subscription id
        self.start: dict[tuple[str, str], Any] = {}  # where a partition with no commit starts
        self.started: dict[tuple[str, str], dict[int, int]] = {}  # where each such partition did start

    def subscribe(self, client: bytes, params: SubscribeParams, settings: QueueSettings, now_ms: int) -> dict[str, Any]:
        b = self.broker
        queue, name = params["queue"], params["group"]
        if not name:  # the broker sends only a group's subscriptions here
            raise BadParameter("a stream group subscription names its group")
        key = (queue, name)
        if name in b.shared.groups_of(queue):
            raise KindMismatch(f"group {name!r} on {queue!r} is a queue group, not a stream group")
        state = b.store.meta.group_state(queue, name)
        if state is not None and state.get("kind") not in (None, "stream"):
            raise KindMismatch(f"group {name!r} on {queue!r} is a {state.get('kind')!r} group, not a stream group")
        group = self.groups.get(key)
        if group is None:
            group = StreamGroup(settings.log_partitions, session_timeout_ms=params["session_timeout_ms"])
            self.groups[key] = group
            self.members[key] = {}
            self.start[key] = params["start"]
        credit = Credit(params["credit_messages"], params["credit_bytes"])
        sub = Subscription(b.subs.new_id(), client, queue, name, {}, credit, now_ms)
        sub.kind = "stream"
        member = str(sub.id)
        b.subs.add(sub)
        self.members[key][member] = sub.id
        changes = group.join(member, now_ms)
        initial = self._apply(key, changes, skip_event_for=member)
        return {
            "subscription": sub.id,
            "member": member,
            "generation": group.generation,
            "partitions": {str(p): off for p, off in initial.items()},
            "kind": "stream",
        }

    def uncommitted_start(self, queue: str, name: str, part: dict[str, Any]) -> int:
        """Where the group stands on a partition it has not committed (DESCRIBE_QUEUE's ``part``
        row): where a live group started it, or would (``latest``: the high watermark; an
        offset), else the log start, as a member joining now would."""
        started = self.started.get((queue, name), {}).get(int(part["partition"]))
        if started is not None:
            return max(started, int(part["log_start_offset"]))
        start = self.start.get((queue, name), "committed")
        if start == "latest":
            return int(part["high_watermark"])
        if isinstance(start, int) and part["log_start_offset"] <= start <= part["next_offset"]:
            return start
        return int(part["log_start_offset"])

    def _start_offset(self, key: tuple[str, str], p: int) -> int:
        b = self.broker
        queue, name = key
        plog = b.store.partition(queue, p)
        lo = plog.log_start_offset
        committed = b.store.meta.committed(queue, name)
        if p in committed:
            return min(max(committed[p], lo), plog.next_offset)
        start = self.start.get(key, "committed")
        if start == "latest":
            offset = b.partitions[(queue, p)].visible
        elif isinstance(start, int) and lo <= start <= plog.next_offset:
            offset = start
        else:
            offset = lo
        self.started.setdefault(key, {}).setdefault(p, offset)
        return offset

    def _apply(
        self, key: tuple[str, str], changes: list[Change], *, skip_event_for: str | None = None
    ) -> dict[int, int]:
        """Carry out the coordinator's changes; returns what ``skip_event_for`` was assigned (its reply says it)."""
        b = self.broker
        group = self.groups[key]
        members = self.members[key]
        events: dict[str, dict[str, Any]] = {}
        for change in changes:
            sub = b.subs.by_id.get(members.get(change.member, -1))
            if sub is None:
                continue
            ev = events.setdefault(change.member, {"assigned": {}, "revoked": []})
            if isinstance(change, Assign):
                for p in change.partitions:
                    offset = self._start_offset(key, p)
                    b.subs.assign(sub, p, offset)
                    ev["assigned"][str(p)] = offset
            elif isinstance(change, Revoke):
                for p in change.partitions:
                    b.subs.unassign(sub, p)  # stop pushing at once; it still holds p until it confirms
                    ev["revoked"].append(p)
        initial: dict[int, int] = {}
        for member, ev in events.items():
            if member == skip_event_for and not ev["revoked"]:
                initial = {int(p): o for p, o in ev["assigned"].items()}
                continue
            sub = b.subs.by_id.get(members[member])
            if sub is not None:
                params = {"generation": group.generation, **ev}
                frames = fr.encode(fr.Header(Op.ASSIGNMENT, sub.id, fr.FLAG_EVENT), params)
                b._send_or_count(sub.client, frames)
        return initial

    def revoked(self, client: bytes, params: RevokedParams, now_ms: int) -> dict[str, Any]:
        _, key, member = self.member_of(client, params["subscription"])
        changes = self.groups[key].revoked(member, params["partitions"], now_ms)
        self._apply(key, changes)
        return {"generation": self.groups[key].generation}

    def member_of(self, client: bytes, sub_id: int) -> tuple[Subscription, tuple[str, str], str]:
        sub = self.broker.subs.by_id.get(sub_id)
        if sub is None or sub.client != client:
            raise UnknownSubscription(f"no subscription {sub_id} for this client")
        key = (sub.queue, sub.group or "")
        if sub.kind != "stream" or key not in self.groups or str(sub.id) not in self.members[key]:
            raise UnknownMember(f"subscription {sub_id} is not a member of a stream group")
        return sub, key, str(sub.id)

    def holds(self, sub: Subscription, partition: int) -> bool:
        """Whether ``sub`` (a stream group member) may commit ``partition`` now."""
        key = (sub.queue, sub.group or "")
        group = self.groups.get(key)
        return group is not None and group.owner(partition) == str(sub.id)

    def heartbeat(self, client: bytes, now_ms: int) -> None:
        for sub in self.broker.subs.of_client(client):
            key = (sub.queue, sub.group or "")
            if sub.kind == "stream" and key in self.groups:
                try:
                    self.groups[key].heartbeat(str(sub.id), now_ms)
                except UnknownMember:
                    pass

    def on_remove(self, sub: Subscription) -> None:
        """The subscription ended (unsubscribe, session expiry, client gone): it leaves its group."""
        key = (sub.queue, sub.group or "")
        members = self.members.get(key)
        if sub.kind != "stream" or members is None or members.pop(str(sub.id), None) is None:
            return
        try:
            changes = self.groups[key].leave(str(sub.id), self.broker._now_ms)
        except UnknownMember:
            return
        self._apply(key, changes)

    def tick(self, now_ms: int) -> None:
        for key, group in list(self.groups.items()):
            deadline = group.next_deadline_ms()
            if deadline is not None and deadline <= now_ms:
                before = set(group.members)
                changes = group.expire(now_ms)
                gone = before - set(group.members)
                for member in gone:
                    sub_id = self.members[key].pop(member, None)
                    if sub_id is not None:
                        log.info("stream group %s/%s: member %s expired", key[0], key[1], member)
                        sub = self.broker.subs.by_id.get(sub_id)
                        if sub is not None:
                            sub.kind = "expired"  # remove() must not make it leave twice
                            self.broker.subs.remove(sub_id)
                self._apply(key, changes)

    def next_deadline_ms(self) -> int | None:
        deadlines = [d for d in (g.next_deadline_ms() for g in self.groups.values()) if d is not None]
        return min(deadlines) if deadlines else None

    def grow(self, queue: str, partitions: int) -> None:
        """The queue has ``partitions`` partitions now: each stream group rebalances over them."""
        for key in [k for k in self.groups if k[0] == queue]:
            self._apply(key, self.groups[key].grow(partitions))

    def groups_of(self, queue: str) -> set[str]:
        return {name for (q, name) in self.groups if q == queue}

    def shrink(self, queue: str, partitions: int) -> None:
        """Shrinking removed the queue's partitions from ``partitions`` on: each stream group tells
        their holders (a revoke) and rebalances over the rest."""
        for key in [k for k in self.groups if k[0] == queue]:
            self._apply(key, self.groups[key].shrink(partitions))

    def forget_queue(self, queue: str) -> None:
        for key in [k for k in self.groups if k[0] == queue]:
            del self.groups[key]
            del self.members[key]
            self.start.pop(key, None)
            self.started.pop(key, None)

    def forget_group(self, queue: str, name: str) -> None:
        """The group was deleted (it has no members): forget its assignment state."""
        key = (queue, name)
        self.groups.pop(key, None)
        self.members.pop(key, None)
        self.start.pop(key, None)
        self.started.pop(key, None)

    def describe(self, queue: str) -> dict[str, Any]:
        return {name: {"kind": "stream", **g.describe()} for (q, name), g in self.groups.items() if q == queue}
