"""`fabric top` on a cluster reached through a router counts every store, not only the one the
router happened to reach (real stores and routers on 127.0.0.1 against the run's etcd)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fabric.client import Admin, Producer
from tests.cluster_procs import ClusterProcs

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def test_top_through_a_router_lists_and_sums_every_store(routed: ClusterProcs) -> None:
    with Admin(routed.all_routers, timeout_ms=10_000) as admin:
        admin.create_queue("topc", partitions=3)
    with Producer(routed.all_routers, acks="all") as producer:
        for i in range(300):
            producer.send("topc", b"m", key=b"k%d" % i)
        producer.flush(30)
    r = subprocess.run(
        [sys.executable, "-m", "fabric.cli", "top", "-n", "1", "-e", routed.router_endpoints["r1"]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "cluster: 3 of 3 store(s) answering" in r.stdout, r.stdout
    nodes = r.stdout.split("NODES")[1]
    rows = {
        line.split()[0]: line for line in nodes.splitlines() if line.split() and line.split()[0] in routed.endpoints
    }
    assert sorted(rows) == ["n1", "n2", "n3"], nodes
    assert all("down" not in row for row in rows.values()), nodes
    # every store counts its own requests (a follower: its leader's answers to REPLICA_FETCH)
    requests = {n: float(row.split("│")[3].strip().rstrip("kM") or 0) for n, row in rows.items()}
    assert all(v > 0 for v in requests.values()), nodes
    assert records_in(rows) >= 300, nodes  # the leaders' appends, summed over the stores


def records_in(rows: dict[str, str]) -> float:
    total = 0.0
    for row in rows.values():
        cell = row.split("│")[-1].strip()
        scale = 1000 if cell.endswith("k") else 1_000_000 if cell.endswith("M") else 1
        total += float(cell.rstrip("kM") or 0) * scale
    return total
