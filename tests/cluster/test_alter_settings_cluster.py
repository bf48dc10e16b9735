"""`fabric queue alter --set` on a cluster: the controller writes the queue key's settings and
every store holding the queue applies them from its watch (real stores and routers on 127.0.0.1
against the run's etcd)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from fabric.client import Admin, Producer
from fabric.errors import QueueFull
from tests.cluster_procs import ClusterProcs

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def _fabric(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabric.cli", *args], capture_output=True, text=True, timeout=60)


def test_alter_set_reaches_every_store_and_applies_there(routed: ClusterProcs) -> None:
    e = ["-e", routed.all_routers]
    with Admin(routed.all_routers, timeout_ms=10_000) as admin:
        admin.create_queue("capped", partitions=1)
    with Producer(routed.all_routers, acks="all") as producer:
        producer.send("capped", b"1").result(10)
    r = _fabric("queue", "alter", "capped", "--set", "max_messages=1", "--set", "retention_ms=3600000", "--json", *e)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["changed"] == {"max_messages": [0, 1], "retention_ms": [604800000, 3600000]}

    def settings() -> dict[str, tuple[int, int]]:
        out = {}
        for node, endpoint in routed.endpoints.items():
            with Admin(endpoint, timeout_ms=5000) as admin:
                s = admin.describe_queue("capped")["settings"]
            out[node] = (s["max_messages"], s["retention_ms"])
        return out

    deadline = time.monotonic() + 15  # each store applies them from its etcd watch
    seen = settings()
    while time.monotonic() < deadline and set(seen.values()) != {(1, 3600000)}:
        time.sleep(0.2)
        seen = settings()
    assert set(seen.values()) == {(1, 3600000)}, seen
    with Producer(routed.all_routers, acks="all", retries=0) as producer, pytest.raises(QueueFull):
        producer.send("capped", b"2").result(10)  # the leader applies the new limit
    r = _fabric("queue", "alter", "capped", "--set", "encrypt=true", *e)
    assert r.returncode == 1 and "chosen at create" in r.stderr, r.stderr
