"""Encryption at rest on a real node (issue 12, item 3): an encrypted queue's marker is in no file
under the data dir (a control queue's is), its messages come back intact through push and FETCH,
after a restart and after a key rotation (old and new key ids); a node missing a key id refuses
the partition naming it and keeps every byte; a node without a key file refuses encrypted queues."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.errors import BadParameter, StorageError
from fabric.protocol.batch import iter_batches
from fabric.security.at_rest import key_id_of
from fabric.testing import Node
from tests.conftest import drain

pytestmark = pytest.mark.integration

SECRET = b"TOP-SECRET-MARKER-91c2"
PLAIN = b"PLAIN-CONTROL-MARKER-55e1"


def _fabric(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabric.cli", *args], capture_output=True, text=True, timeout=60)


def _files_holding(root: Path, needle: bytes) -> list[str]:
    """grep -rl: every file under ``root`` whose bytes contain ``needle``."""
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _start(tmp_path: Path, key_file: Path | None) -> Node:
    config = tmp_path / "node.toml"
    config.write_text(f'[security]\nat_rest_key_file = "{key_file}"\n' if key_file else "")
    return Node(str(tmp_path / "data"), extra=["--config", str(config)])


def _produce(endpoint: str, queue: str, marker: bytes, start: int, n: int) -> None:
    with Producer(endpoint, acks="all", linger_ms=2) as prod:
        futures = [prod.send(queue, marker + b"-%06d" % i) for i in range(start, start + n)]
        prod.flush()
        for f in futures:
            f.result(10)


def _consume_all(endpoint: str, queue: str, n: int) -> list[bytes]:
    with Consumer(queue, endpoint, start="earliest") as cons:
        return [m.value for m in drain(cons, n, seconds=15)]


def _key_ids(data_dir: Path, queue: str) -> set[int]:
    ids: set[int] = set()
    for seg in (data_dir / "queues" / queue / "0").glob("*.log"):
        raw = seg.read_bytes()
        ids |= {key_id_of(raw, pos, h) for pos, h in iter_batches(raw)}  # type: ignore[misc]
    return ids


def test_encrypted_queue_survives_restart_and_rotation_with_no_plaintext_on_disk(tmp_path: Path) -> None:
    key_file = tmp_path / "at-rest.keys"
    r = _fabric("auth", "at-rest-key", "init", str(key_file))
    assert r.returncode == 0, r.stderr
    assert key_file.stat().st_mode & 0o777 == 0o600
    data = tmp_path / "data"
    expected = [SECRET + b"-%06d" % i for i in range(600)]
    node = _start(tmp_path, key_file)
    try:
        r = _fabric("queue", "create", "secret", "--set", "encrypt=true", "-e", node.endpoint)
        assert r.returncode == 0, r.stderr
        with Admin(node.endpoint) as admin:
            admin.create_queue("plain")
            assert admin.describe_queue("secret")["encrypted"] is True
            assert admin.describe_queue("plain")["encrypted"] is False
        assert "encrypted at rest" in _fabric("queue", "describe", "secret", "-e", node.endpoint).stdout
        with Producer(node.endpoint, acks="all") as prod:  # a delayed batch waits sealed in the delay store
            prod.send("secret", SECRET + b"-delayed", delay_ms=60_000).result(10)
        _produce(node.endpoint, "secret", SECRET, 0, 300)
        _produce(node.endpoint, "plain", PLAIN, 0, 300)
        assert _consume_all(node.endpoint, "secret", 300) == expected[:300]
        with Admin(node.endpoint) as admin:  # FETCH (the Spark source's path) decrypts too
            batches, _ = admin.fetch("secret", 0, 0, max_bytes=1 << 20)
            assert [v for b in batches for v in b.values] == expected[:300]
    finally:
        node.stop()
    assert _files_holding(data, SECRET) == []
    assert _files_holding(data, PLAIN)  # the control: an unencrypted queue's marker is there to find

    node = _start(tmp_path, key_file)  # a restart reads what the last process sealed
    try:
        assert _consume_all(node.endpoint, "secret", 300) == expected[:300]
        r = _fabric("auth", "at-rest-key", "rotate", str(key_file))  # the running node takes it within 1 s
        assert r.returncode == 0, r.stderr
        assert "at-rest key id 2" in r.stdout
        time.sleep(1.2)
        _produce(node.endpoint, "secret", SECRET, 300, 300)
    finally:
        node.stop()
    assert _key_ids(data, "secret") == {1, 2}
    assert _files_holding(data, SECRET) == []

    node = _start(tmp_path, key_file)
    try:
        assert _consume_all(node.endpoint, "secret", 600) == expected
    finally:
        node.stop()


def test_a_missing_key_id_is_refused_by_name_and_nothing_is_lost(tmp_path: Path) -> None:
    key_file = tmp_path / "at-rest.keys"
    assert _fabric("auth", "at-rest-key", "init", str(key_file)).returncode == 0
    node = _start(tmp_path, key_file)
    try:
        with Admin(node.endpoint) as admin:
            admin.create_queue("secret", encrypt=True)
        _produce(node.endpoint, "secret", SECRET, 0, 50)
    finally:
        node.stop()
    log_files = {p: p.read_bytes() for p in (tmp_path / "data" / "queues" / "secret").rglob("*.log")}
    assert _fabric("auth", "at-rest-key", "rotate", str(key_file)).returncode == 0
    doc = json.loads(key_file.read_text())
    doc["keys"] = [k for k in doc["keys"] if k["id"] != 1]  # key 1 lost
    lost = tmp_path / "lost.keys"
    fd = os.open(lost, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, json.dumps(doc).encode())
    os.close(fd)
    node = _start(tmp_path, lost)
    try:
        with Admin(node.endpoint) as admin:
            detail = admin.describe_queue("secret")["partition_detail"][0]
            assert "key id 1" in detail["refused"] and str(lost) in detail["refused"]
            with pytest.raises(StorageError, match="key id 1"):
                admin.fetch("secret", 0, 0)
        assert "key id 1" in node.log_text()
    finally:
        node.stop()
    assert {p: p.read_bytes() for p in log_files} == log_files  # not truncated, not rewritten

    node = _start(tmp_path, None)  # no key file at all: existing encrypted queues and new ones refused
    try:
        with Admin(node.endpoint) as admin:
            with pytest.raises(BadParameter, match="at_rest_key_file"):
                admin.create_queue("another", encrypt=True)
            assert "at_rest_key_file" in admin.describe_queue("secret")["partition_detail"][0]["refused"]
    finally:
        node.stop()
    node = _start(tmp_path, key_file)  # the full key file back: all of it readable again
    try:
        assert _consume_all(node.endpoint, "secret", 50) == [SECRET + b"-%06d" % i for i in range(50)]
    finally:
        node.stop()
