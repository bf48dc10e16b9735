"""LeaderReplica and FollowerReplica: one test per rule, then the seeded model of three replicas
(tests/cluster/repl_model.py) over many seeds, and planted bugs that the model must catch."""

from __future__ import annotations

import pytest

from fabric.cluster import replica as R
from fabric.cluster.epochs import LeaderEpochCache
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.replica import FetchDecision, FetchRequest, FollowerReplica, LeaderReplica
from fabric.errors import BadParameter, FencedLeaderEpoch, NotLeader, OffsetOutOfRange
from tests.cluster.repl_model import Violation, run

REC = PartitionRecord(("a", "b", "c"), "a", 2, ("a", "b", "c"), 5)
LAG = 100


def leader(
    record: PartitionRecord = REC,
    *,
    log_end: int = 10,
    hw: int = 4,
    epochs: LeaderEpochCache | None = None,
    min_insync: int = 2,
) -> LeaderReplica:
    cache = LeaderEpochCache([(0, 0), (1, 6)]) if epochs is None else epochs
    return LeaderReplica(
        "a", record, log_end=log_end, high_watermark=hw, epochs=cache, min_insync=min_insync, lag_time_ms=LAG, now_ms=0
    )


def fetch(r: LeaderReplica, who: str, offset: int, last_epoch: int = 2, now: int = 0, epoch: int = 2) -> FetchDecision:
    return r.on_fetch(FetchRequest(who, epoch, offset, last_epoch), now)


def ok(d: FetchDecision) -> int:
    assert d.error is None and d.diverging is None, d
    assert d.read_from is not None
    return d.high_watermark


# ---- becoming leader


def test_new_leader_assigns_its_epoch_at_its_log_end_and_keeps_its_hw() -> None:
    r = leader()
    assert r.epochs.entries == [(0, 0), (1, 6), (2, 10)]
    assert (r.high_watermark, r.log_end, r.epoch_start, r.leader_epoch) == (4, 10, 10, 2)
    assert r.isr == ("a", "b", "c") and r.active and r.pending is None


def test_new_leader_clamps_a_hw_past_its_log_end() -> None:
    assert leader(log_end=3, hw=4, epochs=LeaderEpochCache()).high_watermark == 3


def test_leader_must_be_named_by_the_record_and_not_be_behind_its_cache() -> None:
    with pytest.raises(ValueError, match="names 'b' as leader"):
        leader(PartitionRecord(("a", "b"), "b", 2, ("a", "b"), 0))
    with pytest.raises(FencedLeaderEpoch, match="leader epoch 3"):
        leader(epochs=LeaderEpochCache([(3, 0)]))
    with pytest.raises(ValueError, match="min_insync"):
        leader(min_insync=0)


# ---- fetch checks


def test_fetch_with_older_epoch_is_fenced_newer_means_stale_leader() -> None:
    r = leader()
    assert fetch(r, "b", 10, epoch=1).error is FencedLeaderEpoch
    assert fetch(r, "b", 10, epoch=3).error is NotLeader
    assert fetch(r, "x", 10).error is BadParameter
    assert fetch(r, "a", 10).error is BadParameter
    assert fetch(r, "b", -1, last_epoch=-1).error is BadParameter
    assert fetch(r, "b", 11, last_epoch=-1).error is OffsetOutOfRange
    assert r.follower_end("b") is None  # none of these recorded a position


@pytest.mark.parametrize(
    ("offset", "last_epoch", "diverging"),
    [
        (12, 1, (1, 10)),  # epoch 1 ends at 10 here: the follower has more of it
        (10, 1, None),
        (8, 1, None),
        (7, 0, (0, 6)),  # epoch 0 ended at 6
        (6, 0, None),
        (11, 2, (2, 10)),  # past the leader's log end in the current epoch
        (10, 2, None),
        (9, 1, None),
        (0, -1, None),  # empty follower
    ],
)
def test_divergence_by_the_epoch_cache(offset: int, last_epoch: int, diverging: tuple[int, int] | None) -> None:
    r = leader()
    d = fetch(r, "b", offset, last_epoch)
    assert d.diverging == diverging and d.error is None
    assert r.follower_end("b") == (None if diverging else offset)
    assert d.read_from == (None if diverging else offset)


