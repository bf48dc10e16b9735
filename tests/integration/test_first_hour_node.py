"""Issue 33's defects on the node's side, met from the shell and the client: a group's kind
after a restart, an encrypted queue whose key is missing, which ACL a refusal lacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fabric.client import Admin, Producer
from fabric.testing import Node

pytestmark = pytest.mark.integration


def _fabric(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabric.cli", *args], capture_output=True, text=True, timeout=timeout)


def _node(tmp_path: Path, config: str = "") -> Node:
    (tmp_path / "node.toml").write_text(config)
    return Node(str(tmp_path / "data"), extra=["--config", str(tmp_path / "node.toml")])


def _group_rows(endpoint: str, queue: str) -> dict[str, dict]:
    r = _fabric("group", "list", queue, "--json", "-e", endpoint)
    assert r.returncode == 0, r.stderr
    return {row["group"]: row for row in json.loads(r.stdout)}


def test_group_kinds_and_backlog_survive_a_restart(tmp_path: Path) -> None:
    node = _node(tmp_path)
    try:
        with Admin(node.endpoint) as admin:
            admin.create_queue("kinds", partitions=2)
        with Producer(node.endpoint, acks="all") as p:
            for i in range(10):
                p.send("kinds", b"m%d" % i, key=b"k%d" % (i % 3)).result(10)
        for group, kind in (("work", "queue"), ("keyed", "key_shared"), ("reader", "stream")):
            r = _fabric("recv", "kinds", "--group", group, "--kind", kind, "-n", "4", "-e", node.endpoint)
            assert r.returncode == 0, r.stderr
        before = _group_rows(node.endpoint, "kinds")
        assert {g: r["kind"] for g, r in before.items()} == {"work": "queue", "keyed": "key_shared", "reader": "stream"}
        assert before["work"]["backlog"] == 6 and before["keyed"]["backlog"] == 6
    finally:
        node.stop()
    node = _node(tmp_path)
    try:
        after = _group_rows(node.endpoint, "kinds")
    finally:
        node.stop()
    assert after == before
