"""The store-removal planner (pure): which store a cluster could do without, and the moves that
empty it within headroom; the moves carried out step by step (as the controller does) leave the
chosen store with no replica and every partition with its replication factor."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.cluster.moves import step_move
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.placement import replicas_for
from fabric.cluster.removal import Disk, choose, plan_drain, plan_drains

GB = 1 << 30


def _record(replicas: tuple[str, ...]) -> PartitionRecord:
    return PartitionRecord(replicas, replicas[0], 1, replicas, 1)


def _cluster(stores: list[str], queues: dict[str, tuple[int, int]]) -> dict[tuple[str, int], PartitionRecord]:
    """Partitions placed by rendezvous hashing: ``queues`` name -> (partitions, rf)."""
    return {(q, p): _record(replicas_for(q, p, stores, rf)) for q, (n, rf) in sorted(queues.items()) for p in range(n)}


def _carry_out(parts: dict[tuple[str, int], PartitionRecord], moves, live: set[str]) -> None:
    """Each move to its end, as the controller does (every new replica joins the ISR at once)."""
    for m in moves:
        key = (m.queue, m.partition)
        done = False
        while not done:
            rec, done = step_move(m, parts[key], live)
            if rec is not None:
                if not done:  # caught up: the new replicas are in the ISR
                    rec = PartitionRecord(rec.replicas, rec.leader, rec.leader_epoch, rec.replicas, rec.partition_epoch)
                parts[key] = rec


def test_an_idle_four_store_cluster_empties_the_store_that_frees_the_most() -> None:
    stores = ["s1", "s2", "s3", "s4"]
    parts = _cluster(stores, {"orders": (8, 3), "clicks": (6, 2)})
    drains = plan_drains(parts, stores)
    assert all(d.removable for d in drains)
    best = choose(drains)
    assert best is not None
    assert best.replicas == max(d.replicas for d in drains)  # idle: no sizes, the most replicas
    _carry_out(parts, best.moves, set(stores))
    assert not any(best.store in r.replicas for r in parts.values())  # it holds nothing: removable
    for (q, _), rec in parts.items():
        assert len(rec.replicas) == (3 if q == "orders" else 2) and len(set(rec.replicas)) == len(rec.replicas)


def test_bytes_decide_before_replica_counts() -> None:
    stores = ["a", "b", "c"]
    parts = {("q", 0): _record(("a", "b")), ("q", 1): _record(("a", "c")), ("q", 2): _record(("b", "c"))}
    sizes = {("q", 0): 10, ("q", 1): 10, ("q", 2): 1000}
    best = choose(plan_drains(parts, stores, sizes=sizes))
    assert best is not None and best.store == "b" and best.bytes == 1010  # b and c hold 1010; b by name


def test_a_partition_with_as_many_replicas_as_other_stores_cannot_leave() -> None:
    stores = ["a", "b", "c"]
    parts = {("q", 0): _record(("a", "b", "c"))}
    drains = plan_drains(parts, stores)
    assert not any(d.removable for d in drains)
    assert "q/0 has 3 replicas and there are 2 other live stores" in (drains[0].problem or "")
    assert choose(drains) is None


def test_disk_headroom_and_replica_caps_are_kept() -> None:
    stores = ["a", "b", "c"]
    parts = {("q", 0): _record(("a",)), ("q", 1): _record(("b",)), ("q", 2): _record(("c",))}
    sizes = {("q", 0): 5 * GB, ("q", 1): 1, ("q", 2): 1}
    disks = {n: Disk(used_bytes=4 * GB, free_bytes=6 * GB) for n in stores}
    d = plan_drain("a", parts, stores, disks=disks, sizes=sizes)
    assert not d.removable and "keeps 20% of its disk free" in (d.problem or "")  # 6 - 5 < 2 GB
    assert plan_drain("a", parts, stores, disks=disks, sizes=sizes, headroom=0.05).removable
    assert plan_drain("b", parts, stores, disks=disks, sizes=sizes).removable
    assert not plan_drain("b", parts, stores, replicas_max=1).removable  # a and c hold one each
    assert plan_drain("b", parts, stores, replicas_max=2).removable


def test_a_move_under_way_or_a_lone_store_is_named() -> None:
    parts = {("q", 0): _record(("a",))}
    assert plan_drain("a", parts, ["a", "b"], busy={("q", 0)}).problem == "a move of q/0 is under way"
    assert plan_drain("a", parts, ["a"]).problem == "the only live store"
    assert plan_drain("x", parts, ["a"]).problem == "not live"
    assert choose(plan_drains({}, ["a", "b"])) is None  # nothing to free


def test_load_reports_give_the_disk() -> None:
    assert Disk.from_load(b'{"disk_used_bytes": 3, "disk_free_bytes": 7, "in_bytes_per_s": 0}') == Disk(3, 7)
    assert Disk.from_load(b"{}") is None and Disk.from_load(b"nope") is None


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=2, max_value=6),
    st.lists(st.tuples(st.integers(1, 6), st.integers(1, 3)), min_size=1, max_size=4),
    st.data(),
)
def test_any_removable_store_ends_empty_with_every_replication_factor_kept(nstores, queues, data) -> None:
    stores = [f"s{i}" for i in range(nstores)]
    spec = {f"q{i}": (n, min(rf, nstores)) for i, (n, rf) in enumerate(queues)}
    parts = _cluster(stores, spec)
    sizes = {k: data.draw(st.integers(0, 1000)) for k in parts}
    before = {k: len(r.replicas) for k, r in parts.items()}
    for d in plan_drains(parts, stores, sizes=sizes):
        if not d.removable:
            assert d.moves == ()
            continue
        work = dict(parts)
        _carry_out(work, d.moves, set(stores))
        assert not any(d.store in r.replicas for r in work.values())
        assert {k: len(set(r.replicas)) for k, r in work.items()} == before
        assert d.bytes == sum(s for k, s in sizes.items() if d.store in parts[k].replicas)
    # a store is removable exactly when each of its partitions has room elsewhere
    for d in plan_drains(parts, stores):
        assert d.removable == all(len(r.replicas) < nstores for r in parts.values() if d.store in r.replicas)