def test_divergence_names_the_older_epoch_when_the_follower_has_one_the_leader_never_saw() -> None:
    r = leader(epochs=LeaderEpochCache([(0, 0), (3, 6)]), record=PartitionRecord(("a", "b"), "a", 4, ("a", "b"), 0))
    d = fetch(r, "b", 8, last_epoch=2, epoch=4)
    assert d.diverging == (0, 6)


def test_a_follower_with_a_newer_epoch_than_the_leader_means_the_leader_is_stale() -> None:
    r = leader(epochs=LeaderEpochCache([(0, 0)]))
    assert fetch(r, "b", 10, last_epoch=3).error is NotLeader


# ---- high watermark


def test_hw_waits_until_every_isr_member_fetched_in_this_term() -> None:
    r = leader()
    assert ok(fetch(r, "b", 10)) == 4  # c has not fetched in epoch 2: HW stays
    assert ok(fetch(r, "c", 8, last_epoch=1)) == 8
    assert ok(fetch(r, "c", 10)) == 10


def test_hw_is_the_lowest_log_end_of_the_isr_and_never_goes_back() -> None:
    r = leader()
    fetch(r, "b", 10)
    fetch(r, "c", 10)
    r.on_append(15, now_ms=1)
    assert r.high_watermark == 10
    fetch(r, "b", 15)
    assert r.high_watermark == 10
    fetch(r, "c", 13)
    assert r.high_watermark == 13
    fetch(r, "c", 12)  # a late, reordered request
    assert r.high_watermark == 13
    with pytest.raises(ValueError, match="cannot go back"):
        r.on_append(14, now_ms=2)


def test_replicas_outside_the_isr_do_not_hold_the_hw_back() -> None:
    r = leader(PartitionRecord(("a", "b", "c"), "a", 2, ("a", "b"), 5))
    fetch(r, "c", 6, last_epoch=0)
    assert ok(fetch(r, "b", 10)) == 10


def test_a_leader_alone_in_the_isr_moves_the_hw_on_append() -> None:
    r = leader(PartitionRecord(("a", "b", "c"), "a", 2, ("a",), 5))
    r.on_append(12, now_ms=0)
    assert r.high_watermark == 12


# ---- ISR changes


def test_shrink_after_lag_time_without_catching_up() -> None:
    r = leader()
    fetch(r, "b", 10, now=0)
    fetch(r, "c", 10, now=0)
    r.on_append(20, now_ms=1)
    fetch(r, "b", 20, now=50)
    fetch(r, "c", 15, now=50)  # behind the leader end 20, and 15 >= 10 (its previous end): caught up at 0
    assert r.isr_change(LAG) is None
    new = r.isr_change(LAG + 1)
    assert new == REC.with_isr(["a", "b"])
    assert r.pending == new
    assert r.isr == ("a", "b", "c")  # not applied before it commits


def test_a_fetch_parked_at_the_log_end_longer_than_the_lag_time_is_caught_up_at_the_append() -> None:
    r = leader()
    fetch(r, "b", 10, now=0)  # both wait at the log end (an idle partition's long fetch)...
    fetch(r, "c", 10, now=0)
    r.on_append(11, now_ms=LAG * 10, waiting=["b", "c"])  # ...past the lag time, then one append
    assert r.isr_change(LAG * 10 + 1) is None  # neither leaves: they held the whole log until now
    fetch(r, "b", 11, now=LAG * 10 + 5)
    assert r.isr_change(LAG * 11 + 1) == REC.with_isr(["a", "b"])  # c never came back for it

    r = leader()
    fetch(r, "b", 10, now=0)
    fetch(r, "c", 8, now=0)  # c waits (throttled, say) below the log end: no credit for it
    r.on_append(11, now_ms=LAG * 10, waiting=["b", "c", "x"])
    assert r.isr_change(LAG * 10 + 1) == REC.with_isr(["a", "b"])

    r = leader()  # the rule it replaces: without a parked fetch the append finds them lagging
    fetch(r, "b", 10, now=0)
    fetch(r, "c", 10, now=0)
    r.on_append(11, now_ms=LAG * 10)
    assert r.isr_change(LAG * 10 + 1) == REC.with_isr(["a"])


