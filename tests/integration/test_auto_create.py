"""Queues created on first send (issue 15 #9, seed 002): on for the embedded node, off by config."""

from __future__ import annotations

import pytest

from fabric.client import Admin, Producer
from fabric.errors import UnknownQueue
from fabric.protocol.batch import encode_batch
from fabric.protocol.ops import Op
from fabric.testing import Node
from fabric.transport.connection import connect
from tests.integration.test_cli import fabric

pytestmark = pytest.mark.integration


def test_a_first_send_creates_the_queue_from_the_defaults(node):
    e = ["-e", node.endpoint]
    r = fabric("send", "newq", "hello", *e)
    assert r.returncode == 0, r.stderr
    r = fabric("recv", "newq", "--from", "earliest", "-n", "1", *e)
    assert r.stdout.split() == ["hello"]
    with Admin(node.endpoint) as admin:
        d = admin.describe_queue("newq")
    assert d["partitions"] == 1 and "created" not in d  # a plain describe never creates nor says so
    assert "created on first send" in node.log_text()


def test_the_produce_reply_says_it_created_the_queue(node):
    conn = connect(node.endpoint, timeout_ms=5000)
    try:
        params = {"queue": "raw", "partition": 0}
        first = conn.request(Op.PRODUCE, params, [encode_batch([b"a"])]).params
        again = conn.request(Op.PRODUCE, params, [encode_batch([b"b"])]).params
    finally:
        conn.close()
    assert first.get("created") is True and "created" not in again


def test_only_a_send_creates(node):
    with Admin(node.endpoint) as admin, pytest.raises(UnknownQueue):
        admin.describe_queue("nothere")
    r = fabric("recv", "nothere", "-n", "1", "--timeout-ms", "200", "-e", node.endpoint)
    assert r.returncode == 1 and "UNKNOWN_QUEUE" in r.stderr
    r = fabric("send", "orders.dlq", "x", "-e", node.endpoint)
    assert r.returncode == 1 and "UNKNOWN_QUEUE" in r.stderr


def test_off_by_config_the_error_says_how(tmp_path):
    cfg = tmp_path / "node.toml"
    cfg.write_text("[node]\nauto_create_queues = false\n")
    node = Node(str(tmp_path / "data"), extra=["--config", str(cfg)])
    try:
        with Producer(node.endpoint) as p, pytest.raises(UnknownQueue) as err:
            p.send("nope", b"x").result(5)
        assert "fabric queue create nope" in err.value.message and "auto_create_queues" in err.value.message
    finally:
        node.stop()
