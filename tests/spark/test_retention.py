"""Retention holds of Spark queries: kept segments, `fabric spark queries` and `fabric spark forget`."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from fabric.client import Admin
from fabric.settings import QueueSettings
from fabric.spark.queries import hold_retention
from fabric.store.store import Store
from tests.store.helpers import SMALL, fill

pytestmark = pytest.mark.spark


def test_retention_keeps_what_a_spark_group_needs_and_releases_it(tmp_path):
    store = Store(tmp_path, defaults=QueueSettings(), now_ms=0)
    try:
        store.create_queue("held", dataclasses.replace(SMALL, retention_ms=1_000), now_ms=0)
        fill(store.partition("held", 0), 300, value_bytes=500, ts=0)  # 900 records over many segments
        log = store.partition("held", 0)
        store.meta.commit("held", "spark.q1", {0: 450})
        store.meta.commit("held", "spark.q2", {0: 600})
        store.meta.commit("held", "plain", {0: 0})  # an ordinary group holds nothing
        store.enforce_retention(now_ms=10_000)
        assert 0 < log.log_start_offset <= 450  # segments below the smallest hold went, the held one stayed
        store.meta.commit("held", "spark.q1", {0: 900})
        store.enforce_retention(now_ms=10_000)
        assert 450 < log.log_start_offset <= 600
        store.meta.delete_group("held", "spark.q2")  # forgotten: nothing is held any more
        store.enforce_retention(now_ms=10_000)
        assert log.log_start_offset > 600
    finally:
        store.close(clean=False)


def fabric(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["fabric", *args], capture_output=True, text=True, timeout=60)


def test_cli_lists_and_forgets_registered_queries(fabric_node):
    ep = fabric_node.endpoint
    with Admin(ep) as a:
        a.create_queue("rq", partitions=2)
        hold_retention(a, "rq", "nightly", {"0": 0, "1": 0})
    r = fabric("spark", "queries", "-e", ep, "--json")
    assert r.returncode == 0, r.stderr
    rows = [x for x in json.loads(r.stdout) if x["query"] == "nightly"]
    assert rows == [{"query": "nightly", "queue": "rq", "committed": {"0": 0, "1": 0}, "lag": 0}]
    assert "nightly" in fabric("spark", "queries", "-e", ep).stdout
    r = fabric("spark", "forget", "nightly", "-e", ep, "--yes")
    assert r.returncode == 0 and "forgot query nightly on rq" in r.stdout, r.stderr
    assert not [x for x in json.loads(fabric("spark", "queries", "-e", ep, "--json").stdout) if x["query"] == "nightly"]
    r = fabric("spark", "forget", "nightly", "-e", ep, "--yes")
    assert r.returncode != 0 and "no query" in r.stderr