def test_caught_up_by_reaching_the_leader_end_seen_at_the_previous_fetch() -> None:
    r = leader()
    fetch(r, "c", 10, now=0)
    r.on_append(20, now_ms=10)
    fetch(r, "c", 10, now=20)  # caught up at 0
    r.on_append(30, now_ms=30)
    fetch(r, "c", 20, now=90)  # reached 20, the leader's end at its fetch at 20: caught up at 20
    fetch(r, "b", 30, now=90)
    assert r.isr_change(115) is None
    assert r.isr_change(121) is not None


def test_members_that_never_fetch_leave_and_caught_up_ones_stay() -> None:
    r = leader()
    fetch(r, "b", 10, now=0)
    assert r.isr_change(LAG * 5) == REC.with_isr(["a", "b"])  # c never fetched; b is at the end


def test_expand_needs_the_hw_and_the_start_of_this_epoch() -> None:
    rec = PartitionRecord(("a", "b", "c"), "a", 2, ("a", "b"), 5)
    r = leader(rec, hw=4)
    fetch(r, "c", 6, last_epoch=0)  # >= HW 4 but before the epoch start 10
    assert r.isr_change(0) is None
    fetch(r, "c", 10)
    assert r.isr_change(0) == rec.with_isr(["a", "b", "c"])

    r = leader(rec, hw=4)
    r.on_append(20, now_ms=0)
    fetch(r, "b", 20)
    assert r.high_watermark == 20
    fetch(r, "c", 15)  # past the epoch start, below the HW
    assert r.isr_change(0) is None


def test_one_proposal_at_a_time_and_a_rejected_one_may_be_tried_again() -> None:
    r = leader()
    fetch(r, "b", 10)
    first = r.isr_change(LAG + 1)
    assert first is not None
    assert r.isr_change(LAG + 2) is None
    assert r.on_isr_result(first, committed=False)
    assert r.pending is None and r.isr == REC.isr
    assert r.isr_change(LAG + 3) == first


@pytest.mark.parametrize("in_store", ["old", "new", "other", "gone"])
def test_a_swap_with_an_unknown_outcome_is_settled_by_what_the_store_holds(in_store: str) -> None:
    rec = PartitionRecord(("a", "b", "c"), "a", 2, ("a", "b"), 5)
    r = leader(rec, hw=10)
    fetch(r, "c", 10)  # back from a restart, caught up: it may join
    grown = r.isr_change(0)
    assert grown == rec.with_isr(["a", "b", "c"])
    other = PartitionRecord(rec.replicas, "a", 2, ("a",), 7)  # another write won
    stored = {"old": rec, "new": grown, "other": other, "gone": None}[in_store]
    record, committed = R.settle_isr_swap(rec, grown, stored)
    assert r.on_isr_result(record, committed)
    assert r.pending is None  # never left pending: a pending proposal blocks every later one
    if in_store == "new":
        assert r.isr == ("a", "b", "c") and r.isr_change(1) is None
    elif in_store == "other":
        assert r.record == other
    else:  # it did not go in: proposed again
        assert r.isr == ("a", "b") and r.isr_change(1) == grown


def test_a_committed_shrink_applies_and_moves_the_hw() -> None:
    r = leader()
    fetch(r, "b", 10)
    r.on_append(12, now_ms=0)
    fetch(r, "b", 12)
    assert r.high_watermark == 4  # c unknown in this term
    new = r.isr_change(LAG + 1)
    assert new is not None
    assert r.high_watermark == 4  # a pending shrink does not count
    assert r.on_isr_result(new, committed=True)
    assert r.isr == ("a", "b") and r.record == new and r.pending is None
    assert r.high_watermark == 12


