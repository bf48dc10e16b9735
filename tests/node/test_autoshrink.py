"""Shrinking's pure parts: when an idle queue halves (ShrinkPolicy), which count it halves to,
when a retiring partition may go (partition_drained), the key rule that keeps per-key order, and
a stream group losing partitions (StreamGroup.shrink)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fabric.node.autoshrink import IDLE_SHARE, ShrinkPolicy, partition_drained, shrink_target
from fabric.protocol.batch import crc32c
from fabric.push.groups import Assign, Revoke, StreamGroup
from fabric.settings import QueueSettings, was_retired

MB = 1_000_000


def _settings(**kw: int) -> QueueSettings:
    base = {
        "partitions": 8,
        "auto_partitions_max": 8,
        "auto_partitions_min": 2,
        "auto_partitions_bytes_per_s": MB,
        "auto_partitions_idle_ms": 3000,
    }
    return QueueSettings.from_dict({**base, **kw})


def _run(settings: QueueSettings, rates: list[float]) -> list[int | None]:
    """Feed one second per rate (bytes/s per partition); the targets returned, per second."""
    policy, total, out = ShrinkPolicy(), 0, []
    policy.observe(0, total, settings)
    for i, rate in enumerate(rates, 1):
        total += int(rate * settings.partitions)
        out.append(policy.observe(i * 1000, total, settings))
    return out


def test_halves_after_the_idleness_lasts_and_not_before() -> None:
    assert _run(_settings(), [0] * 5) == [None, None, None, 4, None]  # idle from t=1 s; 3 s later: halve


def test_load_above_a_quarter_of_the_expand_threshold_starts_the_clock_again() -> None:
    busy = MB / IDLE_SHARE + 1
    assert _run(_settings(), [0, 0, busy, 0, 0, 0, 0]) == [None] * 6 + [4]
    assert _run(_settings(), [busy] * 8) == [None] * 8


def test_never_below_the_minimum_nor_when_off() -> None:
    assert _run(_settings(partitions=2), [0] * 6) == [None] * 6
    assert _run(_settings(auto_partitions_idle_ms=0), [0] * 6) == [None] * 6


def test_shrink_target_halves_only_an_even_count_not_below_the_minimum() -> None:
    assert shrink_target(_settings()) == 4
    assert shrink_target(_settings(partitions=4)) == 2
    assert shrink_target(_settings(partitions=2)) is None
    assert shrink_target(_settings(partitions=6, auto_partitions_min=3)) == 3
    assert shrink_target(_settings(partitions=3, auto_partitions_min=1)) is None  # odd: n/2 does not divide n
    assert shrink_target(_settings(partitions=6, auto_partitions_min=4)) is None


def test_was_retired_names_partitions_between_the_count_and_the_maximum() -> None:
    s = _settings(partitions=4)
    assert [p for p in range(10) if was_retired(s, p)] == [4, 5, 6, 7]
    assert not was_retired(QueueSettings.from_dict({"partitions": 2}), 5)  # no auto-expand: a bad partition


def test_a_retiring_partition_goes_when_every_group_has_consumed_it() -> None:
    assert partition_drained(100, 0, [100, 100], delayed=False)
    assert not partition_drained(100, 0, [100, 99], delayed=False)  # one group behind
    assert not partition_drained(100, 0, [100], delayed=True)  # a delayed message may still come
    assert partition_drained(100, 100, [0], delayed=False)  # retention took what the group had not read
    assert not partition_drained(100, 0, [], delayed=False)  # no group: it stays until retention empties it
    assert partition_drained(100, 100, [], delayed=False)
    assert partition_drained(0, 0, [0], delayed=False)  # never written


@given(st.integers(min_value=0, max_value=2**32 - 1), st.integers(min_value=1, max_value=256), st.integers(1, 4))
def test_the_key_rule_a_retired_partition_maps_where_its_keys_hash_after(h: int, half: int, halvings: int) -> None:
    """n -> n / 2: a key on a kept partition stays; one on a retired partition p hashes to p % (n / 2).
    Over several halvings (n -> n / 2^k) p % m is still where the key hashes."""
    n = half * 2**halvings
    p = h % n
    for m in (n >> k for k in range(1, halvings + 1)):
        assert h % m == p % m
        if p < m:
            assert h % m == p  # kept: the key does not move


def test_the_key_rule_holds_for_real_keys() -> None:
    for i in range(1000):
        c = crc32c(b"key-%d" % i)
        assert c % 4 == (c % 8) % 4


def test_a_stream_group_losing_partitions_tells_their_holders_and_rebalances() -> None:
    g = StreamGroup(8, session_timeout_ms=10_000)
    g.join("a", 0)
    g.join("b", 0)
    g.revoked("a", g.revoking("a"), 0)  # a gave back what b took
    assert g.owned("a") == {0, 1, 2, 3} and g.owned("b") == {4, 5, 6, 7}
    gen = g.generation
    changes = g.shrink(4)
    assert changes[0] == Revoke("b", (4, 5, 6, 7))  # told: nothing more comes from them
    assert Revoke("a", (2, 3)) in changes  # and the rest rebalances: a gives two to b
    g.revoked("a", [2, 3], 0)
    assert g.owned("a") == {0, 1} and g.owned("b") == {2, 3} and g.generation > gen
    assert g.revoked("b", [4, 5], 0) == []  # a late confirmation of a removed partition is ignored
    g.check_invariants()
    assert g.shrink(4) == []
    assert any(isinstance(c, Assign) for c in g.grow(8))  # it may grow again later
    g.check_invariants()
