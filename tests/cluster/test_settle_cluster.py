"""Settling by receipt handle through the routers of a cluster: `fabric recv --no-ack` leaves
its leases at the queue's group coordinator, and `fabric ack` reaches them there (real stores
and routers on 127.0.0.1 against the run's etcd)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fabric.client import Admin, Producer
from tests.cluster_procs import ClusterProcs

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def _fabric(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabric.cli", *args], capture_output=True, text=True, timeout=60)


def test_ack_by_receipt_handle_through_the_routers(routed: ClusterProcs) -> None:
    e = ["-e", routed.all_routers]
    with Admin(routed.all_routers, timeout_ms=10_000) as admin:
        admin.create_queue("jobs", partitions=2, visibility_timeout_ms=60_000)
    with Producer(routed.all_routers, acks="all") as producer:
        for i in range(4):
            producer.send("jobs", b"j%d" % i, key=b"k%d" % i)
        producer.flush(30)
    r = _fabric("recv", "jobs", "--group", "w", "--kind", "queue", "--no-ack", "-n", "4", "--json", *e)
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert sorted(x["value"] for x in got) == ["j0", "j1", "j2", "j3"]
    r = _fabric("ack", "jobs", "w", *[x["receipt_handle"] for x in got], "--json", *e)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["acked"] == 4
    with Admin(routed.all_routers, timeout_ms=10_000) as admin:
        g = admin.describe_group("jobs", "w")
    assert g["in_flight"] == 0 and g["backlog"] == 0, g
