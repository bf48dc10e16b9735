"""RangeSet and RangeMap against plain Python sets and dicts of offsets."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.errors import BadParameter
from fabric.push.ranges import RangeMap, RangeSet

N = 64  # offsets 0..N-1 in the property tests

_range = st.tuples(st.integers(0, N), st.integers(0, N)).map(lambda t: (min(t), max(t)))
_set_ops = st.lists(st.tuples(st.sampled_from(["add", "remove"]), _range), max_size=40)


def _check_canonical(rs: RangeSet, model: set[int]) -> None:
    pairs = list(rs)
    for s, e in pairs:
        assert s < e
    for (_, e1), (s2, _) in itertools.pairwise(pairs):
        assert e1 < s2  # disjoint and never touching: touching ranges merge
    assert {x for s, e in pairs for x in range(s, e)} == model
    assert len(rs) == len(model)
    assert rs.ranges_count == len(pairs)
    assert rs.first() == (min(model) if model else None)


@settings(max_examples=300, deadline=None)
@given(ops=_set_ops, probe=_range)
def test_rangeset_matches_a_set(ops, probe):
    rs, model = RangeSet(), set()
    for op, (s, e) in ops:
        if op == "add":
            assert rs.add(s, e) == len(set(range(s, e)) - model)
            model |= set(range(s, e))
        else:
            assert rs.remove(s, e) == len(set(range(s, e)) & model)
            model -= set(range(s, e))
        _check_canonical(rs, model)
    for x in range(-1, N + 2):
        assert (x in rs) == (x in model)
        span = rs.span_at(x)
        assert (span is not None) == (x in model)
        if span is not None:
            assert span[0] <= x < span[1] and (span[0] - 1) not in model and span[1] not in model
    s, e = probe
    inside = sorted(model & set(range(s, e)))
    got = rs.intersect(s, e)
    assert [x for a, b in got for x in range(a, b)] == inside
    assert all(a < b for a, b in got)
    assert rs.overlaps(s, e) == bool(inside)
    assert rs.count(s, e) == len(inside)
    assert rs.covers(s, e) == (len(inside) == e - s)
    missing = [x for x in range(s, e) if x not in model]
    assert [x for a, b in rs.gaps(s, e) for x in range(a, b)] == missing
    gap = rs.first_gap(s, e)
    if missing:
        assert gap is not None and gap[0] == missing[0] and gap == rs.gaps(s, e)[0]
    else:
        assert gap is None


@settings(max_examples=100, deadline=None)
@given(ops=_set_ops)
def test_rangeset_copy_and_json_round_trip(ops):
    rs = RangeSet()
    for op, (s, e) in ops:
        getattr(rs, op)(s, e)
    back = RangeSet.from_list(json.loads(json.dumps(rs.to_list())))
    assert back == rs and list(back) == list(rs) and len(back) == len(rs)
    c = rs.copy()
    c.add(N + 5, N + 6)
    assert N + 5 not in rs and c != rs


def test_rangeset_merges_touching_and_splits_on_remove():
    rs = RangeSet([(0, 5), (10, 15)])
    assert rs.add(5, 10) == 5
    assert list(rs) == [(0, 15)]
    assert rs.remove(3, 7) == 4
    assert list(rs) == [(0, 3), (7, 15)]
    assert rs.remove(100, 200) == 0 and rs.add(2, 2) == 0
    assert rs.to_list() == [[0, 3], [7, 15]]
    rs.clear()
    assert len(rs) == 0 and rs.first() is None and not rs


def test_empty_ranges_are_no_ops():
    rs = RangeSet([(0, 4)])
    assert rs.remove(2, 2) == 0 and rs.add(2, 2) == 0 and list(rs) == [(0, 4)]
    assert rs.intersect(2, 2) == [] and not rs.overlaps(2, 2) and rs.count(2, 2) == 0
    assert rs.covers(2, 2) and rs.first_gap(2, 2) is None and rs.gaps(9, 9) == []
    rm: RangeMap[int] = RangeMap()
    rm.set(0, 4, 1)
    rm.set(2, 2, 7)
    assert rm.pop(2, 2) == [] and rm.intersect(2, 2) == [] and list(rm) == [(0, 4, 1)]


def test_rangeset_rejects_backwards_ranges_and_bad_lists():
    rs = RangeSet()
    with pytest.raises(BadParameter):
        rs.add(5, 4)
    with pytest.raises(BadParameter):
        rs.intersect(5, 4)
    for bad in [{"a": 1}, [[1]], [[3, 1]], [["a", "b"]], [[1, 2.5]]]:
        with pytest.raises(BadParameter):
            RangeSet.from_list(bad)


def test_rangeset_handles_huge_ranges_without_per_offset_work():
    rs = RangeSet()
    rs.add(0, 10**15)
    rs.remove(10**12, 10**12 + 1)
    assert len(rs) == 10**15 - 1 and rs.ranges_count == 2
    assert rs.first_gap(0, 10**15) == (10**12, 10**12 + 1)


_map_ops = st.lists(
    st.tuples(st.sampled_from(["set", "pop"]), _range, st.integers(0, 3)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=_map_ops, probe=_range)
def test_rangemap_matches_a_dict(ops, probe):
    rm: RangeMap[int] = RangeMap()
    model: dict[int, int] = {}
    for op, (s, e), v in ops:
        if op == "set":
            rm.set(s, e, v)
            model.update(dict.fromkeys(range(s, e), v))
        else:
            got = rm.pop(s, e)
            assert {x: val for a, b, val in got for x in range(a, b)} == {
                x: model[x] for x in range(s, e) if x in model
            }
            for x in range(s, e):
                model.pop(x, None)
        pieces = list(rm)
        for a, b, _ in pieces:
            assert a < b
        for (_, e1, v1), (s2, _, v2) in itertools.pairwise(pieces):
            assert e1 < s2 or (e1 == s2 and v1 != v2)  # touching pieces merge when equal
        assert {x: val for a, b, val in pieces for x in range(a, b)} == model
        assert len(rm) == len(model)
    for x in range(-1, N + 2):
        assert rm.get(x) == model.get(x) and (x in rm) == (x in model)
    s, e = probe
    got = rm.intersect(s, e)
    assert {x: val for a, b, val in got for x in range(a, b)} == {x: model[x] for x in range(s, e) if x in model}
    first = rm.first()
    if model:
        assert first is not None and first[0] == min(model) and first[2] == model[min(model)]
    else:
        assert first is None and rm.ranges_count == 0


def test_rangemap_set_merges_with_equal_neighbours_only():
    rm: RangeMap[str] = RangeMap()
    rm.set(0, 5, "a")
    rm.set(10, 15, "a")
    rm.set(5, 10, "a")
    assert list(rm) == [(0, 15, "a")]
    rm.set(5, 10, "b")
    assert list(rm) == [(0, 5, "a"), (5, 10, "b"), (10, 15, "a")]
    assert rm.pop(3, 12) == [(3, 5, "a"), (5, 10, "b"), (10, 12, "a")]
    assert list(rm) == [(0, 3, "a"), (12, 15, "a")]
    with pytest.raises(BadParameter):
        rm.set(3, 1, "x")
