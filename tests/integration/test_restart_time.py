"""Restart after kill -9 is index-based: only the active segment's tail is scanned."""

from __future__ import annotations

import re
import time

import pytest

from fabric.client import Admin, Producer
from fabric.testing import Node
from tests.conftest import kill9

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def _fill_kill_restart(tmp_path, total_bytes: int) -> tuple[float, str]:
    data = str(tmp_path / "data")
    node = Node(data)
    with Admin(node.endpoint) as admin:
        admin.create_queue("big", fsync="never", retention_ms=0)
    payload = b"r" * 1000
    with Producer(node.endpoint, batch_bytes=1 << 20, linger_ms=20) as p:
        for _ in range(total_bytes // len(payload)):
            p.send("big", payload)
        p.flush(120)
    kill9(node)
    t0 = time.monotonic()
    node = Node(data)
    ready_s = time.monotonic() - t0
    line = node.ready_line
    with Admin(node.endpoint) as admin:
        assert admin.describe_queue("big")["messages"] == total_bytes // len(payload)
    node.stop()
    return ready_s, line


def test_restart_after_kill9_is_quick(tmp_path):
    ready_s, line = _fill_kill_restart(tmp_path, 128 * 1024 * 1024)
    started_ms = int(re.search(r"started in (\d+) ms", line).group(1))
    assert started_ms < 2000, line
    assert ready_s < 10  # whole process start, imports included, on a loaded CI machine


@pytest.mark.slow
def test_restart_after_kill9_with_1gib(tmp_path):
    ready_s, line = _fill_kill_restart(tmp_path, 1024 * 1024 * 1024)
    started_ms = int(re.search(r"started in (\d+) ms", line).group(1))
    print(f"1 GiB restart: store open {started_ms} ms, process ready {ready_s:.2f} s")
    assert started_ms < 2000, line
    assert ready_s < 2.5, line