def test_a_pending_expansion_holds_the_hw_at_the_new_member_kip_497() -> None:
    rec = PartitionRecord(("a", "b", "c"), "a", 2, ("a", "b"), 5)
    r = leader(rec, hw=10)
    fetch(r, "b", 10)
    fetch(r, "c", 10)
    new = r.isr_change(0)
    assert new == rec.with_isr(["a", "b", "c"])
    r.on_append(20, now_ms=1)
    fetch(r, "b", 20)
    assert r.high_watermark == 10  # c may be elected as soon as the swap lands: wait for it
    assert r.on_isr_result(new, committed=False)
    assert r.high_watermark == 20


def test_records_from_the_store_update_or_depose_the_leader() -> None:
    r = leader()
    fetch(r, "b", 10)
    proposal = r.isr_change(LAG + 1)
    assert proposal is not None
    shrunk_by_controller = REC.with_isr(["a", "c"])  # took partition epoch 6 first
    assert r.on_isr_result(shrunk_by_controller, committed=True)
    assert r.isr == ("a", "c") and r.pending is None  # our swap cannot land any more
    assert r.on_isr_result(proposal, committed=False)
    assert r.on_isr_result(REC, committed=True)  # older news: ignored
    assert r.isr == ("a", "c")
    assert not r.on_isr_result(shrunk_by_controller.with_leader("c"), committed=True)
    assert not r.active
    assert fetch(r, "c", 10).error is NotLeader
    assert r.isr_change(10_000) is None
    assert not r.acked(0)
    assert not r.on_isr_result(shrunk_by_controller, committed=True)  # deposed for good


def test_a_new_epoch_naming_the_same_leader_ends_this_term() -> None:
    r = leader()
    assert not r.on_isr_result(REC.with_leader("a"), committed=True)


# ---- acks=all


def test_acked_needs_the_hw_and_enough_isr_members() -> None:
    r = leader(min_insync=2)
    fetch(r, "b", 10)
    fetch(r, "c", 10)
    r.on_append(13, now_ms=0)
    assert not r.acked(13) and r.acked(10)
    fetch(r, "b", 13)
    fetch(r, "c", 13)
    assert r.acked(13) and r.not_enough_replicas() is None
    alone = PartitionRecord(("a", "b", "c"), "a", 2, ("a",), 9)
    assert r.on_isr_result(alone, committed=True)
    assert not r.acked(13)
    assert r.not_enough_replicas() == "1 in-sync replica(s) ['a'], fewer than min_insync_replicas=2"


# ---- follower


def follower(log_end: int = 10, hw: int = 4, cache: LeaderEpochCache | None = None) -> FollowerReplica:
    epochs = LeaderEpochCache([(0, 0), (1, 6)]) if cache is None else cache
    return FollowerReplica("b", "a", 2, log_end=log_end, high_watermark=hw, epochs=epochs)


def test_follower_fetches_from_its_log_end_with_its_last_epoch() -> None:
    f = follower()
    req = f.next_fetch()
    assert req == FetchRequest("b", 2, 10, 1)
    assert f.is_current(req)
    f.on_appended(12, [(2, 10)], leader_high_watermark=11)
    assert not f.is_current(req)
    assert f.next_fetch() == FetchRequest("b", 2, 12, 2)


def test_follower_hw_is_min_of_leader_hw_and_own_end_and_never_goes_back() -> None:
    f = follower()
    f.on_appended(12, [(1, 10), (2, 11)], leader_high_watermark=20)
    assert f.high_watermark == 12 and f.epochs.entries == [(0, 0), (1, 6), (2, 11)]
    f.on_appended(12, [], leader_high_watermark=8)  # a leader that knows less
    assert f.high_watermark == 12


