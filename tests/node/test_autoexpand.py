"""The auto-expand policy (pure): when a queue's partitions stay loaded it doubles them, up to
``auto_partitions_max``, and never while the load dips or the maximum is reached."""

from __future__ import annotations

import pytest

from fabric.errors import BadParameter
from fabric.node.autoexpand import ExpandPolicy
from fabric.settings import QueueSettings

MB = 1_000_000


def _settings(**kw: int) -> QueueSettings:
    base = {
        "partitions": 2,
        "auto_partitions_max": 8,
        "auto_partitions_bytes_per_s": MB,
        "auto_partitions_after_ms": 3000,
    }
    return QueueSettings.from_dict({**base, **kw})


def _run(policy: ExpandPolicy, settings: QueueSettings, rates: list[float], led: int = 2, start: int = 0) -> list:
    """Feed one second per rate (bytes/s per led partition); the targets returned, per second."""
    total, out = 0, []
    policy.observe(start, total, led, settings)
    for i, rate in enumerate(rates, 1):
        total += int(rate * led)
        out.append(policy.observe(start + i * 1000, total, led, settings))
    return out


def test_grows_after_the_load_lasts_and_not_before() -> None:
    s = _settings()
    got = _run(ExpandPolicy(), s, [2 * MB] * 5)
    assert got == [None, None, None, 4, None]  # loaded from t=1 s; 3 s later: double


def test_a_dip_starts_the_clock_again() -> None:
    s = _settings()
    assert _run(ExpandPolicy(), s, [2 * MB, 2 * MB, 0.5 * MB, 2 * MB, 2 * MB, 2 * MB, 2 * MB]) == [None] * 6 + [4]


def test_capped_at_the_maximum_and_off_at_it() -> None:
    assert _run(ExpandPolicy(), _settings(partitions=6), [2 * MB] * 5)[3] == 8  # min(2 * 6, 8)
    assert _run(ExpandPolicy(), _settings(partitions=8), [2 * MB] * 6) == [None] * 6
    assert _run(ExpandPolicy(), _settings(auto_partitions_max=0), [2 * MB] * 6) == [None] * 6


def test_only_the_partitions_led_here_count() -> None:
    s = _settings()
    assert _run(ExpandPolicy(), s, [2 * MB] * 5, led=0) == [None] * 5  # a follower never asks
    # the same bytes over more led partitions is less load per partition
    assert _run(ExpandPolicy(), _settings(partitions=4), [0.9 * MB] * 6, led=4) == [None] * 6


def test_settings_refuse_what_cannot_expand() -> None:
    with pytest.raises(BadParameter, match="priority_levels"):
        _settings(priority_levels=2)
    with pytest.raises(BadParameter, match="auto_partitions_after_ms"):
        _settings(auto_partitions_after_ms=10)
    with pytest.raises(BadParameter, match="auto_partitions_max"):
        QueueSettings.from_dict({"mode": "direct", "auto_partitions_max": 4})
