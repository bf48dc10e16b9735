"""LeaderEpochCache: KIP-279 end offsets, assign/truncate rules, checkpoint bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.cluster.epochs import UNDEFINED, LeaderEpochCache

FAST = settings(max_examples=200, deadline=None)


def cache() -> LeaderEpochCache:
    return LeaderEpochCache([(1, 0), (3, 10), (5, 20)])


# ---- reading


def test_empty_cache_knows_nothing() -> None:
    c = LeaderEpochCache()
    assert c.latest_epoch() == -1
    assert c.end_offset_for(0, 5) == (UNDEFINED, UNDEFINED)
    assert c.start_offset_for(0) is None
    assert len(c) == 0


@pytest.mark.parametrize(
    ("epoch", "expected"),
    [
        (5, (5, 30)),  # the latest epoch ends at the log end
        (4, (3, 20)),  # unknown epoch: the largest older one, ending where the next starts
        (3, (3, 20)),
        (2, (1, 10)),
        (1, (1, 10)),
        (0, (0, 0)),  # older than all: the requested epoch, ending at the first start
        (6, (UNDEFINED, UNDEFINED)),  # newer than all
        (UNDEFINED, (UNDEFINED, UNDEFINED)),
    ],
)
def test_end_offset_for(epoch: int, expected: tuple[int, int]) -> None:
    assert cache().end_offset_for(epoch, 30) == expected


def test_start_offset_for_exact_epochs_only() -> None:
    c = cache()
    assert [c.start_offset_for(e) for e in range(7)] == [None, 0, None, 10, None, 20, None]


# ---- assign


def test_assign_new_epoch_and_repeats() -> None:
    c = LeaderEpochCache()
    assert c.assign(1, 0)
    assert not c.assign(1, 5)  # same epoch, later batch: nothing new
    assert c.assign(2, 5)
    assert c.entries == [(1, 0), (2, 5)]
    assert c.latest_epoch() == 2


def test_assign_earlier_start_for_latest_epoch_replaces_it() -> None:
    c = LeaderEpochCache([(1, 0), (2, 10)])
    assert c.assign(2, 8)
    assert c.entries == [(1, 0), (2, 8)]


def test_assign_drops_entries_that_break_monotonicity() -> None:
    c = cache()
    assert c.assign(4, 12)  # epoch 5 is newer, starts later: dropped
    assert c.entries == [(1, 0), (3, 10), (4, 12)]
    c = cache()
    assert c.assign(6, 15)  # epoch 5 starts at 20 >= 15: dropped
    assert c.entries == [(1, 0), (3, 10), (6, 15)]


@pytest.mark.parametrize(("epoch", "start"), [(-1, 0), (0, -1), (True, 0), (1.0, 0)])
def test_assign_rejects_bad_entries(epoch: object, start: object) -> None:
    with pytest.raises(ValueError, match=">= 0"):
        LeaderEpochCache().assign(epoch, start)  # type: ignore[arg-type]


def test_constructor_rejects_non_monotonic_entries() -> None:
    with pytest.raises(ValueError, match="epochs must increase"):
        LeaderEpochCache([(2, 0), (2, 5)])
    with pytest.raises(ValueError, match="must not decrease"):
        LeaderEpochCache([(1, 5), (2, 4)])


# ---- truncation


@pytest.mark.parametrize(
    ("end", "expected"),
    [
        (30, [(1, 0), (3, 10), (5, 20)]),
        (21, [(1, 0), (3, 10), (5, 20)]),
        (20, [(1, 0), (3, 10)]),
        (15, [(1, 0), (3, 10)]),
        (10, [(1, 0)]),
        (0, []),
    ],
)
def test_truncate_from_end(end: int, expected: list[tuple[int, int]]) -> None:
    c = cache()
    assert c.truncate_from_end(end) == (expected != cache().entries)
    assert c.entries == expected


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        (0, [(1, 0), (3, 10), (5, 20)]),
        (5, [(1, 5), (3, 10), (5, 20)]),
        (10, [(3, 10), (5, 20)]),
        (15, [(3, 15), (5, 20)]),
        (20, [(5, 20)]),
        (25, [(5, 25)]),
    ],
)
def test_truncate_from_start(start: int, expected: list[tuple[int, int]]) -> None:
    c = cache()
    assert c.truncate_from_start(start) == (expected != cache().entries)
    assert c.entries == expected


def test_truncate_from_start_before_the_first_epoch_changes_nothing() -> None:
    c = LeaderEpochCache([(1, 10)])
    assert not c.truncate_from_start(5)
    assert c.entries == [(1, 10)]


# ---- checkpoint bytes


def test_encode_is_a_small_text_checkpoint() -> None:
    assert cache().encode() == b"0\n3\n1 0\n3 10\n5 20\n"
    assert LeaderEpochCache().encode() == b"0\n0\n"
    assert LeaderEpochCache.decode(cache().encode()) == cache()
    assert LeaderEpochCache.decode(b"0\n0\n") == LeaderEpochCache()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "does not end with a newline"),
        (b"0\n1\n1 0", "does not end with a newline"),
        (b"\xff\n", "not ASCII"),
        (b"1\n0\n", "version 1 is not supported"),
        (b"x\n0\n", "line 1: expected the version"),
        (b"0\n", "line 2: expected the entry count"),
        (b"0\n2\n1 0\n", "says 2 entries but holds 1"),
        (b"0\n1\n1 0\n2 5\n", "says 1 entries but holds 2"),
        (b"0\n1\n1\n", "line 3: expected '<epoch> <start_offset>'"),
        (b"0\n1\n1 -5\n", "line 3"),
        (b"0\n1\n01 5\n", "line 3"),
        (b"0\n1\n1  5\n", "line 3"),
        (b"0\n2\n2 0\n1 5\n", "epochs must increase"),
        (b"0\n2\n1 5\n2 0\n", "must not decrease"),
    ],
)
def test_decode_rejects_corrupt_checkpoints(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LeaderEpochCache.decode(data)


# ---- properties against a brute-force model: a log as the epoch of each offset

logs = st.lists(st.integers(0, 6), max_size=30).map(sorted)


def built(log: list[int]) -> LeaderEpochCache:
    c = LeaderEpochCache()
    for offset, epoch in enumerate(log):
        c.assign(epoch, offset)
    return c


def brute_end_offset_for(log: list[int], epoch: int) -> tuple[int, int]:
    if epoch < 0 or not log or epoch > log[-1]:
        return (UNDEFINED, UNDEFINED)
    older = [e for e in log if e <= epoch]
    if not older:
        return (epoch, 0)
    found = max(older)
    return (found, next((i for i, e in enumerate(log) if e > found), len(log)))


@FAST
@given(logs, st.integers(-1, 7))
def test_end_offset_for_matches_the_log(log: list[int], epoch: int) -> None:
    assert built(log).end_offset_for(epoch, len(log)) == brute_end_offset_for(log, epoch)


@FAST
@given(logs, st.integers(0, 31))
def test_truncate_from_end_equals_building_from_the_shorter_log(log: list[int], end: int) -> None:
    c = built(log)
    c.truncate_from_end(end)
    assert c == built(log[:end])


@FAST
@given(logs)
def test_checkpoint_round_trips(log: list[int]) -> None:
    c = built(log)
    assert LeaderEpochCache.decode(c.encode()) == c


@FAST
@given(st.binary(max_size=40) | st.text("0123456789 \n-", max_size=40).map(str.encode))
def test_decode_of_any_bytes_is_a_cache_or_a_value_error(data: bytes) -> None:
    try:
        c = LeaderEpochCache.decode(data)
    except ValueError:
        return
    assert c.encode() == data
