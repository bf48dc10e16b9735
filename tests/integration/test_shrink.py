"""Shrinking on a real node: an idle queue halves back to ``auto_partitions_min`` while a keyed
producer keeps sending and a stream group and a queue group keep reading; nothing is lost or
left unconsumed, and every key's messages arrive in the order sent, for both groups."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.client.messages import Message

KEYS = [b"k%d" % i for i in range(32)]


def _check_order(name: str, got: list[Message], sent: int) -> None:
    by_key: dict[bytes, list[int]] = defaultdict(list)
    where: dict[bytes, list[tuple[int, int, int]]] = defaultdict(list)  # (seq, partition, offset): for a failure
    for m in got:
        k, seq = m.value.split(b":")
        by_key[k].append(int(seq))
        where[k].append((int(seq), m.partition, m.offset))
    assert sum(len(v) for v in by_key.values()) == sent, f"{name}: {len(got)} messages, {sent} sent"
    for k in KEYS:
        seqs = by_key[k]
        assert seqs == sorted(set(seqs)) and len(seqs) == sent // len(KEYS), f"{name}: key {k!r} got {where[k]}"


def _shrink_under_traffic(node, queue: str, start: int, low: int, seconds: float, round_s: float = 0.0) -> None:
    """A keyed producer sends a round of every key (at most one per ``round_s``) while both groups
    read, until the queue has been at ``low`` partitions for a while; then check everything."""
    with (
        Producer(node.endpoint, linger_ms=2) as prod,
        Consumer(queue, node.endpoint, group="stream-g", start="earliest", auto_commit_interval_ms=200) as stream,
        Consumer(queue, node.endpoint, group="workers", kind="queue", start="earliest") as worker,
        Admin(node.endpoint) as admin,
    ):
        streamed: list[Message] = []
        worked: list[Message] = []
        seen = [start]
        rounds = 0
        deadline = time.monotonic() + seconds
        # a round of every key, then what both groups have: until the queue is at its minimum,
        # then a few rounds more (keys whose partition went now hash over the smaller count)
        after_low = 0
        retiring_seen = False  # DESCRIBE_QUEUE's live_partitions below partitions while it shrinks
        next_round = 0.0
        last: list = []  # each round's last future: a batch to a retiring partition waits until it is read
        while time.monotonic() < deadline and after_low < 20 and rounds < 2000:
            # paced by the slower group: a round goes when both are at most 4 rounds behind
            behind = rounds * len(KEYS) - min(len(streamed), len(worked))
            if behind <= 4 * len(KEYS) and time.monotonic() >= next_round:
                next_round = time.monotonic() + round_s
                last = [prod.send(queue, b"%s:%d" % (k, rounds), key=k) for k in KEYS]
                rounds += 1
            streamed.extend(stream.poll(20))
            for m in worker.poll(20):
                worked.append(m)
                worker.ack(m)
            d = admin.describe_queue(queue)
            n = d["partitions"]
            if d["live_partitions"] < n:
                retiring_seen = True
            if n != seen[-1]:
                seen.append(n)
            if n == low:
                after_low += 1
        sent = rounds * len(KEYS)
        deadline = time.monotonic() + 30
        while (len(streamed) < sent or len(worked) < sent or not all(f.done() for f in last)) and (
            time.monotonic() < deadline
        ):
            streamed.extend(stream.poll(200))
            for m in worker.poll(200):
                worked.append(m)
                worker.ack(m)
        worker.flush_acks()
        prod.flush(10)
    expected = [start]
    while expected[-1] > low:
        expected.append(expected[-1] // 2)
    assert seen == expected, seen
    assert retiring_seen
    _check_order("stream group", streamed, sent)
    _check_order("queue group", worked, sent)
    text = node.log_text()
    assert f"shrank {2 * low} -> {low} partitions" in text


def test_an_idle_queue_shrinks_to_its_minimum_keeping_every_key_in_order(node) -> None:
    with Admin(node.endpoint) as admin:
        admin.create_queue(
            "calm",
            partitions=8,
            auto_partitions_max=8,
            auto_partitions_min=2,
            auto_partitions_idle_ms=1000,
            auto_partitions_bytes_per_s=4_000_000,
        )
    _shrink_under_traffic(node, "calm", 8, 2, 60)
    with Admin(node.endpoint) as admin:
        d = admin.describe_queue("calm")
    assert d["partitions"] == 2


@pytest.mark.slow
def test_a_queue_grown_under_load_shrinks_back(node) -> None:
    """1 -> 8 partitions under load (auto-expand), then back to 1 once the load is low."""
    with Admin(node.endpoint) as admin:
        admin.create_queue(
            "tide",
            partitions=1,
            auto_partitions_max=8,
            auto_partitions_bytes_per_s=20_000,
            auto_partitions_after_ms=1000,
            auto_partitions_idle_ms=1000,
        )
        assert admin.describe_queue("tide")["settings"]["auto_partitions_min"] == 1
    with Producer(node.endpoint, linger_ms=5) as prod, Admin(node.endpoint) as admin:
        deadline = time.monotonic() + 40
        n = 0
        while admin.describe_queue("tide")["partitions"] < 8 and time.monotonic() < deadline:
            for _ in range(200):  # ~800 KB/s: every partition stays loaded, even 8 of them
                prod.send("tide", b"x" * 2000, key=b"load%d" % n)
                n += 1
            prod.flush(10)
        assert admin.describe_queue("tide")["partitions"] == 8
    with Consumer("tide", node.endpoint, group="stream-g", start="earliest") as c:
        got = 0
        deadline = time.monotonic() + 30
        while got < n and time.monotonic() < deadline:
            got += len(c.poll(200))
        assert got == n
        c.commit()
    with Consumer("tide", node.endpoint, group="workers", kind="queue", start="earliest") as w:
        acked = 0
        deadline = time.monotonic() + 30
        while acked < n and time.monotonic() < deadline:
            for m in w.poll(200):
                w.ack(m)
                acked += 1
        w.flush_acks()
    # a round of 32 small keyed messages every 0.2 s: well below a quarter of 20 KB/s per partition
    _shrink_under_traffic(node, "tide", 8, 1, 60, round_s=0.2)


@pytest.mark.slow
def test_a_group_created_while_partitions_retire_holds_their_removal(node) -> None:
    """A stream group that joins (from earliest) after retirement began is a group like the
    others: the retired partitions stay until it has read them, and it gets every message."""
    with Admin(node.endpoint) as admin:
        admin.create_queue(
            "q",
            partitions=8,
            auto_partitions_max=8,
            auto_partitions_min=4,
            auto_partitions_idle_ms=1000,
            auto_partitions_bytes_per_s=4_000_000,
        )
        with Producer(node.endpoint) as prod:
            for i in range(800):
                prod.send("q", b"%d" % i, key=b"k%d" % i)
        with Consumer("q", node.endpoint, group="first", start="earliest", auto_commit_interval_ms=100) as c:
            got, deadline = 0, time.monotonic() + 30
            while got < 800 and time.monotonic() < deadline:
                got += len(c.poll(200))
            while admin.describe_queue("q")["live_partitions"] == 8 and time.monotonic() < deadline:
                c.poll(200)  # (its commits go on)
            assert admin.describe_queue("q")["live_partitions"] == 4
            with Consumer("q", node.endpoint, group="late", start="earliest", auto_commit_interval_ms=100) as late:
                values = [m.value for m in late.poll(100)]
                until = time.monotonic() + 3  # the late group reads nothing more for 3 s: nothing may go
                while time.monotonic() < until:
                    c.poll(200)
                assert admin.describe_queue("q")["partitions"] == 8
                deadline = time.monotonic() + 30
                while len(values) < 800 and time.monotonic() < deadline:
                    values += [m.value for m in late.poll(200)]
                assert sorted(values) == sorted(b"%d" % i for i in range(800))
                while admin.describe_queue("q")["partitions"] == 8 and time.monotonic() < deadline:
                    late.poll(200)
                    c.poll(100)
                assert admin.describe_queue("q")["partitions"] == 4
