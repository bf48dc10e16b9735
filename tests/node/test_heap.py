"""The heap keeper freezes what queues created at run time hold once the set of queues is still,
thaws and collects once after deletions, and times every collection by generation."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from fabric.node.heap import SETTLE_MS, UNFROZEN_MAX_MS, Heap


@pytest.fixture
def heap() -> Iterator[Heap]:
    threshold = gc.get_threshold()
    h = Heap()
    h.start((0, 0))
    yield h
    h.stop()
    gc.unfreeze()  # give the test process its collector back
    gc.set_threshold(*threshold)


class Node:  # a cycle, as queue objects often hold (a log and its segments pointing back)
    def __init__(self) -> None:
        self.me = self


def test_start_freezes_and_times_collections(heap: Heap) -> None:
    assert gc.get_freeze_count() > 0
    assert heap._on_gc in gc.callbacks
    gc.collect(0)
    gc.collect(2)
    assert sum(heap.pauses[0].counts) >= 1 and sum(heap.pauses[2].counts) >= 1
    assert heap.pauses[2].sum > 0


def test_new_queues_are_frozen_once_the_set_is_still(heap: Heap) -> None:
    frozen = gc.get_freeze_count()
    kept = [Node() for _ in range(1000)]  # what 1,000 new queues hold
    assert not heap.tick(0, (1, 0))  # changed: wait for it to settle
    assert not heap.tick(SETTLE_MS - 1, (1, 0))
    assert heap.tick(SETTLE_MS, (1, 0))
    assert gc.get_freeze_count() >= frozen + len(kept)
    assert not heap.tick(SETTLE_MS + 10_000, (1, 0))  # nothing new
    assert heap.freezes == 1


def test_a_set_that_keeps_changing_is_frozen_at_least_once_a_minute(heap: Heap) -> None:
    t = 0
    froze = []
    while t <= UNFROZEN_MAX_MS + 1000:
        froze.append(heap.tick(t, (t // 1000 + 1, 0)))  # a queue every second
        t += 1000
    assert froze.count(True) == 1 and froze[-1] is False


def test_deletions_thaw_collect_and_freeze_again(heap: Heap) -> None:
    garbage = [Node() for _ in range(500)]
    heap.tick(0, (1, 0))
    heap.tick(SETTLE_MS, (1, 0))  # frozen with everything else
    del garbage  # cycles among frozen objects: no collection looks at them...
    gc.collect()
    heap.tick(SETTLE_MS + 1000, (1, 1))
    collected_before = gc.get_stats()[2]["collected"]
    assert heap.tick(2 * SETTLE_MS + 1000, (1, 1))  # ...until a deletion thaws and collects
    assert gc.get_stats()[2]["collected"] >= collected_before + 500
