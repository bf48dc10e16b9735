"""Two real single-store clusters on the run's shared etcd with ``federation_report_ms`` set: each
controller publishes its cluster's report, the stores their load, one store is elected manager,
and `fabric federation status` shows it all; the manager's store killed with kill -9, another
store takes the post."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from fabric.client import Admin, Producer
from fabric.cluster.etcd import EtcdClient
from fabric.federation.directory import ROOT
from tests.cluster_procs import ClusterProcs

pytestmark = pytest.mark.cluster


def _status(etcd: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric.cli", "federation", "status", "--etcd", ",".join(etcd), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=os.environ,
    )


def _wait(etcd: list[str], ok: Any, timeout_s: float = 20) -> dict[str, Any]:
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        out = _status(etcd, "--json")
        if out.returncode == 0:
            last = json.loads(out.stdout)
            if ok(last):
                return last  # type: ignore[no-any-return]
        time.sleep(0.3)
    raise AssertionError(f"the federation did not get there in {timeout_s} s; last status: {last}")


def _create(etcd: list[str], queue: str, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "fabric.cli", "queue", "create", queue, *args]
        + (["--clusters", "1"] if "--clusters" not in args else [])
        + ["--etcd", ",".join(etcd), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _partitions(cluster: ClusterProcs, queue: str) -> int:
    return sum(1 for p in cluster.status()["partitions"] if p["queue"] == queue)


def test_two_clusters_report_and_elect_one_manager(etcd_cluster, tmp_path) -> None:
    etcd = etcd_cluster.endpoints
    raw = EtcdClient(etcd)
    raw.delete(ROOT, prefix=True)  # the run's etcd is shared: this test's federation starts empty
    extra = "federation_report_ms = 300\n"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = ClusterProcs(tmp_path / "a", etcd, size=1, rf=1, min_insync=1, routers=1, cluster_extra=extra)
    b = ClusterProcs(tmp_path / "b", etcd, size=1, rf=1, min_insync=1, cluster_extra=extra)
    try:
        a.start_all()
        b.start_all()
        with Admin(a.endpoints["n1"]) as admin:
            admin.create_queue("fed-load", partitions=2)
        with Producer(a.endpoints["n1"], acks="leader") as prod:
            for i in range(200):
                prod.send("fed-load", b"x" * 1000, key=str(i).encode())
            prod.flush(10)

        doc = _wait(
            etcd,
            lambda d: (
                {c["name"] for c in d["clusters"]} == {a.name, b.name}
                and d["manager"] is not None
                and all(c["accepts_queues"] for c in d["clusters"])
                and any(c["utilisation"]["partitions"] == 2 for c in d["clusters"])
            ),
        )
        clusters = {c["name"]: c for c in doc["clusters"]}
        ca, cb = clusters[a.name], clusters[b.name]
        assert ca["health"]["stores"] == 1 and ca["health"]["controller"] == "n1" and ca["health"]["offline"] == 0
        assert ca["routers"] == [a.router_endpoints["r1"]] and cb["routers"] == []
        assert ca["utilisation"]["partitions"] == 2 and cb["utilisation"]["partitions"] == 0
        assert ca["utilisation"]["disk_free_bytes"] > 0 and ca["age_ms"] < 5000
        manager = doc["manager"]["name"]
        assert manager in (f"{a.name}/n1", f"{b.name}/n1")

        human = _status(etcd)
        assert human.returncode == 0, human.stderr
        assert f"federation manager: {manager}" in human.stdout and a.name in human.stdout and b.name in human.stdout

        # queues through the manager: a split one over both clusters, then one on the emptier cluster
        split = _create(etcd, "fed-split", "-p", "4", "--clusters", "2")
        assert sorted(split["clusters"]) == sorted([a.name, b.name])
        assert split["placement"] == [split["clusters"][p % 2] for p in range(4)]
        one = _create(etcd, "fed-one", "-p", "3")
        assert one["clusters"] == [b.name]  # a holds fed-load's 2 partitions and took as many of fed-split
        assert _partitions(a, "fed-split") == 2 and _partitions(b, "fed-split") == 2
        assert _partitions(b, "fed-one") == 3 and _partitions(a, "fed-one") == 0
        again = subprocess.run(
            [
                sys.executable,
                "-m",
                "fabric.cli",
                "queue",
                "create",
                "fed-one",
                "--clusters",
                "1",
                "--etcd",
                ",".join(etcd),
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert again.returncode == 1 and "QUEUE_EXISTS" in again.stderr
        too_many = subprocess.run(
            [
                sys.executable,
                "-m",
                "fabric.cli",
                "queue",
                "create",
                "fed-3",
                "-p",
                "3",
                "--clusters",
                "3",
                "--etcd",
                *etcd[:1],
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert too_many.returncode == 1 and "needs 3 healthy clusters with room, 2 have" in too_many.stderr

        # the manager's store dies: the other cluster's store is elected within the lease (2 s)
        (a if manager.startswith(a.name) else b).kill9("n1")
        other = f"{b.name}/n1" if manager.startswith(a.name) else f"{a.name}/n1"
        doc = _wait(etcd, lambda d: d["manager"] is not None and d["manager"]["name"] == other, 15)
        assert doc["manager"]["epoch"] > 0
    finally:
        a.stop_all()
        b.stop_all()
        raw.delete(ROOT, prefix=True)
        raw.close()


def test_fabric_up_starts_every_cluster_of_a_federation_config_and_stops_them(etcd_cluster, tmp_path) -> None:
    etcd = etcd_cluster.endpoints
    raw = EtcdClient(etcd)
    raw.delete(ROOT, prefix=True)
    extra = "federation_report_ms = 300\n"
    procs = []
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        procs.append(ClusterProcs(tmp_path / c, etcd, size=1, rf=1, min_insync=1, routers=1, cluster_extra=extra))
    a, b = procs
    fed = tmp_path / "fed.toml"
    fed.write_text(f'[federation]\nclusters = ["a/{a.config.name}", "b/{b.config.name}"]\n')
    up = subprocess.Popen(
        [sys.executable, "-m", "fabric.cli", "up", "--config", str(fed), "--json", "--ready-timeout", "40"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        assert up.stdout is not None
        line = up.stdout.readline()  # the ready line; the process exits (EOF) if it is never ready
        assert line, up.stderr.read() if up.stderr else ""
        info = json.loads(line)
        assert info["federation"] is True
        assert [c["name"] for c in info["clusters"]] == [a.name, b.name]
        assert info["clusters"][1]["routers"][0]["endpoint"] == b.router_endpoints["r1"]
        doc = _wait(etcd, lambda d: {c["name"] for c in d["clusters"]} == {a.name, b.name} and d["manager"] is not None)
        assert all(c["health"]["stores"] == 1 for c in doc["clusters"])
    finally:
        up.terminate()
        up.wait(60)
        raw.delete(ROOT, prefix=True)
        raw.close()
    assert up.returncode == 0
    for p in (a, b):  # each supervisor stopped its store and router: nothing stays registered
        p.wait(lambda s: not any(n["live"] for n in s["nodes"]) and not any(r["live"] for r in s["routers"]), 10)
