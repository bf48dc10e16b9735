"""The replication checkpoint files: every replica's high watermark in one file, a partition's
leader epochs in its directory; atomic, read back as written, and safe when damaged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fabric.errors import StorageError
from fabric.store import checkpoints
from fabric.store.checkpoints import (
    HW_CHECKPOINT,
    HighWatermarkCheckpoint,
    read_leader_epochs,
    read_partition_hw,
    write_leader_epochs,
)


def test_high_watermarks_are_read_back_for_the_same_queue_id_only(tmp_path: Path) -> None:
    cp = HighWatermarkCheckpoint(tmp_path)
    assert cp.saved == {}  # no file yet
    cp.put(("q", 0), "id-1", 7)
    cp.put(("r", 2), "id-2", 0)
    cp.write(durable=True)
    assert sorted(os.listdir(tmp_path)) == [HW_CHECKPOINT]  # no temp file left
    again = HighWatermarkCheckpoint(tmp_path)
    assert again.saved == {("q", 0): ("id-1", 7), ("r", 2): ("id-2", 0)}
    assert again.get(("q", 0), "id-1") == 7
    assert again.get(("q", 0), "id-9") is None  # a queue deleted and created again by the name
    assert again.get(("q", 0), None) is None
    assert again.get(("q", 1), "id-1") is None


def test_an_unreadable_line_or_file_is_skipped(tmp_path: Path) -> None:
    (tmp_path / HW_CHECKPOINT).write_text("q\tid\t0\t5\nnot a line\nq\tid\tx\t1\n")
    assert HighWatermarkCheckpoint(tmp_path).saved == {("q", 0): ("id", 5)}
    (tmp_path / HW_CHECKPOINT).write_bytes(b"\xff\xfe")
    assert HighWatermarkCheckpoint(tmp_path).saved == {}  # from the logs: a lower start, safe


def test_a_partition_that_left_is_dropped_at_the_next_write(tmp_path: Path) -> None:
    cp = HighWatermarkCheckpoint(tmp_path)
    cp.put(("q", 0), "id", 3)
    cp.write(durable=False)
    cp.drop(("q", 1))
    assert not cp.unwritten  # it was not there
    cp.drop(("q", 0))
    assert cp.unwritten
    cp.write(durable=False)
    assert not cp.unwritten and (tmp_path / HW_CHECKPOINT).read_text() == ""


def test_a_failed_write_is_remembered_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cp = HighWatermarkCheckpoint(tmp_path)
    cp.put(("q", 0), "id", 3)

    def fail(path: Path, data: bytes, durable: bool = True) -> None:
        raise StorageError("no")

    monkeypatch.setattr(checkpoints, "atomic_write", fail)
    cp.write(durable=False)
    assert cp.unwritten


def test_a_partitions_own_file_of_earlier_builds(tmp_path: Path) -> None:
    assert read_partition_hw(tmp_path) is None
    (tmp_path / checkpoints.HW_FILE).write_bytes(b"12")
    assert read_partition_hw(tmp_path) == 12
    (tmp_path / checkpoints.HW_FILE).write_bytes(b"twelve")
    assert read_partition_hw(tmp_path) is None


def test_leader_epochs_round_trip_as_bytes(tmp_path: Path) -> None:
    assert read_leader_epochs(tmp_path) is None
    write_leader_epochs(tmp_path, b"1 0\n")
    write_leader_epochs(tmp_path, b"1 0\n2 10\n")
    assert read_leader_epochs(tmp_path) == b"1 0\n2 10\n"
    assert os.listdir(tmp_path) == [checkpoints.EPOCH_FILE]
