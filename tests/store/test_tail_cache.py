"""The tail cache: a bounded, contiguous run of the newest batches."""

from __future__ import annotations

from fabric.store.tail_cache import TailCache


def filled(capacity: int, sizes: list[int]) -> TailCache:
    cache = TailCache(capacity)
    base = 0
    for i, size in enumerate(sizes):
        cache.add(base, bytes([i % 256]) * size)
        base += 10
    return cache


def test_read_respects_max_bytes_exactly() -> None:
    cache = filled(10_000, [100, 200, 300])
    assert cache.read(0, 300) == b"\x00" * 100 + b"\x01" * 200
    assert cache.read(0, 299) == b"\x00" * 100
    assert cache.read(15, 1) == b"\x01" * 200  # containing batch, whole
    assert cache.read(29, 10_000) == b"\x02" * 300


def test_eviction_keeps_the_newest_within_capacity() -> None:
    cache = filled(500, [100, 200, 300])
    assert cache.size_bytes == 500 and cache.first_offset == 10
    assert cache.read(5, 100) is None  # evicted: the caller goes to disk
    many = filled(1_000, [10] * 5_000)
    assert many.size_bytes == 1_000 and len(many) == 100 and many.first_offset == 49_000


def test_batch_larger_than_capacity_empties_the_cache() -> None:
    cache = filled(500, [100, 100, 600])
    assert len(cache) == 0 and cache.read(20, 10) is None
    cache.add(30, b"x" * 50)
    assert cache.read(30, 10) == b"x" * 50


def test_drop_before_and_drop_from() -> None:
    cache = filled(10_000, [10, 20, 30, 40])  # bases 0, 10, 20, 30
    cache.drop_before(20)
    assert cache.first_offset == 20 and cache.size_bytes == 70
    cache.drop_from(30)
    assert cache.read(20, 10_000) == b"\x02" * 30 and cache.size_bytes == 30
    cache.drop_from(20)
    assert len(cache) == 0 and cache.size_bytes == 0


def test_zero_capacity_caches_nothing() -> None:
    cache = filled(0, [1, 2, 3])
    assert len(cache) == 0 and cache.read(0, 10) is None
