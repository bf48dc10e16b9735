"""The client's hybrid logical clock: never backwards, never repeated, past what it observed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fabric.client.hlc import LOGICAL_MAX, HybridClock, header_value


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2**40)), max_size=200))
def test_ticks_strictly_increase_and_pass_every_observation(events):
    clock = HybridClock()
    last = -1
    seen = 0
    for observe, ms in events:
        if observe:
            clock.observe(ms)
            seen = max(seen, ms)
        else:
            t = clock.tick(ms)
            assert t > last
            assert t >> 16 >= max(ms, seen)
            last = t
            assert header_value(t) == b"%020d" % t and len(header_value(t)) == 20


def test_a_stopped_wall_clock_counts_logically_then_borrows_the_next_millisecond():
    clock = HybridClock()
    first = clock.tick(1000)
    assert first == 1000 << 16
    for _ in range(LOGICAL_MAX):
        clock.tick(1000)
    assert clock.tick(1000) == 1001 << 16
    assert clock.tick(999) == (1001 << 16) + 1  # the wall clock went back: the HLC does not
