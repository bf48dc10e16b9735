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
from fabric.errors import FabricError, QueueElsewhere, QueueMoved
from fabric.federation.directory import ROOT, drain_key, queue_key
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

        # fabric queue move of fed-one (on b) under load, then the front door with fed-one on a
        src = _move_under_load(etcd, {a.name: a, b.name: b}, "fed-one", 3)
        # the source, emptied of fed-one, would be drained of nothing movable: fed-split stays (split)
        drain = _fabric("federation", "drain", src.name, "--etcd", ",".join(etcd), "--dry-run", "--json")
        assert drain.returncode == 0, drain.stderr
        assert [(m["queue"], m["destination"]) for m in json.loads(drain.stdout)["moves"]] == [("fed-split", None)]
        ra, rb = a.router_endpoints["r1"], b.router_endpoints["r1"]
        _front_door(rb, ra, split["placement"])  # fed-one is wholly on a now: reached through b's router

        # a federation queue deleted through the manager: out of the table and off its cluster
        gone = subprocess.run(
            [sys.executable, "-m", "fabric.cli", "queue", "delete", "fed-one", "--yes", "--json", "--etcd", etcd[0]],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert gone.returncode == 0, gone.stderr
        assert json.loads(gone.stdout) == {"queue": "fed-one", "deleted": True, "clusters": [a.name]}
        assert raw.get(queue_key("fed-one")) is None
        a.wait(lambda s: not any(p["queue"] == "fed-one" for p in s["partitions"]), 10)  # its store follows the map

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


def _fabric(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric.cli", *args], capture_output=True, text=True, timeout=90, env=os.environ
    )


def _move_under_load(
    etcd: list[str],
    clusters: dict[str, ClusterProcs],
    q: str,
    parts: int,
    *,
    kill_when_copying: Any = None,
    max_pause_s: float = 2.0,
) -> ClusterProcs:
    """`fabric queue move` of queue ``q`` (``parts`` partitions, on one of ``clusters``; returns that
    one, the source) to the other under a continuous acks=all load, with a group's committed
    offsets: every acknowledged message on the destination once, at its source offset, in order
    per partition, the group carried on from its offsets, writes paused under ``max_pause_s`` at
    the cut-over. One producer, given the source cluster's router, writes throughout: what the
    sealed source refuses (QUEUE_MOVED) is sent again, and once the directory names the
    destination the router redirects it there (QUEUE_ELSEWHERE). ``kill_when_copying``: called once, from the load loop, when the move
    is seen copying (a kill -9 of the manager's store)."""
    src = clusters[_placement(etcd, q)[0]]
    dst = next(c for n, c in clusters.items() if n != src.name)
    urls = ",".join(etcd)
    dry = _fabric("queue", "move", q, "--to", dst.name, "--etcd", urls, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["problem"] is None and json.loads(dry.stdout)["source"] == src.name

    acked: dict[int, list[int]] = {p: [] for p in range(parts)}  # partition -> message numbers in offset order
    offsets: dict[int, list[int]] = {p: [] for p in range(parts)}
    with Producer(src.endpoints["n1"], acks="all") as prod:
        for i in range(300):
            prod.send(q, str(i).encode(), partition=i % parts)
        prod.flush(20)
    for i in range(300):
        acked[i % parts].append(i)
    committed = {p: 100 - 10 * p for p in range(parts)}
    with Admin(src.endpoints["n1"]) as admin:
        admin.commit(q, "g", committed)
    raw = EtcdClient(etcd)
    try:  # the source's node publishes commits to etcd within a second; the switch carries them from there
        deadline = time.monotonic() + 10
        while raw.get(f"/clusters/{src.name}/groups/{q}/g") is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        raw.close()

    mover = subprocess.Popen(
        [sys.executable, "-m", "fabric.cli", "queue", "move", q, "--to", dst.name, "--etcd", urls, "--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    n, pauses, last_ack, killed = 300, [], time.monotonic(), False
    watch = EtcdClient(etcd)
    pending: list[int] = []
    deadline = time.monotonic() + 60
    # one producer through the source cluster's router for the whole move: refused while the queue
    # is sealed (QUEUE_MOVED), redirected once the directory names the destination (QUEUE_ELSEWHERE)
    try:
        with Producer(src.router_endpoints["r1"], acks="all", retries=0) as prod:
            while time.monotonic() < deadline:
                if not pending:
                    if mover.poll() is not None and n >= 300 + 150:
                        break  # moved, and written through the front door since
                    pending, n = list(range(n, n + 10)), n + 10
                futures = [(i, prod.send(q, str(i).encode(), partition=i % parts)) for i in pending]
                pending = []
                for i, f in futures:
                    try:
                        offsets[i % parts].append(f.result(10).offset)  # type: ignore[arg-type]
                        acked[i % parts].append(i)
                    except (QueueMoved, QueueElsewhere):  # refused: nothing of it written; sent again
                        pending.append(i)
                if pending:
                    time.sleep(0.02)
                    continue
                now = time.monotonic()
                pauses.append(now - last_ack)
                last_ack = now
                if kill_when_copying is not None and not killed and b'"copying"' in _value(watch, q):
                    kill_when_copying()
                    killed = True
    finally:
        watch.close()
        out, err = mover.communicate(timeout=60)
    assert mover.returncode == 0, out + err
    assert "copying" in out and "cutover" in out and "switched" in out and out.rstrip().endswith("done")
    assert not pending and max(pauses) < max_pause_s, (pending, max(pauses))
    assert killed or kill_when_copying is None
    assert _placement(etcd, q) == [dst.name] * parts
    assert _partitions(src, q) == 0 and _partitions(dst, q) == parts

    # on the destination: every acknowledged message once, in offset order, at its source offset
    with Admin(dst.endpoints["n1"]) as admin:
        assert admin.committed(q, "g") == committed
        for p in range(parts):
            got: list[int] = []
            while len(got) < len(acked[p]):
                batches, _ = admin.fetch(q, p, len(got))
                assert batches, f"partition {p}: {len(got)} of {len(acked[p])}"
                got += [int(v) for b in batches for v in b.values]
            assert got == acked[p], f"partition {p} differs"
            assert offsets[p] == sorted(offsets[p]) and offsets[p][0] == 300 // parts
    with Consumer(q, dst.endpoints["n1"], group="g", auto_commit=False) as consumer:
        first: dict[int, int] = {}
        deadline = time.monotonic() + 20
        while len(first) < parts and time.monotonic() < deadline:
            for m in consumer.poll(500):
                first.setdefault(m.partition, m.offset)
        assert first == committed  # the group continues from its committed offsets
    return src


def _value(meta: EtcdClient, queue: str) -> bytes:
    kv = meta.get(f"/federation/moves/{queue}")
    return kv.value if kv is not None else b""


def _placement(etcd: list[str], queue: str) -> list[str]:
    raw = EtcdClient(etcd)
    try:
        kv = raw.get(f"/federation/queues/{queue}")
        assert kv is not None
        return list(json.loads(kv.value)["partitions"])
    finally:
        raw.close()


@pytest.mark.slow
def test_a_move_goes_on_after_the_manager_is_killed_mid_move(etcd_cluster, tmp_path) -> None:
    """Three single-store clusters; the manager on the first, drained so that it holds nothing; a
    queue moved between the other two under load, the manager's store killed with kill -9 while
    the move is copying: a store of the other clusters is elected and finishes the move (the
    destination's controller creates its copy only every 1.5 s, so the move is still copying
    when the kill comes); no message lost or stored twice."""
    etcd = etcd_cluster.endpoints
    raw = EtcdClient(etcd)
    raw.delete(ROOT, prefix=True)
    roots = [tmp_path / x for x in ("m", "a", "b")]
    for r in roots:
        r.mkdir()
    fast, slow = "federation_report_ms = 300\n", "federation_report_ms = 1500\n"
    m = ClusterProcs(roots[0], etcd, size=1, rf=1, min_insync=1, cluster_extra=fast)
    a = ClusterProcs(roots[1], etcd, size=1, rf=1, min_insync=1, cluster_extra=slow)
    b = ClusterProcs(roots[2], etcd, size=1, rf=1, min_insync=1, cluster_extra=slow)
    try:
        m.start_all()
        _wait(etcd, lambda d: d["manager"] is not None and d["manager"]["name"] == f"{m.name}/n1")
        raw.put(drain_key(m.name), b"{}")  # no queue for the manager's cluster
        a.start_all()
        b.start_all()
        _wait(etcd, lambda d: sum(c["accepts_queues"] for c in d["clusters"]) == 2)
        _create(etcd, "fed-kill", "-p", "2")
        _move_under_load(
            etcd, {a.name: a, b.name: b}, "fed-kill", 2, kill_when_copying=lambda: m.kill9("n1"), max_pause_s=5.0
        )
        doc = _wait(etcd, lambda d: d["manager"] is not None)
        assert doc["manager"]["name"] in (f"{a.name}/n1", f"{b.name}/n1")
    finally:
        for c in (m, a, b):
            c.stop_all()
        raw.delete(ROOT, prefix=True)
        raw.close()


def _front_door(ra: str, rb: str, placement: list[str]) -> None:
    """fed-split (4 partitions over both clusters) written through ``ra`` and read through ``rb``;
    fed-one (3 partitions, wholly on ``rb``'s cluster) written and read through ``ra``."""
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
    sent = {f"o{i}".encode() for i in range(30)}
    with Consumer("fed-one", ra, group="fd", start="earliest") as cons:  # wholly on the other cluster
        deadline = time.monotonic() + 20
        while not sent <= seen and time.monotonic() < deadline:
            seen.update(m.value for m in cons.poll(500))
    assert sent <= seen
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
