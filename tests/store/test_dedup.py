"""The per-queue deduplication window: ids seen within the window are duplicates, memory is bounded."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.errors import BadParameter
from fabric.store.dedup import ID_BYTES_MAX, DedupWindow

WINDOW = 5 * 60 * 1000


def test_first_sighting_is_not_a_duplicate_and_the_second_is() -> None:
    w = DedupWindow(WINDOW)
    assert not w.seen(b"a", 0)
    assert w.seen(b"a", 1)
    assert not w.seen(b"b", 2)
    assert len(w) == 2


def test_the_window_runs_from_the_first_sighting() -> None:
    w = DedupWindow(1_000)
    assert not w.seen(b"a", 0)
    assert w.seen(b"a", 999)  # a duplicate does not extend the window
    assert not w.seen(b"a", 1_000)  # expired: a new first sighting
    assert w.seen(b"a", 1_999)
    assert not w.seen(b"a", 2_000)


def test_expire_forgets_old_ids() -> None:
    w = DedupWindow(1_000)
    for i in range(10):
        w.seen(bytes([i + 1]), i * 100)
    assert w.expire(1_000) == 1
    assert w.expire(1_450) == 4
    assert len(w) == 5
    assert w.seen(bytes([10]), 1_450)
    assert not w.seen(bytes([1]), 1_450)


def test_time_running_backwards_is_clamped() -> None:
    w = DedupWindow(1_000)
    w.seen(b"a", 5_000)
    assert w.seen(b"a", 100)  # still a duplicate: time does not go back
    w.seen(b"b", 100)  # counts as first seen at 5_000
    assert w.expire(5_999) == 0
    assert w.expire(6_000) == 2


def test_max_ids_bounds_memory_and_evicts_the_oldest() -> None:
    w = DedupWindow(WINDOW, max_ids=3)
    for key in (b"a", b"b", b"c", b"d"):
        assert not w.seen(key, 0)
    assert len(w) == 3
    assert w.evicted == 1
    assert not w.seen(b"a", 1)  # forgotten early: the limit of the guarantee
    assert w.seen(b"c", 1) and w.seen(b"d", 1)


@pytest.mark.parametrize("key", [b"", b"x" * (ID_BYTES_MAX + 1)])
def test_bad_ids_are_refused(key: bytes) -> None:
    with pytest.raises(BadParameter):
        DedupWindow(WINDOW).seen(key, 0)


def test_bytearray_and_memoryview_ids_match_bytes() -> None:
    w = DedupWindow(WINDOW)
    w.seen(bytearray(b"id"), 0)
    assert w.seen(memoryview(b"id"), 1)
    assert w.seen(b"id", 2)


@pytest.mark.parametrize(("window_ms", "max_ids"), [(0, 1), (-1, 1), (1, 0)])
def test_bad_settings(window_ms: int, max_ids: int) -> None:
    with pytest.raises(ValueError):
        DedupWindow(window_ms, max_ids)


def test_snapshot_round_trip() -> None:
    w = DedupWindow(1_000)
    for i, key in enumerate([b"a", b"\x00\xff", b"c" * ID_BYTES_MAX]):
        w.seen(key, i * 400)
    data = w.snapshot()
    back = DedupWindow.restore(data, 1_000)
    assert back.snapshot() == data
    assert back.seen(b"\x00\xff", 1_000)
    assert not back.seen(b"a", 1_000)  # the restored clock and times carry on
    assert len(back) == 3


def test_restore_with_fewer_max_ids_keeps_the_newest() -> None:
    w = DedupWindow(WINDOW)
    for i in range(5):
        w.seen(bytes([i + 1]), i)
    back = DedupWindow.restore(w.snapshot(), WINDOW, max_ids=2)
    assert len(back) == 2
    assert back.seen(b"\x05", 10) and back.seen(b"\x04", 10)


def test_restore_empty_window() -> None:
    back = DedupWindow.restore(DedupWindow(WINDOW).snapshot(), WINDOW)
    assert len(back) == 0
    assert not back.seen(b"a", 0)


def _snap(ids: object, clock: object = 10) -> bytes:
    return json.dumps({"version": 1, "clock_ms": clock, "ids": ids}).encode()


A = base64.b64encode(b"a").decode()
B = base64.b64encode(b"b").decode()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"\xff",
        b"[]",
        json.dumps({"version": 2, "clock_ms": 0, "ids": []}).encode(),
        _snap([], clock="0"),
        _snap({}),
        _snap([[A]]),
        _snap([[A, "1"]]),
        _snap([["!!", 1]]),
        _snap([["", 1]]),
        _snap([[A, 1], [A, 2]]),  # repeated
        _snap([[A, 2], [B, 1]]),  # out of time order
        _snap([[A, 11]]),  # newer than the clock
        _snap([[base64.b64encode(b"x" * (ID_BYTES_MAX + 1)).decode(), 1]]),
    ],
)
def test_corrupt_snapshot_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        DedupWindow.restore(data, WINDOW)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.binary(min_size=1, max_size=2), st.integers(0, 50)), max_size=60),
    st.integers(1, 100),
    st.integers(1, 8),
)
def test_matches_a_brute_force_model(events: list[tuple[bytes, int]], window_ms: int, max_ids: int) -> None:
    """Against a list of every sighting: a duplicate iff first seen within the window and not evicted."""
    w = DedupWindow(window_ms, max_ids)
    now = 0
    live: list[tuple[bytes, int]] = []  # (id, first seen), oldest first: what the window should hold
    for key, step in events:
        now += step
        live = [(k, t) for k, t in live if now - t < window_ms]
        expected = any(k == key for k, _ in live)
        if not expected:
            live.append((key, now))
            live = live[-max_ids:]
        assert w.seen(key, now) == expected
        assert len(w) == len(live) <= max_ids
    assert DedupWindow.restore(w.snapshot(), window_ms, max_ids).snapshot() == w.snapshot()
