"""Producer -> node -> consumer through real processes and sockets."""

from __future__ import annotations

import time

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.errors import MessageTooLarge, OffsetOutOfRange, QueueExists, UnknownQueue
from tests.conftest import drain

pytestmark = pytest.mark.integration


def test_send_and_receive_100k_in_order(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("orders", partitions=3)
    n = 100_000
    with Producer(node.endpoint, linger_ms=2) as producer:
        futures = [producer.send("orders", b"%d" % i, key=b"k%d" % (i % 50)) for i in range(n)]
        producer.flush()
    metas = [f.result() for f in futures]
    assert all(m.offset is not None for m in metas)
    with Consumer("orders", node.endpoint, group="g1", start="earliest") as consumer:
        got = drain(consumer, n)
    assert len(got) == n
    assert sorted(int(m.value) for m in got) == list(range(n))
    # FIFO per partition: offsets consecutive from 0, and the producer's order per key kept
    by_part: dict[int, list] = {}
    for m in got:
        by_part.setdefault(m.partition, []).append(m)
    for msgs in by_part.values():
        assert [m.offset for m in msgs] == list(range(len(msgs)))
    last_by_key: dict[bytes, int] = {}
    for m in got:
        assert m.key is not None
        assert int(m.value) > last_by_key.get(m.key, -1)
        last_by_key[m.key] = int(m.value)
    # the same key always lands in the same partition
    assert len({(m.key, m.partition) for m in got}) == 50


def test_group_offsets_resume_where_committed(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("jobs")
    with Producer(node.endpoint) as producer:
        for i in range(100):
            producer.send("jobs", b"job-%d" % i)
    with Consumer("jobs", node.endpoint, group="workers", auto_commit=False) as c:
        first = drain(c, 40)
        c.commit({0: first[39].offset + 1})
    with Consumer("jobs", node.endpoint, group="workers") as c:
        rest = drain(c, 60)
    assert rest[0].value == b"job-40"
    assert [m.offset for m in rest] == list(range(40, 100))
    with Admin(node.endpoint) as admin:
        assert admin.committed("jobs", "workers") == {0: 100}
        d = admin.describe_queue("jobs")
        assert d["groups"]["workers"]["total_lag"] == 0


def test_fetch_long_poll_waits_for_data(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("lp")
    with Consumer("lp", node.endpoint, start="latest") as c, Producer(node.endpoint, linger_ms=0) as p:
        assert c.fetch(0, 0) == []
        t0 = time.monotonic()
        assert c.fetch(0, 0, wait_ms=300) == []
        assert time.monotonic() - t0 >= 0.25
        p.send("lp", b"late").result(5)
        msgs = c.fetch(0, 0, wait_ms=5000)
        assert [m.value for m in msgs] == [b"late"]
        with pytest.raises(OffsetOutOfRange):
            c.fetch(0, 99)


def test_admin_errors_and_delete_removes_data(node, tmp_path):
    with Admin(node.endpoint) as admin:
        admin.create_queue("tmpq", partitions=2)
        with pytest.raises(QueueExists):
            admin.create_queue("tmpq")
        assert admin.create_queue("tmpq", if_not_exists=True)["partitions"] == 2
        with Producer(node.endpoint) as p:
            p.send("tmpq", b"x").result(5)
        assert any(q["name"] == "tmpq" for q in admin.list_queues())
        assert admin.delete_queue("tmpq")
        assert not (tmp_path / "data" / "queues" / "tmpq").exists()
        with pytest.raises(UnknownQueue):
            admin.describe_queue("tmpq")
        admin.create_queue("tmpq")
        assert admin.describe_queue("tmpq")["messages"] == 0
        with pytest.raises(UnknownQueue), Producer(node.endpoint) as p:
            p.send("nope.dlq", b"x")  # dead-letter queues are never created on a send


def test_oversize_message_rejected_client_and_server(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("small", max_message_bytes=1000)
    with Producer(node.endpoint) as p:
        with pytest.raises(MessageTooLarge):
            p.send("small", b"x" * 1001)
        assert p.send("small", b"x" * 1000).result(5).offset == 0


def test_lz4_headers_keys_round_trip(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("rich")
    with Producer(node.endpoint, compression="lz4") as p:
        f1 = p.send("rich", b"a" * 500, key=b"k1", headers={"trace": b"abc"}, timestamp_ms=1_700_000_000_000)
        f2 = p.send("rich", "text value", headers={"n": "1"})
        assert [f1.result(5).offset, f2.result(5).offset] == [0, 1]
    with Consumer("rich", node.endpoint, start="earliest") as c:
        got = drain(c, 2)
    assert got[0].value == b"a" * 500 and got[0].key == b"k1" and got[0].headers == {"trace": b"abc"}
    assert got[0].timestamp_ms == 1_700_000_000_000
    assert got[1].value == b"text value" and got[1].key is None and got[1].headers == {"n": b"1"}


def test_send_many_is_send_in_bulk(node):
    """send_many: every value stored once, in order per partition, each future naming the offset
    that holds its value, one callback per value; batches fill and seal as with send."""
    with Admin(node.endpoint) as admin:
        admin.create_queue("bulk", partitions=2)
    values = [b"v%d" % i for i in range(20_000)]
    called: list[BaseException | None] = []
    with Producer(node.endpoint, linger_ms=5, batch_bytes=4096) as p:
        futures = []
        for i in range(0, len(values), 333):
            futures.extend(p.send_many("bulk", values[i : i + 333], callback=lambda m, e: called.append(e)))
        assert p.send_many("bulk", []) == []
        # a read-only sequence whose futures are made when asked for
        last = p.send_many("bulk", [b"v%d" % i for i in range(20_000, 20_005)])
        p.flush()
    assert len(last) == 5 and last[-1].done() and list(last) == last
    tail = [f.result(1) for f in last[1:]]
    metas = [f.result(10) for f in futures]
    assert len(metas) == len(values) and len(called) == len(values) and not any(called)
    assert {m.partition for m in metas} == {0, 1}  # sticky partition moves on per batch, as with send
    with Consumer("bulk", node.endpoint, start="earliest") as c:
        got = drain(c, len(values) + 5)
    stored = {(m.partition, m.offset): m.value for m in got}
    assert len(stored) == len(values) + 5
    assert all(stored[(m.partition, m.offset)] == v for m, v in zip(metas, values))
    assert [stored[(m.partition, m.offset)] for m in tail] == [b"v20001", b"v20002", b"v20003", b"v20004"]
    for part in (0, 1):
        offsets = sorted(o for (p_, o) in stored if p_ == part)
        order = [int(stored[(part, o)][1:]) for o in offsets]
        assert order == sorted(order)


def test_send_many_cuts_batches_exactly_where_send_does(node):
    """The same values through a send loop and through send_many in uneven runs land at the same
    (partition, offset): batches cut at the same byte limit (the value that reaches it goes in)
    and message count, and the sticky partition moves on at the same points. Sizes only, no
    timing: linger is a minute, and without idempotence no batch waits open for a window."""
    import random

    rng = random.Random(20)
    values = [rng.randbytes(rng.choice((0, 1, 40, 150, 400, 900))) for _ in range(600)]
    with Admin(node.endpoint) as admin:
        admin.create_queue("cut-send", partitions=3)
        admin.create_queue("cut-many", partitions=3)
    placed = {}
    for queue in ("cut-send", "cut-many"):
        with Producer(node.endpoint, linger_ms=60_000, batch_bytes=2048, batch_messages=9, idempotent=False) as p:
            if queue == "cut-send":
                futures = [p.send(queue, v) for v in values]
            else:
                futures, i = [], 0
                while i < len(values):
                    k = rng.randint(1, 40)
                    futures.extend(p.send_many(queue, values[i : i + k]))
                    i += k
            p.flush(10)
        placed[queue] = [(m.partition, m.offset) for m in (f.result(1) for f in futures)]
    assert placed["cut-many"] == placed["cut-send"]
    assert len({part for part, _ in placed["cut-send"]}) == 3
    with Consumer("cut-many", node.endpoint, start="earliest") as c:
        got = {(m.partition, m.offset): m.value for m in drain(c, len(values))}
    assert [got[where] for where in placed["cut-many"]] == values


def test_send_many_takes_the_send_path_for_what_send_would_refuse(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("small2", max_message_bytes=1000)
    with Producer(node.endpoint, linger_ms=5) as p:
        # str values are encoded as send does; an oversize one raises at that value, after the ones before it
        assert [f.result(5).offset for f in p.send_many("small2", ["a", "b"])] == [0, 1]
        with pytest.raises(MessageTooLarge):
            p.send_many("small2", [b"ok", b"x" * 1001, b"never"])
        p.flush()
    with Producer(node.endpoint, linger_ms=0) as p:  # linger 0: value by value, each sent at once
        assert [f.result(5).offset for f in p.send_many("small2", [b"c", b"d"])] == [3, 4]
