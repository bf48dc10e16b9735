"""IPv6 endpoints (issue 33, defect 12): a node listening on tcp://[::1]:0 serves a client there."""

from __future__ import annotations

import socket

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.testing import Node

from ..conftest import drain

pytestmark = pytest.mark.integration


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture
def v6_node(tmp_path):
    if not _has_ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback (::1)")
    n = Node(str(tmp_path / "data"), listen="tcp://[::1]:0")
    try:
        yield n
    finally:
        n.stop()


def test_a_node_on_ipv6_loopback_serves_admin_producer_and_consumer(v6_node):
    assert v6_node.endpoint.startswith("tcp://[::1]:")
    with Admin(v6_node.endpoint, timeout_ms=5000) as admin:
        assert admin.ping()["node"]
        admin.create_queue("six")
    with Producer(v6_node.endpoint) as producer:
        producer.send("six", b"over ipv6").result(10)
    with Consumer("six", v6_node.endpoint, start="earliest") as consumer:
        assert [m.value for m in drain(consumer, 1, 15)] == [b"over ipv6"]


def test_the_cli_reaches_a_node_on_ipv6(v6_node):
    from .test_cli import fabric

    e = ["-e", v6_node.endpoint]
    r = fabric("send", "six-cli", "hello", *e)
    assert r.returncode == 0, r.stderr
    r = fabric("recv", "six-cli", "--count", "1", "--json", *e)
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stdout.splitlines()] and '"hello"' in r.stdout


def test_only_bracketed_ipv6_endpoints_turn_the_ipv6_option_on():
    """IPv4 listeners keep their plain address (127.0.0.1, not [::ffff:127.0.0.1]) and
    localhost is not resolved to ::1 behind a node that listens on 127.0.0.1."""
    from fabric.transport.endpoints import ipv6

    assert ipv6("tcp://[::1]:7420") == 1 and ipv6("tcp://[fe80::1%eth0]:1") == 1
    assert ipv6("tcp://127.0.0.1:7420") == 0 and ipv6("tcp://localhost:7420") == 0 and ipv6("ipc:///tmp/x") == 0
