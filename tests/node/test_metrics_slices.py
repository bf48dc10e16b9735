"""A metrics scrape copies the node's figures in turns of the loop of SCRAPE_SLICE queues each, so
thousands of queues never stall the loop for a whole scrape; the slices add up to one snapshot.
A real Broker and Store in memory, with replication roles."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fabric.node import metrics
from fabric.settings import QueueSettings
from tests.node.test_replication_timers import Node, _record

QUEUES = 25
SLICE = 10


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    monkeypatch.setattr(metrics, "SCRAPE_SLICE", SLICE)
    n = Node(tmp_path, "b")
    for i in range(QUEUES):
        n.broker.create_queue(f"q{i:02d}", QueueSettings())
        n.repl.apply(f"q{i:02d}", 0, _record("a"), 0)
    n.broker.store.meta.commit("q03", "billing", {0: 0})
    yield n
    n.store.close()


def _turns(log: list[Any], between: Callable[[], None] = lambda: None) -> Callable[..., Any]:
    def on_loop(fn: Callable[[], Any], timeout_s: float) -> Any:
        out = fn()
        log.append(out)
        between()
        return out

    return on_loop


def test_slices_add_up_to_one_snapshot(node: Node) -> None:
    turns: list[Any] = []
    sliced = metrics.sliced_snapshot(node.broker, _turns(turns))
    whole = metrics.snapshot(node.broker)
    assert sliced is not None
    assert len(turns) == 1 + 3  # the node-wide figures, then 10 + 10 + 5 queues
    assert [len(t[0]) for t in turns[1:]] == [10, 10, 5]
    assert sliced["queues"] == whole["queues"] and len(sliced["queues"]) == QUEUES
    assert sorted(r["queue"] for r in sliced["replicas"]) == sorted(r["queue"] for r in whole["replicas"])
    assert len(sliced["replicas"]) == QUEUES
    assert "billing" in sliced["queues"]["q03"]["groups"]
    assert "names" not in sliced and "group_names" not in sliced


def test_a_queue_deleted_between_turns_is_left_out(node: Node) -> None:
    turns: list[Any] = []

    def delete_one() -> None:
        if len(turns) == 1:
            node.broker.store.delete_queue("q15")

    sliced = metrics.sliced_snapshot(node.broker, _turns(turns, delete_one))
    assert sliced is not None and "q15" not in sliced["queues"] and len(sliced["queues"]) == QUEUES - 1


def test_a_turn_that_does_not_come_fails_the_scrape(node: Node) -> None:
    calls = []

    def on_loop(fn: Callable[[], Any], timeout_s: float) -> Any:
        calls.append(fn)
        return fn() if len(calls) < 3 else None

    assert metrics.sliced_snapshot(node.broker, on_loop) is None
