"""tools.latency_floor, run small: every message gets through the minimal relay and is counted
once, each poll's commit is answered, and the wake-up probe hears every message in both modes."""

from __future__ import annotations

from tools.latency_floor import relay_latency, wake_cost


def test_the_relay_delivers_every_message_once_and_answers_each_commit() -> None:
    r = relay_latency(rate=2_000, seconds=0.5)
    assert r["sent"] == 1_000
    assert r["received"] == 1_000  # none lost, none counted twice (the COMMIT replies are not messages)
    assert 1 <= r["commits"] <= r["received"]  # one per poll; a poll returns one message or more
    assert 0 < r["p50_us"] <= r["p90_us"] <= r["p99_us"] <= r["p999_us"]


def test_the_wake_up_probe_hears_every_message_in_both_modes() -> None:
    got = wake_cost(count=300, gap_s=0.0001)
    assert set(got) == {"sleeping", "polling"}
    for r in got.values():
        assert r["delivered"] == 300
        assert 0 < r["delay_p50_us"] <= r["delay_p99_us"]
        assert r["send_us_p50"] > 0
