"""The file layer: segment names and atomic writes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from fabric.errors import DiskFull, StorageError
from fabric.store.files import atomic_write, free_name, parse_segment_name, segment_path, storage_error


def test_segment_names_round_trip(tmp_path: Path) -> None:
    path = segment_path(tmp_path, 1234, ".log")
    assert path.name == "00000000000000001234.log"
    assert parse_segment_name(path.name) == 1234
    assert parse_segment_name("00000000000000001234.index", ".index") == 1234


@pytest.mark.parametrize("name", ["1234.log", "0000000000000000123a.log", "00000000000000001234.log.bad", "x.tmp"])
def test_foreign_names_are_not_segments(name: str) -> None:
    assert parse_segment_name(name) is None


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "marker.json"
    atomic_write(target, b"old")
    atomic_write(target, b"new contents")
    assert target.read_bytes() == b"new contents"
    assert os.listdir(tmp_path) == ["marker.json"]


def test_atomic_write_failure_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "marker.json"
    atomic_write(target, b"old")

    def no_space(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", no_space)
    with pytest.raises(DiskFull):
        atomic_write(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["marker.json"]


def test_os_errors_map_into_the_error_tree() -> None:
    assert isinstance(storage_error(OSError(errno.ENOSPC, "full"), "x"), DiskFull)
    err = storage_error(OSError(errno.EIO, "io"), "reading y")
    assert type(err) is StorageError and "reading y" in err.message


def test_free_name_never_overwrites(tmp_path: Path) -> None:
    seg = tmp_path / "00000000000000000000.log"
    (tmp_path / "00000000000000000000.log.bad").write_bytes(b"")
    assert free_name(seg, ".bad").name == "00000000000000000000.log.1.bad"
