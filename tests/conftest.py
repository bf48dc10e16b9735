"""Shared fixtures: real fabric nodes started as processes on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fabric.testing import Node


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
    from tests.session_groups import one_per_run

    one_per_run("etcd", tmp_path_factory)
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


# Session fixtures are per process: under pytest-xdist (`-n 2 --dist loadgroup`, as tools/check
# runs) every test that uses the one etcd cluster runs on one worker, and every Spark test on one
# worker, so a run still starts one etcd cluster and one SparkSession.
SESSION_GROUPS = (("etcd_cluster", "etcd"), ("spark", "spark"), ("fabric_node", "spark"))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        for fixture, group in SESSION_GROUPS:
            if fixture in names:
                item.add_marker(pytest.mark.xdist_group(group))
                break


LEFT_THREADS_GRACE_S = 10.0
_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


def pytest_unconfigure(config: pytest.Config) -> None:
    """A test that left a non-daemon thread running (a reader loop whose stop flag a failed
    assertion skipped) would keep this process alive after the last test, and CI would wait out
    its whole limit with nothing to show. Give such threads a grace period, then name them, print
    their stacks and exit: non-zero, since a thread left running is a test's defect."""
    import faulthandler
    import sys
    import threading
    import time

    deadline = time.monotonic() + LEFT_THREADS_GRACE_S
    left = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    for t in left:
        t.join(max(0.0, deadline - time.monotonic()))
    left = [t for t in left if t.is_alive()]
    if not left:
        return
    sys.stdout.flush()
    print(
        f"\n{len(left)} non-daemon thread(s) still running after the tests: {[t.name for t in left]}", file=sys.stderr
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(_exit_status[0] if _exit_status and _exit_status[0] else 1)
