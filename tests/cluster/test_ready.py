"""Ready means ready (issue 31, item 5) and cluster status from anywhere (item 7), on real
processes: `fabric up --config` says ready only when `fabric queue create` through the routers
works; `fabric node start` / `fabric router start` say so (--json, --ready-file) once registered;
`fabric cluster status -e` through a router or a store shows what the etcd path shows."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabric.client import Admin
from fabric.cluster.status import read_status
from tests.cluster_procs import ClusterProcs
from tests.etcd_fixture import free_ports

pytestmark = [pytest.mark.cluster, pytest.mark.integration]
FABRIC = [sys.executable, "-m", "fabric.cli"]
STARTS = 3  # fresh starts per run (the issue asks 20 of 20, which takes minutes: checked by hand)


def fabric(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _config(root: Path, etcd: list[str], stores: int, routers: int, name: str, ports: list[int]) -> Path:
    nodes = "".join(
        f'[[cluster.nodes]]\nid = "s{i}"\nlisten = "tcp://127.0.0.1:{ports[i]}"\ndata_dir = "{root}/s{i}"\n\n'
        for i in range(stores)
    )
    nodes += "".join(
        f'[[cluster.routers]]\nid = "r{i}"\nlisten = "tcp://127.0.0.1:{ports[stores + i]}"\n\n' for i in range(routers)
    )
    urls = ", ".join(f'"{u}"' for u in etcd)
    config = root / "c.toml"
    config.write_text(
        f'[node]\nauto_create_queues = false\n\n[cluster]\nname = "{name}"\netcd = [{urls}]\n'
        f'replication_factor = {min(3, stores)}\nnode_lease_ttl_s = 1\ndata_dir = "{root}/sup"\n\n{nodes}'
    )
    return config


def _read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The process's first stdout line, within ``timeout_s`` (empty if it exited first)."""
    import selectors

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout_s):
            raise AssertionError(f"no line in {timeout_s} s")
        return proc.stdout.readline()
    finally:
        sel.close()


