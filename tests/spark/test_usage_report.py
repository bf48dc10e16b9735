"""The usage pipeline end to end: a real node records usage into __usage, the Spark job sums it per
principal, queue and hour, and the report's totals equal what was stored and consumed."""

from __future__ import annotations

import json
import time

from fabric.client import Admin, Consumer, Producer
from fabric.testing import Node


def _wait_for_usage(endpoint: str, want: dict[tuple[str, str], int], seconds: float = 20) -> None:
    """Until __usage holds at least ``want[(queue, operation)]`` messages for each."""
    seen: dict[tuple[str, str], int] = {}
    deadline = time.monotonic() + seconds
    with Admin(endpoint) as admin:
        while "__usage" not in {q["name"] for q in admin.list_queues()} and time.monotonic() < deadline:
            time.sleep(0.1)
    with Consumer("__usage", endpoint, start="earliest", group=None) as c:
        while time.monotonic() < deadline and any(seen.get(k, 0) < n for k, n in want.items()):
            for m in c.poll(300):
                r = json.loads(m.value)
                key = (r["queue"], r["operation"])
                seen[key] = seen.get(key, 0) + r["messages"]
    assert all(seen.get(k, 0) >= n for k, n in want.items()), seen


def test_usage_report_totals_equal_what_was_sent(spark, tmp_path):
    from fabric.spark.usage import report

    cfg = tmp_path / "node.toml"
    cfg.write_text("[node]\nusage_interval_ms = 200\n")
    node = Node(str(tmp_path / "data"), extra=["--config", str(cfg)])
    try:
        since = int(time.time() * 1000) - 1000
        sent = {"orders": 2000, "payments": 700}
        with Admin(node.endpoint) as admin:
            for q in sent:
                admin.create_queue(q, partitions=2)
        with Producer(node.endpoint) as p:
            for q, n in sent.items():
                for i in range(n):
                    p.send(q, b"v" * (20 + i % 300), key=b"k%d" % (i % 11))
            p.flush(30)
        got = 0
        with Consumer("orders", node.endpoint, group="shipping", start="earliest") as c:
            deadline = time.monotonic() + 20
            while got < sent["orders"] and time.monotonic() < deadline:
                got += len(c.poll(500))
        assert got == sent["orders"]
        with Admin(node.endpoint) as admin:
            stored = {q: admin.describe_queue(q)["size_bytes"] for q in sent}
        _wait_for_usage(
            node.endpoint, {("orders", "produce"): 2000, ("payments", "produce"): 700, ("orders", "consume"): 2000}
        )
        rows = report(spark, node.endpoint, since, tmp_path / "report")
    finally:
        node.stop()
    totals: dict[str, list[int]] = {}
    for r in rows:
        assert r["principal"] == "anonymous" and r["hour"] is not None
        t = totals.setdefault(r["queue"], [0, 0, 0, 0])
        for i, col in enumerate(("produced_messages", "produced_bytes", "consumed_messages", "consumed_bytes")):
            t[i] += r[col]
    assert totals["orders"][:3] == [2000, stored["orders"], 2000]
    assert totals["payments"][:3] == [700, stored["payments"], 0]
    assert rows[0]["queue"] == "orders"  # busiest first
    out = tmp_path / "report"
    assert list((out / "usage.parquet").glob("*.parquet"))
    csvs = list((out / "usage.csv").glob("*.csv"))
    assert len(csvs) == 1 and csvs[0].read_text().splitlines()[0].startswith("principal,queue,hour")
    assert (out / "busiest_queues.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_node_that_recorded_nothing_reports_no_usage(spark, tmp_path):
    from fabric.spark.usage import report

    node = Node(str(tmp_path / "data"))  # fresh: no __usage queue yet
    try:
        with Admin(node.endpoint) as admin:
            assert "__usage" not in {q["name"] for q in admin.list_queues()}
        assert report(spark, node.endpoint, 0, tmp_path / "out") == []
    finally:
        node.stop()
    assert (tmp_path / "out" / "usage.csv").is_dir() and (tmp_path / "out" / "busiest_queues.png").is_file()
