"""A follower whose copy ends below its leader's log start (it was away while the leader purged
the partition) starts its copy at the leader's log start and rejoins the ISR (real stores on
127.0.0.1 against the run's etcd)."""

from __future__ import annotations

import signal
import time

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.errors import FabricError
from tests.cluster_procs import ClusterProcs

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def _copy(endpoint: str, queue: str) -> tuple[int, int, list[bytes]]:
    """(log start, high watermark, values from the log start) of partition 0 on one node."""
    with Admin(endpoint, timeout_ms=5000) as admin:
        detail = admin.describe_queue(queue)["partition_detail"][0]
    start, hw = detail["log_start_offset"], detail["high_watermark"]
    values: list[bytes] = []
    with Consumer(queue, endpoint=endpoint, partitions=[0], start="earliest") as cons:
        offset = start
        for _ in range(100):
            got = cons.fetch(0, offset, max_bytes=4 << 20)
            if not got:
                break
            values.extend(m.value for m in got)
            offset = got[-1].offset + 1
    return start, hw, values


def test_a_follower_away_during_a_purge_starts_at_the_leaders_log_start_and_rejoins(cluster: ClusterProcs) -> None:
    with Admin(cluster.endpoints["n1"], timeout_ms=10_000) as admin:
        admin.create_queue("reset", partitions=1)
    status = cluster.wait(lambda s: any(p["queue"] == "reset" and len(p["isr"]) == 3 for p in s["partitions"]))
    assert status
    leader = cluster.leader("reset", 0)
    assert leader is not None
    follower = next(n for n in cluster.endpoints if n != leader)
    cluster.signal(follower, signal.SIGSTOP)
    try:
        with Producer(cluster.endpoints[leader], acks="all", request_timeout_ms=10_000) as prod:
            # the paused follower's parked fetch is answered with the first message (the answer
            # waits in its socket); the rest come after, when it has no fetch at the leader
            prod.send("reset", b"old0", partition=0).result(15)
            for f in [prod.send("reset", b"old%d" % i, partition=0) for i in range(1, 30)]:
                f.result(15)  # two of three in sync: min_insync_replicas 2 still holds
        out = cluster.wait(lambda s: all(follower not in p["isr"] for p in s["partitions"] if p["queue"] == "reset"))
        assert out
        deadline = time.monotonic() + 10  # the high watermark passes the 30 once the ISR shrank
        while _copy(cluster.endpoints[leader], "reset")[1] < 30 and time.monotonic() < deadline:
            time.sleep(0.1)
        with Admin(cluster.endpoints[leader], timeout_ms=10_000) as admin:
            assert admin.purge_queue("reset")["purged"] == 30
        with Producer(cluster.endpoints[leader], acks="all", request_timeout_ms=10_000) as prod:
            for f in [prod.send("reset", b"new%d" % i, partition=0) for i in range(10)]:
                f.result(15)
    finally:
        cluster.signal(follower, signal.SIGCONT)
    # it asks from below the leader's log start: refused with that start, it starts its copy there
    back = cluster.wait(lambda s: all(follower in p["isr"] for p in s["partitions"] if p["queue"] == "reset"), 30)
    assert back, cluster.log_text(follower)[-3000:]
    want = (30, 40, [b"new%d" % i for i in range(10)])
    assert _copy(cluster.endpoints[leader], "reset") == want
    deadline = time.monotonic() + 10  # its high watermark follows the leader's within a fetch
    seen = None
    while time.monotonic() < deadline:
        try:
            seen = _copy(cluster.endpoints[follower], "reset")
        except FabricError as exc:
            seen = exc
        if seen == want:
            break
        time.sleep(0.1)
    assert seen == want
    assert "below the leader's log start 30: starting it there" in cluster.log_text(follower)
