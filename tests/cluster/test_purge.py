"""PURGE in a cluster: the leader of each partition starts its log at the high watermark and
every follower's copy follows (real stores and routers on 127.0.0.1 against the run's etcd)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from fabric.client import Admin, Consumer, Producer
from tests.cluster_procs import ClusterProcs
from tests.conftest import drain

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def test_purge_through_a_router_empties_every_copy_and_the_group_reads_only_what_follows(
    routed: ClusterProcs,
) -> None:
    with Admin(routed.all_routers, timeout_ms=10_000) as admin:
        admin.create_queue("purged", partitions=2)
    with Producer(routed.all_routers, acks="all") as producer:
        for i in range(40):
            producer.send("purged", b"old%d" % i, key=b"k%d" % i)
        producer.flush(30)
    r = subprocess.run(
        [sys.executable, "-m", "fabric.cli", "queue", "purge", "purged", "--yes", "--json", "-e", routed.all_routers],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["purged"] == 40

    def starts() -> dict[str, list[int]]:
        out = {}
        for node, endpoint in routed.endpoints.items():
            with Admin(endpoint, timeout_ms=5000) as admin:
                detail = admin.describe_queue("purged")["partition_detail"]
            out[node] = [(x["log_start_offset"], x["high_watermark"]) for x in detail]
        return out

    deadline = time.monotonic() + 20  # followers take the leader's log start from their next fetch answer
    seen = starts()
    while time.monotonic() < deadline and any(s != h for copy in seen.values() for s, h in copy):
        time.sleep(0.2)
        seen = starts()
    assert all(s == h for copy in seen.values() for s, h in copy), seen
    assert sum(h for _, h in next(iter(seen.values()))) == 40
    with Producer(routed.all_routers, acks="all") as producer:
        producer.send("purged", b"new").result(10)
    with Consumer("purged", routed.all_routers, group="g", start="earliest") as consumer:
        assert [m.value for m in drain(consumer, 1, 20)] == [b"new"]
        assert consumer.poll(500) == []