def test_fabric_up_says_ready_only_when_queue_create_through_the_routers_works(etcd_cluster, tmp_path) -> None:
    """At the --json ready line every store is registered, a controller elected, every router
    registered and reaching every store, and `fabric queue create orders -p 3` through the
    routers succeeds, on every one of STARTS fresh starts; the ready file holds the same object
    and goes at the clean stop."""
    for start in range(STARTS):
        root = tmp_path / f"start{start}"
        root.mkdir()
        ports = free_ports(5)
        config = _config(root, list(etcd_cluster.endpoints), 3, 2, f"rdy{os.getpid()}x{start}", ports)
        ready_file = root / "ready.json"
        up = subprocess.Popen(
            [*FABRIC, "up", "--config", str(config), "--json", "--ready-file", str(ready_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            info = json.loads(_read_line(up, 60))
            assert info["event"] == "ready" and info["name"] == f"rdy{os.getpid()}x{start}"
            assert json.loads(ready_file.read_text()) == info
            status = read_status(list(etcd_cluster.endpoints), info["name"])
            assert status["controller"] and [n["name"] for n in status["nodes"]] == ["s0", "s1", "s2"]
            assert [r["name"] for r in status["routers"]] == ["r0", "r1"]
            for router in info["routers"]:  # each router reaches each store
                with Admin(router["endpoint"], timeout_ms=2000) as admin:
                    assert [admin.ping(node=s)["node"] for s in ("s0", "s1", "s2")] == ["s0", "s1", "s2"]
            routers = ",".join(r["endpoint"] for r in info["routers"])
            r = fabric("queue", "create", "orders", "-p", "3", "-e", routers)
            assert r.returncode == 0, f"start {start}: {r.stderr}"
        finally:
            up.send_signal(signal.SIGINT)
            assert up.wait(40) == 0
        assert not ready_file.exists()
        assert not list((root / "sup" / "pids").glob("*.pid"))


def test_fabric_up_names_what_is_missing_when_not_ready_in_time(etcd_cluster, tmp_path) -> None:
    """A store that cannot start (its port is taken): progress lines, then exit 1 naming it."""
    ports = free_ports(2)
    taken = socket.socket()
    taken.bind(("127.0.0.1", ports[1]))
    taken.listen()
    try:
        config = _config(tmp_path, list(etcd_cluster.endpoints), 2, 0, f"late{os.getpid()}", ports)
        r = fabric("up", "--config", str(config), "--ready-timeout", "8", "--json", timeout=60)
    finally:
        taken.close()
    assert r.returncode == 1 and r.stdout == ""
    assert "waiting for the cluster:" in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    # s0 registers within the 8 s unless the machine is very slow; s1 never does
    assert "not ready after 8 s" in last and re.search(r"stores not registered: (s0, )?s1\b", last), r.stderr
    assert "exited since the start: s1 (see " in last and last.rstrip().endswith("s1.log)")
    assert not list((tmp_path / "sup" / "pids").glob("*.pid"))


def _start(c: ClusterProcs, kind: str, name: str, ready: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*FABRIC, kind, "start", str(c.config), f"--{kind}", name, "--json", "--ready-file", str(ready)],
        stdout=subprocess.PIPE,
        stderr=open(c.root / f"{name}.log", "w"),  # noqa: SIM115 - lives as long as the process
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    c.procs[name] = proc  # type: ignore[assignment]  # stop_all stops it by PID
    return proc


def _comparable(status: dict) -> dict:
    return {k: v for k, v in status.items() if k != "revision"}


def test_node_and_router_start_say_ready_once_registered_and_status_from_an_endpoint(etcd_cluster, tmp_path) -> None:
    c = ClusterProcs(tmp_path, list(etcd_cluster.endpoints), size=2, rf=2, min_insync=1, routers=1)
    files = {n: tmp_path / f"{n}.ready" for n in ("n1", "n2", "r1")}
    try:
        procs = {n: _start(c, "node", n, files[n]) for n in ("n1", "n2")}
        procs["r1"] = _start(c, "router", "r1", files["r1"])
        infos = {}
        for name, proc in procs.items():
            infos[name] = json.loads(_read_line(proc, 30))
            assert json.loads(files[name].read_text()) == infos[name]
            live = {x["name"]: x["live"] for x in c.status()["nodes"] + c.status()["routers"]}
            assert live[name], f"{name} said ready before it registered"
        assert infos["n1"]["event"] == "ready" and infos["n1"]["node"] == "n1" and infos["n1"]["cluster"] == c.name
        assert infos["r1"]["router"] == "r1" and infos["r1"]["endpoint"] == c.router_endpoints["r1"]
        c.wait(lambda s: s["controller"] and all(n["live"] for n in s["nodes"]))
        r = fabric("queue", "create", "q", "-p", "2", "-e", c.all_routers)
        assert r.returncode == 0, r.stderr
        # the same status through the router (-e), a store (FABRIC_ENDPOINT) and etcd (--config)
        deadline = time.monotonic() + 20
        while True:
            via_etcd = fabric("cluster", "status", "--config", str(c.config), "--json")
            via_router = fabric("cluster", "status", "-e", c.router_endpoints["r1"], "--json")
            via_store = fabric("cluster", "status", "--json", env={"FABRIC_ENDPOINT": c.endpoints["n2"]})
            assert via_etcd.returncode == via_router.returncode == via_store.returncode == 0, via_router.stderr
            got = [_comparable(json.loads(x.stdout)) for x in (via_etcd, via_router, via_store)]
            if got[0] == got[1] == got[2] or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert got[1] == got[0] and got[2] == got[0]
        assert len(got[0]["partitions"]) == 2 and [n["name"] for n in got[0]["routers"]] == ["r1"]
        human = fabric("cluster", "status", "-e", c.router_endpoints["r1"])
        assert human.returncode == 0 and f"cluster {c.name}: controller" in human.stdout
        assert "q      0" in human.stdout or "q " in human.stdout, human.stdout
    finally:
        c.stop_all()
    for name, f in files.items():
        assert not f.exists(), f"{name}'s ready file outlived a clean stop"
