"""elect/plan rules and the Controller against MemoryEtcd: election, fencing, failover."""

from __future__ import annotations

import json

import pytest

from fabric.cluster.agent import NodeAgent
from fabric.cluster.controller import Controller, elect, plan
from fabric.cluster.keys import CONTROLLER_KEY, node_key, partition_key, queue_key
from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.partition import PartitionRecord
from fabric.errors import BadParameter, NotEnoughReplicas, NotLeader, QueueExists, UnknownQueue

R = PartitionRecord


def test_elect_first_live_isr_member_in_replica_order() -> None:
    rec = R(("a", "b", "c"), "a", 3, ("c", "b", "a"), 7)
    assert elect(rec, {"a", "b"}) is None  # leader live: nothing to do
    assert elect(rec, {"b", "c"}) == R(("a", "b", "c"), "b", 4, ("c", "b"), 8)
    assert elect(rec, {"c"}) == R(("a", "b", "c"), "c", 4, ("c",), 8)


def test_elect_offline_keeps_isr_and_unclean_takes_any_live_replica() -> None:
    rec = R(("a", "b", "c"), "a", 3, ("a", "b"), 7)
    offline = elect(rec, {"c"})
    assert offline == R(("a", "b", "c"), None, 4, ("a", "b"), 8)
    assert elect(offline, {"c"}) is None  # stays offline: no change, no bump
    assert elect(offline, {"b", "c"}) == R(("a", "b", "c"), "b", 5, ("b",), 9)  # a member is back
    assert elect(rec, {"c"}, unclean=True) == R(("a", "b", "c"), "c", 4, ("c",), 8)
    assert elect(rec, {"x"}) == offline  # non-replicas never lead


def test_plan_removes_dead_and_restarted_members_from_isr() -> None:
    rec = R(("a", "b", "c"), "a", 1, ("a", "b", "c"), 1)
    assert plan(rec, 10, {"a": 2, "b": 3, "c": 4}) is None
    assert plan(rec, 10, {"a": 2, "b": 3}) == R(("a", "b", "c"), "a", 1, ("a", "b"), 2)
    assert plan(rec, 10, {"a": 2, "b": 3, "c": 11}) == R(("a", "b", "c"), "a", 1, ("a", "b"), 2)  # c restarted


def test_plan_reelects_a_restarted_leader() -> None:
    rec = R(("a", "b"), "a", 1, ("a", "b"), 1)
    assert plan(rec, 10, {"a": 12, "b": 3}) == R(("a", "b"), "b", 2, ("b",), 2)
    # the only ISR member restarted: it is still the best copy, elected again with a new epoch
    solo = R(("a", "b"), "a", 1, ("a",), 1)
    assert plan(solo, 10, {"a": 12, "b": 3}) == R(("a", "b"), "a", 2, ("a",), 2)
    # an offline partition comes back when an ISR member registers again
    off = R(("a", "b"), None, 2, ("a",), 2)
    assert plan(off, 10, {"b": 3}) is None
    assert plan(off, 10, {"a": 12, "b": 3}) == R(("a", "b"), "a", 3, ("a",), 3)
    assert plan(off, 10, {"b": 3}, unclean=True) == R(("a", "b"), "b", 3, ("b",), 3)


def _cluster(m: MemoryEtcd, names: list[str], now: int = 0) -> list[NodeAgent]:
    agents = [NodeAgent(m, n, f"tcp://127.0.0.1:{7000 + i}", lease_ttl_s=2) for i, n in enumerate(names)]
    for a in agents:
        a.step(now)
        assert a.registered
    return agents


def _record(m: MemoryEtcd, q: str, p: int) -> PartitionRecord:
    kv = m.get(partition_key(q, p))
    assert kv is not None
    return PartitionRecord.from_json(kv.value)


def test_one_controller_wins_and_epoch_is_create_revision() -> None:
    m = MemoryEtcd()
    c1, c2 = Controller(m, "c1", "e1", lease_ttl_s=2), Controller(m, "c2", "e2", lease_ttl_s=2)
    c1.step(0)
    c2.step(0)
    kv = m.get(CONTROLLER_KEY)
    assert c1.is_controller and not c2.is_controller
    assert kv is not None and c1.epoch == kv.create_revision and json.loads(kv.value)["name"] == "c1"
    with pytest.raises(NotLeader):
        c2.create_queue("q", {}, 1, 1)


