"""Priority pass order of shared groups, and which offsets a TTL expiry may take."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.errors import BadParameter
from fabric.push.leases import PartitionLeases
from fabric.push.shared import SharedGroup


def _group(levels: int, per_level: int) -> SharedGroup:
    floors = dict.fromkeys(range(levels * per_level), 0)
    return SharedGroup.create(
        "q", "g", "queue", floors=floors, state=None, visibility_ms=1000, max_receive_count=0, levels=levels
    )


def test_without_priorities_the_order_is_plain_round_robin():
    g = _group(1, 4)
    assert g.pass_order([0, 1, 2, 3], 1) == [1, 2, 3, 0]


@given(st.integers(2, 10), st.integers(1, 4), st.integers(0, 50))
def test_every_pass_covers_each_partition_once(levels, per_level, rr):
    g = _group(levels, per_level)
    parts = list(range(levels * per_level))
    for _ in range(20):
        order = g.pass_order(parts, rr)
        assert sorted(order) == parts


def test_leading_levels_follow_weights_and_the_lowest_is_never_starved():
    levels = 10
    g = _group(levels, 2)
    parts = list(range(20))
    leads = Counter(g.pass_order(parts, i)[0] // 2 for i in range(55 * 20))
    # weight l + 1 out of 55: level 9 leads 10/55 of the passes, level 0 1/55
    assert leads == {lv: (lv + 1) * 20 for lv in range(levels)}
    # after the leading level, the others come highest first
    order = g.pass_order(parts, 0)
    rest = [p // 2 for p in order[2:]]
    assert rest == sorted(rest, reverse=True)
    # the lowest level leads within every window of 55 passes
    window = [g.pass_order(parts, i)[0] // 2 for i in range(55)]
    assert 0 in window


def test_expirable_is_new_and_redeliverable_offsets_never_leased_ones():
    pl = PartitionLeases(0, visibility_ms=1000, max_receive_count=0)
    [d] = pl.deliver("a", 0, 10, 4)  # 0..3 leased
    assert (d.start, d.end) == (0, 4)
    pl.nack("a", 2, 4, 0)  # 2..3 redeliverable, rc 1
    pl.ack("a", 0, 1, 0)  # 0 settled
    assert pl.expirable(0, 10) == [(2, 4, 1), (4, 10, 0)]
    assert pl.state(1) == "leased"  # expirable changes nothing
    for s, e, _ in pl.expirable(0, 10):
        pl.settle(s, e)
    assert [pl.state(o) for o in range(10)] == ["settled", "leased"] + ["settled"] * 8
    assert pl.backlog(10) == 1
    pl.verify()
    with pytest.raises(BadParameter):
        pl.expirable(5, 2)


@pytest.mark.parametrize("kind", ["queue", "key_shared"])
def test_an_uncounted_nack_gives_the_delivery_back_without_counting_it(kind):
    g = SharedGroup.create("q", "g", kind, floors={0: 0}, state=None, visibility_ms=1000, max_receive_count=2)
    g.join(1)
    pl = g.leases[0]
    if kind == "key_shared":
        pl.offer([(0, b"k"), (1, b"k")])
        [d] = pl.deliver("1", 0, 5)
    else:
        [d] = pl.deliver("1", 0, 2, 5)
    assert (d.start, d.end, d.receive_count) == (0, 2, 1)
    assert pl.nack("1", 0, 2, 0, uncount=True) == 2
    assert pl.receive_count(0) == 0 and pl.state(0) == "redeliverable"
    pl.verify()
    snap = g.snapshot()
    again = SharedGroup.create("q", "g", kind, floors={0: 0}, state=snap, visibility_ms=1000, max_receive_count=2)
    again.join(2)
    pl2 = again.leases[0]
    if kind == "key_shared":
        pl2.offer([(0, b"k"), (1, b"k")])
        got = pl2.deliver("2", 10, 5)
    else:
        got = pl2.deliver("2", 10, 2, 5)
    assert [(x.start, x.end, x.receive_count) for x in got] == [(0, 2, 1)]  # a first delivery, still
    pl2.verify()
