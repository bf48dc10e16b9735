"""A client given several endpoints whose first one is dead moves on by itself, also while a
request is waiting to be sent (it once waited out its whole timeout on the dead one)."""

from __future__ import annotations

import time

import pytest

from fabric.client import Admin, Producer
from tests.etcd_fixture import free_ports

pytestmark = pytest.mark.integration


def test_a_dead_first_endpoint_is_passed_over(node):
    dead = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    t0 = time.monotonic()
    with Admin(f"{dead},{node.endpoint}", timeout_ms=10_000) as admin:
        assert admin.ping()["node"]
        admin.create_queue("listed")
    assert time.monotonic() - t0 < 6
    with Producer(f"{dead},{node.endpoint}", request_timeout_ms=10_000) as prod:
        assert prod.send("listed", b"x").result(8).offset == 0
