"""KeySharedLeases: unit tests per move, and a Hypothesis state machine against a per-offset model."""

from __future__ import annotations

import functools
import json
import random
import time
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fabric.errors import BadParameter, InternalError, NotLeaseHolder, UnknownMember
from fabric.push.keyshared import (
    MESSAGE_TRANSITIONS,
    SLOTS,
    KeySharedLeases,
    MessageEvent,
    MessageState,
    ring_points,
    slot_of,
)
from fabric.push.leases import Delivery
from tests.depth import examples


def _table(floor: int = 0, visibility_ms: int = 1000, max_receive_count: int = 3, **kw: int) -> KeySharedLeases:
    return KeySharedLeases(floor, visibility_ms=visibility_ms, max_receive_count=max_receive_count, **kw)


def _offsets(deliveries: list[Delivery]) -> list[int]:
    return [o for d in deliveries for o in range(d.start, d.end)]


def _slot(key: bytes) -> int:
    s = slot_of(key)
    assert s is not None
    return s


def _key_owned_by(t: KeySharedLeases, member: str, prefix: str = "k") -> bytes:
    """A key whose slot ``member`` owns now."""
    for i in range(10_000):
        key = f"{prefix}{i}".encode()
        if t.owner(_slot(key)) == member:
            return key
    raise AssertionError(f"no key owned by {member}")


def _colliding_keys() -> tuple[bytes, bytes]:
    """Two different keys in one slot."""
    seen: dict[int, bytes] = {}
    for i in range(100_000):
        key = b"c%d" % i
        s = slot_of(key)
        assert s is not None
        if s in seen:
            return seen[s], key
        seen[s] = key
    raise AssertionError("no collision")


def _join_until_owner(t: KeySharedLeases, key: bytes) -> str:
    """Join new members until one of them takes the slot of ``key``; returns that member."""
    for i in range(1000):
        t.join(f"n{i}")
        if t.owner(_slot(key)) == f"n{i}":
            return f"n{i}"
    raise AssertionError("no member took the slot")


def _pair(members: tuple[str, str] = ("a", "b")) -> tuple[KeySharedLeases, bytes, bytes]:
    """A table with two members and one key owned by each."""
    t = _table()
    for m in members:
        t.join(m)
    return t, _key_owned_by(t, members[0]), _key_owned_by(t, members[1])


# -- slots and the ring ----------------------------------------------------------------


