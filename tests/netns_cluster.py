"""A fabric cluster spread over network namespaces (tests/netns.py): three etcd members
(``e1..e3``, 10.77.0.11-13), three stores (``n1..n3``, 10.77.0.21-23), two routers (``r1``,
``r2``, 10.77.0.41-42: ``fabric router start``, as users run a cluster) and a client host
(``c``, 10.77.0.30), each in a namespace of its own on one bridge. The client side (queue
creation, load, status, reads) runs inside ``c`` through ``python -m tests.netns_client``."""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from fabric.cluster import etcd_members
from fabric.cluster.etcd_members import EtcdMemberSpec
from tests.netns import Host, Netns

LEASE_TTL_S = 2
REPLICA_LAG_TIME_MS = 2000
FENCED = re.compile(r"node (n\d): (lease lost|etcd has not confirmed the lease)")


class NetCluster:
    def __init__(self, net: Netns, root: Path, name: str = "net") -> None:
        self.net, self.root, self.name = net, root, name
        self.etcd_hosts = [net.add_host(f"e{i}", 10 + i) for i in (1, 2, 3)]
        self.store_hosts = {f"n{i}": net.add_host(f"n{i}", 20 + i) for i in (1, 2, 3)}
        self.router_hosts = {f"r{i}": net.add_host(f"r{i}", 40 + i) for i in (1, 2)}
        self.client = net.add_host("c", 30)
        self.etcd = [f"http://{h.addr}:2379" for h in self.etcd_hosts]
        self.endpoints = {n: f"tcp://{h.addr}:7000" for n, h in self.store_hosts.items()}
        self.router_endpoints = {r: f"tcp://{h.addr}:7100" for r, h in self.router_hosts.items()}
        self.config = root / "cluster.toml"
        self.procs: dict[str, Any] = {}
        self._server: Any = None

    @property
    def all_endpoints(self) -> str:
        return ",".join(self.endpoints.values())

    @property
    def all_routers(self) -> str:
        return ",".join(self.router_endpoints.values())

    def start(self, timeout_s: float = 40) -> None:
        specs = [
            EtcdMemberSpec(h.name, str(self.root / h.name), f"http://{h.addr}:2379", f"http://{h.addr}:2380")
            for h in self.etcd_hosts
        ]
        for spec, host in zip(specs, self.etcd_hosts):
            argv = etcd_members.argv(spec, specs, new=True)
            self.procs[host.name] = self.net.spawn(host, argv, self.root / f"{host.name}.log")
        self.ask("etcd-healthy", ",".join(self.etcd))
        nodes = "".join(
            f'[[cluster.nodes]]\nid = "{n}"\nlisten = "{e}"\ndata_dir = "{self.root / n}"\n\n'
            for n, e in self.endpoints.items()
        )
        nodes += "".join(
            f'[[cluster.routers]]\nid = "{r}"\nlisten = "{e}"\n\n' for r, e in self.router_endpoints.items()
        )
        etcd = ", ".join(f'"{u}"' for u in self.etcd)
        self.config.write_text(
            f'[node]\nlog_level = "info"\n\n[security]\ninsecure = true\n\n'
            f'[cluster]\nname = "{self.name}"\netcd = [{etcd}]\nreplication_factor = 3\nmin_insync_replicas = 2\n'
            f"node_lease_ttl_s = {LEASE_TTL_S}\nreplica_lag_time_ms = {REPLICA_LAG_TIME_MS}\n"
            f'data_dir = "{self.root / "sup"}"\n\n{nodes}'
        )
        for n, host in self.store_hosts.items():
            argv = [sys.executable, "-m", "fabric.cli", "node", "start", str(self.config), "--node", n]
            self.procs[n] = self.net.spawn(host, argv, self.root / f"{n}.log")
        for r, host in self.router_hosts.items():
            argv = [sys.executable, "-m", "fabric.cli", "router", "start", str(self.config), "--router", r]
            self.procs[r] = self.net.spawn(host, argv, self.root / f"{r}.log")
        self.wait(
            lambda s: (
                sum(x["live"] for x in s["nodes"]) == 3
                and s["controller"]
                and sum(x["live"] for x in s["routers"]) == len(self.router_hosts)
            ),
            timeout_s,
        )

    def client_run(self, *args: str, timeout_s: float = 60) -> str:
        return self.net.run(self.client, [sys.executable, "-m", "tests.netns_client", *args], timeout_s)

    def ask(self, *args: str) -> Any:
        """One command to the client host's ``serve`` process (started on first use)."""
        if self._server is None or self._server.poll() is not None:
            argv = [sys.executable, "-m", "tests.netns_client", "serve"]
            self._server = self.net.spawn_piped(self.client, argv, self.root / "client-serve.log")
        assert self._server.stdin is not None and self._server.stdout is not None
        self._server.stdin.write(json.dumps(list(args)) + "\n")
        answer = json.loads(self._server.stdout.readline() or '{"error": "the client host\'s server ended"}')
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer["ok"]

    def client_spawn(self, *args: str, log: str) -> Any:
        return self.net.spawn(self.client, [sys.executable, "-m", "tests.netns_client", *args], self.root / log)

    def status(self) -> dict[str, Any]:
        etcd, nodes, routers = ",".join(self.etcd), ",".join(self.endpoints), ",".join(self.router_endpoints)
        return self.ask("status", etcd, self.name, nodes, routers)  # type: ignore[no-any-return]

    def wait(self, ok, timeout_s: float = 30) -> dict[str, Any]:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.status()
                if ok(last):
                    return last  # type: ignore[no-any-return]
            except (RuntimeError, ValueError) as exc:
                last = exc
            time.sleep(0.3)
        raise AssertionError(f"cluster did not get there in {timeout_s} s; last status: {last}")

    def leaders(self, status: dict[str, Any], queue: str) -> dict[int, str | None]:
        return {p["partition"]: p["leader"] for p in status["partitions"] if p["queue"] == queue}

    def fenced(self) -> dict[str, int]:
        """How many times each store said it was fenced (lease lost, or not confirmed in time)."""
        counts = {n: 0 for n in self.endpoints}
        for n in self.endpoints:
            for m in FENCED.finditer((self.root / f"{n}.log").read_text(errors="replace")):
                counts[m.group(1)] += 1
        return counts

    def read(self, node: str, queue: str, p: int) -> list[str]:
        return self.ask("read", self.endpoints[node], queue, str(p))  # type: ignore[no-any-return]