def test_follower_rejects_appends_that_do_not_fit() -> None:
    f = follower()
    with pytest.raises(ValueError, match="leader epoch 3"):
        f.on_appended(11, [(3, 10)], 0)
    with pytest.raises(ValueError, match="leader epoch 0"):
        f.on_appended(11, [(0, 10)], 0)  # older than the epoch of our last batch
    with pytest.raises(ValueError, match="leader epoch 1"):
        f.on_appended(12, [(2, 10), (1, 11)], 0)
    with pytest.raises(ValueError, match="out of order or range"):
        f.on_appended(11, [(2, 11)], 0)
    with pytest.raises(ValueError, match="out of order or range"):
        f.on_appended(12, [(2, 10), (2, 10)], 0)
    assert f.epochs.entries == [(0, 0), (1, 6)] and f.log_end == 10
    with pytest.raises(ValueError, match="cannot go back"):
        f.on_appended(9, [], 0)
    with pytest.raises(FencedLeaderEpoch):
        follower(cache=LeaderEpochCache([(3, 0)]))
    with pytest.raises(ValueError, match="itself"):
        FollowerReplica("a", "a", 1, log_end=0, high_watermark=0, epochs=LeaderEpochCache())


@pytest.mark.parametrize(
    ("cache", "log_end", "diverging", "to", "entries"),
    [
        # the leader's epoch 0 ends at 6, ours at 6 too: cut there (our epoch 1 is not the leader's)
        ([(0, 0), (1, 6)], 10, (0, 6), 6, [(0, 0)]),
        # same epoch 1, the leader's ends at 8: cut there
        ([(0, 0), (1, 6)], 10, (1, 8), 8, [(0, 0), (1, 6)]),
        # the leader answers with epoch 1, which we never had: cut to the end of our epoch 0 and ask again
        ([(0, 0), (2, 6)], 10, (1, 9), 6, [(0, 0)]),
        # the leader's epoch 0 ends after ours: our own end of it wins
        ([(0, 0), (1, 6)], 10, (0, 7), 6, [(0, 0)]),
        # the leader's end is past our log: nothing to cut
        ([(0, 0), (1, 6)], 10, (1, 12), 10, [(0, 0), (1, 6)]),
    ],
)
def test_on_diverging_truncates_by_the_epoch_rule(
    cache: list[tuple[int, int]], log_end: int, diverging: tuple[int, int], to: int, entries: list[tuple[int, int]]
) -> None:
    f = follower(log_end=log_end, hw=2, cache=LeaderEpochCache(cache))
    assert f.on_diverging(*diverging) == to
    assert f.log_end == to and f.epochs.entries == entries and f.high_watermark == 2


def test_reset_to_the_leaders_log_start_empties_the_epochs_and_fetches_from_there() -> None:
    f = follower(log_end=10, hw=4)
    with pytest.raises(ValueError):
        f.reset_to(10)
    f.reset_to(30)
    assert (f.log_end, f.high_watermark, f.epochs.entries) == (30, 30, [])
    assert f.next_fetch() == FetchRequest("b", 2, 30, -1)


def test_truncation_is_never_to_the_hw_and_lowers_a_hw_past_it() -> None:
    f = follower(log_end=10, hw=4)
    assert f.on_diverging(1, 8) == 8  # not 4
    assert f.high_watermark == 4
    f = follower(log_end=10, hw=9)
    assert f.on_diverging(1, 8) == 8
    assert f.high_watermark == 8
    with pytest.raises(ValueError, match="must be >= 0"):
        f.on_diverging(-1, -1)


def test_leader_and_follower_agree_after_a_fast_leader_change_kip_279() -> None:
    """KIP-279 scenario: b led epoch 1 briefly and wrote offsets 6..9 that nobody else has; a led
    epoch 2 from offset 6. b follows a, truncates to 6 and fetches a's batches."""
    a = leader(log_end=8, hw=6, epochs=LeaderEpochCache([(0, 0), (2, 6)]))
    b = follower(log_end=10, hw=6, cache=LeaderEpochCache([(0, 0), (1, 6)]))
    d = a.on_fetch(b.next_fetch(), 0)
    assert d.diverging == (0, 6)
    assert b.on_diverging(*d.diverging) == 6
    d = a.on_fetch(b.next_fetch(), 0)
    assert d.read_from == 6
    b.on_appended(8, [(2, 6)], d.high_watermark)
    assert b.epochs.entries == a.epochs.entries


