"""Delivery that recovers (issue 15): push consumers never stall on credit, groups commit exactly
what the application was given, and acks can be awaited until they survive a crash."""

from __future__ import annotations

import time

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.client.consumer import Message
from fabric.testing import Node
from tests.conftest import drain, kill9

pytestmark = pytest.mark.integration


def _send_batches(endpoint: str, queue: str, sizes: list[int]) -> None:
    """One record batch per size (flush between), in order, on partition 0."""
    n = 0
    with Producer(endpoint, linger_ms=5_000, batch_bytes=8 << 20, batch_messages=1_000_000) as p:
        for size in sizes:
            for _ in range(size):
                p.send(queue, b"%d" % n, partition=0)
                n += 1
            p.flush()


def test_a_push_consumer_gets_past_a_batch_larger_than_its_credit_left(node):
    """A 3,000-record batch, then one of 18,000: the consumer owes 3,000 (below its 5,000 grant step)
    and 17,000 of its 20,000 credit is left. Before the fix it stopped at offset 3,000."""
    with Admin(node.endpoint) as admin:
        admin.create_queue("q", partitions=1)
    _send_batches(node.endpoint, "q", [3_000, 18_000, 500])
    with Consumer("q", node.endpoint, start="earliest") as c:
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 21_500 and time.monotonic() < deadline:
            b = c.poll_batch(200)
            if b is not None:
                got.extend(b.values)
    assert len(got) == 21_500
    assert got == [b"%d" % i for i in range(21_500)]


def test_iterating_then_breaking_commits_only_what_was_given(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("orders", partitions=1)
    _send_batches(node.endpoint, "orders", [100])  # one batch of 100
    with Consumer("orders", node.endpoint, group="billing", start="earliest") as c:
        seen = []
        for m in c:
            seen.append(m.offset)
            if len(seen) == 10:
                break
        c.commit()
        assert c.committed() == {0: 10}
        # the rest of that batch is not lost to this consumer either
        rest = c.poll_batch(2000)
        assert rest is not None and rest.base_offset == 10 and len(rest) == 90
        seen.append(-1)
    # closing auto-commits what was given: all 100 now
    with Consumer("orders", node.endpoint, group="billing") as c:
        assert c.committed() == {0: 100}


def test_the_next_member_of_the_group_gets_what_was_not_given(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("orders", partitions=1)
    _send_batches(node.endpoint, "orders", [50])
    with Consumer("orders", node.endpoint, group="g", start="earliest") as c:
        first = []
        for m in c:
            first.append(m.offset)
            if len(first) == 7:
                break
    # closed with auto_commit: offset 7 committed, not 50
    with Consumer("orders", node.endpoint, group="g") as c:
        rest = [m.offset for m in drain(c, 43, seconds=15)]
    assert first == list(range(7)) and rest == list(range(7, 50))


def test_awaited_acks_survive_a_crash_of_the_node(tmp_path):
    """ack(wait=True) returns once the node saved the acks: after kill -9 and a restart nothing
    acked comes back, though the visibility timeout of what was never acked runs out."""
    data = str(tmp_path / "data")
    node = Node(data)
    try:
        with Admin(node.endpoint) as admin:
            admin.create_queue("jobs", partitions=1, visibility_timeout_ms=1_000)
        _send_batches(node.endpoint, "jobs", [20])
        w = Consumer("jobs", node.endpoint, group="workers", kind="queue", heartbeat_ms=200)
        got = drain(w, 20, seconds=15)
        assert len(got) == 20
        w.ack(got[:15], wait=True)
        kill9(node)
        w._conn.close()
        node = Node(data, listen=node.endpoint)
        with Consumer("jobs", node.endpoint, group="workers", kind="queue") as again:
            back = drain(again, 20, seconds=4)  # the 5 unacked come back (again and again: no ack here)
        assert {m.offset for m in back} == set(range(15, 20))
    finally:
        node.stop()


def test_flush_acks_reports_an_ack_the_node_refused(node):
    from fabric.errors import NotLeaseHolder

    with Admin(node.endpoint) as admin:
        admin.create_queue("jobs", partitions=1)
    _send_batches(node.endpoint, "jobs", [5])
    with Consumer("jobs", node.endpoint, group="w", kind="queue") as b:
        assert len(drain(b, 5, seconds=10)) == 5  # b holds all five leases
        with Consumer("jobs", node.endpoint, group="w", kind="queue") as a:
            a.ack_offset(0, 3)  # asynchronous: a never held it; the node refuses it later
            assert a.poll(100) == []  # the ack goes out while a polls (ack_interval_ms=10)
            with pytest.raises(NotLeaseHolder):
                a.flush_acks()
            a.flush_acks()  # reported once
            assert a.ack_errors == 1
            with pytest.raises(NotLeaseHolder):  # the same, waited for at once
                a.ack(Message("jobs", 0, 4, b""), wait=True)
            assert a.ack_errors == 2


def test_a_consumer_back_over_a_new_link_replaces_its_old_subscription(node):
    """SUBSCRIBE ``replaces``: a consumer that lost its link (a router or node failover) and
    subscribes again ends its old subscription at once, so its group's partitions do not wait
    for the old session to expire."""
    from fabric.client import Admin, Consumer
    from fabric.protocol.ops import Op
    from fabric.transport.connection import connect

    with Admin(node.endpoint) as admin:
        admin.create_queue("relink", partitions=3)
    old = Consumer("relink", node.endpoint, group="g", session_timeout_ms=60_000)
    try:
        assert old.assignment() == [0, 1, 2]
        conn = connect(node.endpoint, timeout_ms=5000)
        try:
            params = {"queue": "relink", "group": "g", "session_timeout_ms": 60_000}
            # another client cannot end it without naming it: it joins and gets nothing yet
            reply = conn.request(Op.SUBSCRIBE, params).params
            assert reply["partitions"] == {}
            conn.request(Op.UNSUBSCRIBE, {"subscription": reply["subscription"]})
            reply = conn.request(Op.SUBSCRIBE, {**params, "replaces": old._sub}).params
            assert sorted(reply["partitions"]) == ["0", "1", "2"]  # at once, not after 60 s
            with Admin(node.endpoint) as admin:
                assert len(admin.describe_group("relink", "g")["members"]) == 1
        finally:
            conn.close()
    finally:
        old.close()
