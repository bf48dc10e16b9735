"""The Prometheus endpoint of a real node: the families an operator needs, with values that move
when traffic moves, and a clear refusal of a bad [metrics] listen."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fabric.client import Admin, Consumer, Producer
from fabric.errors import UnknownQueue

from ..conftest import JsonNode

pytestmark = pytest.mark.integration


def _scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """{sample name: {sorted labels: value}}."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _value(m: dict, name: str, **labels: str) -> float:
    want = tuple(sorted(labels.items()))
    rows = m.get(name, {})
    assert want in rows, f"{name}{labels} not in {sorted(rows)[:5]}"
    return rows[want]


@pytest.fixture
def metrics_node(tmp_path):
    node = JsonNode(tmp_path / "data", "--metrics-listen", "127.0.0.1:0")
    try:
        yield node.info
    finally:
        node.stop()


def test_families_are_there_and_move_with_traffic(metrics_node):
    ep, url = metrics_node["endpoint"], metrics_node["metrics_endpoint"]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    with Admin(ep) as admin:
        admin.create_queue("orders", partitions=2, fsync="always")
    before = _scrape(url)
    assert _value(before, "fabric_up") == 1
    for family in (
        "fabric_requests_total",
        "fabric_log_end_offset",
        "fabric_high_watermark",
        "fabric_fsync_duration_seconds_bucket",
        "fabric_gc_pause_seconds_bucket",
        "fabric_group_commit_requests_count",
        "fabric_idle_spells_total",
        "fabric_idle_polled_spells_total",
        "fabric_request_duration_seconds_bucket",
        "fabric_disk_free_bytes",
        "fabric_process_resident_memory_bytes",
    ):
        assert family in before, family
    assert _value(before, "fabric_log_end_offset", queue="orders", partition="0") == 0

    with Producer(ep, linger_ms=1) as p:
        for i in range(1000):
            p.send("orders", b"x" * 100, key=b"k%d" % (i % 10))
        p.flush(30)
    with Consumer("orders", ep, group="billing", start="earliest") as c:
        got = 0
        deadline = time.monotonic() + 20
        while got < 600 and time.monotonic() < deadline:
            b = c.poll_batch(500)
            got += len(b) if b else 0
        c.commit()
        after = _scrape(url)
    ends = sum(_value(after, "fabric_log_end_offset", queue="orders", partition=str(p)) for p in (0, 1))
    assert ends == 1000
    assert _value(after, "fabric_messages_in_total", queue="orders") == 1000
    assert _value(after, "fabric_bytes_in_total", queue="orders") > 100_000
    assert _value(after, "fabric_messages_out_total", queue="orders") >= got
    assert _value(after, "fabric_requests_total", op="produce") > 0
    assert "produce" not in {dict(k).get("op") for k in before["fabric_requests_total"]}
    assert _value(after, "fabric_fsync_duration_seconds_count") > _value(before, "fabric_fsync_duration_seconds_count")
    assert _value(after, "fabric_idle_spells_total") > _value(before, "fabric_idle_spells_total")
    assert 0 <= _value(after, "fabric_idle_polled_spells_total") <= _value(after, "fabric_idle_spells_total")
    lag = _value(after, "fabric_consumer_lag_messages", queue="orders", group="billing")
    assert lag == 1000 - got
    assert _value(after, "fabric_consumer_lag_seconds", queue="orders", group="billing") >= 0


def test_errors_are_counted_by_code(metrics_node):
    ep, url = metrics_node["endpoint"], metrics_node["metrics_endpoint"]
    with Admin(ep) as admin:
        for _ in range(3):
            with pytest.raises(UnknownQueue):
                admin.describe_queue("no-such-queue")
    m = _scrape(url)
    assert _value(m, "fabric_errors_total", code="UNKNOWN_QUEUE") == 3


def test_bad_metrics_listen_is_refused_with_the_key(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[metrics]\nlisten = "nowhere"\n')
    r = subprocess.run(
        [sys.executable, "-m", "fabric.cli", "up", "--config", str(cfg)], capture_output=True, text=True, timeout=30
    )
    assert r.returncode != 0 and "metrics.listen" in r.stderr
    cfg.write_text("[metrics]\nport = 9\n")
    r = subprocess.run(
        [sys.executable, "-m", "fabric.cli", "up", "--config", str(cfg)], capture_output=True, text=True, timeout=30
    )
    assert r.returncode != 0 and "metrics.port" in r.stderr


def _referenced_families(text: str) -> set[str]:
    import re

    names = set(re.findall(r"\bfabric_[a-z_]+", text))
    # histogram/counter sample suffixes name the family they belong to
    return {re.sub(r"_(bucket|count|sum|total)$", "", n) for n in names}


def test_alert_rules_and_dashboard_use_only_exported_families(metrics_node):
    """promtool checks and unit-tests the alert rules; every fabric_* name that they and the Grafana
    dashboard use is one a real node exports (names that drift would alert on nothing)."""
    import shutil
    from pathlib import Path

    configs = Path(__file__).resolve().parents[2] / "configs"
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: apt-get install prometheus (.ci/run installs it)"
    rules = configs / "prometheus"
    for args in (["check", "rules", "fabric-alerts.yml"], ["test", "rules", "fabric-alerts.test.yml"]):
        r = subprocess.run([promtool, *args], cwd=rules, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    ep, url = metrics_node["endpoint"], metrics_node["metrics_endpoint"]
    with Admin(ep) as admin:  # a DLQ, a queue group and a delayed message, so every family has rows
        admin.create_queue("jobs", fsync="never")
        admin.create_queue("jobs.dlq", fsync="never")
    with Producer(ep) as p:
        p.send("jobs", b"later", delay_ms=60_000).result(10)
    with urllib.request.urlopen(url, timeout=10) as r:
        exported = {f.name for f in text_string_to_metric_families(r.read().decode())}
    cluster_only = {"fabric_partition_isr_size", "fabric_under_replicated_partitions"}  # a cluster node's
    dashboard = json.loads((configs / "grafana" / "fabric-dashboard.json").read_text())
    used = _referenced_families((rules / "fabric-alerts.yml").read_text()) | _referenced_families(json.dumps(dashboard))
    missing = used - exported - cluster_only
    assert not missing, f"used but not exported: {sorted(missing)}"
