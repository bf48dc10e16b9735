"""The federation planner: the healthy cluster with the most room, splits, and what is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.errors import BadParameter
from fabric.federation.directory import QueuePlacement
from fabric.federation.planner import Limits, NoRoom, load, partitions_placed, place, problems, utilisation
from tests.federation.reports import report

NOW = 1_000_000
GIB = 2**30


def test_a_new_queue_goes_to_the_cluster_with_the_most_room() -> None:
    reports = {"a": report("a", in_bps=150e6), "b": report("b", in_bps=30e6), "c": report("c", used=60 * GIB)}
    assert place("q", 3, reports, [], NOW).partitions == ("b", "b", "b")


def test_round_robin_is_not_the_rule_utilisation_is() -> None:
    """Two idle clusters, one with more partitions already: the emptier one gets queues until even."""
    reports = {"a": report("a", partitions=5), "b": report("b", partitions=0)}
    table: list[QueuePlacement] = []
    for i in range(9):
        table.append(place(f"q{i}", 1, reports, table, NOW + i))
    assert [p.partitions[0] for p in table] == ["b"] * 5 + ["a", "b", "a", "b"]
    # the same with equal clusters and traffic: whichever carries less takes the next queue
    reports = {"a": report("a", in_bps=2e6), "b": report("b", in_bps=1e6)}
    assert place("q", 1, reports, [], NOW).clusters == ("b",)


def test_a_split_queue_spreads_its_partitions_over_the_roomiest_clusters() -> None:
    reports = {c: report(c, in_bps=10e6 * i) for i, c in enumerate("abcd")}
    p = place("q", 12, reports, [], NOW, clusters=3)
    assert p.clusters == ("a", "b", "c")
    assert p.partitions == ("a", "b", "c") * 4
    assert place("r", 2, reports, [], NOW, clusters=3).clusters == ("a", "b")  # no more clusters than partitions


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (report("a", published_ms=NOW - 20_000), "report 20000 ms old"),
        (report("a", controller=None), "no controller"),
        (report("a", stores=1), "1 live stores, fewer than 2"),
        (report("a", offline=2), "2 partitions offline"),
        (report("a", under=1), "1 partitions under-replicated"),
        (report("a", used=95 * GIB, free=5 * GIB), "full (95% used)"),
        (report("a", in_bps=300e6), "full (100% used)"),
        (report("a", partitions=5500), "full (92% used)"),
    ],
)
def test_an_unhealthy_or_full_cluster_gets_no_queue(bad, why: str) -> None:
    reports = {"a": bad, "z": report("z", in_bps=250e6)}  # z is busy but healthy: it gets the queue
    assert problems(bad, NOW, rf=2) == [why]
    assert place("q", 4, reports, [], NOW, rf=2).clusters == ("z",)
    with pytest.raises(NoRoom, match=f"a: {why.replace('(', '.').replace(')', '.')}"):
        place("q", 4, {"a": bad}, [], NOW, rf=2)


def test_a_split_needs_that_many_clusters_with_room() -> None:
    reports = {"a": report("a"), "b": report("b", controller=None)}
    with pytest.raises(NoRoom, match="needs 2 healthy clusters with room, 1 have: b: no controller"):
        place("q", 4, reports, [], NOW, clusters=2)
    with pytest.raises(NoRoom, match="no cluster has reported"):
        place("q", 1, {}, [], NOW)
    with pytest.raises(BadParameter):
        place("q", 0, reports, [], NOW)


def test_the_queue_table_counts_before_the_next_report() -> None:
    r = report("a", partitions=10, stores=1, used=0)
    assert utilisation(r, 990, Limits(store_partitions=2000)) == 0.5
    assert utilisation(r, 0, Limits(store_partitions=2000)) == 10 / 2000
    before, after = QueuePlacement("old", ("a",) * 7, NOW - 1), QueuePlacement("new", ("a", "b"), NOW)
    assert partitions_placed([before, after], {"a": r}) == {"a": 1}  # the report counts the old queue


@given(
    loads=st.lists(st.tuples(st.floats(0, 400e6), st.integers(0, 99), st.booleans()), min_size=1, max_size=6),
    partitions=st.integers(1, 24),
    clusters=st.integers(1, 6),
)
def test_the_chosen_clusters_are_eligible_and_none_left_out_has_more_room(
    loads: list[tuple[float, int, bool]], partitions: int, clusters: int
) -> None:
    reports = {
        f"c{i}": report(f"c{i}", in_bps=bps, used=used * GIB, free=(100 - used) * GIB, controller="n" if ok else None)
        for i, (bps, used, ok) in enumerate(loads)
    }
    eligible = {n for n, r in reports.items() if not problems(r, NOW)}
    try:
        p = place("q", partitions, reports, [], NOW, clusters=clusters)
    except NoRoom:
        assert len(eligible) < min(partitions, clusters)
        return
    assert len(p.partitions) == partitions and len(p.clusters) == min(partitions, clusters)
    assert set(p.clusters) <= eligible
    worst_chosen = max(load(reports[c]) for c in p.clusters)
    assert all(load(reports[c]) >= worst_chosen for c in eligible - set(p.clusters))
    counts = [len(p.partitions_on(c)) for c in p.clusters]
    assert max(counts) - min(counts) <= 1