def test_slot_of_is_stable_spread_and_checks_its_input():
    assert slot_of(None) is None
    assert (slot_of(b""), slot_of(b"a"), slot_of(b"user-42")) == (0, 50669, 4464)  # the hash is a contract
    assert ring_points("a", 3) == [13628, 32513, 20663]
    slots = [_slot(b"user-%d" % i) for i in range(20_000)]
    assert all(0 <= s < SLOTS for s in slots)
    quarters = Counter(s // (SLOTS // 4) for s in slots)
    assert all(4_500 < n < 5_500 for n in quarters.values())
    with pytest.raises(BadParameter):
        slot_of("text")  # type: ignore[arg-type]


def test_owner_is_the_member_with_the_first_point_at_or_after_the_slot():
    t = _table(virtual_points=8)
    assert t.owner(0) is None and t.members() == []
    for m in ("b", "a", "c"):
        t.join(m)
    ring = sorted((p, m) for m in "abc" for p in ring_points(m, 8))
    for slot in (0, 1, ring[0][0], ring[3][0], ring[3][0] + 1, ring[-1][0], ring[-1][0] + 1, SLOTS - 1):
        want = next((m for p, m in ring if p >= slot), ring[0][1])
        assert t.owner(slot) == want
    assert t.members() == ["a", "b", "c"]
    with pytest.raises(BadParameter):
        t.owner(SLOTS)


def test_a_join_or_leave_moves_only_that_members_share_of_slots():
    t = _table()
    for m in ("a", "b", "c"):
        t.join(m)
    before = [t.owner(s) for s in range(SLOTS)]
    t.join("d")
    after = [t.owner(s) for s in range(SLOTS)]
    moved = [s for s in range(SLOTS) if before[s] != after[s]]
    assert all(after[s] == "d" for s in moved)
    assert 0.1 < len(moved) / SLOTS < 0.4  # about a quarter
    t.leave("d", 0)
    assert [t.owner(s) for s in range(SLOTS)] == before
    t.leave("b", 0)
    gone = [s for s in range(SLOTS) if before[s] != t.owner(s)]
    assert gone and all(before[s] == "b" for s in gone)


def test_join_is_idempotent_and_checks_the_member():
    t = _table()
    t.join("a")
    t.join("a")
    assert t.members() == ["a"]
    for bad in ("", "x" * 257, 7):
        with pytest.raises(BadParameter):
            t.join(bad)  # type: ignore[arg-type]
    assert t.leave("nobody", 0) == 0


# -- offers --------------------------------------------------------------------------------


def test_offers_continue_offered_upto_and_are_checked_whole():
    t = _table(floor=5)
    assert (t.floor, t.offered_upto, t.pending) == (5, 5, 0)
    assert t.state(5) == "unoffered" and t.state(4) == "settled"
    t.offer([(5, b"k"), (6, None)])
    assert (t.floor, t.offered_upto, t.pending) == (5, 7, 2) and t.state(6) == "new"
    for bad in ([(8, b"k")], [(7, b"k"), (9, b"k")], [(7, "text")], [(7,)], [("7", b"k")]):
        with pytest.raises(BadParameter):
            t.offer(bad)  # type: ignore[arg-type]
    assert t.offered_upto == 7 and t.pending == 2  # nothing of a refused offer was taken
    t.offer([])
    assert t.offered_upto == 7
    t.verify()


def test_max_pending_refuses_offers_beyond_it():
    t = _table(max_pending=3)
    t.offer([(0, b"a"), (1, b"b")])
    with pytest.raises(BadParameter, match="max_pending"):
        t.offer([(2, b"a"), (3, b"b")])
    t.offer([(2, b"a")])
    assert t.pending == 3


# -- delivery -------------------------------------------------------------------------------


def test_each_key_goes_to_its_owner_and_keyless_messages_to_anyone():
    t, ka, kb = _pair()
    t.offer([(0, ka), (1, kb), (2, ka), (3, None), (4, kb), (5, None)])
    assert t.deliver("a", 0, 10) == [Delivery(0, 1, 1, 1000), Delivery(2, 4, 1, 1000), Delivery(5, 6, 1, 1000)]
    assert t.deliver("b", 0, 10) == [Delivery(1, 2, 1, 1000), Delivery(4, 5, 1, 1000)]
    assert t.holder_of_slot(_slot(ka)) == "a" and t.holder_of_slot(_slot(kb)) == "b"
    assert (t.in_flight, t.held("a"), t.held("b")) == (6, 4, 2)
    t.verify()


def test_deliver_takes_lowest_offsets_first_up_to_max_records():
    t = _table()
    t.join("a")
    keys = [b"x", b"y", None]
    t.offer([(o, keys[o % 3]) for o in range(12)])
    assert _offsets(t.deliver("a", 0, 5)) == [0, 1, 2, 3, 4]
    assert _offsets(t.deliver("a", 0, 0)) == []
    assert _offsets(t.deliver("a", 0, 100)) == list(range(5, 12))


def test_deliver_to_a_non_member_raises():
    t = _table()
    t.offer([(0, None)])
    with pytest.raises(UnknownMember):
        t.deliver("a", 0, 1)
    t.join("a")
    with pytest.raises(BadParameter):
        t.deliver("a", 0, -1)


def test_keys_sharing_a_slot_share_its_order():
    k1, k2 = _colliding_keys()
    t = _table()
    t.join("a")
    t.offer([(0, k1), (1, k2)])
    t.deliver("a", 0, 1)
    t.nack("a", 0, 1, 0, delay_ms=100)
    assert t.deliver("a", 0, 10) == []  # k2 waits behind k1's delayed redelivery
    assert _offsets(t.deliver("a", 100, 10)) == [0, 1]


# -- hand-over ------------------------------------------------------------------------------


def test_a_joining_owner_waits_until_the_old_holder_acks():
    t = _table()
    t.join("a")
    t.offer([(o, b"k") for o in range(4)])
    assert _offsets(t.deliver("a", 0, 2)) == [0, 1]
    new = _join_until_owner(t, b"k")
    assert t.owner(_slot(b"k")) == new and t.holder_of_slot(_slot(b"k")) == "a"
    assert t.deliver(new, 0, 10) == [] and t.deliver("a", 0, 10) == []  # draining: nobody gets more
    t.ack("a", 0, 1, 1)
    assert t.deliver(new, 1, 10) == []  # "a" still holds offset 1
    t.ack("a", 1, 2, 2)
    assert t.holder_of_slot(_slot(b"k")) is None
    assert _offsets(t.deliver(new, 2, 10)) == [2, 3]
    t.verify()


def test_expiry_hands_a_slot_over_and_redelivers_first():
    t = _table(visibility_ms=100)
    t.join("a")
    t.offer([(0, b"k"), (1, b"k")])
    t.deliver("a", 0, 1)
    new = _join_until_owner(t, b"k")
    assert t.deliver(new, 99, 10) == []
    assert t.next_deadline_ms() == 100
    assert t.deliver(new, 100, 10) == [Delivery(0, 1, 2, 200), Delivery(1, 2, 1, 200)]
    with pytest.raises(NotLeaseHolder, match=f"leased to '{new}'"):
        t.ack("a", 0, 1, 100)


def test_leave_releases_leases_at_once_to_the_new_owner():
    t, ka, kb = _pair()
    t.offer([(0, ka), (1, ka), (2, kb)])
    t.deliver("a", 0, 10)
    t.deliver("b", 0, 10)
    assert t.leave("a", 5) == 2
    assert t.members() == ["b"] and t.owner(_slot(ka)) == "b"
    assert (t.state(0), t.receive_count(0), t.redeliverable) == ("redeliverable", 1, 2)
    assert t.deliver("b", 5, 10) == [Delivery(0, 2, 2, 1005)]
    assert t.leave("a", 5) == 0
    t.verify()


def test_a_slot_held_by_its_owner_keeps_flowing_to_it():
    t = _table()
    t.join("a")
    t.offer([(0, b"k")])
    t.deliver("a", 0, 10)
    t.offer([(1, b"k"), (2, b"k")])
    assert _offsets(t.deliver("a", 0, 10)) == [1, 2]  # pipelining: the holder may hold several
    t.ack("a", 0, 3, 0)
    assert t.floor == 3 and t.holder_of_slot(_slot(b"k")) is None


# -- order -------------------------------------------------------------------------------


def test_a_nacked_message_goes_before_newer_ones_of_its_slot():
    t = _table()
    t.join("a")
    t.offer([(o, b"k") for o in range(3)])
    t.deliver("a", 0, 2)
    assert t.nack("a", 1, 2, 0) == 1
    assert t.deliver("a", 0, 10) == [Delivery(1, 2, 2, 1000), Delivery(2, 3, 1, 1000)]
    t.nack("a", 0, 3, 0)  # 0, 1 and 2 back: redelivered in offset order
    assert _offsets(t.deliver("a", 0, 10)) == [0, 1, 2]


def test_a_delayed_redelivery_blocks_its_slot_only():
    t = _table()
    t.join("a")
    t.offer([(0, b"k"), (1, b"k"), (2, b"other"), (3, None), (4, None)])
    t.deliver("a", 0, 10)
    t.nack("a", 0, 1, 10, delay_ms=500)
    t.nack("a", 3, 4, 10, delay_ms=500)
    t.ack("a", 1, 3, 10)
    t.ack("a", 4, 5, 10)
    t.offer([(5, b"k"), (6, b"other"), (7, None)])
    assert _offsets(t.deliver("a", 20, 10)) == [6, 7]  # k is blocked by 0; a keyless delay blocks nothing
    assert t.state(0) == "redeliverable" and t.next_deadline_ms() == 510
    assert t.deliver("a", 509, 10) == []
    assert t.deliver("a", 510, 10) == [Delivery(0, 1, 2, 1510), Delivery(3, 4, 2, 1510), Delivery(5, 6, 1, 1510)]


def test_a_delay_behind_a_redelivery_blocks_the_rest_of_its_slot():
    t = _table()
    t.join("a")
    t.offer([(0, b"k"), (1, b"k"), (2, b"k")])
    t.deliver("a", 0, 2)
    t.nack("a", 1, 2, 0, delay_ms=100)
    t.nack("a", 0, 1, 0)
    assert _offsets(t.deliver("a", 0, 10)) == [0]  # then 1 is delayed, and 2 waits behind it
    assert t.deliver("a", 99, 10) == []
    assert t.deliver("a", 100, 10) == [Delivery(1, 2, 2, 1100), Delivery(2, 3, 1, 1100)]
    t.verify()


def test_deliveries_split_by_receive_count_and_gaps():
    t = _table(max_receive_count=0)
    t.join("a")
    t.offer([(o, None) for o in range(6)])
    t.deliver("a", 0, 6)
    t.nack("a", 0, 3, 0)
    t.ack("a", 3, 4, 0)
    assert [(d.start, d.end, d.receive_count) for d in t.deliver("a", 0, 10)] == [(0, 3, 2)]
    t.nack("a", 1, 2, 0)
    t.nack("a", 4, 6, 0)
    assert [(d.start, d.end, d.receive_count) for d in t.deliver("a", 0, 10)] == [(1, 2, 3), (4, 6, 2)]


# -- the member's moves and their illegal forms -------------------------------------------


def test_ack_by_a_non_holder_raises_after_settling_its_own_part():
    t, ka, kb = _pair()
    t.offer([(0, ka), (1, ka), (2, kb), (3, ka)])
    t.deliver("a", 0, 2)
    t.deliver("b", 0, 10)
    with pytest.raises(NotLeaseHolder, match=r"ack of offset 2 by 'a': it is leased to 'b'"):
        t.ack("a", 0, 4, 1)
    assert (t.floor, t.state(1), t.holder(2)) == (2, "settled", "b")
    with pytest.raises(NotLeaseHolder, match=r"offset 3 .* never delivered"):
        t.ack("b", 2, 4, 1)
    with pytest.raises(NotLeaseHolder, match=r"offset 4 .* not offered yet"):
        t.ack("a", 4, 9, 1)
    assert t.ack("a", 0, 3, 1) == 0  # settled offsets are ignored, whoever asks
    t.verify()


def test_every_verb_names_the_state_of_what_it_may_not_touch():
    t = _table(max_receive_count=2)
    t.join("a")
    t.offer([(0, None), (1, None), (2, None)])
    t.deliver("a", 0, 3)
    t.nack("a", 0, 2, 0)
    assert _offsets(t.deliver("a", 0, 2)) == [0, 1]
    t.nack("a", 0, 1, 0)  # dead: received max_receive_count times
    t.change_visibility("a", 1, 2, 0, 0)
    t.nack("a", 2, 3, 0, delay_ms=50)
    for call, state in (
        (lambda: t.nack("a", 0, 1, 1), "dead"),
        (lambda: t.change_visibility("a", 1, 2, 1, 10), "dead"),
        (lambda: t.ack("a", 2, 3, 1), "redeliverable"),
    ):
        with pytest.raises(NotLeaseHolder, match=state):
            call()
    assert t.dead == 2 and t.redeliverable == 1


def test_empty_ranges_change_nothing():
    t = _table()
    t.join("a")
    t.offer([(0, b"k")])
    t.deliver("a", 0, 1)
    assert t.ack("b", 0, 0, 1) == 0 and t.nack("a", 1, 1, 1) == 0 and t.change_visibility("a", 0, 0, 1, 5) == 0
    assert t.settle(0, 0) == 0 and t.return_dead(0, 0) == 0 and t.in_flight == 1


def test_bad_arguments_raise_bad_parameter_and_change_nothing():
    t = _table()
    t.join("a")
    t.offer([(o, None) for o in range(10)])
    t.deliver("a", 0, 10)
    for call in (
        lambda: t.ack("a", -1, 3, 1),
        lambda: t.ack("a", 5, 3, 1),
        lambda: t.ack("", 0, 3, 1),
        lambda: t.nack("a", 0, 3, 1, delay_ms=-1),
        lambda: t.nack("a", 0, 3, 1, delay_ms=12 * 3600 * 1000 + 1),
        lambda: t.change_visibility("a", 0, 3, 1, -5),
        lambda: t.deliver("a", -1, 10),
        lambda: t.expire(2**62 + 1),
        lambda: t.settle(3, 2),
        lambda: t.take_dead(0, limit=0),
        lambda: t.state(-1),
        lambda: t.holder_of_slot(-1),
        lambda: _table(visibility_ms=0),
        lambda: _table(max_receive_count=-1),
        lambda: _table(virtual_points=0),
    ):
        with pytest.raises(BadParameter):
            call()
    assert t.in_flight == 10 and t.floor == 0


def test_change_visibility_extends_or_gives_back():
    t = _table(visibility_ms=100)
    t.join("a")
    t.offer([(0, b"k"), (1, b"k")])
    t.deliver("a", 0, 2)
    assert t.change_visibility("a", 0, 1, 50, 500) == 1
    assert t.next_deadline_ms() == 100
    assert t.expire(100) == 1 and t.state(0) == "leased" and t.state(1) == "redeliverable"
    assert t.next_deadline_ms() == 550
    assert t.deliver("a", 100, 5) == [Delivery(1, 2, 2, 200)]  # "a" still holds the slot
    assert t.change_visibility("a", 0, 2, 150, 0) == 2
    assert t.in_flight == 0 and _offsets(t.deliver("a", 150, 5)) == [0, 1]


def test_expiry_releases_and_a_late_ack_fails():
    t = _table(visibility_ms=100)
    t.join("a")
    t.offer([(0, None), (1, b"k")])
    t.deliver("a", 0, 5)
    assert t.expire(99) == 0 and t.expire(100) == 2
    assert t.next_deadline_ms() is None and t.redeliverable == 2
    with pytest.raises(NotLeaseHolder, match="redeliverable"):
        t.ack("a", 0, 2, 101)


# -- dead letters and settling ------------------------------------------------------------


def test_dead_letters_are_reported_once_then_settled():
    t = _table(max_receive_count=2, visibility_ms=10)
    t.join("a")
    t.offer([(0, b"k"), (1, b"k"), (2, None)])
    t.deliver("a", 0, 3)
    t.nack("a", 0, 3, 0)
    assert t.receive_count(0) == 1
    t.deliver("a", 0, 3)
    assert t.expire(10) == 3 and t.dead == 3 and t.in_flight == 0
    assert t.deliver("a", 10, 10) == []
    assert t.take_dead(10, limit=1) == [(0, 3, 2)] and t.take_dead(10) == []
    assert t.return_dead(1, 2) == 1 and t.take_dead(10) == [(1, 2, 2)]
    assert t.state(1) == "dead" and t.settle(0, 3) == 3
    assert (t.floor, t.dead, t.pending) == (3, 0, 0)
    t.verify()


def test_max_receive_count_zero_never_dead_letters():
    t = _table(max_receive_count=0)
    t.join("a")
    t.offer([(0, b"k")])
    for i in range(20):
        assert t.deliver("a", 0, 1) == [Delivery(0, 1, i + 1, 1000)]
        t.nack("a", 0, 1, 0)
    assert t.dead == 0


def test_settle_works_in_every_state_and_frees_slots():
    t, ka, kb = _pair()
    t.offer([(0, ka), (1, ka), (2, kb), (3, None)])
    t.deliver("a", 0, 1)
    t.deliver("b", 0, 1)
    assert t.settle(0, 3) == 3  # a lease, a new message and a lease
    assert t.holder_of_slot(_slot(ka)) is None and t.in_flight == 0
    assert t.floor == 3 and t.settle(0, 3) == 0
    t.verify()


def test_settling_offsets_not_offered_yet_skips_them():
    t = _table()
    t.join("a")
    t.offer([(0, b"k")])
    assert t.settle(2, 5) == 3 and t.state(3) == "settled" and t.offered_upto == 1
    t.offer([(1, b"k"), (2, b"k"), (3, None), (4, b"k")])  # offers may still carry them: they stay settled
    assert t.offered_upto == 5 and t.pending == 2 and t.state(2) == "settled"
    assert _offsets(t.deliver("a", 0, 10)) == [0, 1]
    assert t.settle(5, 8) == 3 and t.offered_upto == 8  # a span at offered_upto is skipped at once
    t.ack("a", 0, 2, 0)
    assert t.floor == 8 and t.pending == 0
    assert t.settle(100, 200) == 100 and t.floor == 8
    t.verify()


# -- snapshots --------------------------------------------------------------------------


def test_snapshot_restore_then_offer_again_from_the_floor():
    t = _table(max_receive_count=3)
    t.join("a")
    keys = [b"k", b"j", None, b"k", b"j", None, b"k", b"k"]
    t.offer(list(enumerate(keys)))
    t.deliver("a", 0, 6)
    t.ack("a", 1, 2, 0)
    t.nack("a", 2, 3, 0, delay_ms=100)
    t.settle(20, 22)
    snap = json.loads(json.dumps(t.snapshot()))
    assert snap["floor"] == 0 and snap["settled"] == [[1, 2], [20, 22]] and snap["counts"] == [[0, 1, 1], [2, 6, 1]]
    r = KeySharedLeases.restore(snap, visibility_ms=1000, max_receive_count=3)
    assert (r.floor, r.offered_upto, r.pending, r.members()) == (0, 0, 0, [])
    assert r.snapshot() == snap
    r.offer(list(enumerate(keys)))
    assert [r.state(o) for o in range(8)] == ["redeliverable", "settled"] + ["redeliverable"] * 4 + ["new"] * 2
    assert r.receive_count(5) == 1 and r.redeliverable == 5
    r.join("b")
    assert r.deliver("b", 0, 10) == [Delivery(0, 1, 2, 1000), Delivery(2, 6, 2, 1000), Delivery(6, 8, 1, 1000)]
    r.verify()


def test_restored_counts_at_the_limit_come_back_dead():
    t = _table(max_receive_count=2)
    t.join("a")
    t.offer([(0, b"k"), (1, b"k")])
    t.deliver("a", 0, 2)
    t.nack("a", 0, 2, 0)
    t.deliver("a", 0, 1)
    snap = t.snapshot()
    r = KeySharedLeases.restore(snap, visibility_ms=1000, max_receive_count=2)
    r.offer([(0, b"k"), (1, b"k")])
    assert r.take_dead(0) == [(0, 1, 2)] and r.state(1) == "redeliverable"
    lenient = KeySharedLeases.restore(snap, visibility_ms=1000, max_receive_count=0)
    lenient.offer([(0, b"k")])
    assert lenient.state(0) == "redeliverable"


def test_bad_snapshots_raise_bad_parameter():
    good = _table().snapshot()
    for bad in (
        {},
        {**good, "version": 2},
        {**good, "kind": "queue"},
        {**good, "floor": -1},
        {**good, "settled": [[0, 3]]},
        {**good, "settled": "x"},
        {**good, "counts": [[0, 2, 0]]},
        {**good, "counts": [[3, 5, 1], [4, 6, 1]]},
        {**good, "counts": [[1, 2, 1]], "settled": [[1, 3]]},
        {**good, "counts": [[1, 2]]},
        {**good, "counts": None},
    ):
        with pytest.raises(BadParameter):
            KeySharedLeases.restore(bad, visibility_ms=1000, max_receive_count=3)


# -- internals -------------------------------------------------------------------------


def test_the_transition_table_refuses_illegal_moves():
    t = _table()
    t.offer([(0, None)])
    msg = t._msgs[0]
    with pytest.raises(InternalError, match="illegal event 'ack' in state 'new'"):
        t._step(0, msg, MessageEvent.ACK, MessageState.SETTLED)
    assert (MessageState.NEW, MessageEvent.NACK) not in MESSAGE_TRANSITIONS
    assert msg.state is MessageState.NEW


def test_verify_catches_two_holders_of_one_slot():
    t = _table()
    t.join("a")
    t.join("b")
    t.offer([(0, b"k"), (1, b"k")])
    owner = t.owner(_slot(b"k"))
    t.deliver(owner, 0, 1)  # type: ignore[arg-type]
    t.verify()
    t._msgs[1].state, t._msgs[1].member, t._msgs[1].rc = MessageState.LEASED, "ab".replace(owner, ""), 1  # type: ignore[arg-type]
    with pytest.raises(InternalError):
        t.verify()


def test_100k_messages_1000_keys_4_members_is_fast():
    t = _table(visibility_ms=60_000)
    members = ["m1", "m2", "m3", "m4"]
    for m in members:
        t.join(m)
    rng = random.Random(7)
    keys = [b"key-%d" % i for i in range(1000)]
    records = [(o, keys[rng.randrange(1000)]) for o in range(100_000)]
    began = time.perf_counter()
    for i in range(0, len(records), 5_000):
        t.offer(records[i : i + 5_000])
    got: dict[str, list[Delivery]] = {m: [] for m in members}
    for _ in range(100):
        for m in members:
            got[m] += t.deliver(m, 1, 2_000)
        if t.in_flight == 100_000:
            break
    elapsed = time.perf_counter() - began
    assert t.in_flight == 100_000 and t.pending == 100_000
    holders: dict[bytes, set[str]] = {}
    for m, ds in got.items():
        for o in _offsets(ds):
            holders.setdefault(records[o][1], set()).add(m)
    assert all(len(h) == 1 for h in holders.values())
    assert all(len(ds) > 0 for ds in got.values())
    # ~0.5 s on a laptop; the bound only catches a quadratic path (speed is measured by the
    # benchmarks, not asserted: 3.0 s failed once beside other test suites on 2 cores)
    assert elapsed < 15.0, f"offer + deliver of 100k took {elapsed:.2f} s"


# -- the state machine -----------------------------------------------------------------

MEMBERS = ["m1", "m2", "m3"]
K1, K2 = _colliding_keys()
KEYS = [b"x", b"y", K1, K2, None]  # K1 and K2 share a slot


@functools.cache
def ring_owner(members: frozenset[str], virtual_points: int, slot: int) -> str | None:
    """The model's ring: the member with the first point at or after the slot, wrapping; ties by member id."""
    ring = sorted((p, m) for m in members for p in ring_points(m, virtual_points))
    return next((m for p, m in ring if p >= slot), ring[0][1] if ring else None)


NAMES = {"waiting": "redeliverable", "taken": "dead"}


@dataclass
class Rec:
    key: bytes | None
    state: str = "new"  # new, leased, waiting (ready or delayed), dead, taken, settled
    rc: int = 0
    holder: str | None = None
    deadline: int = 0
    not_before: int = 0

    @property
    def slot(self) -> int:
        """The key's slot; -1 for a keyless message."""
        return -1 if self.key is None else _slot(self.key)


class KeySharedMachine(RuleBasedStateMachine):
    """Drives KeySharedLeases and a dict of offsets side by side; they must agree after every step."""

    @initialize(
        visibility_ms=st.sampled_from([1, 30, 250, 1000, 1000]),
        max_receive_count=st.integers(0, 3),
        floor=st.integers(0, 3),
        virtual_points=st.sampled_from([1, 2, 64]),
        members=st.lists(st.sampled_from(MEMBERS), min_size=1, max_size=3, unique=True),
    )
    def start(self, visibility_ms, max_receive_count, floor, virtual_points, members):
        self.vis, self.max_rc, self.vp = visibility_ms, max_receive_count, virtual_points
        self.t = KeySharedLeases(
            floor, visibility_ms=visibility_ms, max_receive_count=max_receive_count, virtual_points=virtual_points
        )
        self.recs: dict[int, Rec] = {o: Rec(None, "settled") for o in range(floor)}
        self.upto = floor  # offered_upto
        self.members: set[str] = set()
        for m in members:
            self.t.join(m)
            self.members.add(m)
        self.now = 0
        self.synced = 0  # now_ms of the last call that expired leases and ended delays

    # -- the model ------------------------------------------------------------------

    def state(self, o: int) -> str:
        if o in self.recs:
            return self.recs[o].state
        return "unoffered"

    def floor(self) -> int:
        o = 0
        while o < self.upto and self.state(o) == "settled":
            o += 1
        return o

    def skip_settled(self) -> None:
        while self.state(self.upto) == "settled":
            self.upto += 1

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

    def slot_offsets(self, slot: int) -> list[int]:
        return sorted(o for o, r in self.recs.items() if r.key is not None and r.slot == slot)

    def slot_holders(self, slot: int) -> set[str]:
        return {h for o in self.slot_offsets(slot) if (h := self.recs[o].holder) is not None}

    def takeable(self, member: str) -> list[int]:
        """What ``member`` may take now, lowest first: keyless ready messages, and per slot it owns and
        nobody else holds, the oldest waiting messages up to the first one still delayed."""
        out: list[int] = []
        slots: set[int] = set()
        for o, r in self.recs.items():
            ready = r.state == "new" or (r.state == "waiting" and r.not_before <= self.now)
            if r.key is None and ready:
                out.append(o)
            elif r.key is not None:
                slots.add(r.slot)
        for s in slots:
            if self.owner(s) != member or not self.slot_holders(s) <= {member}:
                continue
            for o in self.slot_offsets(s):
                r = self.recs[o]
                if r.state == "new" or (r.state == "waiting" and r.not_before <= self.now):
                    out.append(o)
                elif r.state == "waiting":
                    break  # a delayed redelivery blocks its slot
        return sorted(out)

    def owner(self, slot: int) -> str | None:
        return ring_owner(frozenset(self.members), self.vp, slot)

    def held_by(self, member: str) -> list[int]:
        return [o for o, r in self.recs.items() if r.state == "leased" and r.holder == member]

    def pick_range(self, data, member: str) -> tuple[int, int]:
        held = sorted(self.held_by(member))
        if held and data.draw(st.integers(0, 3)):
            s = e = data.draw(st.sampled_from(held))
            while self.state(e) == "settled" or (self.state(e) == "leased" and self.recs[e].holder == member):
                e += 1
            return s, data.draw(st.integers(s + 1, e))
        s = data.draw(st.integers(0, self.upto + 2))
        return s, s + data.draw(st.integers(0, 8))

    def member_move(self, member: str, s: int, e: int, act) -> tuple[int, int | None]:
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
        return n, bad

    def call(self, fn, n: int, bad: int | None) -> None:
        if bad is None:
            assert fn() == n
        else:
            with pytest.raises(NotLeaseHolder, match=f"offset {bad} "):
                fn()

    # -- rules ------------------------------------------------------------------------

    @rule(member=st.sampled_from(MEMBERS))
    def join_or_leave(self, member):
        """A member joins, or leaves if it is in the group: its leases are released at once."""
        if member not in self.members:
            self.t.join(member)
            self.members.add(member)
            return
        got = self.t.leave(member, self.now)
        self.expire()
        mine = self.held_by(member)
        for o in mine:
            self.release(o, self.now)
        self.members.discard(member)
        assert got == len(mine)

    @rule(data=st.data())
    def join_stealing_a_held_slot(self, data):
        """A member joins whose arc takes a slot someone holds leases on: the slot must drain first."""
        held = sorted({r.slot for r in self.recs.values() if r.state == "leased" and r.key is not None})
        outside = [m for m in MEMBERS if m not in self.members]
        thieves = sorted(
            {m for m in outside for s in held if ring_owner(frozenset(self.members | {m}), self.vp, s) == m}
        )
        if thieves:
            member = data.draw(st.sampled_from(thieves))
            self.t.join(member)
            self.members.add(member)

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6))
    def offer(self, keys):
        records = [(self.upto + i, k) for i, k in enumerate(keys)]
        self.t.offer(records)
        for o, k in records:
            if self.state(o) != "settled":
                self.recs[o] = Rec(k)
        self.upto += len(records)
        self.skip_settled()

    @rule(dt=st.sampled_from([0, 1, 5, 20, 60, 200]))
    def advance_time(self, dt):
        self.now += dt

    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(1, 8))
    def deliver_more(self, member, max_records):
        """Deliveries drawn twice as often as other moves: they are what every other move acts on."""
        self.deliver(member, max_records)

    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(1, 8))
    def deliver(self, member, max_records):
        if member not in self.members:
            with pytest.raises(UnknownMember):
                self.t.deliver(member, self.now, max_records)
            return
        got = self.t.deliver(member, self.now, max_records)
        self.expire()
        want = self.takeable(member)[:max_records]
        assert _offsets(got) == want
        for o in want:
            r = self.recs[o]
            r.state, r.holder, r.deadline, r.rc = "leased", member, self.now + self.vis, r.rc + 1
        for d in got:
            assert d.deadline_ms == self.now + self.vis
            assert all(self.recs[o].rc == d.receive_count for o in range(d.start, d.end))
        for o in want:  # per-key order: everything older of the slot is done or with this member
            if self.recs[o].key is None:
                continue
            for older in self.slot_offsets(self.recs[o].slot):
                if older < o:
                    r = self.recs[older]
                    assert r.state in ("settled", "dead", "taken") or (r.state == "leased" and r.holder == member)

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

    @rule(
        op=st.sampled_from(["expire_leases", "return_dead", "settle", "restart"]),
        data=st.data(),
    )
    def rarer_move(self, op, data):
        """The moves that tear things down, folded into one rule so building moves are drawn more often."""
        getattr(self, op)(data)

    def expire_leases(self, data):
        assert self.t.expire(self.now) == self.expire()

    @rule(settle_now=st.booleans(), limit=st.sampled_from([1, 1024]))
    def take_dead(self, settle_now, limit):
        got = self.t.take_dead(self.now, limit)
        self.expire()
        dead = {o: r.rc for o, r in self.recs.items() if r.state == "dead"}
        reported = {o: rc for s, e, rc in got for o in range(s, e)}
        assert reported.items() <= dead.items() and (limit == 1 or reported == dead)
        assert [s for s, _, _ in got] == sorted(s for s, _, _ in got) and (not got or got[0][0] == min(dead))
        for o in reported:
            self.recs[o].state = "taken"
        if settle_now:
            for s, e, _ in got:
                self.t.settle(s, e)
            for o in reported:
                self.recs[o].state = "settled"

    def return_dead(self, data):
        s = data.draw(st.integers(0, self.upto))
        e = s + data.draw(st.integers(0, 10))
        taken = [o for o in range(s, e) if self.state(o) == "taken"]
        for o in taken:
            self.recs[o].state = "dead"
        assert self.t.return_dead(s, e) == len(taken)

    def settle(self, data):
        s = data.draw(st.integers(0, self.upto + 5))
        e = s + data.draw(st.integers(0, 6))
        fresh = [o for o in range(s, e) if self.state(o) != "settled"]
        for o in fresh:
            old = self.recs.get(o)
            self.recs[o] = Rec(old.key if old is not None else None, "settled")
        self.skip_settled()
        assert self.t.settle(s, e) == len(fresh)

    def restart(self, data):
        """Snapshot, restore, offer the log again from the floor and rejoin: the node after a crash."""
        snap = json.loads(json.dumps(self.t.snapshot()))
        self.t = KeySharedLeases.restore(
            snap, visibility_ms=self.vis, max_receive_count=self.max_rc, virtual_points=self.vp
        )
        assert self.t.snapshot() == snap and self.t.offered_upto == self.t.floor == self.floor()
        while self.t.offered_upto < self.upto:  # the caller reads on from offered_upto, a few at a time
            pos = self.t.offered_upto
            self.t.offer([(o, self.recs[o].key) for o in range(pos, min(pos + 3, self.upto))])
        for m in sorted(self.members):
            self.t.join(m)
        for r in self.recs.values():
            if r.state not in ("settled", "new"):
                r.holder = None
                r.state = "dead" if 0 < self.max_rc <= r.rc else "waiting"
                r.not_before = 0

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self):
        t = self.t
        t.verify()
        assert (t.floor, t.offered_upto) == (self.floor(), self.upto)
        assert t.members() == sorted(self.members)
        for s in {r.slot for r in self.recs.values() if r.key is not None}:
            assert t.owner(s) == self.owner(s)
        for o in range(self.upto + 8):
            st_ = self.state(o)
            assert t.state(o) == NAMES.get(st_, st_), o
            r = self.recs.get(o)
            assert t.holder(o) == (r.holder if r is not None else None)
            assert t.receive_count(o) == (r.rc if r is not None and st_ != "settled" else 0)
        states = Counter(r.state for r in self.recs.values())
        assert (t.in_flight, t.redeliverable, t.dead) == (
            states["leased"],
            states["waiting"],
            states["dead"] + states["taken"],
        )
        assert t.pending == sum(n for s, n in states.items() if s != "settled")
        for m in MEMBERS:
            assert t.held(m) == len(self.held_by(m))
        times = [r.deadline for r in self.recs.values() if r.state == "leased"]
        times += [r.not_before for r in self.recs.values() if r.state == "waiting" and r.not_before > self.synced]
        assert t.next_deadline_ms() == (min(times) if times else None)

    @invariant()
    def one_holder_per_slot_and_order_per_slot(self):
        if not hasattr(self, "t"):
            return
        for s in {r.slot for r in self.recs.values() if r.key is not None}:
            holders = self.slot_holders(s)
            assert len(holders) <= 1
            assert self.t.holder_of_slot(s) == (next(iter(holders)) if holders else None)
            leased = [o for o in self.slot_offsets(s) if self.recs[o].state == "leased"]
            new = [o for o in self.slot_offsets(s) if self.recs[o].state == "new"]
            assert not leased or not new or max(leased) < min(new)  # nothing leased past a never-delivered one


