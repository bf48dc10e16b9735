"""Which queues move: evening out the clusters' loads (rebalance) and emptying one (drain), pure;
then asking for them through the directory on the in-memory etcd."""

from __future__ import annotations

import random

import pytest

from fabric.cluster.memetcd import MemoryEtcd
from fabric.federation.directory import QueuePlacement, cluster_key, queue_key
from fabric.federation.manager import Manager
from fabric.federation.move_requests import ask_moves, plan_move, propose, read_move, set_draining
from fabric.federation.planner import NoRoom, load
from fabric.federation.rebalance import GAP, MAX_MOVES, drain, rebalance, weight
from tests.federation.reports import report

NOW = 1_000_000
GIB = 2**30


def _table(*queues: tuple[str, tuple[str, ...]]) -> dict[str, QueuePlacement]:
    return {q: QueuePlacement(q, parts, 1) for q, parts in queues}


def test_a_busy_cluster_gives_its_heaviest_fitting_queues_to_the_idle_one() -> None:
    reports = {
        "busy": report("busy", in_bps=200e6, out_bps=40e6, partitions=12),
        "idle": report("idle", partitions=0),
    }
    table = _table(("big", ("busy",) * 8), ("mid", ("busy",) * 3), ("one", ("busy",)))
    moves = rebalance(reports, table, NOW)
    assert [(m.queue, m.source, m.destination) for m in moves] == [("mid", "busy", "idle"), ("one", "busy", "idle")]
    # big alone would leave them further apart than mid: they would swap places
    even = rebalance({"a": report("a", partitions=4), "b": report("b", partitions=3)}, _table(("q", ("a",) * 4)), NOW)
    assert even == []


def test_split_moving_and_draining_are_left_out() -> None:
    reports = {"busy": report("busy", in_bps=250e6, partitions=10), "idle": report("idle"), "gone": report("gone")}
    table = _table(("split", ("busy", "idle")), ("moving", ("busy",) * 2), ("q", ("busy",) * 2))
    moves = rebalance(reports, table, NOW, moving={"moving"}, draining={"idle"})
    assert {m.queue for m in moves} <= {"q"} and all(m.destination == "gone" for m in moves)


def test_drain_sends_every_queue_somewhere_else_and_says_why_one_stays() -> None:
    reports = {"old": report("old", partitions=7), "a": report("a"), "b": report("b", in_bps=100e6)}
    table = _table(("q1", ("old",) * 3), ("q2", ("old",) * 2), ("split", ("old", "a")), ("other", ("b",)))
    out = {p.queue: p for p in drain("old", reports, table, NOW)}
    assert set(out) == {"q1", "q2", "split"}
    assert out["split"].destination is None and "split" in out["split"].why
    assert out["q1"].destination == "a"  # the least loaded
    lonely = drain("old", {"old": reports["old"]}, table, NOW)
    assert all(p.destination is None and "no other cluster" in p.why for p in lonely if p.queue != "split")


@pytest.mark.parametrize("seed", range(30))
def test_rebalance_never_widens_the_gap_it_closes(seed: int) -> None:
    """A property over random federations: each proposal goes from a cluster that may hold
    queues to one that may take them, weighs no more than the gap it closes, and the estimated
    loads afterwards are no further apart than before."""
    rng = random.Random(seed)
    names = [f"c{i}" for i in range(rng.randint(2, 5))]
    table: dict[str, QueuePlacement] = {}
    for i in range(rng.randint(1, 20)):
        table[f"q{i}"] = QueuePlacement(f"q{i}", (rng.choice(names),) * rng.randint(1, 16), 1)
    counts = {n: sum(len(p.partitions) for p in table.values() if p.clusters[0] == n) for n in names}
    reports = {
        n: report(n, in_bps=rng.choice([0, 50e6, 200e6]), used=rng.choice([5, 40]) * GIB, partitions=counts[n])
        for n in names
    }
    before = {n: load(r) for n, r in reports.items()}
    moves = rebalance(reports, table, NOW)
    assert len(moves) <= MAX_MOVES and len({m.queue for m in moves}) == len(moves)
    loads = dict(before)
    for m in moves:
        assert m.destination is not None and m.destination != m.source
        gap = loads[m.source] - loads[m.destination]
        assert gap > GAP and 0 < m.weight <= gap + 1e-3
        assert m.weight == pytest.approx(weight(table[m.queue], reports[m.source]), abs=1e-3)
        loads[m.source] -= m.weight
        loads[m.destination] += m.weight
    assert max(loads.values()) - min(loads.values()) <= max(before.values()) - min(before.values()) + 1e-9


def test_asking_for_the_proposals_and_draining_in_the_directory() -> None:
    etcd = MemoryEtcd(NOW)
    for n, bps in (("busy", 250e6), ("idle", 0.0)):
        etcd.put(cluster_key(n), report(n, in_bps=bps, partitions=4, published_ms=NOW).to_json())
    etcd.put(queue_key("q"), QueuePlacement("q", ("busy",) * 2, 1).to_json())
    etcd.put(queue_key("r"), QueuePlacement("r", ("busy",) * 2, 1).to_json())
    proposals = propose(etcd, NOW)
    assert proposals and proposals[0].destination == "idle"
    asked = ask_moves(etcd, proposals, NOW)
    assert all(why is None for _, why in asked)
    assert read_move(etcd, proposals[0].queue).destination == "idle"  # type: ignore[union-attr]
    assert ask_moves(etcd, proposals, NOW)[0][1] is not None  # asked twice: the move is under way

    set_draining(etcd, "idle", True)
    assert "being drained" in plan_move(etcd, "r", "idle", NOW)["problem"]
    m = Manager(etcd, "m", "tcp://m", lease_ttl_s=3)
    m.step(NOW)
    with pytest.raises(NoRoom):  # the only other cluster is draining
        m.create_queue("new", 2, NOW, clusters=2)
    assert m.create_queue("new", 1, NOW).clusters == ("busy",)
    d = {p.queue: p for p in propose(etcd, NOW, "busy")}
    assert d["new"].destination is None and "no other cluster" in d["new"].why  # idle is draining
    set_draining(etcd, "idle", False)
    assert propose(etcd, NOW, "busy")[0].destination == "idle"
