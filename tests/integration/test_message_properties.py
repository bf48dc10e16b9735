"""Message properties with real processes: delays across kill -9, TTL expiry, priorities, dedup ids."""

from __future__ import annotations

import time

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.errors import BadParameter
from fabric.testing import Node

from ..conftest import drain, kill9

pytestmark = pytest.mark.integration


def test_delayed_message_arrives_on_time_across_a_kill9(node, tmp_path):
    with Admin(node.endpoint) as admin:
        admin.create_queue("later", partitions=2)
    with Producer(node.endpoint, linger_ms=0) as p:
        sent_at = time.time()
        meta = p.send("later", b"in three seconds", delay_ms=3000).result(10)
        now = p.send("later", b"now").result(10)
    assert meta.offset is None and meta.delayed_until_ms is not None
    assert abs(meta.delayed_until_ms / 1000 - (sent_at + 3)) < 0.1
    assert now.offset is not None
    with Admin(node.endpoint) as admin:
        assert admin.describe_queue("later")["delayed"]["batches"] == 1
    time.sleep(1)
    kill9(node)
    restarted = Node(node.data_dir, listen=node.endpoint)
    try:
        with Consumer("later", restarted.endpoint, start="earliest") as c:
            got = drain(c, 1, 5)
            assert [m.value for m in got] == [b"now"]
            serving = time.time()  # on a loaded machine the restart itself may outlast the delay
            assert c.poll(max(0, int((sent_at + 2.8 - time.time()) * 1000))) == []  # not before its time
            got = drain(c, 1, 3)
            arrived = time.time()
        assert [m.value for m in got] == [b"in three seconds"]
        due = max(sent_at + 3, serving)
        assert sent_at + 2.9 <= arrived < due + 0.25, (
            f"arrived {arrived - sent_at:.3f} s after the send, due at {due - sent_at:.3f}"
        )
        with Admin(restarted.endpoint) as admin:
            assert admin.describe_queue("later")["delayed"]["batches"] == 0
    finally:
        restarted.stop()


