"""PartitionLeases: unit tests per move, and a Hypothesis state machine against a per-offset model."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fabric.errors import BadParameter, NotLeaseHolder
from fabric.push.leases import Delivery, PartitionLeases
from tests.depth import examples


def _table(floor: int = 0, visibility_ms: int = 1000, max_receive_count: int = 3, **kw: int) -> PartitionLeases:
    return PartitionLeases(floor, visibility_ms=visibility_ms, max_receive_count=max_receive_count, **kw)


def _offsets(deliveries: list[Delivery]) -> list[int]:
    return [o for d in deliveries for o in range(d.start, d.end)]


# -- unit tests ------------------------------------------------------------------------


def test_fresh_delivery_then_acks_advance_the_floor():
    t = _table(floor=10)
    ds = t.deliver("a", 0, high_watermark=30, max_records=15)
    assert ds == [Delivery(10, 25, 1, 1000)]
    assert (t.floor, t.cursor, t.in_flight, t.backlog(30)) == (10, 25, 15, 20)
    assert t.ack("a", 15, 20, 1) == 5
    assert t.floor == 10 and t.oldest_unsettled() == 10  # a hole at 10..15 holds the floor
    assert t.ack("a", 10, 15, 2) == 5
    assert t.floor == 20 and t.backlog(30) == 10 and t.holder(20) == "a" and t.holder(15) is None
    t.verify()


def test_acks_of_settled_offsets_are_idempotent():
    t = _table()
    t.deliver("a", 0, 10, 10)
    assert t.ack("a", 0, 10, 1) == 10
    assert t.ack("a", 0, 10, 2) == 0
    assert t.ack("b", 3, 7, 3) == 0  # settled is settled, whoever asks
    assert t.floor == 10 and t.oldest_unsettled() is None


def test_ack_by_a_non_holder_raises_after_settling_its_own_part():
    t = _table()
    t.deliver("a", 0, 10, 5)
    t.deliver("b", 0, 10, 5)
    with pytest.raises(NotLeaseHolder, match=r"offset 5 by 'a'.*leased to 'b'"):
        t.ack("a", 0, 10, 1)
    assert t.floor == 5 and t.holder(5) == "b" and t.in_flight == 5
    with pytest.raises(NotLeaseHolder, match=r"offset 10 .* never delivered"):
        t.ack("b", 5, 12, 1)  # 10 and 11 were never delivered
    assert t.floor == 10
    t.verify()


def test_empty_ranges_change_nothing():
    t = _table()
    t.deliver("a", 0, 10, 10)
    assert t.ack("b", 5, 5, 1) == 0 and t.nack("a", 5, 5, 1) == 0 and t.change_visibility("a", 5, 5, 1, 9) == 0
    assert t.settle(5, 5) == 0 and t.return_dead(5, 5) == 0
    assert t._leases.ranges_count == 1 and t.in_flight == 10
    t.verify()


def test_moves_on_offsets_not_held_raise_for_every_verb():
    t = _table()
    t.deliver("a", 0, 10, 10)
    for call in (
        lambda: t.nack("b", 0, 1, 1),
        lambda: t.change_visibility("b", 0, 1, 1, 500),
        lambda: t.ack("a", 10, 11, 1),
    ):
        with pytest.raises(NotLeaseHolder):
            call()
    assert t.in_flight == 10 and t.holder(0) == "a"


def test_nack_with_delay_is_not_redelivered_before_the_delay():
    t = _table()
    t.deliver("a", 0, 4, 4)
    assert t.nack("a", 0, 4, 100, delay_ms=500) == 4
    assert t.redeliverable == 4 and t.state(0) == "redeliverable"
    assert t.next_deadline_ms() == 600
    assert t.deliver("b", 599, 4, 10) == []
    assert t.deliver("b", 600, 4, 10) == [Delivery(0, 4, 2, 1600)]
    assert t.receive_count(0) == 2 and t.holder(3) == "b"


def test_nack_without_delay_is_redelivered_at_once_lowest_offsets_first():
    t = _table()
    t.deliver("a", 0, 10, 10)
    t.nack("a", 6, 8, 1)
    t.nack("a", 2, 4, 1)
    ds = t.deliver("b", 1, 20, 3)
    assert ds == [Delivery(2, 4, 2, 1001), Delivery(6, 7, 2, 1001)]
    ds = t.deliver("b", 1, 20, 4)  # the rest of the redeliveries, then fresh offsets
    assert ds == [Delivery(7, 8, 2, 1001), Delivery(10, 13, 1, 1001)]


def test_deliveries_are_split_by_receive_count():
    t = _table(max_receive_count=0)
    t.deliver("a", 0, 10, 10)
    t.nack("a", 0, 10, 0)
    t.deliver("a", 0, 10, 5)  # 0..5 now received twice
    t.nack("a", 0, 5, 0)
    ds = t.deliver("b", 0, 10, 10)
    assert [(d.start, d.end, d.receive_count) for d in ds] == [(0, 5, 3), (5, 10, 2)]


def test_expiry_makes_leases_redeliverable_and_a_late_ack_fails():
    t = _table(visibility_ms=100)
    t.deliver("a", 0, 5, 5)
    assert t.next_deadline_ms() == 100
    assert t.expire(99) == 0 and t.in_flight == 5
    assert t.expire(100) == 5  # valid while now < deadline
    assert t.in_flight == 0 and t.redeliverable == 5 and t.next_deadline_ms() is None
    with pytest.raises(NotLeaseHolder, match="redeliverable"):
        t.ack("a", 0, 5, 101)
    t2 = _table(visibility_ms=100)
    t2.deliver("a", 0, 5, 5)
    with pytest.raises(NotLeaseHolder):  # ack itself applies the expiry first
        t2.ack("a", 0, 5, 100)
    assert t2.deliver("b", 100, 5, 5) == [Delivery(0, 5, 2, 200)]


def test_change_visibility_extends_shortens_and_zero_gives_back():
    t = _table(visibility_ms=100)
    t.deliver("a", 0, 10, 10)
    assert t.change_visibility("a", 0, 5, 50, 1000) == 5
    assert t.expire(100) == 5  # only 5..10 kept the old deadline
    assert t.holder(0) == "a" and t.next_deadline_ms() == 1050
    assert t.change_visibility("a", 0, 2, 60, 0) == 2
    assert t.state(0) == "redeliverable" and t.in_flight == 3
    assert t.change_visibility("a", 2, 5, 60, 10) == 3
    assert t.next_deadline_ms() == 70
    t.verify()


def test_dead_letter_after_max_receive_count():
    t = _table(visibility_ms=10, max_receive_count=2)
    assert t.deliver("a", 0, 3, 3)[0].receive_count == 1
    t.expire(10)
    assert t.deliver("a", 10, 3, 3)[0].receive_count == 2
    t.nack("a", 0, 3, 11, delay_ms=10_000)  # a third delivery would pass the limit: dead at once
    assert t.dead == 3 and t.redeliverable == 0 and t.state(1) == "dead"
    assert t.deliver("b", 12, 3, 3) == []
    assert t.take_dead(12) == [(0, 3, 2)]
    assert t.take_dead(13) == []  # reported once
    assert t.return_dead(0, 2) == 2
    assert t.take_dead(14) == [(0, 2, 2)]
    with pytest.raises(NotLeaseHolder, match="dead"):
        t.ack("a", 0, 1, 15)
    assert t.settle(0, 3) == 3
    assert t.floor == 3 and t.dead == 0
    t.verify()


def test_zero_max_receive_count_never_dead_letters():
    t = _table(visibility_ms=1, max_receive_count=0)
    for now in range(50):
        ds = t.deliver("a", now, 1, 1)
        assert ds[0].receive_count == now + 1
    assert t.take_dead(100) == []


def test_drop_member_gives_its_leases_back_at_once():
    t = _table(max_receive_count=1)
    t.deliver("a", 0, 5, 5)
    t.deliver("b", 0, 10, 5)
    assert t.members() == ["a", "b"] and t.held("a") == 5
    assert t.drop_member("a", 1) == 5
    assert t.drop_member("a", 1) == 0 and t.held("a") == 0
    assert t.dead == 5  # max_receive_count 1: received once already
    assert t.holder(7) == "b"


def test_settle_overrides_any_state_and_skips_offsets_ahead_of_the_cursor():
    t = _table()
    t.deliver("a", 0, 10, 5)
    assert t.settle(3, 8) == 5  # 3..5 leased, 5..8 new (purged)
    assert t.in_flight == 3 and t.cursor == 8
    assert t.ack("a", 0, 5, 1) == 3  # 3 and 4 were settled already: ignored
    assert t.floor == 8
    assert t.deliver("b", 1, 10, 10) == [Delivery(8, 10, 1, 1001)]
    t.settle(20, 25)
    assert t.deliver("b", 2, 30, 100) == [Delivery(10, 20, 1, 1002), Delivery(25, 30, 1, 1002)]
    assert t.backlog(30) == 17 and t.settle(0, 2) == 0
    t.verify()


def test_snapshot_round_trip_keeps_counts_and_forgets_leases():
    t = _table(max_receive_count=3)
    t.deliver("a", 0, 20, 10)
    t.ack("a", 2, 4, 1)
    t.nack("a", 4, 6, 1, delay_ms=10_000)
    t.deliver("b", 2, 20, 2)  # 4..6 are delayed: b gets 10..12
    t.settle(15, 17)
    snap = json.loads(json.dumps(t.snapshot()))
    r = PartitionLeases.restore(snap, visibility_ms=1000, max_receive_count=3)
    assert r.snapshot() == snap
    assert (r.floor, r.cursor, r.in_flight) == (0, 12, 0)
    assert r.redeliverable == 10 and r.receive_count(4) == 1 and r.receive_count(2) == 0
    ds = r.deliver("c", 5, 20, 100)
    assert _offsets(ds) == [0, 1, *range(4, 12), 12, 13, 14, 17, 18, 19]  # settled 2, 3, 15, 16 never again
    assert [d.receive_count for d in ds] == [2, 2, 1, 1]
    r.verify()


def test_restore_turns_exhausted_counts_into_dead_letters():
    t = _table(max_receive_count=1)
    t.deliver("a", 0, 4, 4)
    r = PartitionLeases.restore(t.snapshot(), visibility_ms=1000, max_receive_count=1)
    assert r.take_dead(0) == [(0, 4, 1)]


@pytest.mark.parametrize(
    "snap",
    [
        None,
        {"version": 2, "floor": 0, "cursor": 0, "settled": [], "counts": []},
        {"version": 1, "floor": -1, "cursor": 0, "settled": [], "counts": []},
        {"version": 1, "floor": 5, "cursor": 4, "settled": [], "counts": []},
        {"version": 1, "floor": 0, "cursor": 4, "settled": [], "counts": [[0, 3, 1]]},  # 3 in no state
        {"version": 1, "floor": 0, "cursor": 4, "settled": [[2, 3]], "counts": [[0, 4, 1]]},  # overlap
        {"version": 1, "floor": 0, "cursor": 4, "settled": [], "counts": [[2, 4, 1], [0, 2, 1]]},  # order
        {"version": 1, "floor": 0, "cursor": 4, "settled": [], "counts": [[0, 4, -1]]},
        {"version": 1, "floor": 3, "cursor": 4, "settled": [[1, 2]], "counts": [[3, 4, 1]]},
        {"version": 1, "floor": 0, "cursor": 4, "settled": "x", "counts": []},
        {"version": 1, "floor": 0, "cursor": 4, "settled": [], "counts": [[0, 4]]},
    ],
)
def test_restore_rejects_a_bad_snapshot(snap):
    with pytest.raises(BadParameter):
        PartitionLeases.restore(snap, visibility_ms=1000, max_receive_count=3)


def test_lease_and_range_limits_stop_deliveries():
    t = _table(max_leases=2)
    assert len(t.deliver("a", 0, 100, 5)) == 1
    assert len(t.deliver("b", 0, 100, 5)) == 1
    assert t.deliver("c", 0, 100, 5) == []  # table full
    t.ack("a", 0, 5, 1)
    assert t.deliver("c", 1, 100, 5) == [Delivery(10, 15, 1, 1001)]
    u = _table(max_ranges=3, max_receive_count=0)
    u.deliver("a", 0, 100, 10)
    u.nack("a", 1, 2, 0, delay_ms=100)
    u.nack("a", 3, 4, 0, delay_ms=200)  # leases 0..1, 2..3, 4..10 and two delayed holes: 5 ranges
    assert u.deliver("b", 0, 100, 10) == []  # no fresh offsets while that fragmented
    for start, end in [(0, 1), (2, 3), (4, 10)]:
        u.ack("a", start, end, 0)
    assert u.deliver("b", 100, 100, 10) == [Delivery(1, 2, 2, 1100), Delivery(10, 19, 1, 1100)]


def test_ranges_do_the_work_not_offsets():
    t = _table(visibility_ms=10**6)
    big = 10**12
    ds = t.deliver("a", 0, big, big)
    assert ds == [Delivery(0, big, 1, 10**6)]
    assert t.ack("a", big // 2, big, 1) == big // 2 and t.ack("a", 0, big // 2, 1) == big // 2
    assert t.floor == big
    for i in range(2000):  # a busy consumer: many batches, acked out of order
        t.deliver("a", 1, big + 500 * (i + 1), 500)
        if i % 2:
            t.ack("a", big + 500 * (i - 1), big + 500 * (i + 1), 2)
    assert t.floor == big + 1_000_000 and t.in_flight == 0
    assert len(t._lease_timers) <= 2 * t._leases.ranges_count + 1024  # stale timers are compacted


def test_next_deadline_skips_settled_leases():
    t = _table(visibility_ms=100)
    t.deliver("a", 0, 5, 5)
    t.deliver("a", 50, 10, 5)
    t.ack("a", 0, 5, 60)
    assert t.next_deadline_ms() == 150
    t.nack("a", 5, 10, 60, delay_ms=30)
    assert t.next_deadline_ms() == 90


def test_bad_arguments_raise_bad_parameter():
    with pytest.raises(BadParameter, match="visibility_ms"):
        _table(visibility_ms=0)
    with pytest.raises(BadParameter, match="max_receive_count"):
        _table(max_receive_count=1001)
    t = _table()
    t.deliver("a", 0, 10, 10)
    for call in (
        lambda: t.deliver("", 0, 10, 1),
        lambda: t.deliver("a", -1, 10, 1),
        lambda: t.deliver("a", 0, 10, -1),
        lambda: t.ack("a", 5, 4, 0),
        lambda: t.ack("a", -1, 4, 0),
        lambda: t.nack("a", 0, 1, 0, delay_ms=-1),
        lambda: t.change_visibility("a", 0, 1, 0, 12 * 3600 * 1000 + 1),
        lambda: t.settle(3, 2),
        lambda: t.take_dead(0, limit=0),
    ):
        with pytest.raises(BadParameter):
            call()
    assert t.in_flight == 10


# -- the state machine -----------------------------------------------------------------

MEMBERS = ["a", "b", "c"]
HW_MAX = 60


@dataclass
class Rec:
    state: str  # leased, waiting, dead, taken, settled (never delivered: no record)
    rc: int = 0
    holder: str | None = None
    deadline: int = 0
    not_before: int = 0


class LeaseMachine(RuleBasedStateMachine):
    """Drives PartitionLeases and a dict of offsets side by side; they must agree after every step."""

    @initialize(
        visibility_ms=st.sampled_from([1, 30, 250, 1000]),
        max_receive_count=st.integers(0, 3),
        floor=st.integers(0, 5),
    )
    def start(self, visibility_ms, max_receive_count, floor):
        self.vis, self.max_rc = visibility_ms, max_receive_count
        self.t = PartitionLeases(floor, visibility_ms=visibility_ms, max_receive_count=max_receive_count)
        self.recs: dict[int, Rec] = {o: Rec("settled") for o in range(floor)}
        self.cursor = floor
        self.now = 0
        self.synced = 0  # now_ms of the last call that expired leases and promoted delays
        self.hw = floor

    # -- the model ------------------------------------------------------------------

    def state(self, o: int) -> str:
        return self.recs[o].state if o in self.recs else "new"

    def floor(self) -> int:
        o = 0
        while self.state(o) == "settled":
            o += 1
        return o

    def normalize(self) -> None:
        self.cursor = max(self.cursor, self.floor())
        while self.state(self.cursor) == "settled":
            self.cursor += 1

    def release(self, o: int, not_before: int) -> None:
        r = self.recs[o]
        r.holder = None
        r.state = "dead" if 0 < self.max_rc <= r.rc else "waiting"
        r.not_before = not_before

    def expire(self) -> int:
        expired = [o for o, r in self.recs.items() if r.state == "leased" and r.deadline <= self.now]
        for o in expired:
            self.release(o, self.now)
        self.synced = self.now
        return len(expired)

    def lease(self, o: int, member: str) -> None:
        r = self.recs.setdefault(o, Rec("new"))
        assert r.state in ("new", "waiting")  # never a settled, leased or dead offset
        r.state, r.holder, r.deadline, r.rc = "leased", member, self.now + self.vis, r.rc + 1

    def held_by(self, member: str) -> list[int]:
        return [o for o, r in self.recs.items() if r.state == "leased" and r.holder == member]

    def pick_range(self, data, member: str) -> tuple[int, int]:
        """Mostly a part of one run of offsets the member holds (settled ones may sit inside), else anything."""
        held = sorted(self.held_by(member))
        if held and data.draw(st.integers(0, 3)):
            s = e = data.draw(st.sampled_from(held))
            while self.state(e) == "settled" or (self.state(e) == "leased" and self.recs[e].holder == member):
                e += 1
            return s, data.draw(st.integers(s + 1, e))
        s = data.draw(st.integers(0, self.hw + 2))
        return s, s + data.draw(st.integers(0, 8))

    def member_move(self, member: str, s: int, e: int, act) -> tuple[int, int | None]:
        """The model's ack/nack/change_visibility: act on held offsets; first offset neither held nor settled."""
        self.expire()
        n, bad = 0, None
        for o in range(s, e):
            st_ = self.state(o)
            if st_ == "settled":
                continue
            if st_ == "leased" and self.recs[o].holder == member:
                act(o)
                n += 1
            elif bad is None:
                bad = o
        self.normalize()
        return n, bad

    def call(self, fn, n: int, bad: int | None) -> None:
        if bad is None:
            assert fn() == n
        else:
            with pytest.raises(NotLeaseHolder, match=f"offset {bad} "):
                fn()

    # -- rules ------------------------------------------------------------------------

    def produce(self, n: int) -> None:
        self.hw = min(HW_MAX, self.hw + n)

    @rule(dt=st.sampled_from([0, 1, 5, 20, 60, 200]))
    def advance_time(self, dt):
        self.now += dt

    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(0, 12), produced=st.integers(0, 6))
    def deliver_more(self, member, max_records, produced):
        self.deliver(member, max_records, produced)

    @rule(
        op=st.sampled_from(["expire_leases", "drop_member", "take_dead", "return_dead", "settle", "restart"]),
        member=st.sampled_from(MEMBERS),
        flag=st.booleans(),
        data=st.data(),
    )
    def rarer_move(self, op, member, flag, data):
        """The moves that tear leases down, folded into one rule so building moves are drawn more often."""
        getattr(self, op)(member, flag, data)

    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(0, 12), produced=st.integers(0, 6))
    def deliver(self, member, max_records, produced):
        self.produce(produced)
        got = self.t.deliver(member, self.now, self.hw, max_records)
        self.expire()
        want: list[int] = []
        ready = sorted(o for o, r in self.recs.items() if r.state == "waiting" and r.not_before <= self.now)
        for o in ready:
            if len(want) == max_records or o >= self.hw:
                break
            want.append(o)
        pos = self.cursor
        while len(want) < max_records and pos < self.hw:
            if self.state(pos) != "settled":
                want.append(pos)
            pos += 1
        for o in want:
            self.lease(o, member)
        if pos > self.cursor:
            self.cursor = pos
            self.normalize()
        assert _offsets(got) == want
        for d in got:
            assert d.deadline_ms == self.now + self.vis
            assert all(self.recs[o].rc == d.receive_count for o in range(d.start, d.end))

    @rule(member=st.sampled_from(MEMBERS), data=st.data())
    def ack(self, member, data):
        s, e = self.pick_range(data, member)

        def act(o: int) -> None:
            self.recs[o].state, self.recs[o].holder = "settled", None

        n, bad = self.member_move(member, s, e, act)
        self.call(lambda: self.t.ack(member, s, e, self.now), n, bad)

    @rule(member=st.sampled_from(MEMBERS), data=st.data(), delay=st.sampled_from([0, 0, 1, 50, 200]))
    def nack(self, member, data, delay):
        s, e = self.pick_range(data, member)
        n, bad = self.member_move(member, s, e, lambda o: self.release(o, self.now + delay))
        self.call(lambda: self.t.nack(member, s, e, self.now, delay), n, bad)

    @rule(member=st.sampled_from(MEMBERS), data=st.data(), vis=st.sampled_from([0, 1, 30, 300]))
    def change_visibility(self, member, data, vis):
        s, e = self.pick_range(data, member)

        def act(o: int) -> None:
            if vis == 0:
                self.release(o, self.now)
            else:
                self.recs[o].deadline = self.now + vis

        n, bad = self.member_move(member, s, e, act)
        self.call(lambda: self.t.change_visibility(member, s, e, self.now, vis), n, bad)

    def expire_leases(self, member, flag, data):
        assert self.t.expire(self.now) == self.expire()

    def drop_member(self, member, flag, data):
        got = self.t.drop_member(member, self.now)
        self.expire()
        mine = self.held_by(member)
        for o in mine:
            self.release(o, self.now)
        assert got == len(mine)

    def take_dead(self, member, settle_now, data):
        got = self.t.take_dead(self.now)
        self.expire()
        dead = {o: r.rc for o, r in self.recs.items() if r.state == "dead"}
        assert {o: rc for s, e, rc in got for o in range(s, e)} == dead
        for o in dead:
            self.recs[o].state = "taken"
        if settle_now:
            for s, e, _ in got:
                self.t.settle(s, e)
            for o in dead:
                self.recs[o].state = "settled"
            self.normalize()

    def return_dead(self, member, flag, data):
        s = data.draw(st.integers(0, self.hw))
        e = s + data.draw(st.integers(0, 10))
        taken = [o for o in range(s, e) if self.state(o) == "taken"]
        for o in taken:
            self.recs[o].state = "dead"
        assert self.t.return_dead(s, e) == len(taken)

    def settle(self, member, flag, data):
        s = data.draw(st.integers(0, self.hw + 5))
        e = s + data.draw(st.integers(0, 6))
        fresh = [o for o in range(s, e) if self.state(o) != "settled"]
        for o in fresh:
            self.recs[o] = Rec("settled")
        self.normalize()
        assert self.t.settle(s, e) == len(fresh)

    def restart(self, member, flag, data):
        snap = json.loads(json.dumps(self.t.snapshot()))
        self.t = PartitionLeases.restore(snap, visibility_ms=self.vis, max_receive_count=self.max_rc)
        assert self.t.snapshot() == snap
        for _o, r in self.recs.items():
            if r.state != "settled":
                r.holder = None
                r.state = "dead" if 0 < self.max_rc <= r.rc else "waiting"
                r.not_before = 0

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self):
        t = self.t
        t.verify()  # internal invariants: one state per offset, no overlaps, per-member counts
        assert (t.floor, t.cursor) == (self.floor(), self.cursor)
        names = {"waiting": "redeliverable", "taken": "dead"}
        for o in range(HW_MAX + 12):
            st_ = self.state(o)
            assert t.state(o) == names.get(st_, st_), o
            r = self.recs.get(o)
            assert t.holder(o) == (r.holder if r is not None else None)
            assert t.receive_count(o) == (r.rc if r is not None and st_ != "settled" else 0)
            if st_ == "leased" and self.max_rc:
                assert 1 <= r.rc <= self.max_rc  # type: ignore[union-attr]
        states = [r.state for r in self.recs.values()]
        assert t.in_flight == states.count("leased")
        assert t.redeliverable == states.count("waiting")
        assert t.dead == states.count("dead") + states.count("taken")
        assert t.backlog(self.hw) == sum(1 for o in range(self.floor(), self.hw) if self.state(o) != "settled")
        assert t.oldest_unsettled() == (self.floor() if self.floor() < self.cursor else None)
        for m in MEMBERS:
            assert t.held(m) == len(self.held_by(m))
        times = [r.deadline for r in self.recs.values() if r.state == "leased"]
        times += [r.not_before for r in self.recs.values() if r.state == "waiting" and r.not_before > self.synced]
        assert t.next_deadline_ms() == (min(times) if times else None)

    @precondition(lambda self: hasattr(self, "t"))
    @invariant()
    def leases_never_overlap(self):
        owners: dict[int, str] = {}
        for s, e, lease in self.t._leases:
            for o in range(s, e):
                assert o not in owners
                owners[o] = lease.member


LeaseMachine.TestCase.settings = settings(max_examples=examples(100), stateful_step_count=40, deadline=None)
TestLeaseMachine = LeaseMachine.TestCase
