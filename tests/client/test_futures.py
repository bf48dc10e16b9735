"""send_many's futures: a read-only sequence whose RecordFutures are made when asked for, one per
value, in order, across the batches the values went into."""

from __future__ import annotations

from typing import Any

import pytest

from fabric.client.batches import Batch, Futures, RecordFuture


def _batch(name: str) -> Batch:
    owner: Any = None
    return Batch(owner, name, 0, 0.0, 1 << 20, 1 << 20)


def _futures() -> tuple[Futures, Batch, Batch]:
    a, b = _batch("a"), _batch("b")
    f = Futures()
    f._add(a, 5, 3)  # a[5..7]
    f._add(a, 8, 2)  # continues the run: a[5..9]
    f._add(b, 0, 1)
    f._add(b, 4, 2)  # not contiguous: a run of its own
    return f, a, b


def test_length_order_and_positions_across_runs() -> None:
    f, a, b = _futures()
    assert len(f) == 8 and len(f._runs) == 3
    assert [(x._batch, x._index) for x in f] == [(a, 5), (a, 6), (a, 7), (a, 8), (a, 9), (b, 0), (b, 4), (b, 5)]
    assert f[0] == RecordFuture(a, 5) and f[4] == RecordFuture(a, 9) and f[5] == RecordFuture(b, 0)
    assert f[-1] == RecordFuture(b, 5) and f[-8] == RecordFuture(a, 5)
    assert f[2:6] == [RecordFuture(a, 7), RecordFuture(a, 8), RecordFuture(a, 9), RecordFuture(b, 0)]
    assert f[::-3] == [RecordFuture(b, 5), RecordFuture(a, 9), RecordFuture(a, 6)]
    with pytest.raises(IndexError):
        f[8]
    with pytest.raises(IndexError):
        f[-9]


def test_equal_to_the_list_of_its_futures_and_unhashable() -> None:
    f, a, _ = _futures()
    assert f == list(f) and list(f) == f and f == tuple(f)
    assert f != list(f)[:-1] and f != [RecordFuture(a, 0)] * 8
    assert Futures() == [] and [] == Futures() and not Futures()  # noqa: SIM300 (the reflected ==)
    assert f.index(RecordFuture(a, 7)) == 2 and RecordFuture(a, 9) in f and RecordFuture(a, 10) not in f
    with pytest.raises(TypeError):
        hash(f)


def test_record_futures_of_one_record_are_equal_and_hash_alike() -> None:
    a, b = _batch("a"), _batch("a")
    assert RecordFuture(a, 1) == RecordFuture(a, 1) and hash(RecordFuture(a, 1)) == hash(RecordFuture(a, 1))
    assert RecordFuture(a, 1) != RecordFuture(a, 2) and RecordFuture(a, 1) != RecordFuture(b, 1)
    assert len({RecordFuture(a, 1), RecordFuture(a, 1), RecordFuture(b, 1)}) == 2
    assert RecordFuture(a, 1) != (a, 1)
