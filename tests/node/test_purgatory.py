"""The purgatory of requests that wait: by partition, by deadline, each out exactly once."""

from __future__ import annotations

from fabric.node.purgatory import Purgatory


def test_wake_takes_a_partitions_requests_in_the_order_they_came() -> None:
    p: Purgatory[tuple[str, int], str] = Purgatory()
    p.park(("q", 0), 500, "a")
    p.park(("q", 1), 100, "other")
    p.park(("q", 0), 200, "b")
    assert len(p) == 3 and p.waiting(("q", 0)) == 2
    assert p.wake(("q", 0)) == ["a", "b"]
    assert p.wake(("q", 0)) == [] and len(p) == 1


def test_expire_takes_what_is_due_earliest_first_and_skips_the_woken() -> None:
    p: Purgatory[str, str] = Purgatory()
    p.park("k", 300, "late")
    p.park("k", 100, "early")
    p.park("j", 200, "woken")
    assert p.next_deadline_ms() == 100
    assert p.wake("j") == ["woken"]
    assert p.expire(99) == []
    assert p.expire(250) == ["early"]  # "woken" was due too, but left already
    assert p.next_deadline_ms() == 300 and len(p) == 1
    assert p.expire(300) == ["late"]
    assert p.next_deadline_ms() is None and len(p) == 0


def test_drain_takes_everything_once() -> None:
    p: Purgatory[str, int] = Purgatory()
    for i in range(5):
        p.park(str(i % 2), 1000 + i, i)
    assert sorted(p.drain()) == [0, 1, 2, 3, 4]
    assert len(p) == 0 and p.expire(10_000) == [] and p.next_deadline_ms() is None


def test_a_partition_woken_often_does_not_grow_the_deadline_heap_without_bound() -> None:
    p: Purgatory[str, int] = Purgatory()
    for i in range(10_000):
        p.park("k", 60_000 + i, i)
        assert p.wake("k") == [i]
    assert len(p._deadlines) == 0  # emptied whenever nothing waits
