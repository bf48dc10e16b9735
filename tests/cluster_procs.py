"""Real cluster nodes for tests: `fabric node start CONFIG --node ID` processes on 127.0.0.1 free
ports, against the run's shared etcd (each test cluster under its own /clusters/<name>)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from fabric.cluster.status import read_status
from tests.etcd_fixture import free_ports


@dataclass
class ClusterProcs:
    root: Path
    etcd: list[str]
    size: int = 3
    rf: int = 3
    min_insync: int = 2
    lease_ttl_s: int = 1
    routers: int = 0  # [[cluster.routers]] r1.. (started by start_all)
    keys_dir: str = ""  # [security] keys_dir (`fabric auth init`): authentication on every process
    admins: tuple[str, ...] = ()  # [security] admins
    cluster_extra: str = ""  # more [cluster] lines, e.g. "federation_report_ms = 500\n"
    name: str = field(default_factory=lambda: "t" + uuid.uuid4().hex[:10])
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    endpoints: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, str] = field(default_factory=dict)  # node -> http://127.0.0.1:PORT/metrics
    router_endpoints: dict[str, str] = field(default_factory=dict)
    router_metrics: dict[str, str] = field(default_factory=dict)  # router -> http://127.0.0.1:PORT/metrics

    def __post_init__(self) -> None:
        ports = free_ports(2 * self.size + 2 * self.routers)
        self.router_endpoints = {
            f"r{i + 1}": f"tcp://127.0.0.1:{ports[2 * self.size + i]}" for i in range(self.routers)
        }
        rm = {f"r{i + 1}": ports[2 * self.size + self.routers + i] for i in range(self.routers)}
        self.router_metrics = {r: f"http://127.0.0.1:{port}/metrics" for r, port in rm.items()}
        self.endpoints = {f"n{i + 1}": f"tcp://127.0.0.1:{ports[i]}" for i in range(self.size)}
        metrics_ports = {f"n{i + 1}": ports[self.size + i] for i in range(self.size)}
        self.metrics = {n: f"http://127.0.0.1:{port}/metrics" for n, port in metrics_ports.items()}
        nodes = "".join(
            f'[[cluster.nodes]]\nid = "{n}"\nlisten = "{e}"\ndata_dir = "{self.root / n}"\n'
            f'metrics_listen = "127.0.0.1:{metrics_ports[n]}"\n\n'
            for n, e in self.endpoints.items()
        )
        nodes += "".join(
            f'[[cluster.routers]]\nid = "{r}"\nlisten = "{e}"\nmetrics_listen = "127.0.0.1:{rm[r]}"\n\n'
            for r, e in self.router_endpoints.items()
        )
        etcd = ", ".join(f'"{u}"' for u in self.etcd)
        security = ""
        if self.keys_dir:
            admins = ", ".join(f'"{a}"' for a in self.admins)
            security = f'[security]\nkeys_dir = "{self.keys_dir}"\nadmins = [{admins}]\n\n'
        self.config = self.root / "cluster.toml"
        self.config.write_text(
            f'[node]\nlog_level = "info"\n\n{security}[cluster]\nname = "{self.name}"\netcd = [{etcd}]\n'
            f"replication_factor = {self.rf}\nmin_insync_replicas = {self.min_insync}\n"
            f"node_lease_ttl_s = {self.lease_ttl_s}\nreplica_lag_time_ms = 2000\n"
            f'data_dir = "{self.root / "sup"}"\n{self.cluster_extra}\n{nodes}'
        )

    @property
    def all_endpoints(self) -> str:
        return ",".join(self.endpoints.values())

    def _spawn(self, name: str, kind: str) -> None:
        """`fabric node|router start CONFIG --node|--router NAME`, its output in ROOT/NAME.log."""
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "fabric.cli", kind, "start", str(self.config), f"--{kind}", name],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def start(self, node: str) -> None:
        self._spawn(node, "node")

    @property
    def all_routers(self) -> str:
        return ",".join(self.router_endpoints.values())

    def start_router(self, router: str) -> None:
        self._spawn(router, "router")

    def start_all(self, timeout_s: float = 30) -> None:
        for n in self.endpoints:
            self.start(n)
        for r in self.router_endpoints:
            self.start_router(r)
        self.wait(
            lambda s: (
                sum(x["live"] for x in s["nodes"]) == self.size
                and s["controller"]
                and sum(x["live"] for x in s["routers"]) == self.routers
            ),
            timeout_s,
        )

    def kill9(self, node: str) -> None:
        proc = self.procs.pop(node)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def signal(self, node: str, sig: int) -> None:
        os.kill(self.procs[node].pid, sig)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a store a test paused must be able to stop
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()

    def status(self) -> dict:
        return read_status(self.etcd, self.name, list(self.endpoints), list(self.router_endpoints))

    def wait(self, ok, timeout_s: float = 20):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.status()
                if ok(last):
                    return last
            except Exception as exc:  # etcd busy: look again
                last = exc
            time.sleep(0.1)
        raise AssertionError(f"cluster {self.name} did not get there in {timeout_s} s; last status: {last}")

    def leader(self, queue: str, p: int) -> str | None:
        for part in self.status()["partitions"]:
            if part["queue"] == queue and part["partition"] == p:
                return part["leader"]  # type: ignore[no-any-return]
        return None

    def log_text(self, node: str) -> str:
        return (self.root / f"{node}.log").read_text(errors="replace")
