"""`fabric cluster shrink` on real processes: an idle four-store cluster (replication factor 2)
marks its removable stores in `cluster status`, shows the plan with --dry-run (nothing written),
and with --wait empties the store that frees the most; every message is still there, once."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from fabric.client import Admin, Consumer, Producer
from tests.cluster_procs import ClusterProcs

pytestmark = pytest.mark.slow  # four stores and their moves: ~20 s here


def _fabric(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabric.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_cluster_shrink_empties_one_store_of_an_idle_four_store_cluster(etcd_cluster, tmp_path) -> None:
    c = ClusterProcs(tmp_path, list(etcd_cluster.endpoints), size=4, rf=2, min_insync=1)
    try:
        c.start_all()
        with Admin(c.all_endpoints, timeout_ms=10_000) as admin:
            admin.create_queue("idle", partitions=8)
        c.wait(lambda s: sum(1 for p in s["partitions"] if p["queue"] == "idle" and p["leader"]) == 8, 30)
        total = 400
        with Producer(c.all_endpoints, acks="all", request_timeout_ms=5000, retries=100) as prod:
            for i in range(total):
                prod.send("idle", b"m%d" % i, key=b"k%d" % (i % 40))
            prod.flush(60)

        r = _fabric("cluster", "status", "--config", str(c.config), "--json")
        assert r.returncode == 0, r.stderr
        status = json.loads(r.stdout)
        assert all(n["removable"] for n in status["nodes"]), status["nodes"]  # rf 2 of 4: any could go
        r = _fabric("cluster", "status", "--config", str(c.config))
        assert "removable" in r.stdout and "fabric cluster shrink" in r.stdout

        r = _fabric("cluster", "shrink", "--config", str(c.config), "--dry-run", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        plan = json.loads(r.stdout.strip().splitlines()[-1])
        assert plan["dry_run"] and plan["moves"], plan
        assert not c.status()["moves"]  # nothing written

        r = _fabric("cluster", "shrink", "--config", str(c.config), "--wait", "--timeout", "90")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "holds no replica: stop its process" in r.stdout, r.stdout
        status = c.status()
        emptied = [n for n in c.endpoints if not any(n in p["replicas"] for p in status["partitions"])]
        assert len(emptied) == 1, status["partitions"]
        assert all(len(p["replicas"]) == 2 for p in status["partitions"] if p["queue"] == "idle")

        seen: list[bytes] = []
        consumers = []
        try:
            for p in range(8):  # each partition from its leader (rf 2 of 4: a node holds only some)
                leader = c.leader("idle", p)
                assert leader is not None and leader != emptied[0]
                consumers.append(Consumer("idle", c.endpoints[leader], start="earliest", partitions=[p]))
            deadline = time.monotonic() + 30
            while len(seen) < total and time.monotonic() < deadline:
                for cons in consumers:
                    b = cons.poll_batch(50)
                    if b is not None:
                        seen.extend(b.values)
        finally:
            for cons in consumers:
                cons.close()
        assert sorted(seen) == sorted(b"m%d" % i for i in range(total))  # nothing lost, nothing twice
    finally:
        c.stop_all()
