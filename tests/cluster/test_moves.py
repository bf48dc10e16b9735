"""Replica moves (fabric/cluster/moves.py, pure) and the controller carrying them out against
MemoryEtcd, a step per ISR change, resumable by the next controller, cancellable."""

from __future__ import annotations

import pytest

from fabric.cluster.agent import NodeAgent
from fabric.cluster.controller import Controller
from fabric.cluster.keys import move_key, partition_key
from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.moves import Move, drain_plan, phase, rebalance_plan, shrink, step_move
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.placement import place
from fabric.cluster.rebalance import cancel_all, read_map, submit

R = PartitionRecord
LIVE = {"a", "b", "c", "d"}


def test_a_move_grows_waits_for_the_isr_then_shrinks() -> None:
    rec = R(("a", "b", "c"), "a", 3, ("a", "b", "c"), 7)
    move = Move("q", 0, ("a", "b", "c"), ("a", "b", "d"))
    grown, done = step_move(move, rec, LIVE)
    assert not done and grown == R(("a", "b", "c", "d"), "a", 3, ("a", "b", "c"), 8)
    assert phase(move, grown) == "catching-up"
    assert step_move(move, grown, LIVE) == (None, False)  # d not in the ISR yet
    caught_up = grown.with_isr(("a", "b", "c", "d"))
    assert phase(move, caught_up) == "finishing"
    final, done = step_move(move, caught_up, LIVE)
    assert done and final is not None
    assert (final.replicas, final.leader, final.leader_epoch, final.isr) == (("a", "b", "d"), "a", 3, ("a", "b", "d"))
    assert final.partition_epoch > caught_up.partition_epoch


def test_a_move_off_the_leader_hands_leadership_over() -> None:
    rec = R(("a", "b", "c", "d"), "a", 3, ("a", "b", "c", "d"), 9)
    final = shrink(rec, ("d", "b", "c"), LIVE)
    assert final is not None and final.leader == "d" and final.leader_epoch == 4 and "a" not in final.isr
    # no member of the target in the ISR and live: the move waits, the leader stays
    assert shrink(R(("a", "b"), "a", 1, ("a",), 1), ("b",), LIVE) is None


def test_a_move_waits_for_a_node_that_is_not_live_and_can_be_cancelled() -> None:
    rec = R(("a", "b", "c"), "a", 3, ("a", "b", "c"), 7)
    move = Move("q", 0, ("a", "b", "c"), ("a", "b", "e"))
    assert step_move(move, rec, LIVE) == (None, False)
    grown = R(("a", "b", "c", "e"), "a", 3, ("a", "b", "c"), 8)
    back, done = step_move(Move("q", 0, ("a", "b", "c"), ("a", "b", "e"), cancel=True), grown, LIVE)
    assert done and back is not None and back.replicas == ("a", "b", "c") and back.isr == ("a", "b", "c")


def test_adding_a_fourth_node_moves_a_quarter_of_the_replicas() -> None:
    parts = {}
    for q in ("orders", "events", "audit"):
        for p, replicas in enumerate(place(q, 40, ["a", "b", "c"], 3)):
            parts[(q, p)] = R(replicas, replicas[0], 0, replicas, 0)
    moves = rebalance_plan(parts, ["a", "b", "c", "d"])
    moved = sum(len(m.adds) for m in moves)
    total = sum(len(r.replicas) for r in parts.values())
    assert 0.15 < moved / total <= 0.30, moved / total
    assert all(m.adds == ("d",) for m in moves)  # only onto the new node
    assert all(m.target[0] == parts[(m.queue, m.partition)].leader for m in moves if m.target[0] != "d")
    assert rebalance_plan(parts, ["a", "b", "c"]) == []  # placed where hashing puts them: nothing


def test_draining_a_node_moves_only_its_replicas() -> None:
    parts = {("q", p): R(r, r[0], 0, r, 0) for p, r in enumerate(place("q", 12, ["a", "b", "c", "d"], 2))}
    moves = drain_plan(parts, "b", ["a", "b", "c", "d"])
    on_b = [k for k, r in parts.items() if "b" in r.replicas]
    assert sorted((m.queue, m.partition) for m in moves) == sorted(on_b)
    assert all("b" not in m.target and len(m.target) == 2 and m.drops == ("b",) for m in moves)


def _agents(m: MemoryEtcd, names: list[str]) -> list[NodeAgent]:
    agents = [NodeAgent(m, n, f"tcp://127.0.0.1:{7000 + i}", lease_ttl_s=5) for i, n in enumerate(names)]
    for a in agents:
        a.step(0)
    return agents


def _record(m: MemoryEtcd, q: str, p: int) -> PartitionRecord:
    kv = m.get(partition_key(q, p))
    assert kv is not None
    return PartitionRecord.from_json(kv.value)


def test_the_controller_carries_a_move_out_and_a_new_controller_resumes_it() -> None:
    m = MemoryEtcd()
    agents = _agents(m, ["a", "b", "c"])
    c1 = Controller(m, "c1", "e1", lease_ttl_s=5)
    c1.step(0)
    c1.create_queue("q", {}, 1, 2)
    rec = _record(m, "q", 0)
    spare = next(n for n in "abc" if n not in rec.replicas)
    target = (rec.replicas[0], spare)
    written, skipped = submit(m, [Move("q", 0, rec.replicas, target)], 1)
    assert len(written) == 1 and not skipped
    assert submit(m, [Move("q", 0, rec.replicas, target)], 2)[1]  # one move per partition at a time
    c1.step(100)
    grown = _record(m, "q", 0)
    assert grown.replicas == (*rec.replicas, spare) and spare not in grown.isr
    # the controller dies; another takes over and finds the move where it stood
    m.lease_revoke(c1._lease)
    c2 = Controller(m, "c2", "e2", lease_ttl_s=5)
    c2.step(200)
    c2.step(300)
    assert _record(m, "q", 0) == grown and read_map(m).moves
    # the leader admits the caught-up replica to the ISR (its CAS, as for any follower)
    agents[0].cas_partition("q", 0, grown, grown.with_isr((*grown.isr, spare)))
    c2.step(400)
    final = _record(m, "q", 0)
    assert set(final.replicas) == set(target) and set(final.isr) == set(target)
    assert not read_map(m).moves and m.get(move_key("q", 0)) is None


def test_cancel_puts_the_replicas_back() -> None:
    m = MemoryEtcd()
    _agents(m, ["a", "b", "c"])
    c = Controller(m, "c", "e", lease_ttl_s=5)
    c.step(0)
    c.create_queue("q", {}, 1, 2)
    rec = _record(m, "q", 0)
    spare = next(n for n in "abc" if n not in rec.replicas)
    submit(m, [Move("q", 0, rec.replicas, (rec.replicas[0], spare))], 1)
    c.step(100)
    assert spare in _record(m, "q", 0).replicas
    assert len(cancel_all(m)) == 1
    c.step(200)
    back = _record(m, "q", 0)
    assert back.replicas == rec.replicas and back.leader == rec.leader and not read_map(m).moves


@pytest.mark.parametrize("bad", [b"not json", b'{"target": [], "original": ["a"]}'])
def test_an_unreadable_move_is_dropped(bad: bytes) -> None:
    m = MemoryEtcd()
    _agents(m, ["a", "b"])
    c = Controller(m, "c", "e", lease_ttl_s=5)
    c.step(0)
    c.create_queue("q", {}, 1, 2)
    before = _record(m, "q", 0)
    m.put(move_key("q", 0), bad)
    c.step(100)
    assert m.get(move_key("q", 0)) is None and _record(m, "q", 0) == before
