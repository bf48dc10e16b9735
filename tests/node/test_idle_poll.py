"""The node loop's adaptive busy-poll (fabric.node.idle_poll), in memory: it spins only while a
steady stream of requests makes spinning pay, and never when turned off."""

from __future__ import annotations

import pytest

from fabric.node.idle_poll import IdlePoll
from fabric.settings import IDLE_POLL_US_MAX


def test_an_idle_or_occasional_node_never_spins() -> None:
    idle = IdlePoll(200)
    for _ in range(1_000):
        assert idle.spin_s() == 0.0
        idle.idle_ended(0.05)  # a request every 50 ms: far longer than the budget
    assert idle.spun == 0


def test_a_steady_stream_turns_spinning_on_and_a_pause_turns_it_off() -> None:
    idle = IdlePoll(200)
    spins = []
    for _ in range(30):  # requests every ~120 us, as at 5,000 a second with the work between
        spins.append(idle.spin_s())
        idle.idle_ended(0.000_120)
    assert spins[0] == 0.0 and spins[-1] == pytest.approx(0.000_2)
    assert 0 < idle.spun < 30  # it waited to see that spinning pays
    for _ in range(30):  # the stream stops: spells run to the timers, spinning stops
        idle.idle_ended(0.1)
    assert idle.spin_s() == 0.0


def test_mostly_short_spells_keep_spinning_through_an_occasional_long_one() -> None:
    idle = IdlePoll(200)
    for _ in range(50):
        idle.idle_ended(0.000_1)
    for i in range(200):
        idle.idle_ended(0.01 if i % 5 == 0 else 0.000_1)  # one spell in five is long
        assert idle.spin_s() > 0


def test_zero_is_off_and_the_budget_is_bounded() -> None:
    idle = IdlePoll(0)
    for _ in range(100):
        idle.idle_ended(0.0)
        assert idle.spin_s() == 0.0
    with pytest.raises(ValueError):
        IdlePoll(IDLE_POLL_US_MAX + 1)
    with pytest.raises(ValueError):
        IdlePoll(-1)
