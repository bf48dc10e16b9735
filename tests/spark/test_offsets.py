"""The source's offset arithmetic: parsing the options, admission control, splitting into tasks (pure)."""

from __future__ import annotations

import itertools

import pytest

from fabric.errors import BadParameter
from fabric.spark import offsets as off

pytestmark = pytest.mark.spark


def test_parse_spec_forms():
    assert off.parse_spec(None, "latest") == off.Spec("latest", {})
    assert off.parse_spec("earliest", "latest") == off.Spec("earliest", {})
    assert off.parse_spec("timestamp:1700000000000", "latest") == off.Spec(1700000000000, {})
    assert off.parse_spec('{"0": 5, "1": -2}', "latest") == off.Spec("latest", {0: 5, 1: -2})
    assert off.parse_spec('{"orders": {"0": 5}}', "earliest") == off.Spec("earliest", {0: 5})
    for bad in ("soon", "timestamp:x", '{"0": "5"}', '{"a": 1}', '{"0": -3}', "[1]"):
        with pytest.raises(BadParameter):
            off.parse_spec(bad, "latest")


def test_cap_rows_is_exact_proportional_and_always_progresses():
    start = {"0": 0, "1": 100, "2": 50}
    latest = {"0": 1000, "1": 200, "2": 50}
    end = off.cap_rows(start, latest, 550)
    assert sum(end[p] - start[p] for p in end) == 550
    assert end["2"] == 50 and end["0"] - 0 == 500 and end["1"] - 100 == 50
    assert off.cap_rows(start, latest, 10_000) == latest
    tiny = off.cap_rows({"0": 0, "1": 0, "2": 0}, {"0": 5, "1": 5, "2": 5}, 2)  # fewer rows than partitions
    assert sum(tiny.values()) == 2
    assert off.cap_bytes({"0": 0}, {"0": 100}, 1000, 100.0) == {"0": 10}
    assert off.cap_bytes({"0": 0}, {"0": 100}, 1, 100.0) == {"0": 1}


def test_split_spreads_and_caps_ranges():
    ranges = off.split({"0": 0, "1": 10}, {"0": 1000, "1": 10}, min_partitions=4, max_records=10_000)
    assert [r[0] for r in ranges] == [0, 0, 0, 0]
    assert ranges[0][1] == 0 and ranges[-1][2] == 1000
    assert all(a[2] == b[1] for a, b in itertools.pairwise(ranges))  # contiguous, no overlap
    capped = off.split({"0": 0}, {"0": 2500}, min_partitions=0, max_records=1000)
    assert [(a, b) for _, a, b in capped] == [(0, 834), (834, 1668), (1668, 2500)]  # equal parts, <= 1000
    assert off.split({"0": 7}, {"0": 7}, min_partitions=2, max_records=10) == []
    assert off.clamp({"0": 10, "1": 5}, {"0": 8}) == {"0": 8, "1": 5}
