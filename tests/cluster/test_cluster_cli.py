"""`fabric up --config CLUSTER.toml` (the supervisor with its own etcd members), `fabric cluster
status`, `fabric node start`, and cluster configs that do not validate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabric.errors import ConfigError
from fabric.settings import load_config
from tests.etcd_fixture import free_ports

pytestmark = [pytest.mark.cluster, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]


def fabric(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def test_the_shipped_cluster_config_loads() -> None:
    config = load_config(ROOT / "configs" / "cluster-3.toml")
    assert config.cluster is not None
    assert [n.node_id for n in config.cluster.nodes] == ["store-1", "store-2", "store-3"]
    assert len(config.cluster.etcd_members) == 3 and config.cluster.replication_factor == 3
    assert config.auto_create_queues is False  # a cluster creates queues on purpose


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ("[cluster]\netcd = ['http://127.0.0.1:1']\n", "cluster.nodes"),
        ("[cluster]\nbogus = 1\n", "cluster.bogus"),
        (
            "[cluster]\netcd = ['127.0.0.1:1']\n[[cluster.nodes]]\nid='a'\nlisten='tcp://127.0.0.1:7'\ndata_dir='d'\n",
            "cluster.etcd",
        ),
        (
            "[cluster]\netcd = ['http://h:1']\nreplication_factor = 2\n[[cluster.nodes]]\nid='a'\nlisten='tcp://127.0.0.1:7'\ndata_dir='d'\n",
            "replication_factor",
        ),
        (
            "[cluster]\netcd = ['http://h:1']\nreplication_factor = 1\nmin_insync_replicas = 2\n[[cluster.nodes]]\nid='a'\nlisten='tcp://127.0.0.1:7'\ndata_dir='d'\n",
            "min_insync_replicas",
        ),
        (
            "[cluster]\netcd = ['http://h:1']\n[[cluster.nodes]]\nid='a'\nlisten='tcp://127.0.0.1:0'\ndata_dir='d'\n",
            "fixed port",
        ),
        (
            "[cluster]\netcd = ['http://h:1']\nreplication_factor = 1\n[[cluster.nodes]]\nid='a'\nlisten='tcp://127.0.0.1:7'\ndata_dir='d'\n[[cluster.nodes]]\nid='a'\nlisten='tcp://127.0.0.1:8'\ndata_dir='e'\n",
            "repeat the node or router id",
        ),
        (
            "[cluster]\netcd = ['http://h:1']\nreplication_factor = 1\n[[cluster.nodes]]\nid='a'\nlisten='tcp://127.0.0.1:7'\ndata_dir='d'\n[[cluster.routers]]\nid='r'\nlisten='tcp://127.0.0.1:7'\n",
            "repeat the listen",
        ),
        (
            "[cluster]\netcd = ['http://h:1']\nreplication_factor = 1\n[[cluster.nodes]]\nid='a'\nlisten='tcp://127.0.0.1:7'\ndata_dir='d'\n[[cluster.routers]]\nid='r'\nlisten='tcp://127.0.0.1:8'\nzone = 'x'\n",
            "'zone'",
        ),
        (
            "[cluster]\netcd = ['http://h:1']\nreplication_factor = 1\n[[cluster.nodes]]\nid='a'\nlisten='tcp://127.0.0.1:7'\ndata_dir='d'\nport = 3\n",
            "'port'",
        ),
    ],
)
def test_bad_cluster_configs_name_the_key(tmp_path: Path, toml: str, named: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        load_config(path)
    r = fabric("node", "start", str(path), "--node", "a")
    assert r.returncode != 0 and named in r.stderr


def test_node_start_needs_a_cluster_config_and_a_known_node(tmp_path: Path) -> None:
    single = tmp_path / "single.toml"
    single.write_text("[node]\nlog_level = 'info'\n")
    r = fabric("node", "start", str(single), "--node", "x")
    assert r.returncode == 2 and "no [cluster] table" in r.stderr
    r = fabric("node", "start", str(ROOT / "configs" / "cluster-3.toml"), "--node", "store-9")
    assert r.returncode != 0 and "store-9" in r.stderr and "store-1" in r.stderr


def test_fabric_up_supervises_a_whole_cluster(tmp_path: Path) -> None:
    """Three etcd members and three nodes from one config: status, a restart after kill -9, and a
    clean stop of everything on SIGINT (the PID files go with them)."""
    ports = free_ports(11)
    members = "".join(
        f'[[cluster.etcd_members]]\nname = "e{i}"\nclient_url = "http://127.0.0.1:{ports[i]}"\n'
        f'peer_url = "http://127.0.0.1:{ports[3 + i]}"\ndata_dir = "{tmp_path}/e{i}"\n\n'
        for i in range(3)
    )
    nodes = "".join(
        f'[[cluster.nodes]]\nid = "s{i}"\nlisten = "tcp://127.0.0.1:{ports[6 + i]}"\ndata_dir = "{tmp_path}/s{i}"\n\n'
        for i in range(3)
    )
    routers = "".join(
        f'[[cluster.routers]]\nid = "r{i}"\nlisten = "tcp://127.0.0.1:{ports[9 + i]}"\n\n' for i in range(2)
    )
    config = tmp_path / "c.toml"
    config.write_text(
        f'[cluster]\nname = "sup"\ndata_dir = "{tmp_path}/sup"\nnode_lease_ttl_s = 1\n\n{members}{nodes}{routers}'
    )
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115
    up = subprocess.Popen(
        [sys.executable, "-m", "fabric.cli", "up", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        status = _wait_status(
            config,
            lambda s: s["controller"] and all(n["live"] for n in s["nodes"] + s["routers"]) and len(s["routers"]) == 2,
            40,
        )
        assert [n["name"] for n in status["nodes"]] == ["s0", "s1", "s2"]
        pids = {p.stem: int(p.read_text()) for p in (tmp_path / "sup" / "pids").glob("*.pid")}
        assert set(pids) == {"e0", "e1", "e2", "s0", "s1", "s2", "r0", "r1"}
        r = fabric("queue", "create", "q", "-p", "2", "-e", f"tcp://127.0.0.1:{ports[7]}")
        assert r.returncode == 0, r.stderr
        r = fabric("cluster", "status", "--config", str(config))
        assert r.returncode == 0 and "controller" in r.stdout and "q " in r.stdout, r.stdout
        _run_readme_cluster_lines(
            config,
            [f"tcp://127.0.0.1:{ports[6 + i]}" for i in range(3)],
            [f"tcp://127.0.0.1:{ports[9 + i]}" for i in range(2)],
            tmp_path,
        )
        os.kill(pids["s1"], signal.SIGKILL)  # the supervisor starts it again
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            new = int((tmp_path / "sup" / "pids" / "s1.pid").read_text())
            if new != pids["s1"]:
                break
            time.sleep(0.2)
        assert new != pids["s1"]
        _wait_status(config, lambda s: all(n["live"] for n in s["nodes"]), 30)
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(40) == 0
        log.close()
    assert not list((tmp_path / "sup" / "pids").glob("*.pid"))
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert "restarted node s1" in (tmp_path / "up.log").read_text()


def _run_readme_cluster_lines(config: Path, endpoints: list[str], routers: list[str], cwd: Path) -> None:
    """The README's "Run a cluster" lines, on this cluster: its config, ports and node names."""
    import re

    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Run a cluster\n.*?```sh\n(.*?)```", text, flags=re.S)
    assert block, "README has no 'Run a cluster' shell block"
    ran = 0
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for line in block.group(1).splitlines():
        line = line.replace("configs/cluster-3.toml", str(config))
        for i, e in enumerate(endpoints):
            line = line.replace(f"tcp://127.0.0.1:750{i + 1}", e)
        for i, e in enumerate(routers):
            line = line.replace(f"tcp://127.0.0.1:760{i + 1}", e)
        if line.startswith("export FABRIC_ENDPOINT="):
            env["FABRIC_ENDPOINT"] = line.split("=", 1)[1].split()[0]
            continue
        if not line.startswith("fabric ") or line.startswith(("fabric up", "fabric node start", "fabric router start")):
            continue  # the supervisor runs here already; `node start` would be a second store-2
        r = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"README line failed: {line}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
        ran += 1
    assert ran >= 3


def _wait_status(config: Path, ok, seconds: float) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        r = fabric("cluster", "status", "--config", str(config), "--json", timeout=20)
        if r.returncode == 0:
            last = json.loads(r.stdout)
            if ok(last):
                return last
        time.sleep(0.3)
    raise AssertionError(f"no such status in {seconds} s: {last}")
