"""`fabric queue move` and `fabric federation rebalance | drain` on the in-memory etcd (the CLI's
etcd client swapped for it): what each prints and writes, and its exit status."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from fabric.cli import main
from fabric.cluster import etcd as etcd_module
from fabric.cluster.memetcd import MemoryEtcd
from fabric.federation.directory import QueuePlacement, cluster_key, drain_key, queue_key
from fabric.federation.move_requests import read_move
from fabric.federation.moves import Move, move_key
from tests.federation.reports import report

ETCD = ["--etcd", "http://127.0.0.1:9"]


class _Shared(MemoryEtcd):
    def close(self) -> None:  # the CLI closes its client; the test reads on
        pass


@pytest.fixture
def etcd(monkeypatch: pytest.MonkeyPatch) -> MemoryEtcd:
    now = int(time.time() * 1000)
    m = _Shared(now)
    for name, bps in (("east", 250e6), ("west", 0.0)):
        m.put(cluster_key(name), report(name, in_bps=bps, partitions=4, published_ms=now).to_json())
    m.put(queue_key("orders"), QueuePlacement("orders", ("east",) * 2, 1).to_json())
    m.put(queue_key("split"), QueuePlacement("split", ("east", "west"), 1).to_json())
    monkeypatch.setattr(etcd_module, "EtcdClient", lambda urls: m)
    return m


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_queue_move_dry_run_ask_and_cancel(etcd: MemoryEtcd) -> None:
    code, out = _run("queue", "move", "orders", "--to", "west", *ETCD, "--dry-run")
    assert code == 0 and "would move orders: 2 partition(s) east -> west" in out
    code, out = _run("queue", "move", "split", "--to", "west", *ETCD, "--dry-run")
    assert code == 1 and "would refuse" in out and "split" in out
    assert read_move(etcd, "orders") is None
    code, out = _run("queue", "move", "orders", "--to", "west", *ETCD, "--json")
    assert code == 0 and json.loads(out)["phase"] == "requested"
    code, out = _run("queue", "move", "orders", "--to", "west", *ETCD)
    assert code == 1 and "QUEUE_EXISTS" in out and "being moved already" in out
    code, out = _run("queue", "move", "orders", *ETCD, "--cancel")
    assert code == 0 and "cancel asked" in out and read_move(etcd, "orders").cancel  # type: ignore[union-attr]
    etcd.put(
        move_key("orders"), Move("orders", "east", "west", phase="cancelled", error="cancelled on request").to_json()
    )
    code, out = _run("queue", "move", "orders", *ETCD, "--cancel")
    assert code == 1 and "too late" in out
    code, out = _run("queue", "move", "orders", "--to", "west", *ETCD, "--wait", "--wait-timeout", "0")
    assert code == 1 and "requested" in out and "TIMEOUT" in out  # no manager took it


def test_rebalance_and_drain(etcd: MemoryEtcd) -> None:
    code, out = _run("federation", "rebalance", *ETCD, "--dry-run")
    assert code == 0 and "would move orders: east -> west" in out
    assert read_move(etcd, "orders") is None
    code, out = _run("federation", "drain", "east", *ETCD, "--dry-run", "--json")
    moves = {m["queue"]: m for m in json.loads(out)["moves"]}
    assert code == 0 and moves["orders"]["destination"] == "west" and moves["split"]["destination"] is None
    assert etcd.get(drain_key("east")) is None  # a dry run changes nothing
    code, out = _run("federation", "drain", "east", *ETCD)
    assert code == 0 and "moving orders: east -> west" in out and "split: stays on east" in out
    assert etcd.get(drain_key("east")) is not None and read_move(etcd, "orders").destination == "west"  # type: ignore[union-attr]
    code, out = _run("federation", "drain", "east", *ETCD, "--undo")
    assert code == 0 and etcd.get(drain_key("east")) is None
