"""Stream groups: every transition, every illegal event, and a Hypothesis state machine checking
exclusive ownership, balance and stickiness after every step."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fabric.errors import BadParameter, InternalError, UnknownMember
from fabric.push.groups import (
    MEMBER_TRANSITIONS,
    PARTITION_TRANSITIONS,
    Assign,
    Change,
    MemberEvent,
    MemberState,
    PartitionEvent,
    PartitionState,
    Revoke,
    StreamGroup,
    member_step,
    partition_step,
)
from tests.depth import examples

TIMEOUT = 1_000


def group(n: int = 6, **kw: int) -> StreamGroup:
    return StreamGroup(n, session_timeout_ms=TIMEOUT, **kw)


# ---------------------------------------------------------------- construction and changes


@pytest.mark.parametrize(
    "args",
    [
        {"partitions": 0, "session_timeout_ms": 1},
        {"partitions": 1 << 17, "session_timeout_ms": 1},
        {"partitions": 1, "session_timeout_ms": 0},
        {"partitions": 1, "session_timeout_ms": 1, "max_members": 0},
        {"partitions": "3", "session_timeout_ms": 1},
    ],
)
def test_bad_construction_is_bad_parameter(args):
    with pytest.raises(BadParameter):
        StreamGroup(**args)


@pytest.mark.parametrize("parts", [(), (1, 1), (2, 1), (-1,), (True,)])
def test_changes_validate_themselves(parts):
    for cls in (Assign, Revoke):
        with pytest.raises(BadParameter):
            cls("a", parts)
    with pytest.raises(BadParameter):
        Assign("", (0,))


def test_changes_are_frozen():
    a = Assign("a", (0, 1))
    with pytest.raises(AttributeError):
        a.member = "b"  # type: ignore[misc]
    assert a == Assign("a", (0, 1)) and hash(a) == hash(Assign("a", (0, 1)))


# ---------------------------------------------------------------- the tables


@pytest.mark.parametrize("state", list(PartitionState))
@pytest.mark.parametrize("event", list(PartitionEvent))
def test_partition_table_every_pair(state, event):
    if (state, event) in PARTITION_TRANSITIONS:
        assert partition_step(3, state, event) is PARTITION_TRANSITIONS[(state, event)]
    else:
        with pytest.raises(InternalError) as e:
            partition_step(3, state, event)
        assert state.value in str(e.value) and event.value in str(e.value) and "partition 3" in str(e.value)


@pytest.mark.parametrize("state", list(MemberState))
@pytest.mark.parametrize("event", list(MemberEvent))
def test_member_table_every_pair(state, event):
    if (state, event) in MEMBER_TRANSITIONS:
        assert member_step("m", state, event) is MEMBER_TRANSITIONS[(state, event)]
    else:
        assert state is MemberState.GONE
        with pytest.raises(UnknownMember) as e:
            member_step("m", state, event)
        assert state.value in str(e.value) and event.value in str(e.value) and "'m'" in str(e.value)


def test_partition_path_free_owned_revoking_free_owned():
    g = group(2)
    assert g.join("a", 0) == [Assign("a", (0, 1))]
    assert g.state(1) is PartitionState.OWNED and g.owner(1) == "a"
    assert g.join("b", 0) == [Revoke("a", (1,))]
    assert g.state(1) is PartitionState.REVOKING and g.owner(1) == "a"
    assert g.revoked("a", [1], 0) == [Assign("b", (1,))]
    assert g.state(1) is PartitionState.OWNED and g.owner(1) == "b"


# ---------------------------------------------------------------- join


def test_first_member_gets_everything():
    g = group(4)
    assert g.join("a", 10) == [Assign("a", (0, 1, 2, 3))]
    assert g.owned("a") == {0, 1, 2, 3} and g.revoking("a") == frozenset()
    assert g.members == ["a"] and g.generation == 1 and "a" in g and len(g) == 1


def test_second_member_waits_for_revocation():
    g = group(4)
    g.join("a", 0)
    assert g.join("b", 0) == [Revoke("a", (2, 3))]
    assert g.owned("a") == {0, 1} and g.revoking("a") == {2, 3}
    assert g.owned("b") == frozenset() and g.owner(2) == "a"
    assert g.generation == 2


def test_join_when_free_partitions_exist_assigns_at_once():
    g = group(3)
    g.join("a", 0)
    g.join("b", 0)  # a revokes 2
    g.revoked("a", [2], 0)  # b gets 2
    assert g.owned("b") == {2}
    g.leave("b", 0)  # 2 free -> a
    assert g.owned("a") == {0, 1, 2}


def test_rejoin_of_live_member_is_a_heartbeat():
    g = group(2)
    g.join("a", 0)
    assert g.join("a", 900) == []
    assert g.generation == 1 and g.owned("a") == {0, 1}
    assert g.expire(1_500) == []  # the re-join counted as a heartbeat at 900


def test_join_beyond_max_members():
    g = group(2, max_members=2)
    g.join("a", 0)
    g.join("b", 0)
    with pytest.raises(BadParameter):
        g.join("c", 0)
    assert g.join("a", 0) == []  # a live member may still re-join
    assert g.members == ["a", "b"]


@pytest.mark.parametrize("bad", ["", "x" * 256, 7, None])
def test_join_with_bad_member_id(bad):
    with pytest.raises(BadParameter):
        group().join(bad, 0)


def test_more_members_than_partitions():
    g = group(2)
    for m in "abcd":
        g.join(m, 0)
    for m in "abcd":
        for p in g.revoking(m):
            g.revoked(m, [p], 0)
    sizes = sorted(len(g.owned(m)) for m in "abcd")
    assert sizes == [0, 0, 1, 1]


def test_ceil_slots_go_to_biggest_owners():
    g = group(5)
    g.join("b", 0)  # b: 0..4
    changes = g.join("a", 0)  # a is smaller but owns nothing: b keeps ceil = 3
    assert changes == [Revoke("b", (3, 4))]


# ---------------------------------------------------------------- revoked


def test_partial_confirmation():
    g = group(4)
    g.join("a", 0)
    g.join("b", 0)
    assert g.revoked("a", [3], 0) == [Assign("b", (3,))]
    assert g.revoking("a") == {2} and g.owned("b") == {3}
    assert g.revoked("a", [2], 0) == [Assign("b", (2,))]
    assert g.owned("b") == {2, 3}


def test_confirmation_of_partitions_not_revoking_is_ignored():
    g = group(4)
    g.join("a", 0)
    g.join("b", 0)
    g.revoked("a", [2, 3], 0)
    before = g.describe()
    assert g.revoked("a", [2, 3], 0) == []  # duplicate: 2, 3 now b's
    assert g.revoked("a", [0], 0) == []  # owned, never asked back
    assert g.revoked("b", [0, 1], 0) == []  # a's
    assert g.describe() == before


def test_revoked_validates_before_changing_anything():
    g = group(4)
    g.join("a", 0)
    g.join("b", 0)
    before = g.describe()
    bads: list[list[Any]] = [[2, 4], [2, -1], [2, "3"]]
    for bad in bads:
        with pytest.raises(BadParameter):
            g.revoked("a", bad, 0)
    assert g.describe() == before


def test_revoked_from_unknown_member():
    g = group(4)
    with pytest.raises(UnknownMember) as e:
        g.revoked("ghost", [0], 0)
    assert "revoked" in str(e.value) and "gone" in str(e.value)


def test_confirmation_goes_to_recomputed_target():
    g = group(4)
    g.join("a", 0)
    g.join("b", 0)  # a revoking 2, 3 for b
    g.leave("b", 0)  # b gone before a confirms
    assert g.revoking("a") == {2, 3}  # still held by a: nobody else may get them
    assert g.revoked("a", [2, 3], 0) == [Assign("a", (2, 3))]  # the only live member
    assert g.owned("a") == {0, 1, 2, 3}


# ---------------------------------------------------------------- leave


def test_leave_frees_at_once_including_revoking():
    g = group(4)
    g.join("a", 0)
    g.join("b", 0)  # a revoking 2, 3
    g.join("c", 0)  # targets 2/1/1: a keeps its ceil slot
    assert g.owned("a") == {0, 1} and g.revoking("a") == {2, 3}
    changes = g.leave("a", 0)
    assert changes == [Assign("b", (0, 1)), Assign("c", (2, 3))]
    assert g.owner(0) == "b" and g.generation == 4


def test_last_member_leaves():
    g = group(3)
    g.join("a", 0)
    assert g.leave("a", 0) == []
    assert g.owner(0) is None and g.members == [] and g.next_deadline_ms() is None
    assert g.describe()["free"] == [0, 1, 2]


def test_leave_from_unknown_member():
    g = group()
    g.join("a", 0)
    g.leave("a", 0)
    with pytest.raises(UnknownMember) as e:
        g.leave("a", 0)
    assert "leave" in str(e.value) and "gone" in str(e.value)


# ---------------------------------------------------------------- heartbeat and expiry


def test_heartbeat_from_unknown_member():
    with pytest.raises(UnknownMember) as e:
        group().heartbeat("nobody", 0)
    assert "heartbeat" in str(e.value) and "'nobody'" in str(e.value)


def test_expiry_boundary_and_deadline():
    g = group(2)
    g.join("a", 100)
    g.join("b", 200)
    assert g.next_deadline_ms() == 100 + TIMEOUT + 1
    assert g.expire(100 + TIMEOUT) == []  # silent for exactly the timeout: still live
    g.heartbeat("b", 1_000)
    changes = g.expire(100 + TIMEOUT + 1)
    assert g.members == ["b"]
    assert g.owner(0) == "b" and g.owner(1) == "b"
    assert changes == [Assign("b", (0,))] or changes == [Assign("b", (0, 1))]
    assert g.next_deadline_ms() == 1_000 + TIMEOUT + 1


def test_expiry_frees_revoking_partitions_for_the_destination():
    g = group(4)
    g.join("a", 0)
    g.join("b", 500)  # a revoking 2, 3; a never confirms and goes silent
    assert g.expire(1_001) == [Assign("b", (0, 1, 2, 3))]
    assert g.generation == 3


def test_expire_several_at_once_bumps_generation_once():
    g = group(4)
    for m in "abc":
        g.join(m, 0)
    g.join("d", 600)
    gen = g.generation
    g.expire(1_001)
    assert g.members == ["d"] and g.generation == gen + 1
    assert g.owned("d") | g.revoking("d") == {0, 1, 2, 3}


def test_expired_member_is_unknown_then_rejoins_as_new():
    g = group(2)
    g.join("a", 0)
    g.expire(2_000)
    with pytest.raises(UnknownMember):
        g.heartbeat("a", 2_000)
    assert g.owned("a") == frozenset() and g.revoking("a") == frozenset()
    assert g.join("a", 2_000) == [Assign("a", (0, 1))]
    assert g.generation == 3


def test_heartbeat_and_revoked_keep_a_member_alive():
    g = group(2)
    g.join("a", 0)
    g.join("b", 0)
    g.heartbeat("b", 900)
    g.revoked("a", [1], 900)
    assert g.expire(1_500) == []
    g.heartbeat("a", 100)  # time going backwards never shortens a session
    assert g.next_deadline_ms() == 900 + TIMEOUT + 1


def test_heartbeat_and_revoked_do_not_bump_generation():
    g = group(2)
    g.join("a", 0)
    g.join("b", 0)
    gen = g.generation
    g.heartbeat("a", 1)
    g.revoked("a", [1], 2)
    assert g.generation == gen


# ---------------------------------------------------------------- queries


def test_owner_of_bad_partition():
    g = group(2)
    with pytest.raises(BadParameter):
        g.owner(2)
    with pytest.raises(BadParameter):
        g.owner(-1)


def test_describe_is_json_and_complete():
    g = group(3)
    g.join("a", 5)
    g.join("b", 7)
    d = g.describe()
    assert json.loads(json.dumps(d)) == d
    assert d == {
        "partitions": 3,
        "generation": 2,
        "session_timeout_ms": TIMEOUT,
        "members": {
            "a": {"owned": [0, 1], "revoking": [2], "last_heartbeat_ms": 5},
            "b": {"owned": [], "revoking": [], "last_heartbeat_ms": 7},
        },
        "free": [],
    }


def _history(g: StreamGroup) -> list[list[Change]]:
    out = [g.join("m3", 0), g.join("m1", 1), g.join("m2", 2)]
    out.append(g.revoked("m3", sorted(g.revoking("m3")), 3))
    out.append(g.leave("m1", 4))
    out.append(g.join("m9", 5))
    out.append(g.expire(2_000))
    return out


def test_same_history_same_assignment():
    g1, g2 = group(7), group(7)
    assert _history(g1) == _history(g2)
    assert g1.describe() == g2.describe()


# ---------------------------------------------------------------- the state machine


MEMBER_IDS = [f"m{i}" for i in range(6)]


class GroupMachine(RuleBasedStateMachine):
    """Drives a StreamGroup with random events; mirrors what members are told in ``told``."""

    @initialize(n=st.integers(1, 9))
    def setup(self, n: int) -> None:
        self.g = StreamGroup(n, session_timeout_ms=TIMEOUT, max_members=5)
        self.n = n
        self.now = 0
        self.beats: dict[str, int] = {}  # live members and their last sign of life
        self.told: dict[str, tuple[set[int], set[int]]] = {}  # member -> (owned, revoking) per the changes

    def apply(self, changes: list[Change]) -> None:
        """The changes must tell members exactly what the group now thinks, and never hand out a held partition."""
        seen: set[tuple[str, str]] = set()
        for c in changes:
            assert (type(c).__name__, c.member) not in seen, "one change per member and kind"
            seen.add((type(c).__name__, c.member))
            assert c.member in self.beats, "changes go to live members only"
            owned, revoking = self.told[c.member]
            if isinstance(c, Revoke):
                assert set(c.partitions) <= owned
                owned -= set(c.partitions)
                revoking |= set(c.partitions)
            else:
                for p in c.partitions:
                    assert all(p not in o and p not in r for o, r in self.told.values()), f"{p} is still held"
                owned |= set(c.partitions)

    def gone(self, member: str) -> None:
        del self.beats[member]
        del self.told[member]

    @rule(member=st.sampled_from(MEMBER_IDS))
    def join(self, member: str) -> None:
        if member in self.beats:
            assert self.g.join(member, self.now) == []
            self.beats[member] = self.now
            return
        if len(self.beats) >= 5:
            with pytest.raises(BadParameter):
                self.g.join(member, self.now)
            return
        before = {m: len(self.g.owned(m)) for m in self.beats}
        gen = self.g.generation
        changes = self.g.join(member, self.now)
        assert self.g.generation == gen + 1
        self.beats[member] = self.now
        self.told[member] = (set(), set())
        self.apply(changes)
        # Stickiness: only members above their new target give anything up, and only the excess.
        floor, ceil = self.n // len(self.beats), -(-self.n // len(self.beats))
        for c in changes:
            if isinstance(c, Revoke):
                had = before[c.member]
                assert had > floor, f"{c.member} held {had} <= floor {floor} yet lost {c.partitions}"
                assert had - len(c.partitions) >= floor
        for m, had in before.items():
            if had > ceil:
                assert len(self.g.owned(m)) == ceil

    @rule(member=st.sampled_from(MEMBER_IDS))
    def leave(self, member: str) -> None:
        if member not in self.beats:
            with pytest.raises(UnknownMember):
                self.g.leave(member, self.now)
            return
        changes = self.g.leave(member, self.now)
        self.gone(member)
        assert all(isinstance(c, Assign) for c in changes) or self.revocations_pending()
        self.apply(changes)

    @rule(member=st.sampled_from(MEMBER_IDS))
    def heartbeat(self, member: str) -> None:
        if member not in self.beats:
            with pytest.raises(UnknownMember):
                self.g.heartbeat(member, self.now)
            return
        self.g.heartbeat(member, self.now)
        self.beats[member] = self.now

    @precondition(lambda self: any(self.g.revoking(m) for m in self.beats))
    @rule(data=st.data())
    def revoked(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from([m for m in sorted(self.beats) if self.g.revoking(m)]))
        pending = sorted(self.g.revoking(member))
        subset = data.draw(st.lists(st.sampled_from(pending), unique=True, min_size=1))
        others = [p for p in range(self.n) if p not in pending]
        junk = data.draw(st.lists(st.sampled_from(others), max_size=2)) if others else []  # stale: ignored
        gen = self.g.generation
        changes = self.g.revoked(member, subset + junk, self.now)
        assert self.g.generation == gen
        self.beats[member] = self.now
        self.told[member][1].difference_update(subset)
        self.apply(changes)
        assert not self.g.revoking(member) & set(subset)

    @rule(member=st.sampled_from(MEMBER_IDS))
    def revoked_unknown(self, member: str) -> None:
        if member not in self.beats:
            with pytest.raises(UnknownMember):
                self.g.revoked(member, [0], self.now)

    @rule(ms=st.one_of(st.integers(0, 400), st.integers(0, 1_500)))
    def advance_and_expire(self, ms: int) -> None:
        self.now += ms
        deadline = self.g.next_deadline_ms()
        dead = {m for m, t in self.beats.items() if self.now - t > TIMEOUT}
        assert (deadline is not None and deadline <= self.now) == bool(dead)
        changes = self.g.expire(self.now)
        for m in dead:
            self.gone(m)
        assert set(self.g.members) == set(self.beats)
        self.apply(changes)

    def revocations_pending(self) -> bool:
        return any(self.g.revoking(m) for m in self.g.members)

    @invariant()
    def exclusive_ownership(self) -> None:
        self.g.check_invariants()
        holders: dict[int, str] = {}
        for m in self.g.members:
            owned, revoking = self.g.owned(m), self.g.revoking(m)
            assert not owned & revoking
            for p in owned | revoking:
                assert p not in holders, f"partition {p} held by {holders[p]} and {m}"
                holders[p] = m
        for p in range(self.n):
            assert self.g.owner(p) == holders.get(p)

    @invariant()
    def only_live_members_hold(self) -> None:
        assert set(self.g.members) == set(self.beats)
        for m in MEMBER_IDS:
            if m not in self.beats:
                assert self.g.owned(m) == frozenset() and self.g.revoking(m) == frozenset()

    @invariant()
    def members_were_told_the_truth(self) -> None:
        for m, (owned, revoking) in self.told.items():
            assert self.g.owned(m) == owned and self.g.revoking(m) == revoking

    @invariant()
    def covered_and_balanced_when_settled(self) -> None:
        if not self.beats:
            assert all(self.g.owner(p) is None for p in range(self.n))
            return
        assert all(self.g.owner(p) is not None for p in range(self.n)), "a free partition with live members"
        if not self.revocations_pending():
            sizes = [len(self.g.owned(m)) for m in self.g.members]
            assert sum(sizes) == self.n and max(sizes) - min(sizes) <= 1


GroupMachine.TestCase.settings = settings(
    max_examples=examples(150), stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_group_state_machine = GroupMachine.TestCase


def test_a_group_takes_partitions_added_to_its_queue():
    g = StreamGroup(2, session_timeout_ms=1000)
    g.join("a", 0)
    assert sorted(g.owned("a")) == [0, 1]
    generation = g.generation
    changes = g.grow(6)
    assert g.generation == generation + 1 and g.partitions == 6
    assert {p for ch in changes for p in ch.partitions} == {2, 3, 4, 5}  # only the new ones move
    assert sorted(g.owned("a")) == list(range(6))
    g.join("b", 0)  # and a later member shares them like any others
    g.revoked("a", sorted(g.revoking("a")), 0)
    assert len(g.owned("a")) == len(g.owned("b")) == 3
    assert g.grow(6) == []
    with pytest.raises(BadParameter):
        g.grow(3)
