"""Two real single-store clusters on the run's shared etcd with ``federation_report_ms`` set: each
controller publishes its cluster's report, the stores their load, one store is elected manager,
and `fabric federation status` shows it all; queues placed by the manager, one split over both
clusters, are served through a router of either cluster (the front door: acks=all writes to every
partition through one cluster's router, one group reading them all through the other's); the
manager's store killed with kill -9 (its cluster has no store left), another store takes the post,
the other cluster's partitions keep taking writes and the lost cluster's fail at once, naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.cluster.etcd import EtcdClient
from fabric.errors import FabricError, QueueElsewhere
from fabric.federation.directory import ROOT, QueuePlacement, queue_key
from fabric.protocol.batch import crc32c
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
    b = ClusterProcs(tmp_path / "b", etcd, size=1, rf=1, min_insync=1, routers=1, cluster_extra=extra)
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
        assert ca["routers"] == [a.router_endpoints["r1"]] and cb["routers"] == [b.router_endpoints["r1"]]
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

        ra, rb = a.router_endpoints["r1"], b.router_endpoints["r1"]
        _front_door(ra, rb, split["placement"])

        # a queue that moves, as `fabric queue move` leaves the directory: fed-one placed on a now
        # (a's controller creates it there); a producer that sent through b follows it
        with Producer(ra, acks="all") as prod:
            assert prod.send("fed-one", b"on b", partition=0).result(10).offset is not None
            raw.put(queue_key("fed-one"), QueuePlacement("fed-one", (a.name,) * 3, 1).to_json())
            a.wait(lambda s: sum(1 for p in s["partitions"] if p["queue"] == "fed-one") == 3, 10)
            moved = None
            for _ in range(20):  # what was on its way to b fails (QUEUE_ELSEWHERE); then it follows
                try:
                    moved = prod.send("fed-one", b"on a", partition=0).result(10)
                    break
                except QueueElsewhere:
                    continue
            assert moved is not None and moved.offset == 0  # the first message of a's new queue

        # a federation queue deleted through the manager: out of the table and off its cluster
        gone = subprocess.run(
            [sys.executable, "-m", "fabric.cli", "queue", "delete", "fed-one", "--yes", "--json", "--etcd", etcd[0]],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert gone.returncode == 0, gone.stderr
        assert json.loads(gone.stdout) == {"queue": "fed-one", "deleted": True, "clusters": [a.name]}
        assert _partitions(a, "fed-one") == 0 and raw.get(queue_key("fed-one")) is None

        # the manager's store dies: the other cluster's store is elected within the lease (2 s)
        lost, kept = (a, b) if manager.startswith(a.name) else (b, a)
        with Producer(kept.router_endpoints["r1"], acks="all", retries=2) as prod:
            prod.send("fed-split", b"before", partition=0).result(10)  # both clusters' links made
            prod.send("fed-split", b"before", partition=1).result(10)
            lost.kill9("n1")
            doc = _wait(etcd, lambda d: d["manager"] is not None and d["manager"]["name"] == f"{kept.name}/n1", 15)
            assert doc["manager"]["epoch"] > 0
            # the kept cluster's partitions take writes; the lost one's fail at once, naming it
            mine = [p for p in range(4) if split["placement"][p] == kept.name]
            theirs = [p for p in range(4) if split["placement"][p] == lost.name]
            for p in mine:
                assert prod.send("fed-split", b"after", partition=p).result(10).partition == p
            started = time.monotonic()
            with pytest.raises(FabricError) as refused:
                prod.send("fed-split", b"after", partition=theirs[0]).result(15)
            assert time.monotonic() - started < 8, "a write to the lost cluster hung"
            assert lost.name in refused.value.message
    finally:
        a.stop_all()
        b.stop_all()
        raw.delete(ROOT, prefix=True)
        raw.close()


def _front_door(ra: str, rb: str, placement: list[str]) -> None:
    """fed-split (4 partitions over both clusters) and fed-one (3, wholly on b) through either router."""
    n = 200
    with Producer(ra, acks="all") as prod:
        futures = [prod.send("fed-split", f"m{i}".encode(), key=f"k{i}".encode()) for i in range(n)]
        prod.flush(20)
        where = {f.result(10).partition for f in futures}
        assert where == {0, 1, 2, 3}  # every partition, on both clusters, through a's router
        assert all(f.result().partition == crc32c(f"k{i}".encode()) % 4 for i, f in enumerate(futures))
        for i in range(30):
            prod.send("fed-one", f"o{i}".encode())
        prod.flush(20)
    got: dict[bytes, int] = {}
    with Consumer("fed-split", rb, group="fd", start="earliest") as cons:  # one group, through b's router
        deadline = time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            for m in cons.poll(500):
                got[m.value] = m.partition
        assert sorted(cons.assignment()) == [0, 1, 2, 3]
    assert len(got) == n
    assert all(got[f"m{i}".encode()] == crc32c(f"k{i}".encode()) % 4 for i in range(n))
    seen: set[bytes] = set()
    with Consumer("fed-one", ra, group="fd", start="earliest") as cons:  # wholly on b, through a's router
        deadline = time.monotonic() + 20
        while len(seen) < 30 and time.monotonic() < deadline:
            seen.update(m.value for m in cons.poll(500))
    assert seen == {f"o{i}".encode() for i in range(30)}
    with Admin(rb) as admin:
        d = admin.describe_queue("fed-split")
        assert d["partitions"] == 4 and d["federation"]["partitions"] == placement
        assert sum(r["high_watermark"] for r in d["partition_detail"]) == n
        assert admin.list_offsets("fed-split", 3)["offset"] == sum(1 for v in got.values() if v == 3)
    with Admin(ra) as admin:
        assert admin.describe_queue("fed-one")["partitions"] == 3


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