def test_create_queue_writes_everything_in_one_txn() -> None:
    m = MemoryEtcd()
    _cluster(m, ["a", "b", "c"])
    c = Controller(m, "c", "e", lease_ttl_s=2)
    c.step(0)
    rev = m.revision
    records = c.create_queue("q", {"fsync": "always"}, 4, 3)
    assert m.revision == rev + 1
    for p, rec in enumerate(records):
        assert (
            rec.leader == rec.replicas[0] and rec.isr == rec.replicas and rec.leader_epoch == rec.partition_epoch == 0
        )
        assert _record(m, "q", p) == rec
    value = json.loads(m.get(queue_key("q")).value)  # type: ignore[union-attr]
    assert value == {"settings": {"fsync": "always"}, "partitions": 4, "replication_factor": 3}
    with pytest.raises(QueueExists):
        c.create_queue("q", {}, 1, 1)
    with pytest.raises(NotEnoughReplicas):
        c.create_queue("r", "{}", 1, 4)
    c.delete_queue("q")
    assert m.get_prefix("/fabric/partitions/")[0] == [] and m.get(queue_key("q")) is None
    with pytest.raises(UnknownQueue):
        c.delete_queue("q")


def test_failover_on_leader_death_and_isr_cleanup() -> None:
    m = MemoryEtcd()
    agents = _cluster(m, ["a", "b", "c"])
    c = Controller(m, "c", "e", lease_ttl_s=5)
    c.step(0)
    rec = c.create_queue("q", {}, 1, 3)[0]
    dead = rec.leader
    for a in agents:
        if a.name != dead:
            a.step(1000)
    m.advance(2000)  # only the dead leader's lease lapses
    for a in agents:
        if a.name != dead:
            a.step(2000)
    written = c.step(2000)
    new = _record(m, "q", 0)
    assert written == [("q", 0, new)]
    assert new.leader not in (None, dead) and new.leader in new.isr and dead not in new.isr
    assert new.leader == next(r for r in rec.replicas if r != dead)
    assert (new.leader_epoch, new.partition_epoch) == (1, 1)
    assert c.step(2100) == []  # nothing left to do


def test_controller_write_never_clobbers_a_concurrent_isr_change() -> None:
    m = MemoryEtcd()
    agents = {a.name: a for a in _cluster(m, ["a", "b", "c"])}
    c = Controller(m, "c", "e", lease_ttl_s=5)
    c.step(0)
    rec = c.create_queue("q", {}, 1, 3)[0]
    follower = rec.replicas[2]
    m.delete(node_key(follower))  # the follower died: the controller will want it out of the ISR
    leader = agents[rec.leader]  # type: ignore[index]
    kv = m.get(partition_key("q", 0))
    assert kv is not None
    mine = PartitionRecord(rec.replicas, rec.leader, 0, rec.isr[:2], 1)

    real_txn = m.txn

    def leader_first(compare, success, failure=()):  # the leader's CAS lands between read and write
        m.txn = real_txn  # type: ignore[method-assign]
        assert leader.cas_partition("q", 0, rec, mine)
        return real_txn(compare, success, failure)

    m.txn = leader_first  # type: ignore[method-assign]
    assert c.step(100) == []  # fenced by mod_revision; still controller
    assert c.is_controller and _record(m, "q", 0) == mine


def test_deposed_controller_cannot_write_and_steps_down() -> None:
    m = MemoryEtcd()
    _cluster(m, ["a", "b"])
    c1, c2 = Controller(m, "c1", "e", lease_ttl_s=2), Controller(m, "c2", "e", lease_ttl_s=2)
    c1.step(0)
    m.advance(2000)  # c1 paused past its lease; the nodes' leases lapse too
    _cluster(m, ["a", "b"], 2000)
    c2.step(2000)
    assert c2.is_controller and c1.is_controller  # c1 does not know yet
    with pytest.raises(NotLeader):
        c1.create_queue("q", {}, 1, 1)
    assert not c1.is_controller and m.get(queue_key("q")) is None
    c2.create_queue("q", {}, 1, 2)


