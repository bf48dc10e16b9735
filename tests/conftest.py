"""Shared fixtures: real fabric nodes started as processes on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fabric.bench import Node


@pytest.fixture
def node(tmp_path) -> Iterator[Node]:
    """A `fabric up` process on a free loopback port with its own data dir."""
    n = Node(str(tmp_path / "data"))
    try:
        yield n
    finally:
        n.stop()


def drain(consumer, n: int, seconds: float = 30) -> list:
    """Poll ``consumer`` until it returned ``n`` messages or ``seconds`` passed."""
    import time

    got: list = []
    deadline = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < deadline:
        got.extend(consumer.poll(100))
    return got


def kill9(n: Node) -> None:
    """kill -9 the node we started, by its PID, and reap it."""
    os.kill(n.proc.pid, signal.SIGKILL)
    n.proc.wait(10)


@contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. "4m") mounted at ``where`` for a real full disk; skips without root."""
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory):
    """ONE real 3-member etcd cluster on loopback free ports for the whole run (tests/etcd_fixture.py).
    Errors, not skips, without etcd: `apt-get install etcd-server etcd-client`."""
    from tests.etcd_fixture import running_cluster

    with running_cluster(tmp_path_factory.mktemp("etcd")) as cluster:
        yield cluster


class JsonNode:
    """`fabric up --json ARGS` on loopback port 0: the ready line parsed into ``info``; ``stop()``
    ends it with SIGTERM and keeps what it left on stdout and stderr."""

    def __init__(self, data_dir: Path, *args: str) -> None:
        import json
        import sys

        cmd = [sys.executable, "-m", "fabric.cli", "up", "--json", "--data-dir", str(data_dir)]
        if "--listen" not in args:
            cmd += ["--listen", "tcp://127.0.0.1:0"]
        self.proc = subprocess.Popen([*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError(f"fabric up did not become ready: {self.stderr[-2000:]}")
        self.info: dict = json.loads(line)
        self.stdout = self.stderr = ""

    def stop(self) -> int:
        self.proc.terminate()
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.stdout, self.stderr = self.proc.communicate()
        return self.proc.returncode
