"""Queue groups' lease tables through etcd (fabric/cluster/group_states.py), on MemoryEtcd."""

from __future__ import annotations

from fabric.cluster.group_states import GroupStates
from fabric.cluster.keys import group_state_key, queue_key
from fabric.cluster.memetcd import MemoryEtcd

STATE = {"kind": "queue", "leases": {"0": {"version": 1, "floor": 3, "cursor": 9, "settled": [[5, 9]], "counts": []}}}


def _with_queue(name: str = "q") -> MemoryEtcd:
    m = MemoryEtcd()
    m.put(queue_key(name), b"{}")
    return m


def test_the_coordinators_newest_checkpoint_reaches_the_other_nodes() -> None:
    m = _with_queue()
    coordinator, other = GroupStates(m, publish_ms=1000), GroupStates(m, publish_ms=1000)
    assert other.step(0) == []
    coordinator.note("q", "w", {**STATE, "leases": {}})
    coordinator.note("q", "w", STATE)  # only the newest is published
    coordinator.step(0)
    assert other.step(1) == [("q", "w", STATE)]
    coordinator.note("q", "w", {**STATE, "kind": "key_shared"})
    coordinator.step(500)  # not due yet
    assert other.step(600) == []
    coordinator.step(1000)
    assert other.step(1001) == [("q", "w", {**STATE, "kind": "key_shared"})]
    late = GroupStates(m)  # a node starting later reads everything first
    assert late.step(0) == [("q", "w", {**STATE, "kind": "key_shared"})]


def test_nothing_is_left_behind_for_a_deleted_queue_and_junk_is_skipped() -> None:
    m = MemoryEtcd()
    states = GroupStates(m)
    states.note("gone", "w", STATE)
    states.step(0)
    assert m.get(group_state_key("gone", "w")) is None  # no queue key: nothing written
    m.put(group_state_key("q", "bad"), b"not json")
    m.put(group_state_key("q", "w"), b'{"kind": "queue"}')  # no leases
    assert GroupStates(m).step(0) == []
