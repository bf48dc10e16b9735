"""Issue 33's gaps next to the tools users know (kafka-*, nats, aws sqs), driven from the shell
against a real node: group delete, recv --follow, queue alter --set, queue purge, settling by
receipt handle."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.testing import Node

from ..conftest import drain
from .test_cli import fabric

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gaps_node(tmp_path_factory) -> Iterator[Node]:
    """One node for the module; every test uses queue names of its own."""
    n = Node(str(tmp_path_factory.mktemp("gaps") / "data"))
    try:
        yield n
    finally:
        n.stop()


def _send(endpoint: str, queue: str, values: list[bytes]) -> None:
    with Producer(endpoint) as p:
        for v in values:
            p.send(queue, v)
        p.flush()


def test_group_delete_removes_an_idle_group_and_refuses_a_live_one(gaps_node):
    e = ["-e", gaps_node.endpoint]
    _send(gaps_node.endpoint, "gd", [b"a", b"b"])
    assert fabric("recv", "gd", "--group", "billing", "--count", "2", *e).returncode == 0
    with Consumer("gd", gaps_node.endpoint, group="live", kind="queue") as member:
        assert drain(member, 1, 15)
        r = fabric("group", "delete", "gd", "live", "--yes", *e)
        assert r.returncode == 1 and "live member" in r.stderr, r.stderr
    r = fabric("group", "delete", "gd", "billing", *e)  # no terminal, no --yes: refused, nothing deleted
    assert r.returncode == 2 and "--yes" in r.stderr
    r = fabric("group", "delete", "gd", "billing", "--yes", "--json", *e)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"queue": "gd", "group": "billing", "deleted": True}
    groups = json.loads(fabric("group", "list", "gd", "--json", *e).stdout)
    assert [g["group"] for g in groups] == ["live"]
    r = fabric("group", "delete", "gd", "billing", "--yes", *e)
    assert r.returncode == 1 and "no group" in r.stderr


def test_recv_follow_prints_until_ctrl_c_commits_and_exits_130(gaps_node):
    e = ["-e", gaps_node.endpoint]
    _send(gaps_node.endpoint, "follow", [b"one", b"two"])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabric.cli",
            "recv",
            "follow",
            "--group",
            "tailers",
            "--follow",
            "--timeout-ms",
            "200",
            *e,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)  # past --timeout-ms many times over: --follow does not stop when idle
        assert proc.poll() is None
        _send(gaps_node.endpoint, "follow", [b"three"])
        deadline = time.monotonic() + 15
        with Admin(gaps_node.endpoint) as admin:
            while time.monotonic() < deadline and admin.committed("follow", "tailers").get(0) != 3:
                time.sleep(0.1)
            assert admin.committed("follow", "tailers") == {0: 3}  # committed as it went
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 130, err
    assert out.splitlines() == ["one", "two", "three"]
    assert "3 message(s) printed and committed" in err


def test_recv_follow_needs_a_group(gaps_node):
    r = fabric("recv", "follow-x", "--follow", "-e", gaps_node.endpoint)
    assert r.returncode == 2 and "--group" in r.stderr and "tail -f" in r.stderr
