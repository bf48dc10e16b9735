"""NodeAgent: registration under a lease, fencing, the watched map, role changes, CAS."""

from __future__ import annotations

from fabric.cluster.agent import NodeAgent, RoleChange
from fabric.cluster.controller import Controller
from fabric.cluster.keys import node_key, partition_key
from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.partition import PartitionRecord


def _agent(m: MemoryEtcd, name: str, zone: str | None = None) -> NodeAgent:
    return NodeAgent(m, name, f"tcp://127.0.0.1:{7000 + ord(name[0])}", lease_ttl_s=3, zone=zone)


def test_registers_with_node_epoch_and_keeps_the_lease() -> None:
    m = MemoryEtcd()
    a = _agent(m, "a", zone="z1")
    assert a.step(0) == [] and a.registered and not a.fenced
    kv = m.get(node_key("a"))
    assert kv is not None and a.epoch == kv.create_revision
    for t in range(500, 20_000, 500):
        m.advance(t)
        a.step(t)
    assert a.registered and m.get(node_key("a")) is not None
    assert a.nodes["a"].zone == "z1" and a.nodes["a"].epoch == a.epoch


def test_restarted_node_waits_for_its_old_registration_to_lapse() -> None:
    m = MemoryEtcd()
    old = _agent(m, "a")
    old.step(0)
    new = _agent(m, "a")  # the process restarted at once; the old lease still runs
    new.step(100)
    assert not new.registered
    m.advance(3000)
    new.step(3000)
    assert new.registered and new.epoch > old.epoch


def test_lease_loss_fences_then_registers_again_with_a_new_epoch() -> None:
    m = MemoryEtcd()
    a = _agent(m, "a")
    a.step(0)
    first = a.epoch
    m.advance(5000)  # paused for longer than the lease
    a.step(5000)
    assert a.fenced or a.registered
    assert a.epoch != first
    # the step that saw the loss also re-registered (register is due): not fenced any more
    assert a.registered and not a.fenced


def test_fenced_while_registration_impossible() -> None:
    m = MemoryEtcd()
    a = _agent(m, "a")
    a.step(0)
    m.advance(5000)
    m.put(node_key("a"), b"{}", m.lease_grant(60))  # someone holds the name
    a.step(5000)
    assert a.fenced and not a.registered and a.epoch == 0


def test_role_changes_follow_the_map() -> None:
    m = MemoryEtcd()
    agents = {n: _agent(m, n) for n in "abc"}
    for a in agents.values():
        a.step(0)
    c = Controller(m, "c", "e", lease_ttl_s=3)
    c.step(0)
    rec = c.create_queue("q", {}, 2, 2)
    seen = {n: a.step(10) for n, a in agents.items()}
    for p, r in enumerate(rec):
        for n in "abc":
            mine = [ch for ch in seen[n] if ch.partition == p]
            if n in r.replicas:
                assert mine == [RoleChange("q", p, r, n == r.leader, mine[0].mod_revision)]
            else:
                assert mine == []
    assert all(a.step(20) == [] for a in agents.values())  # nothing new: nothing reported
    leader = agents[rec[0].leader]  # type: ignore[index]
    shrunk = PartitionRecord(rec[0].replicas, rec[0].leader, 0, (rec[0].leader,), 1)  # type: ignore[arg-type]
    assert leader.cas_partition("q", 0, rec[0], shrunk)
    assert not leader.cas_partition("q", 0, rec[0], shrunk)  # old value is gone
    assert [ch.record for ch in leader.step(30)] == [shrunk]
    c.delete_queue("q")
    assert sorted((ch.partition, ch.record) for ch in leader.step(40)) == [
        (p, None) for p, r in enumerate(rec) if leader.name in r.replicas
    ]


def test_fencing_demotes_and_stale_grants_are_not_taken_up() -> None:
    m = MemoryEtcd()
    a = _agent(m, "a")
    a.step(0)
    m.put(partition_key("q", 0), PartitionRecord(("a",), "a", 0, ("a",), 0).to_json())
    (ch,) = a.step(10)
    assert ch.is_leader
    m.advance(4000)
    m.put(node_key("a"), b'{"endpoint": "x"}', m.lease_grant(1))  # blocks re-registration for 1 s
    (ch,) = a.step(4000)
    assert a.fenced and not ch.is_leader and ch.record is not None and ch.record.leader == "a"
    m.advance(5000)
    assert a.step(5000) == []  # registered again, but the grant predates this epoch
    assert a.registered and not a.fenced
    c = Controller(m, "c", "e", lease_ttl_s=3)
    c.step(5000)  # sees "a" restarted: elects it again with a new leader epoch
    (ch,) = a.step(5010)
    assert ch.is_leader and ch.record is not None and ch.record.leader_epoch == 1


def test_watch_loss_rereads_the_map() -> None:
    m = MemoryEtcd(history_max=4)
    a = _agent(m, "a")
    a.step(0)
    m.put(partition_key("q", 0), PartitionRecord(("a",), "a", 0, ("a",), 0).to_json())
    assert len(a.step(1)) == 1
    for i in range(20):  # history runs past the agent's watch
        m.put(f"/fabric/queues/x{i}", b"{}")
    final = PartitionRecord(("a",), "a", 0, ("a",), 1)
    m.put(partition_key("q", 0), final.to_json())
    m.put(partition_key("q", 1), final.to_json())
    changes = a.step(2) + a.step(3)
    assert sorted((ch.partition, ch.record) for ch in changes) == [(0, final), (1, final)]
    m.set_available(False)
    assert a.step(4) == [] and a.partitions[("q", 0)] == final  # keeps the last map
    m.set_available(True)
    m.delete(partition_key("q", 1))
    m.put(partition_key("q", 1), final.to_json())  # a new partition under the same key
    changes = a.step(5) + a.step(6)
    assert [(ch.partition, ch.record) for ch in changes] == [(1, None), (1, final)]


def test_close_gives_up_the_registration_and_cas_needs_one() -> None:
    m = MemoryEtcd()
    a = _agent(m, "a")
    assert a.lease_confirmed_ms is None
    a.step(100)
    assert a.lease_confirmed_ms == 100
    rec = PartitionRecord(("a",), "a", 0, ("a",), 0)
    m.put(partition_key("q", 0), rec.to_json())
    a.close()
    assert m.get(node_key("a")) is None and not a.registered
    assert not a.cas_partition("q", 0, rec, PartitionRecord(("a",), "a", 0, ("a",), 1))
