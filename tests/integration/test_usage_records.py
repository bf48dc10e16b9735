"""Usage records: a real node writes what was produced and consumed per queue into __usage; the
totals equal what was sent, and clients cannot write to or create '__' queues."""

from __future__ import annotations

import json
import time

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.errors import BadParameter
from fabric.testing import Node

pytestmark = pytest.mark.integration


def _usage_rows(endpoint: str, want_messages: int, queue: str, seconds: float = 15) -> list[dict]:
    rows: list[dict] = []
    deadline = time.monotonic() + seconds
    with Consumer("__usage", endpoint, start="earliest", group=None) as c:
        while time.monotonic() < deadline:
            rows.extend(json.loads(m.value) for m in c.poll(300))
            produced = sum(r["messages"] for r in rows if r["queue"] == queue and r["operation"] == "produce")
            consumed = sum(r["messages"] for r in rows if r["queue"] == queue and r["operation"] == "consume")
            if produced >= want_messages and consumed >= want_messages:
                break
    return rows


def test_usage_totals_equal_what_was_sent(tmp_path):
    cfg = tmp_path / "node.toml"
    cfg.write_text("[node]\nusage_interval_ms = 300\n")
    node = Node(str(tmp_path / "data"), extra=["--config", str(cfg)])
    try:
        with Admin(node.endpoint) as admin:
            admin.create_queue("billing-q", partitions=2)
        sizes = [10 + (i * 37) % 900 for i in range(3000)]
        with Producer(node.endpoint) as p:
            for i, n in enumerate(sizes):
                p.send("billing-q", b"x" * n, key=b"k%d" % (i % 7))
            p.flush(30)
        got = 0
        with Consumer("billing-q", node.endpoint, group="readers", start="earliest") as c:
            deadline = time.monotonic() + 20
            while got < len(sizes) and time.monotonic() < deadline:
                got += len(c.poll(500))
        assert got == len(sizes)
        with Admin(node.endpoint) as admin:
            stored = admin.describe_queue("billing-q")["size_bytes"]
        with Admin(node.endpoint) as admin:  # the first flush creates __usage (every 300 ms here)
            deadline = time.monotonic() + 10
            while "__usage" not in {q["name"] for q in admin.list_queues()} and time.monotonic() < deadline:
                time.sleep(0.1)
        rows = _usage_rows(node.endpoint, len(sizes), "billing-q")
        mine = [r for r in rows if r["queue"] == "billing-q"]
        produced = [r for r in mine if r["operation"] == "produce"]
        consumed = [r for r in mine if r["operation"] == "consume"]
        assert sum(r["messages"] for r in produced) == len(sizes)
        assert sum(r["bytes"] for r in produced) == stored  # record batches as stored
        assert sum(r["messages"] for r in consumed) == len(sizes)
        assert all(r["principal"] == "anonymous" and r["node"] == "node-1" for r in mine)
        assert all(r["start_ms"] <= r["end_ms"] for r in mine)
        assert not [r for r in rows if r["queue"] == "__usage"]  # its own reads are not billed
        # clients read __usage, but may not write to or create '__' queues
        with Producer(node.endpoint, linger_ms=0) as p, pytest.raises(BadParameter):
            p.send("__usage", b"forged").result(10)
        with Admin(node.endpoint) as admin, pytest.raises(BadParameter):
            admin.create_queue("__mine")
    finally:
        node.stop()
