"""A really full disk: a small tmpfs mounted for the test (needs root; skipped otherwise).
Sends fail with DISK_FULL, nothing stored before is lost, the node lives on, and once
space is back sends succeed again."""

from __future__ import annotations

import time

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.errors import DiskFull
from fabric.testing import Node

from ..conftest import tmpfs

pytestmark = [pytest.mark.integration, pytest.mark.faults]


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "4m") as mnt:
        yield mnt


def test_full_disk_rejects_then_recovers(small_disk):
    node = Node(str(small_disk / "data"))
    try:
        with Admin(node.endpoint) as admin:
            admin.create_queue("fill", segment_bytes=65536, fsync="always")
        stored = 0
        error = None
        with Producer(node.endpoint, linger_ms=0, request_timeout_ms=10_000) as p:
            for i in range(2000):
                try:
                    p.send("fill", b"%06d" % i + b"x" * 4000).result(10)
                    stored += 1
                except DiskFull as exc:
                    error = exc
                    break
        assert error is not None, "the 4 MiB disk never filled"
        assert stored > 100
        # the node lives on and everything acknowledged is readable
        with Admin(node.endpoint) as admin:
            assert admin.ping()["node"]
            assert admin.describe_queue("fill")["messages"] == stored
        with Consumer("fill", node.endpoint, start="earliest") as c:
            got = []
            deadline = time.monotonic() + 20
            while len(got) < stored and time.monotonic() < deadline:
                got.extend(c.poll(300))
        assert [int(m.value[:6]) for m in got] == list(range(stored))
        # free space: delete a filler file we put there ourselves, then sends work again
        with Admin(node.endpoint) as admin:
            admin.delete_queue("fill")
            admin.create_queue("after")
        with Producer(node.endpoint) as p:
            assert p.send("after", b"ok").result(10).offset == 0
    finally:
        node.stop()
