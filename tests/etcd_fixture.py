"""A real 3-member etcd cluster on 127.0.0.1 free ports, for the session-scoped ``etcd_cluster``
fixture (tests/conftest.py). Tests that kill or stop a member put it back with ``heal()``."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fabric.cluster import etcd_members
from fabric.cluster.etcd_members import EtcdMemberSpec
from fabric.testing import free_ports


@dataclass
class EtcdMember:
    spec: EtcdMemberSpec
    cluster: list[EtcdMemberSpec]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return self.spec.client_url

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        assert not self.running, f"{self.spec.name} already runs"
        self.proc = etcd_members.start(self.spec, self.cluster, self.log_path)

    def kill9(self) -> None:
        """kill -9 the member we started, by its PID, and reap it."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            etcd_members.stop(self.proc)

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class EtcdCluster:
    members: list[EtcdMember] = field(default_factory=list)

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def wait_healthy(self, timeout_s: float = 15.0) -> None:
        try:
            etcd_members.wait_healthy(self.endpoints, timeout_s)
        except Exception as e:
            logs = "\n".join(f"--- {m.spec.name} (pid {m.proc and m.proc.pid}):\n{m.log_tail()}" for m in self.members)
            raise RuntimeError(f"{e}\n{logs}") from e

    def heal(self) -> None:
        """Restart every member that is not running (same data dir: it rejoins), wait for health."""
        for m in self.members:
            if not m.running:
                m.start()
        self.wait_healthy()

    def stop_all(self) -> None:
        for m in self.members:
            m.stop()


@contextmanager
def running_cluster(base: Path, size: int = 3) -> Iterator[EtcdCluster]:
    etcd_members.etcd_binary()  # ConfigError with the apt-get hint when etcd is missing
    ports = free_ports(2 * size)
    specs = [
        EtcdMemberSpec(
            name=f"e{i}",
            data_dir=str(base / f"e{i}"),
            client_url=f"http://127.0.0.1:{ports[2 * i]}",
            peer_url=f"http://127.0.0.1:{ports[2 * i + 1]}",
        )
        for i in range(size)
    ]
    cluster = EtcdCluster([EtcdMember(s, specs, base / f"e{i}.log") for i, s in enumerate(specs)])
    try:
        for m in cluster.members:
            m.start()
        cluster.wait_healthy()
        yield cluster
    finally:
        cluster.stop_all()
