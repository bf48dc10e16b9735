"""key_shared members that die (issue 15 #2): the keys and leases of a member that leaves pass to
the members still there, without any new message arriving to wake them. Driven through the real
``Subscriptions`` + ``Pusher`` + ``SharedGroup`` the node uses, over an in-memory log.

The case that stranded keys: a member that holds key assignments but no lease (it acked all it
was given, while more of its keys waited) leaves; the table hands its keys on, but nobody was
told to look, so the backlog under those keys waited for a member to join or a message to land.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.protocol.batch import encode_batch, iter_batches, stamp
from fabric.push.credit import Credit
from fabric.push.shared import SharedGroup
from fabric.push.subscriptions import Pusher, Subscription, Subscriptions


class Log:
    def __init__(self, keys: list[bytes], batch: int) -> None:
        self.batches: list[tuple[int, bytes]] = []
        for start in range(0, len(keys), batch):
            part = keys[start : start + batch]
            b = bytearray(encode_batch([b"v"] * len(part), keys=part))
            stamp(b, start)
            self.batches.append((start, bytes(b)))
        self.end = len(keys)

    def read(self, queue: str, p: int, offset: int, max_bytes: int) -> tuple[bytes, int]:
        out, size = [], 0
        for start, data in self.batches:
            if start + self._count(data) <= offset:
                continue
            if out and size + len(data) > max_bytes:
                break
            out.append(data)
            size += len(data)
        return b"".join(out), self.end

    @staticmethod
    def _count(data: bytes) -> int:
        return sum(h.record_count for _, h in iter_batches(data))


class Node:
    """One key_shared group on one partition, its members, and what each was pushed."""

    def __init__(self, log: Log, members: int, credit: int) -> None:
        self.log = log
        self.subs = Subscriptions()
        self.group = SharedGroup.create(
            "q", "g", "key_shared", floors={0: 0}, state=None, visibility_ms=60_000, max_receive_count=0
        )
        self.inbox: dict[int, list[tuple[int, int]]] = {}
        self.pusher = Pusher(self.subs, log.read, self._send)
        for _ in range(members):
            sub = Subscription(self.subs.new_id(), b"c", "q", "g", {0: 0}, Credit(credit, 1 << 30), 0)
            sub.kind, sub.shared = "key_shared", self.group
            self.group.join(sub.id)
            self.subs.add(sub)
            self.inbox[sub.id] = []

    def _send(self, client, sub_id, p, upto, chunk, leases) -> bool:
        for s, e, _rc in leases:
            self.inbox[sub_id].extend((o, sub_id) for o in range(s, e))
        return True

    def ack_all(self, sub_id: int, now_ms: int) -> int:
        """The member acks everything it was pushed and grants the credit back."""
        got = self.inbox[sub_id]
        self.inbox[sub_id] = []
        table = self.group.leases[0]
        for o, _ in got:
            table.ack(self.group.member(sub_id), o, o + 1, now_ms)
        if got:
            self.subs.grant(sub_id, len(got), 0)
        return len(got)


@settings(max_examples=150, deadline=None)
@given(
    keys=st.lists(st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f", b"g"]), min_size=5, max_size=200),
    batch=st.integers(1, 40),
    credit=st.integers(1, 30),
    victim=st.integers(0, 2),
    rounds_before=st.integers(1, 6),
)
def test_keys_of_a_member_that_leaves_reach_the_others_without_new_data(keys, batch, credit, victim, rounds_before):
    log = Log(keys, batch)
    node = Node(log, members=3, credit=credit)
    ids = sorted(node.inbox)
    dead = ids[victim]
    now = 0
    acked = 0
    for _ in range(rounds_before):  # everyone works a while; the victim acks all it got (no leases left)
        node.pusher.deliver(now)
        for sub_id in ids:
            acked += node.ack_all(sub_id, now)
        now += 10
    node.pusher.deliver(now)
    acked += node.ack_all(dead, now)  # ... it holds key assignments, maybe no lease, and dies
    node.subs.remove(dead)
    living = [i for i in ids if i != dead]
    for _ in range(10_000):
        for sub_id in living:
            acked += node.ack_all(sub_id, now)
        if not node.subs.ready:
            break  # nothing more will happen: no new data, no timers
        node.pusher.deliver(now)
        now += 10
    table = node.group.leases[0]
    assert table.floor == log.end, f"stranded: settled up to {table.floor} of {log.end}, {table.pending} pending"
