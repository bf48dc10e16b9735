"""Many queues on one cluster (issue 10's scale bar), a slow run: `pytest -m slow tests/cluster/test_scale.py`
(FABRIC_SCALE_QUEUES sets how many; the bar is 10,000). Creates them through a router, lists
them, sends one message to each, and compares produce throughput on one busy queue with the same
figure measured before the queues existed."""

from __future__ import annotations

import os
import time

import pytest

from fabric.client import Admin, Producer
from tests.cluster_procs import ClusterProcs

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _throughput(endpoint: str, queue: str, n: int = 300_000) -> float:
    with Producer(endpoint, acks="all") as p:
        t0 = time.monotonic()
        for _ in range(n):
            p.send(queue, b"x" * 100)
        p.flush(120)
        return n / (time.monotonic() - t0)


@pytest.mark.timeout(3600)
def test_many_queues(etcd_cluster, tmp_path) -> None:
    count = int(os.environ.get("FABRIC_SCALE_QUEUES", "10000"))
    c = ClusterProcs(tmp_path, list(etcd_cluster.endpoints), routers=1)
    try:
        c.start_all()
        with Admin(c.all_routers, timeout_ms=30_000) as admin:
            admin.create_queue("busy")
        c.wait(lambda s: any(p["queue"] == "busy" and p["leader"] for p in s["partitions"]))
        time.sleep(1)
        # the best of three runs of 300,000 (about a second each): the machine is shared and noisy
        before = max(_throughput(c.all_routers, "busy") for _ in range(3))
        t0 = time.monotonic()
        with Admin(c.all_routers, timeout_ms=60_000) as admin:
            for i in range(count):
                admin.create_queue(f"q{i:05d}")
        created_s = time.monotonic() - t0
        deadline = time.monotonic() + 600
        with Admin(c.all_routers, timeout_ms=60_000) as admin:
            while True:
                t0 = time.monotonic()
                listed = admin.list_queues()
                list_s = time.monotonic() - t0
                if len(listed) >= count + 1 or time.monotonic() > deadline:
                    break
                time.sleep(1)
        assert len(listed) >= count + 1
        t0 = time.monotonic()
        with Producer(c.all_routers, acks="all") as p:
            futs = [p.send(f"q{i:05d}", b"one") for i in range(count)]
            p.flush(600)
            assert all(f.result(60).offset == 0 for f in futs)
        sent_s = time.monotonic() - t0
        time.sleep(5)  # steady state: the followers have fetched the one message of each queue
        after = max(_throughput(c.all_routers, "busy") for _ in range(3))
        print(
            f"{count} queues: created in {created_s:.1f} s ({count / created_s:.0f}/s), listed in {list_s:.2f} s, "
            f"one message each in {sent_s:.1f} s; busy queue {before:,.0f} msg/s before, {after:,.0f} after "
            f"({after / before:.0%})"
        )
        assert after >= 0.9 * before
    finally:
        c.stop_all()