def acks(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stalls(acked: list[dict[str, Any]], since: float, until: float, partitions: int) -> dict[int, float]:
    """Per partition, the longest time without an acknowledgement that began between ``since``
    and ``until`` (from ``since`` to the first ack after it, between acks, and from the last one
    to the next, even after ``until``; to ``until`` when none came)."""
    worst: dict[int, float] = {}
    for p in range(partitions):
        marks = [since, *sorted(a["t"] for a in acked if a["p"] == p and a["t"] >= since)]
        gaps = [b - a for a, b in itertools.pairwise(marks) if a <= until]
        if marks[-1] <= until:
            gaps.append(until - marks[-1])
        worst[p] = max(gaps, default=0.0)
    return worst


def stall_s(acked: list[dict[str, Any]], since: float, until: float, partitions: int) -> float:
    """The longest such time on any partition (``stalls``)."""
    return max(stalls(acked, since, until, partitions).values(), default=0.0)


def lost(cluster: NetCluster, queue: str, partitions: int, acked: list[dict[str, Any]], leaders: dict) -> list[str]:
    """Acknowledged messages not in their partition's log, as the current leader serves it."""
    missing: list[str] = []
    for p in range(partitions):
        stored = set(cluster.read(leaders[p], queue, p))
        missing += [f"p{p}:{a['seq']}" for a in acked if a["p"] == p and str(a["seq"]) not in stored]
    return missing


__all__ = ["LEASE_TTL_S", "REPLICA_LAG_TIME_MS", "Host", "NetCluster", "acks", "lost", "stall_s", "stalls"]