def test_standby_takes_over_when_the_key_vanishes() -> None:
    m = MemoryEtcd()
    c1, c2 = Controller(m, "c1", "e", lease_ttl_s=2), Controller(m, "c2", "e", lease_ttl_s=2)
    c1.step(0)
    c2.step(0)
    for t in range(100, 5000, 100):  # c1 keeps its lease alive: c2 stays standby
        m.advance(t)
        c1.step(t)
        c2.step(t)
        assert c1.is_controller and not c2.is_controller
    m.advance(7000)  # c1 crashed at 4900
    c2.step(7000)
    assert c2.is_controller and c2.epoch > c1.epoch
    c1.step(7000)
    assert not c1.is_controller  # keepalive answered 0
    c1.step(7500)
    assert not c1.is_controller  # and it stays standby while c2 holds the key


def test_outage_then_recovery_keeps_controller() -> None:
    m = MemoryEtcd()
    c = Controller(m, "c", "e", lease_ttl_s=2)
    c.step(0)
    m.set_available(False)
    for t in range(0, 10_000, 500):
        m.advance(t)
        assert c.step(t) == []
    m.set_available(True)
    c.step(10_000)
    assert c.is_controller and m.get(CONTROLLER_KEY).create_revision == c.epoch  # type: ignore[union-attr]


@pytest.mark.parametrize("unclean", [False, True])
def test_unclean_election_only_where_the_queue_allows_it(unclean: bool) -> None:
    m = MemoryEtcd()
    agents = {a.name: a for a in _cluster(m, ["a", "b"])}
    c = Controller(m, "c", "e", lease_ttl_s=5)
    c.step(0)
    settings = {"unclean_leader_election": True} if unclean else {}
    rec = c.create_queue("q", settings, 1, 2)[0]
    leader = rec.leader
    assert leader is not None
    assert agents[leader].cas_partition("q", 0, rec, PartitionRecord(rec.replicas, leader, 0, (leader,), 1))
    m.delete(node_key(leader))  # the only ISR member dies
    m.delete(CONTROLLER_KEY)
    c2 = Controller(m, "c2", "e", lease_ttl_s=5)  # a new controller reads the setting from etcd
    c2.step(10)
    assert c2.is_controller
    after = _record(m, "q", 0)
    if unclean:
        assert after.leader not in (None, leader) and after.isr == (after.leader,)
    else:
        assert after.leader is None and after.isr == (leader,)


def test_alter_queue_adds_placed_partitions_and_leaves_the_old_ones() -> None:
    m = MemoryEtcd()
    _cluster(m, ["a", "b", "c", "d"])
    c = Controller(m, "c", "e", lease_ttl_s=2)
    c.step(0)
    before = c.create_queue("q", {"partitions": 2}, 2, 2)
    rev = m.revision
    added = c.alter_queue("q", 5)
    assert m.revision == rev + 1  # the queue key and the three new records in one txn
    assert len(added) == 3 and [_record(m, "q", p) for p in range(2)] == before
    assert [_record(m, "q", p) for p in range(2, 5)] == added
    assert all(len(set(r.replicas)) == 2 and r.leader == r.replicas[0] for r in added)
    value = json.loads(m.get(queue_key("q")).value)  # type: ignore[union-attr]
    assert value["partitions"] == 5 and value["settings"]["partitions"] == 5
    assert c.alter_queue("q", 5) == []  # the same count: nothing to do
    with pytest.raises(BadParameter, match="only grow"):
        c.alter_queue("q", 3)
    with pytest.raises(UnknownQueue):
        c.alter_queue("nope", 3)
    c.create_queue("prio", {"priority_levels": 3}, 1, 2)
    with pytest.raises(BadParameter, match="priority"):
        c.alter_queue("prio", 2)
    with pytest.raises(NotLeader):
        Controller(m, "x", "ex", lease_ttl_s=2).alter_queue("q", 6)
