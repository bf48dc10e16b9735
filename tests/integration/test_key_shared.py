"""key_shared subscriptions with a real node: one member per key at a time, per-key order, hand-over."""

from __future__ import annotations

import time

import pytest

from fabric.client import Admin, Consumer, Producer

pytestmark = pytest.mark.integration


def _send(endpoint: str, queue: str, n: int, keys: int) -> None:
    with Producer(endpoint) as p:
        for i in range(n):
            p.send(queue, b"%d" % i, key=b"k%d" % (i % keys))
        p.flush(10)


def test_each_key_goes_to_one_member_in_order(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("orders", partitions=2)
    members = [Consumer("orders", node.endpoint, group="g", kind="key_shared", credit_messages=50) for _ in range(3)]
    try:
        _send(node.endpoint, "orders", 3000, 40)
        owner: dict[bytes, int] = {}
        seen: dict[bytes, list[int]] = {}
        total = 0
        deadline = time.monotonic() + 30
        while total < 3000 and time.monotonic() < deadline:
            for i, c in enumerate(members):
                msgs = c.poll(20)
                for m in msgs:
                    assert owner.setdefault(m.key, i) == i, f"key {m.key!r} went to members {owner[m.key]} and {i}"
                    seen.setdefault(m.key, []).append(int(m.value))
                c.ack(msgs)
                total += len(msgs)
        assert total == 3000
        assert all(v == sorted(v) for v in seen.values()), "a key's messages arrived out of order"
        assert len(set(owner.values())) == 3, "keys were not spread over the members"
        with Admin(node.endpoint) as admin:
            for c in members:
                c.flush_acks()
            g = admin.describe_queue("orders")["groups"]["g"]
        assert g["kind"] == "key_shared" and g["backlog"] == 0 and g["in_flight"] == 0
    finally:
        for c in members:
            c.close()


def test_one_poll_takes_every_leased_run_already_received(node):
    """Two members, keys interleaved: each push holds many short runs of a member's offsets.
    One poll() returns all of them that arrived (up to 1,000), not one run per call."""
    with Admin(node.endpoint) as admin:
        admin.create_queue("runs", partitions=1)
    members = [Consumer("runs", node.endpoint, group="g", kind="key_shared", credit_messages=500) for _ in range(2)]
    try:
        _send(node.endpoint, "runs", 400, 40)
        time.sleep(0.5)  # the pushes arrive
        sizes = [len(c.poll(1000)) for c in members]
        assert sum(sizes) == 400 and min(sizes) > 20, sizes  # one run would be a few messages
    finally:
        for c in members:
            c.close()


def test_a_departed_members_keys_move_with_their_unacked_messages_first(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("jobs", visibility_timeout_ms=60_000)
    a = Consumer("jobs", node.endpoint, group="g", kind="key_shared", credit_messages=5)
    b = Consumer("jobs", node.endpoint, group="g", kind="key_shared", credit_messages=100)
    try:
        _send(node.endpoint, "jobs", 200, 10)
        held = a.poll(2000)  # a takes some and never acks them
        assert held
        held_keys = {m.key for m in held}
        got_b = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            msgs = b.poll(100)
            assert not {m.key for m in msgs} & held_keys, "b got a key a still holds"
            got_b += msgs
            b.ack(msgs)
            if not msgs and got_b:
                break
        a.close()  # its leases are released at once: b takes a's keys, oldest first
        later = []
        deadline = time.monotonic() + 10
        while len(got_b) + len(later) < 200 and time.monotonic() < deadline:
            msgs = b.poll(200)
            later += msgs
            b.ack(msgs)
        assert len(got_b) + len(later) == 200
        for key in held_keys:
            mine = [int(m.value) for m in later if m.key == key]
            assert mine == sorted(mine)
            first_held = min(int(m.value) for m in held if m.key == key)
            assert mine[0] == first_held, "the released message did not come first for its key"
            assert next(m for m in later if int(m.value) == first_held).receive_count == 2
    finally:
        a.close()
        b.close()


def test_ttl_expires_key_shared_messages_without_reordering_the_rest(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("fresh")
    with Consumer("fresh", node.endpoint, group="g", kind="key_shared", credit_messages=1) as c:
        assert c.poll(200) == []  # the group exists; it holds nothing
    with Producer(node.endpoint) as p:
        for i in range(6):
            p.send("fresh", b"short-%d" % i, key=b"k%d" % (i % 2), ttl_ms=300)
            p.send("fresh", b"long-%d" % i, key=b"k%d" % (i % 2))
        p.flush(10)
    time.sleep(1.0)
    with Consumer("fresh", node.endpoint, group="g", kind="key_shared") as c:
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 6 and time.monotonic() < deadline:
            msgs = c.poll(200)
            got += msgs
            c.ack(msgs)
        assert c.poll(300) == []
    assert [m.value for m in got if m.key == b"k0"] == [b"long-0", b"long-2", b"long-4"]
    assert [m.value for m in got if m.key == b"k1"] == [b"long-1", b"long-3", b"long-5"]
    with Admin(node.endpoint) as admin:
        assert admin.describe_queue("fresh")["dead_letters"]["reasons"] == {"expired": 6}
