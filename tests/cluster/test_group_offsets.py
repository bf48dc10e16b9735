"""GroupOffsets: consumer groups' commits shared between nodes through (in-memory) etcd."""

from __future__ import annotations

import json

from fabric.cluster.group_offsets import GroupOffsets
from fabric.cluster.keys import group_key, queue_key
from fabric.cluster.memetcd import MemoryEtcd


def _with_queue(name: str = "q") -> MemoryEtcd:
    m = MemoryEtcd()
    m.put(queue_key(name), b"{}")
    return m


def test_a_commit_on_one_node_reaches_another() -> None:
    m = _with_queue()
    a, b = GroupOffsets(m, publish_ms=1000), GroupOffsets(m, publish_ms=1000)
    assert a.step(0) == [] and b.step(0) == []
    a.note("q", "g", {0: 5, 1: 7})
    a.note("q", "g", {0: 9})  # coalesced: one write with the newest
    assert a.step(500) == []  # not due yet
    a.step(1000)
    assert b.step(1000) == [("q", "g", {0: 9, 1: 7})]
    assert json.loads(m.get(group_key("q", "g")).value) == {"0": 9, "1": 7}  # type: ignore[union-attr]


def test_offsets_only_move_forward_whichever_node_publishes() -> None:
    m = _with_queue()
    a, b = GroupOffsets(m, publish_ms=0), GroupOffsets(m, publish_ms=0)
    a.note("q", "g", {0: 10})
    a.step(1)
    b.note("q", "g", {0: 4, 1: 3})  # behind on partition 0: keeps 10, adds partition 1
    b.step(1)
    assert json.loads(m.get(group_key("q", "g")).value) == {"0": 10, "1": 3}  # type: ignore[union-attr]


def test_a_node_starting_late_reads_every_group_first() -> None:
    m = _with_queue()
    a = GroupOffsets(m, publish_ms=0)
    a.note("q", "g1", {0: 1})
    a.note("q", "g2", {0: 2})
    a.step(1)
    late = GroupOffsets(m)
    assert sorted(late.step(0)) == [("q", "g1", {0: 1}), ("q", "g2", {0: 2})]


def test_offsets_of_a_deleted_queue_are_not_written_back() -> None:
    m = MemoryEtcd()  # no queue key: deleted (or never created)
    a = GroupOffsets(m, publish_ms=0)
    a.note("gone", "g", {0: 3})
    a.step(1)
    assert m.get(group_key("gone", "g")) is None
    a.step(2)  # and it is not retried for ever
    assert not a._pending


def test_an_outage_keeps_the_commit_for_the_next_publish() -> None:
    m = _with_queue()
    a = GroupOffsets(m, publish_ms=0)
    a.step(0)
    m.set_available(False)
    a.note("q", "g", {0: 3})
    assert a.step(1) == []
    m.set_available(True)
    a.note("q", "g", {1: 1})
    a.step(2)
    assert json.loads(m.get(group_key("q", "g")).value) == {"0": 3, "1": 1}  # type: ignore[union-attr]