KeySharedMachine.TestCase.settings = settings(
    max_examples=examples(150), stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestKeySharedMachine = KeySharedMachine.TestCase


def test_an_ack_that_hands_a_key_over_says_so() -> None:
    """The owner changed while the old member held the key's messages: the old holder's ack is
    the hand-over, and ``handed_over`` tells the node to wake the new owner (nothing else will).
    An ack that hands nothing over says False."""
    t = _table()
    t.join("a")
    keys = [b"k%d" % i for i in range(16)]
    t.offer([(o, keys[o % 16]) for o in range(64)])
    held = _offsets(t.deliver("a", 0, 16))  # the first message of every key, held by a
    assert held == list(range(16))
    t.join("b")
    moved = [o for o in held if t.owner(_slot(keys[o % 16])) == "b"]
    kept = [o for o in held if o not in moved]
    assert moved and kept, "the join moved none or all of the keys; pick other keys"
    # b owns the moved keys now but may not take them while a holds their first messages
    assert not {o % 16 for o in _offsets(t.deliver("b", 0, 64))} & {o % 16 for o in moved}
    t.ack("a", kept[0], kept[0] + 1, 0)
    assert not t.handed_over  # a still owns that key: nobody else to wake
    for o in moved:
        t.ack("a", o, o + 1, 0)
    assert t.handed_over
    assert {o % 16 for o in _offsets(t.deliver("b", 0, 64))} >= {o % 16 for o in moved}
