"""`fabric queue alter Q --partitions N` on a running node: partitions are added under live
producers and consumers, every message is delivered once, keys that keep their partition keep
their order, and the change survives a restart. Refusals say why and change nothing."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import defaultdict

import pytest
from crc32c import crc32c

from fabric.client import Admin, Consumer, Producer
from fabric.errors import BadParameter, UnknownQueue
from fabric.testing import Node

pytestmark = pytest.mark.integration

KEYS = [b"k%d" % i for i in range(24)]


def _fabric(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabric.cli", *args], capture_output=True, text=True, timeout=60)


def _send_round(prod: Producer, start: int, rounds: int) -> None:
    for seq in range(start, start + rounds):
        for k in KEYS:
            prod.send("orders", b"%s:%d" % (k, seq), key=k)
    prod.flush(30)


def _read(cons: Consumer, want: int, seconds: float = 30) -> list:
    got: list = []
    deadline = time.monotonic() + seconds
    while len(got) < want and time.monotonic() < deadline:
        got.extend(cons.poll(500))
    return got


def test_partitions_added_under_live_producer_and_groups(tmp_path) -> None:
    node = Node(str(tmp_path / "data"))
    try:
        with Admin(node.endpoint) as admin:
            admin.create_queue("orders", partitions=2)
        with (
            Producer(node.endpoint) as prod,
            Consumer("orders", node.endpoint, group="stream-g", start="earliest") as stream,
            Consumer("orders", node.endpoint, group="workers", kind="queue", start="earliest") as worker,
        ):
            _send_round(prod, 0, 5)
            first = _read(stream, 5 * len(KEYS))
            assert len(first) == 5 * len(KEYS)
            assert {m.partition for m in first} == {0, 1}
            r = _fabric("queue", "alter", "orders", "--partitions", "5", "-e", node.endpoint)
            assert r.returncode == 0, r.stderr
            assert "5 partition(s) (3 added)" in r.stdout
            # the producer learns the new count from its next reply; sends after that spread over 5
            _send_round(prod, 5, 1)
            _send_round(prod, 6, 5)
            rest = _read(stream, 6 * len(KEYS))
            worked = []
            deadline = time.monotonic() + 30
            while len(worked) < 11 * len(KEYS) and time.monotonic() < deadline:
                for m in worker.poll(500):
                    worked.append(m)
                    worker.ack(m)
            worker.flush_acks()
        everything = first + rest
        values = sorted(m.value for m in everything)
        assert values == sorted(b"%s:%d" % (k, s) for s in range(11) for k in KEYS)  # each once
        assert {m.partition for m in rest} >= {2, 3, 4}  # the stream group took the new partitions
        assert sorted(m.value for m in worked) == values  # and the queue group
        by_key: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
        for m in everything:
            k, seq = m.value.split(b":")
            by_key[k].append((m.partition, int(seq)))
        for k in KEYS:
            if crc32c(k) % 2 == crc32c(k) % 5:  # the key did not move: its order holds end to end
                assert [s for _, s in by_key[k]] == list(range(11)), k
            else:  # it moved: in order within each partition
                for p in {p for p, _ in by_key[k]}:
                    seqs = [s for q, s in by_key[k] if q == p]
                    assert seqs == sorted(seqs)
        # refusals: nothing changes
        with Admin(node.endpoint) as admin:
            with pytest.raises(BadParameter, match="only grow"):
                admin.alter_queue("orders", partitions=3)
            with pytest.raises(UnknownQueue):
                admin.alter_queue("nope", partitions=3)
            admin.create_queue("urgent", partitions=1, priority_levels=3)
            with pytest.raises(BadParameter, match="priority"):
                admin.alter_queue("urgent", partitions=2)
            admin.create_queue("ticks", mode="direct")
            with pytest.raises(BadParameter, match="direct"):
                admin.alter_queue("ticks", partitions=2)
            assert admin.alter_queue("orders", partitions=5)["added"] == 0  # same count: a no-op
            assert admin.describe_queue("orders")["partitions"] == 5
    finally:
        node.stop()
    node = Node(str(tmp_path / "data"))  # the new partitions are on disk and in the queue's record
    try:
        with Admin(node.endpoint) as admin:
            d = admin.describe_queue("orders")
            assert d["partitions"] == 5
            assert sum(p["messages"] for p in d["partition_detail"]) == 11 * len(KEYS)
        with Consumer("orders", node.endpoint, group="late", start="earliest") as late:
            assert len(_read(late, 11 * len(KEYS))) == 11 * len(KEYS)
    finally:
        node.stop()


def test_a_loaded_queue_expands_itself_up_to_its_maximum(node) -> None:
    """auto_partitions_max: 1 -> 2 -> 4 partitions while a producer keeps each one above the
    threshold, and never past the maximum; the producer follows without a restart."""
    with Admin(node.endpoint) as admin:
        admin.create_queue(
            "busy",
            partitions=1,
            auto_partitions_max=4,
            auto_partitions_bytes_per_s=20_000,
            auto_partitions_after_ms=1000,
        )
    seen = {1}
    deadline = time.monotonic() + 20
    with Producer(node.endpoint, linger_ms=5) as prod, Admin(node.endpoint) as admin:
        n = 0
        while time.monotonic() < deadline:
            for _ in range(100):  # ~400 KB/s: every partition stays loaded, even 4 of them
                prod.send("busy", b"x" * 2000, key=b"k%d" % n)
                n += 1
            prod.flush(10)
            seen.add(admin.describe_queue("busy")["partitions"])
            if 4 in seen and time.monotonic() > deadline - 12:
                break  # and the load went on for several windows at 4: no growth past the maximum
            time.sleep(0.5)
        d = admin.describe_queue("busy")
    assert seen == {1, 2, 4}, seen
    assert d["partitions"] == 4 and sum(p["messages"] for p in d["partition_detail"]) == n
    assert "growing 2 -> 4 partitions" in node.log_text()
