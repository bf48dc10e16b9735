"""Issue 33's defects on the node's side, met from the shell and the client: a group's kind
after a restart, an encrypted queue whose key is missing, which ACL a refusal lacks."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fabric.client import Admin, Consumer, Producer
from fabric.errors import StorageError
from fabric.testing import Node
from tests.conftest import JsonNode

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


def _scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_throttle_seconds_count_the_waits_after_throttled_too(tmp_path: Path) -> None:
    node = JsonNode(tmp_path / "data", "--metrics-listen", "127.0.0.1:0")
    ep, url = node.info["endpoint"], node.info["metrics_endpoint"]
    try:
        with Admin(ep) as admin:
            admin.create_queue("held", fsync="interval")
            admin.quota_set("queue:held", messages_per_s=100, burst_ms=100)  # 10 messages at once
        with Producer(ep, linger_ms=50, batch_messages=200) as first:
            for i in range(110):  # one batch: 100 over, its reply says throttle_ms ~1000
                first.send("held", b"a%d" % i)
            first.flush(30)
        told = first.throttled_ms
        with Producer(ep) as second:  # knows nothing of that: THROTTLED, it waits retry_after_ms, sends again
            t0 = time.monotonic()
            second.send("held", b"b").result(30)
            waited = time.monotonic() - t0
        with Admin(ep) as admin:
            assert admin.quota_list()["refused"]["queue:held"] >= 1
        counted = _scrape(url)["fabric_throttle_seconds_total"][(("target", "queue:held"),)]
        assert 900 <= told <= 1100 and waited >= 0.5, (told, waited)
        assert told / 1000 + 0.8 * waited <= counted <= told / 1000 + waited + 0.2, (told, waited, counted)
    finally:
        node.stop()


def test_consumer_lag_in_seconds_agrees_with_lag_in_messages_for_groups_that_never_committed(tmp_path: Path) -> None:
    node = JsonNode(tmp_path / "data", "--metrics-listen", "127.0.0.1:0")
    ep, url = node.info["endpoint"], node.info["metrics_endpoint"]
    try:
        with Producer(ep, acks="all") as p:
            for i in range(5):
                p.send("lagq", b"old-%d" % i).result(10)
        time.sleep(1.5)  # the five are 1.5 s old
        with (
            Consumer("lagq", ep, group="from-latest", start="latest", auto_commit=False) as at_end,
            Consumer("lagq", ep, group="from-earliest", start="earliest", auto_commit=False) as at_start,
        ):
            got = 0
            for _ in range(50):
                at_end.poll(50)
                got += len(at_start.poll(50))
                if got == 5:
                    break
            m = _scrape(url)
        msgs, secs = m["fabric_consumer_lag_messages"], m["fabric_consumer_lag_seconds"]
        latest = (("group", "from-latest"), ("queue", "lagq"))
        earliest = (("group", "from-earliest"), ("queue", "lagq"))
        assert (msgs[latest], secs[latest]) == (0, 0)  # it started at the end: nothing behind
        assert msgs[earliest] == 5 and secs[earliest] >= 1.4  # it committed nothing: all five behind
    finally:
        node.stop()


def test_tail_heads_each_partition_and_create_says_what_the_queue_is(tmp_path: Path) -> None:
    node = _node(tmp_path)
    e = ["-e", node.endpoint]
    try:
        r = _fabric("queue", "create", "two", "-p", "2", *e)
        assert r.stdout == "queue two ready: 2 partition(s), fsync always\n", r.stderr
        with Producer(node.endpoint, acks="all") as p:
            for part in (0, 1):
                for i in range(3):
                    p.send("two", b"p%d-%d" % (part, i), partition=part).result(10)
        r = _fabric("tail", "two", "-n", "2", *e)
        assert r.returncode == 0, r.stderr
        blocks = sorted(r.stdout.split("==> ")[1:])
        assert blocks == ["partition 0 <==\np0-1\np0-2\n", "partition 1 <==\np1-1\np1-2\n"], r.stdout
        assert "==>" not in _fabric("tail", "two", "-n", "2", "--json", *e).stdout

        r = _fabric("queue", "create", "urgent", "--priority-levels", "3", *e)
        assert r.stdout.startswith("queue urgent ready: 1 partition(s) x 3 priority levels = log partitions 0..2")
        r = _fabric("send", "urgent", "now", "--priority", "2", *e)
        assert "first at partition 2" in r.stderr + r.stdout  # log partition 2: level 2 of partition 0

        r = _fabric("queue", "create", "live", "--set", "mode=direct", *e)
        assert r.returncode == 0, r.stderr
        assert "fsync" not in r.stdout and "direct (brokerless" in r.stdout and "nothing stored" in r.stdout
    finally:
        node.stop()


def test_an_endpoint_that_closes_every_connection_is_a_connection_error_not_a_refusal() -> None:
    """A proxy, a firewall or another service that accepts a TCP connection and closes it fails
    the ZeroMQ handshake the way a secured node refusing a client's keys does; the client tells
    them apart and reports the first as CONNECTION_FAILED."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    port = server.getsockname()[1]
    stop = threading.Event()

    def close_all() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.close()

    t = threading.Thread(target=close_all, daemon=True)
    t.start()
    try:
        r = _fabric("ping", "-e", f"tcp://127.0.0.1:{port}", timeout=30)
    finally:
        stop.set()
        t.join(5)
        server.close()
    assert r.returncode == 1
    assert "error: CONNECTION_FAILED" in r.stderr and "closed before any ZeroMQ handshake" in r.stderr, r.stderr
    assert "NOT_AUTHORIZED" not in r.stderr