# ---- the model: three replicas, random interleavings, invariants after every step

SEEDS = 300
STEPS = 800


@pytest.mark.parametrize("chunk", range(4))
def test_model_keeps_the_invariants(chunk: int) -> None:
    for seed in range(chunk, SEEDS, 4):
        run(seed, STEPS)


@pytest.mark.slow
def test_model_keeps_the_invariants_long() -> None:
    for seed in range(SEEDS, SEEDS + 2000):
        run(seed, 1000)


def violations(seeds: range, steps: int = STEPS) -> list[str]:
    """The first violation the model finds over ``seeds`` (stops there), as a list."""
    for seed in seeds:
        try:
            run(seed, steps)
        except Violation as exc:
            return [str(exc)]
    return []


def test_model_is_not_vacuous() -> None:
    """The runs do elect, diverge, truncate, change the ISR and acknowledge with acks=all."""
    seen = {"leads epoch": 0, "diverged": 0, "committed": 0, "rejected": 0, "paused": 0, "lost": 0}
    acked = 0
    for seed in range(20):
        m = run(seed, STEPS, heal=False)
        acked += m.acked_end
        for line in m.trace:
            for key in seen:
                seen[key] += key in line
    assert all(n >= 5 for n in seen.values()), seen
    assert acked > 100


def skip_truncation(self: FollowerReplica, epoch: int, end_offset: int) -> int:
    return self.log_end


def hw_over_all_reported_replicas(self: LeaderReplica) -> None:
    ends = [self._log_end] + [p.end for p in self._positions.values() if p.end is not None]
    self._hw = max(self._hw, min(ends))


def hw_over_committed_isr_only(self: LeaderReplica) -> set[str]:
    return set(self._record.isr)  # forgets the pending expansion (KIP-497)


def expand_below_the_hw(self: LeaderReplica, pos: R._Position) -> bool:
    return pos.end is not None


_real_on_fetch = LeaderReplica.on_fetch


def no_divergence_check(self: LeaderReplica, req: FetchRequest, now_ms: int) -> FetchDecision:
    d = _real_on_fetch(self, req, now_ms)
    if d.diverging is None:
        return d
    self._record_position(self._positions[req.replica], req.fetch_offset, now_ms)
    self._advance_hw()
    return FetchDecision(None, None, req.fetch_offset, self._hw)


def truncate_to_the_hw(self: FollowerReplica, epoch: int, end_offset: int) -> int:
    to = min(self.high_watermark, self.log_end)  # the pre-KIP-101 rule
    self._truncate(to)
    return to


@pytest.mark.parametrize(
    ("cls", "name", "bug", "seeds", "caught_by"),
    [
        # the leader's divergence check keeps the bad follower out: it never catches up again
        (FollowerReplica, "on_diverging", skip_truncation, 20, "no progress after faults healed"),
        (FollowerReplica, "on_diverging", truncate_to_the_hw, 100, "lacks committed entries"),
        (LeaderReplica, "_advance_hw", hw_over_all_reported_replicas, 20, "lacks committed entries"),
        (LeaderReplica, "_joins", expand_below_the_hw, 40, "lacks committed entries"),
        (LeaderReplica, "on_fetch", no_divergence_check, 20, ""),
        (LeaderReplica, "_hw_members", hw_over_committed_isr_only, 400, "lacks committed entries"),
    ],
    ids=[
        "skip-truncation",
        "truncate-to-hw",
        "hw-over-all-replicas",
        "expand-below-hw",
        "no-divergence-check",
        "kip-497",
    ],
)
def test_the_model_catches_planted_bugs(
    cls: type, name: str, bug: object, seeds: int, caught_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not violations(range(3))  # the real code passes these seeds...
    monkeypatch.setattr(cls, name, bug)
    found = violations(range(seeds))  # ...and the planted bug is caught
    assert found, f"{name} replaced by {bug}: no violation in {seeds} seeds"
    assert caught_by in found[0]
