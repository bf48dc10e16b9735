"""Issue 33's defects on the node's side, met from the shell and the client: a group's kind
after a restart, an encrypted queue whose key is missing, which ACL a refusal lacks."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.errors import StorageError
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


def _key_file(tmp_path: Path, name: str, doc: dict) -> Path:
    path = tmp_path / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, json.dumps(doc).encode())
    os.close(fd)
    return path


def test_a_read_that_cannot_decrypt_fails_on_the_cli_and_in_the_consumer(tmp_path: Path) -> None:
    key_file = tmp_path / "at-rest.keys"
    assert _fabric("auth", "at-rest-key", "init", str(key_file)).returncode == 0
    node = _node(tmp_path, f'[security]\nat_rest_key_file = "{key_file}"\n')
    try:
        with Admin(node.endpoint) as admin:
            admin.create_queue("secret", encrypt=True)
        with Producer(node.endpoint, acks="all") as p:
            p.send("secret", b"hidden").result(10)
    finally:
        node.stop()
    assert _fabric("auth", "at-rest-key", "rotate", str(key_file)).returncode == 0
    doc = json.loads(key_file.read_text())
    doc["keys"] = [k for k in doc["keys"] if k["id"] != 1]  # key 1 lost
    lost = _key_file(tmp_path, "lost.keys", doc)
    node = _node(tmp_path, f'[security]\nat_rest_key_file = "{lost}"\n')
    try:
        for extra in ([], ["--group", "g"], ["--group", "w", "--kind", "queue"]):
            r = _fabric("recv", "secret", "--timeout-ms", "1000", *extra, "-e", node.endpoint)
            assert r.returncode == 1, (extra, r.stdout, r.stderr)
            assert "error: STORAGE_ERROR" in r.stderr and "key id 1" in r.stderr, (extra, r.stderr)
            assert "message(s)" not in r.stderr
        with pytest.raises(StorageError, match="key id 1"), Consumer("secret", node.endpoint, start="earliest") as c:
            for _ in range(20):
                c.poll(200)
    finally:
        node.stop()


def test_a_push_read_that_fails_ends_the_subscription_with_the_error(tmp_path: Path) -> None:
    key_file = tmp_path / "at-rest.keys"
    assert _fabric("auth", "at-rest-key", "init", str(key_file)).returncode == 0
    # a one-byte tail cache holds no batch: every read is from the segment file
    node = _node(tmp_path, f'[limits]\ntail_cache_bytes = 1\n[security]\nat_rest_key_file = "{key_file}"\n')
    try:
        with Admin(node.endpoint) as admin:
            admin.create_queue("sealed", encrypt=True)
        with Producer(node.endpoint, acks="all") as p:
            for i in range(2):
                p.send("sealed", b"batch-%d" % i).result(10)
        (segment,) = (tmp_path / "data" / "queues" / "sealed" / "0").glob("*.log")
        with segment.open("r+b") as f:  # under the running node: its last batch fails authentication when read
            f.seek(segment.stat().st_size - 3)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        unreadable = r"sealed/0 cannot be read: .* fails authentication"
        with pytest.raises(StorageError, match=unreadable), Consumer("sealed", node.endpoint, start="earliest") as c:
            for _ in range(20):
                c.poll(200)
        assert "fails authentication" in node.log_text()
    finally:
        node.stop()


def _readme_acl_lines() -> list[str]:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    return [line.split("#")[0].strip() for line in readme.splitlines() if line.startswith("fabric acl add ")]


def test_the_readme_acl_example_is_enough_to_consume_and_a_refusal_names_what_is_missing(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    assert _fabric("auth", "init", "--dir", str(keys)).returncode == 0
    for name in ("ops", "alice"):
        assert _fabric("auth", "add-client", name, "--dir", str(keys)).returncode == 0
    node = _node(tmp_path, f'[security]\nkeys_dir = "{keys}"\nadmins = ["ops"]\n')

    def as_(name: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "FABRIC_CLIENT_CERT": str(keys / "issued" / f"{name}.key_secret"),
            "FABRIC_SERVER_CERT": str(keys / "server.key"),
        }
        cmd = [sys.executable, "-m", "fabric.cli", *args, "-e", node.endpoint]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)

    try:
        assert as_("ops", "queue", "create", "orders.eu").returncode == 0
        assert as_("ops", "send", "orders.eu", "paid").returncode == 0
        assert as_("ops", "acl", "add", "alice", "consume", "group:billing").returncode == 0
        r = as_("alice", "recv", "orders.eu", "--group", "billing", "--timeout-ms", "500")
        assert r.returncode == 1
        assert (
            "error: NOT_AUTHORIZED: principal 'alice' may not consume 'orders.eu': alice lacks consume on "
            "queue:orders.eu (fabric acl add alice consume orders.eu)"
        ) in r.stderr, r.stderr
        assert as_("ops", "acl", "remove", "alice", "consume", "group:billing").returncode == 0
        r = as_("alice", "recv", "orders.eu", "--group", "billing", "--timeout-ms", "500")
        assert "lacks consume on queue:orders.eu and consume on group:billing" in r.stderr, r.stderr
        lines = _readme_acl_lines()
        assert len(lines) == 3, lines
        for line in lines:
            r = as_("ops", *shlex.split(line)[1:])
            assert r.returncode == 0, (line, r.stderr)
        r = as_("alice", "recv", "orders.eu", "--group", "billing", "-n", "1")
        assert (r.returncode, r.stdout) == (0, "paid\n"), r.stderr
    finally:
        node.stop()
