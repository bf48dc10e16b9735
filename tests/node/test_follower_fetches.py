"""The follower's fetch scheduling as a state machine, driven by hand: a clock set by the test,
a peer send that records frames (or refuses them), answers made up here. No broker, no store,
no sockets."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from fabric.cluster.epochs import LeaderEpochCache
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.replica import FollowerReplica
from fabric.errors import InternalError, NotLeader, OffsetOutOfRange
from fabric.node.follower_fetches import (
    FETCH_BACKOFF_MS,
    FETCH_RETRY_MS,
    FETCH_WAIT_IDLE_MAX_MS,
    FETCH_WAIT_MS,
    LINK_PROBE_MS,
    TRANSITIONS,
    FetchEvent,
    FetchState,
    FollowerFetch,
    FollowerFetches,
)
from fabric.node.roles import Role
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op

KEY = ("q", 0)
BUDGET = 1000


class World:
    """One follower ("b") of ``q/0`` led by "a", and the FollowerFetches that schedules it."""

    def __init__(self) -> None:
        self.now = 0
        self.sent: list[tuple[str, dict[str, Any], int]] = []  # (peer, params, request id)
        self.pipe_open = True
        self.hot: set[tuple[str, int]] = set()
        self.roles: dict[tuple[str, int], Role] = {}
        ids = itertools.count(1)
        self.ff = FollowerFetches(self.roles, "b", self._send, ids.__next__, lambda: self.now, self.hot)
        self.role = self.new_role()

    def new_role(self) -> Role:
        record = PartitionRecord(("a", "b"), "a", 1, ("a", "b"), 1)
        epochs = LeaderEpochCache()
        role = Role(record, epochs)
        role.follower = FollowerReplica("b", "a", 1, log_end=0, high_watermark=0, epochs=epochs)
        role.fetch = FollowerFetch()
        self.roles[KEY] = role
        self.hot.add(KEY)  # as Replication.apply marks a new role
        return role

    def _send(self, peer: str, frames: list[Any]) -> bool:
        if not self.pipe_open:
            return False
        msg = fr.decode(frames)
        self.sent.append((peer, msg.params, msg.header.request_id))
        return True

    @property
    def fetch(self) -> FollowerFetch:
        assert self.role.fetch is not None
        return self.role.fetch

    def pass_(self, now: int) -> None:
        """What Replication.tick does for followers: answered ones, timers, the hot ones."""
        self.now = now
        self.ff.send_answered(now, BUDGET)
        self.ff.fire_timers(now, BUDGET, lambda k, t: self.ff.visit(k, self.roles[k], t))
        for key in list(self.hot):
            self.ff.visit(key, self.roles[key], now)

    def take(self) -> list[tuple[str, dict[str, Any], int]]:
        out, self.sent = self.sent, []
        return out

    def answer(self, rid: int, *, status: int = 0, data: bytes = b"") -> tuple[Any, ...] | None:
        params: dict[str, Any] = (
            {"message": "no"}
            if status
            else {"high_watermark": 0, "log_start_offset": 0, "leader_epoch": 1, "diverging": None}
        )
        header = fr.Header(Op.REPLICA_FETCH, rid, fr.FLAG_REPLY, status)
        return self.ff.on_answer(fr.encode(header, params, [data] if data else []))


@pytest.fixture
def world() -> World:
    return World()


@pytest.mark.parametrize("state", list(FetchState))
@pytest.mark.parametrize("event", list(FetchEvent))
def test_every_pair_moves_by_the_table_or_raises_naming_both(state: FetchState, event: FetchEvent) -> None:
    fetch = FollowerFetch(state=state)
    nxt = TRANSITIONS.get((state, event))
    if nxt is None:
        with pytest.raises(InternalError) as exc:
            fetch.move(event)
        assert state.value in str(exc.value) and event.value in str(exc.value)
        assert fetch.state is state
    else:
        fetch.move(event)
        assert fetch.state is nxt


def test_every_state_can_be_left_and_reached() -> None:
    sources = {s for s, _ in TRANSITIONS}
    targets = set(TRANSITIONS.values())
    assert sources == targets == set(FetchState)


def test_a_new_follower_fetches_at_once_and_the_next_goes_when_it_is_answered(world: World) -> None:
    world.pass_(0)
    [(peer, params, rid)] = world.take()
    assert peer == "a" and params["fetch_offset"] == 0 and params["replica"] == "b"
    assert FETCH_WAIT_IDLE_MAX_MS * 3 // 4 <= params["wait_ms"] <= FETCH_WAIT_IDLE_MAX_MS  # idle, jittered
    assert world.fetch.state is FetchState.IN_FLIGHT and KEY not in world.hot
    world.pass_(5)
    assert world.take() == []  # one in flight at a time
    world.now = 7
    assert world.answer(rid) is not None
    assert world.fetch.state is FetchState.READY
    world.pass_(7)
    assert len(world.take()) == 1 and world.fetch.state is FetchState.IN_FLIGHT


def test_a_fetch_without_an_answer_is_sent_again_by_its_timer_with_a_longer_wait(world: World) -> None:
    world.fetch.wait_ms = FETCH_WAIT_MS  # as a busy partition's
    world.pass_(0)
    [(_, params, rid)] = world.take()
    assert params["wait_ms"] == FETCH_WAIT_MS
    world.pass_(FETCH_WAIT_MS + FETCH_RETRY_MS)  # not yet
    assert world.take() == []
    world.pass_(FETCH_WAIT_MS + FETCH_RETRY_MS + 1)
    [(_, again, rid2)] = world.take()
    assert again["wait_ms"] == 2 * FETCH_WAIT_MS and rid2 != rid
    assert world.answer(rid) is None  # the forgotten one's answer, late: ignored
    assert world.fetch.state is FetchState.IN_FLIGHT and world.fetch.id == rid2


def test_a_refused_fetch_backs_off_then_goes_again(world: World) -> None:
    world.pass_(0)
    [(_, _, rid)] = world.take()
    world.now = 50
    assert world.answer(rid, status=NotLeader.code) is None
    assert world.fetch.state is FetchState.BACKING_OFF and KEY in world.hot
    world.pass_(50 + FETCH_BACKOFF_MS - 1)
    assert world.take() == [] and world.fetch.state is FetchState.BACKING_OFF
    world.pass_(50 + FETCH_BACKOFF_MS)
    assert len(world.take()) == 1 and world.fetch.state is FetchState.IN_FLIGHT and KEY not in world.hot


def test_out_of_range_with_the_leaders_log_start_is_an_answer_and_the_next_fetch_goes_at_once(world: World) -> None:
    world.pass_(0)
    [(_, _, rid)] = world.take()
    header = fr.Header(Op.REPLICA_FETCH, rid, fr.FLAG_REPLY, OffsetOutOfRange.code)
    got = world.ff.on_answer(fr.encode(header, {"message": "below", "log_start_offset": 30}))
    assert got is not None and got[1].params["log_start_offset"] == 30  # the replication resets the copy
    assert world.fetch.state is FetchState.READY and KEY not in world.hot
    world.pass_(1)
    [(_, _, rid2)] = world.take()
    assert world.answer(rid2, status=OffsetOutOfRange.code) is None  # no log start in it: a refusal
    assert world.fetch.state is FetchState.BACKING_OFF


def test_a_full_pipe_backs_off_instead_of_spinning(world: World) -> None:
    world.pipe_open = False
    world.pass_(0)
    assert world.fetch.state is FetchState.BACKING_OFF and world.fetch.retry_at_ms == FETCH_BACKOFF_MS
    world.pipe_open = True
    world.pass_(FETCH_BACKOFF_MS // 2)
    assert world.take() == []
    world.pass_(FETCH_BACKOFF_MS)
    assert len(world.take()) == 1


def test_a_link_down_holds_the_fetch_until_it_is_up(world: World) -> None:
    world.ff.on_link("a", False)
    world.pass_(0)
    assert world.take() == [] and world.fetch.state is FetchState.AWAITING_LINK
    world.pass_(LINK_PROBE_MS - 1)
    assert world.take() == []
    world.ff.on_link("a", True)
    assert world.fetch.state is FetchState.READY
    world.pass_(LINK_PROBE_MS)
    assert len(world.take()) == 1


def test_a_fetch_in_flight_on_a_link_that_broke_is_forgotten_and_sent_when_it_is_back(world: World) -> None:
    world.pass_(0)
    [(_, _, rid)] = world.take()
    world.now = 10
    world.ff.on_link("a", False)
    assert world.fetch.state is FetchState.AWAITING_LINK and rid not in world.ff.fetch_ids
    assert world.answer(rid) is None  # came through after all: ignored
    world.pass_(20)
    assert world.take() == []
    world.ff.on_link("a", True)
    world.pass_(30)
    assert len(world.take()) == 1 and world.fetch.state is FetchState.IN_FLIGHT


def test_a_link_down_longer_than_the_probe_time_is_tried_anyway(world: World) -> None:
    world.ff.on_link("a", False)  # its "up" never comes
    world.pass_(0)
    assert world.fetch.state is FetchState.AWAITING_LINK
    world.ff.visit(KEY, world.role, LINK_PROBE_MS)  # as the safety pass looks at every role
    assert len(world.take()) == 1 and world.fetch.state is FetchState.IN_FLIGHT


def test_an_answer_to_a_fetch_the_log_moved_past_is_not_applied(world: World) -> None:
    world.pass_(0)
    [(_, _, rid)] = world.take()
    world.role.epochs.assign(1, 0)  # the log moved (a batch of epoch 1) since it went out
    world.now = 5
    assert world.answer(rid) is None
    assert world.fetch.state is FetchState.READY and KEY in world.ff.fetch_now


def test_the_wait_doubles_when_idle_and_halves_after_two_answers_with_data(world: World) -> None:
    fetch = world.fetch
    fetch.wait_ms = 8 * FETCH_WAIT_MS
    world.ff.after_answer(fetch, True, 10)
    assert fetch.wait_ms == 8 * FETCH_WAIT_MS  # one answer with data: no change
    world.ff.after_answer(fetch, True, 10)
    assert fetch.wait_ms == 4 * FETCH_WAIT_MS
    world.ff.after_answer(fetch, False, 10)  # empty, early: news of the high watermark
    assert fetch.wait_ms == 4 * FETCH_WAIT_MS
    world.ff.after_answer(fetch, False, 4 * FETCH_WAIT_MS)  # empty after the whole wait: idle
    assert fetch.wait_ms == 8 * FETCH_WAIT_MS
    fetch.wait_ms = FETCH_WAIT_MS
    for _ in range(3):
        world.ff.after_answer(fetch, True, 1)
    assert fetch.wait_ms == FETCH_WAIT_MS  # never below


@pytest.mark.parametrize("seed", range(20))
def test_random_events_keep_one_fetch_in_flight_and_its_bookkeeping_straight(seed: int) -> None:
    """Sends, answers, refusals, lost answers, links going down and up, a full pipe, time
    passing, in a seeded random order: after every step the state says what the bookkeeping
    holds (IN_FLIGHT <=> one entry in fetch_ids <=> a send time), and a fetch goes again within
    the bounds the module promises."""
    rnd = random.Random(seed)
    w = World()
    w.fetch.wait_ms = FETCH_WAIT_MS
    in_flight: list[int] = []
    last_sent = 0
    for _ in range(300):
        step = rnd.choice(["pass", "answer", "refuse", "lose", "down", "up", "pipe"])
        now = w.now + rnd.choice([0, 1, 50, FETCH_BACKOFF_MS, FETCH_WAIT_MS, FETCH_WAIT_MS + FETCH_RETRY_MS + 1])
        w.now = now
        if step == "answer" and in_flight:
            w.answer(in_flight.pop())
        elif step == "refuse" and in_flight:
            w.answer(in_flight.pop(), status=NotLeader.code)
        elif step == "lose" and in_flight:
            in_flight.pop()
        elif step == "down":
            w.ff.on_link("a", False)
        elif step == "up":
            w.ff.on_link("a", True)
        elif step == "pipe":
            w.pipe_open = not w.pipe_open
        w.pass_(now)
        for _, _, rid in w.take():
            in_flight.append(rid)
            last_sent = now
        fetch = w.fetch
        ids = [rid for rid, key in w.ff.fetch_ids.items() if key == KEY]
        if fetch.state is FetchState.IN_FLIGHT:
            assert ids == [fetch.id] and fetch.sent_ms >= 0 and fetch.req is not None and fetch.timer_due
        else:
            assert ids == [] and fetch.sent_ms < 0 and fetch.req is None
        if fetch.state is FetchState.BACKING_OFF:
            assert KEY in w.hot and fetch.retry_at_ms > now
        assert fetch.state is not FetchState.READY, "a READY fetch is sent by the pass that follows"
        if w.pipe_open and "a" not in w.ff.links_down and fetch.state is not FetchState.BACKING_OFF:
            assert fetch.state is FetchState.IN_FLIGHT
            assert now - last_sent <= fetch.sent_wait_ms + FETCH_RETRY_MS + 1