def test_deliver_at_in_the_past_appends_at_once_and_bad_properties_are_refused(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("at", priority_levels=2)
    with Producer(node.endpoint, linger_ms=0) as p:
        meta = p.send("at", b"x", deliver_at_ms=int(time.time() * 1000) - 5000).result(10)
        assert meta.offset == 0
        with pytest.raises(BadParameter, match=r"priority levels 0\.\.1"):
            p.send("at", b"x", priority=2)
        with pytest.raises(BadParameter, match="delay_ms or deliver_at_ms"):
            p.send("at", b"x", delay_ms=5, deliver_at_ms=5)
        with pytest.raises(BadParameter, match="ttl_ms"):
            p.send("at", b"x", ttl_ms=0)
        with pytest.raises(BadParameter, match="dedup window"):
            p.send("at", b"x", dedup_id="a").result(10)


def _queue_group(endpoint: str, queue: str, group: str) -> None:
    """Create a queue group (its floor at the log's start) and leave it empty-handed."""
    with Consumer(queue, endpoint, group=group, kind="queue", credit_messages=1) as c:
        assert c.poll(200) == []


def test_ttl_expired_messages_go_to_the_dlq_with_reason_expired(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("fresh", partitions=2)
    _queue_group(node.endpoint, "fresh", "workers")
    with Producer(node.endpoint) as p:
        for i in range(5):
            p.send("fresh", b"short-%d" % i, ttl_ms=300)
            p.send("fresh", b"long-%d" % i)
        p.flush(10)
    time.sleep(1.0)
    with Consumer("fresh", node.endpoint, group="workers", kind="queue") as c:
        got = drain(c, 5, 10)
        assert sorted(m.value for m in got) == [b"long-%d" % i for i in range(5)]
        assert c.poll(300) == []
        c.ack(got)
        c.flush_acks()
    with Consumer("fresh.dlq", node.endpoint, start="earliest") as peek:
        dead = drain(peek, 5, 10)
    assert sorted(m.value for m in dead) == [b"short-%d" % i for i in range(5)]
    assert {m.headers["x-dlq-reason"] for m in dead} == {b"expired"}
    assert {m.headers["x-dlq-group"] for m in dead} == {b"workers"}
    with Admin(node.endpoint) as admin:
        dl = admin.describe_queue("fresh")["dead_letters"]
    assert dl == {"queue": "fresh.dlq", "messages": 5, "reasons": {"expired": 5}, "reasons_sampled": False}


def test_queue_default_ttl_with_drop_policy(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("ephemeral", default_ttl_ms=300, on_expire="drop")
    _queue_group(node.endpoint, "ephemeral", "g")
    with Producer(node.endpoint) as p:
        for i in range(10):
            p.send("ephemeral", b"%d" % i)
        p.send("ephemeral", b"kept", ttl_ms=60_000)  # its own TTL wins over the queue's
        p.flush(10)
    time.sleep(1.0)
    with Consumer("ephemeral", node.endpoint, group="g", kind="queue") as c:
        got = drain(c, 1, 10)
        assert [m.value for m in got] == [b"kept"]
        assert c.poll(300) == []
    with Admin(node.endpoint) as admin:
        names = [q["name"] for q in admin.list_queues()]
        assert "ephemeral.dlq" not in names
        d = admin.describe_queue("ephemeral")["groups"]["g"]
        assert d["backlog"] == 1


def test_higher_priorities_are_delivered_first_and_the_lowest_is_not_starved(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("tasks", partitions=2, priority_levels=3)
    with Producer(node.endpoint) as p:
        for i in range(200):
            p.send("tasks", b"low-%d" % i, priority=0)
        for i in range(200):
            p.send("tasks", b"high-%d" % i, priority=2)
        meta = p.send("tasks", b"mid", priority=1, partition=1).result(10)
        p.flush(10)
    assert meta.partition == 1 * 2 + 1  # level 1 of partition 1
    with Consumer("tasks", node.endpoint, group="w", kind="queue", credit_messages=10) as c:
        order = []
        deadline = time.monotonic() + 20
        while len(order) < 401 and time.monotonic() < deadline:
            msgs = c.poll(100)
            order += [m.value for m in msgs]
            c.ack(msgs)
    assert len(order) == 401
    first = order[:200]
    highs = sum(v.startswith(b"high") for v in first)
    lows = sum(v.startswith(b"low") for v in first)
    assert highs >= 150, f"only {highs} of the first 200 deliveries were high priority"
    assert lows >= 1, "the lowest level was starved while the highest had messages"


def test_dedup_ids_drop_duplicates_from_different_producers_across_a_restart(node, tmp_path):
    with Admin(node.endpoint) as admin:
        admin.create_queue("orders", dedup_window_ms=60_000)
    with Producer(node.endpoint) as a, Producer(node.endpoint) as b:
        first = a.send("orders", b"order 1", dedup_id="order-1").result(10)
        again = b.send("orders", b"order 1 again", dedup_id="order-1").result(10)
        other = b.send("orders", b"order 2", dedup_id="order-2").result(10)
    assert first.offset == 0 and not first.duplicate
    assert again.duplicate and again.offset is None
    assert other.offset == 1
    node.stop()
    restarted = Node(node.data_dir, listen=node.endpoint)
    try:
        with Producer(restarted.endpoint, linger_ms=20) as p:
            futures = [p.send("orders", b"o%d" % i, dedup_id=f"order-{i}") for i in range(4)]
            results = [f.result(10) for f in futures]
        assert [r.duplicate for r in results] == [False, True, True, False]  # 0 and 3 are new
        assert [r.offset for r in results] == [2, None, None, 3]
        with Consumer("orders", restarted.endpoint, start="earliest") as c:
            got = drain(c, 4, 10)
        assert [m.value for m in got] == [b"order 1", b"order 2", b"o0", b"o3"]
        assert got[0].headers == {"x-dedup-id": b"order-1"}
    finally:
        restarted.stop()


def test_callbacks_get_what_the_futures_say(node):
    """A callback's RecordMetadata is its future's: a dropped duplicate says so (no offset), a
    delayed message gives its due time, a plain value its offset; send_many's one per value."""
    with Admin(node.endpoint) as admin:
        admin.create_queue("cb", dedup_window_ms=60_000)
    seen: dict[str, list] = {}

    def keep(name):
        return lambda meta, err: seen.setdefault(name, []).append((meta, err))

    with Producer(node.endpoint, linger_ms=5) as p:
        futures = {
            "first": p.send("cb", b"a", dedup_id="d-1", callback=keep("first")),
            "again": p.send("cb", b"a again", dedup_id="d-1", callback=keep("again")),
            "later": p.send("cb", b"later", delay_ms=60_000, callback=keep("later")),
            "plain": p.send("cb", b"plain", callback=keep("plain")),
        }
        many = p.send_many("cb", [b"m0", b"m1", b"m2"], callback=keep("many"))
        p.flush(10)
    for name, f in futures.items():
        assert seen[name] == [(f.result(1), None)], name
    assert seen["again"][0][0].duplicate and seen["again"][0][0].offset is None
    assert seen["later"][0][0].delayed_until_ms is not None
    assert [m for m, _ in seen["many"]] == [f.result(1) for f in many]
    assert [m.offset for m, _ in seen["many"]] == [seen["plain"][0][0].offset + i for i in (1, 2, 3)]


def test_overflow_dead_letters_the_oldest_and_the_trim_survives_a_restart(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("bounded", max_messages=5, overflow="dead_letter_oldest")
    with Consumer("bounded", node.endpoint, group="w", kind="queue", credit_messages=1) as c:
        with Producer(node.endpoint, linger_ms=0) as p:
            for i in range(8):
                p.send("bounded", b"m%d" % i).result(10)
        first = drain(c, 1, 5)  # m0 was leased before it overflowed: its ack is simply ignored
        c.ack(first)
        c.flush_acks()
    with Admin(node.endpoint) as admin:
        d = admin.describe_queue("bounded")
        assert d["messages"] == 5 and d["partition_detail"][0]["log_start_offset"] == 3
        assert d["dead_letters"]["reasons"] == {"overflow": 3}
        assert d["groups"]["w"]["backlog"] == 5
    node.stop()
    restarted = Node(node.data_dir, listen=node.endpoint)
    try:
        with Consumer("bounded", restarted.endpoint, start="earliest") as c:
            got = drain(c, 5, 10)
        assert [m.value for m in got] == [b"m3", b"m4", b"m5", b"m6", b"m7"]
        with Consumer("bounded.dlq", restarted.endpoint, start="earliest") as c:
            dead = drain(c, 3, 10)
        assert [(m.value, m.headers["x-dlq-reason"]) for m in dead] == [(b"m%d" % i, b"overflow") for i in range(3)]
        with Producer(restarted.endpoint) as p:
            assert p.send("bounded", b"m8").result(10).offset == 8
        with Admin(restarted.endpoint) as admin:
            d = admin.describe_queue("bounded")
        assert d["messages"] == 5 and d["dead_letters"]["reasons"] == {"overflow": 4}
    finally:
        restarted.stop()
