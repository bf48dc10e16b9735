"""Sparse offset and time indexes: lookups, buffering, loading with sanity checks."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import pytest

from fabric.store.index import OffsetIndex, TimeIndex


def test_offset_lookup_finds_floor_entry(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "a.index")
    for rel, pos in [(10, 1000), (20, 2000), (35, 3500)]:
        index.append(rel, pos)
    assert index.lookup(0) == 0
    assert index.lookup(9) == 0
    assert index.lookup(10) == 1000
    assert index.lookup(34) == 2000
    assert index.lookup(10**6) == 3500
    assert index.last() == (35, 3500)


def test_offset_index_persists_and_loads(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    index = OffsetIndex(path)
    for i in range(1, 2000):
        index.append(i * 3, i * 100)
    index.sync()
    assert path.stat().st_size == 8 * 1999
    loaded = OffsetIndex.load(path, file_size=10**6)
    assert loaded is not None
    assert list(loaded.rels) == list(index.rels) and list(loaded.positions) == list(index.positions)
    index.close()


def test_offset_index_buffers_small_appends(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    index = OffsetIndex(path)
    index.append(1, 100)
    assert not path.exists() or path.stat().st_size == 0
    index.flush()
    assert path.stat().st_size == 8
    index.close()


@pytest.mark.parametrize(
    "raw",
    [
        b"\x01\x02\x03",  # not a multiple of the entry size
        struct.pack("<IIII", 5, 100, 4, 200),  # offsets go backwards
        struct.pack("<IIII", 5, 100, 6, 90),  # positions go backwards
        struct.pack("<II", 5, 10**6),  # position past the end of the segment
    ],
)
def test_insane_offset_index_is_rejected(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "a.index"
    path.write_bytes(raw)
    assert OffsetIndex.load(path, file_size=5000) is None


def test_missing_index_loads_as_none(tmp_path: Path) -> None:
    assert OffsetIndex.load(tmp_path / "nope.index", 100) is None
    assert TimeIndex.load(tmp_path / "nope.timeindex") is None


def test_time_index_only_grows(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "a.timeindex")
    index.maybe_append(100, 1)
    index.maybe_append(90, 2)  # maximum did not grow: skipped
    index.maybe_append(200, 3)
    assert list(index.stamps) == [100, 200] and list(index.rels) == [1, 3]
    # first relative offset that may hold a batch with max_timestamp >= t
    assert index.after_below(50) == 0
    assert index.after_below(100) == 0
    assert index.after_below(150) == 2
    assert index.after_below(201) == 4


def test_time_index_round_trip_and_sanity(tmp_path: Path) -> None:
    path = tmp_path / "a.timeindex"
    index = TimeIndex(path)
    for i in range(100):
        index.maybe_append(1000 + i, i)
    index.sync()
    loaded = TimeIndex.load(path)
    assert loaded is not None and loaded.last_timestamp == 1099
    index.close()
    path.write_bytes(struct.pack("<qIqI", 10, 5, 9, 6))  # timestamps go backwards
    assert TimeIndex.load(path) is None


def test_truncate_from_marks_file_stale_and_flush_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    index = OffsetIndex(path)
    for i in range(1, 10):
        index.append(i, i * 10)
    index.flush()
    index.truncate_from(5)
    assert list(index.rels) == [1, 2, 3, 4]
    index.flush()
    loaded = OffsetIndex.load(path, 1000)
    assert loaded is not None and list(loaded.rels) == [1, 2, 3, 4]
    index.close()


def test_failed_index_write_is_retried_as_rewrite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.index"
    index = OffsetIndex(path)
    index.append(1, 10)
    real_write = os.write

    def no_space(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", no_space)
    assert index.flush() is False
    assert not index.disk_ok
    monkeypatch.setattr(os, "write", real_write)
    index.append(2, 20)
    assert index.flush() is True
    loaded = OffsetIndex.load(path, 1000)
    assert loaded is not None and list(loaded.rels) == [1, 2]
    index.close()
