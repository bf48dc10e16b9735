"""PartitionLog.reset_to: empty a log and start it at an offset past its end (a follower whose
copy ends below its leader's log start), and what a crash between its steps reopens to."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fabric.errors import OffsetOutOfRange
from fabric.store.files import LOG_SUFFIX, atomic_write
from fabric.store.log import START_FILE, PartitionLog
from tests.store.helpers import SMALL, append, fill, make_batch, read_all


def test_reset_reopen_append_and_reads_below_start(log_dir: Path) -> None:
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    fill(log, 100, records=3, value_bytes=300)
    assert log.segment_count > 1
    with pytest.raises(OffsetOutOfRange):
        log.reset_to(log.next_offset, now_ms=0)  # not past the end: truncate_to's job
    assert log.reset_to(1000, now_ms=0) == 1000
    assert (log.log_start_offset, log.next_offset, log.size_bytes, log.segment_count) == (1000, 1000, 0, 1)
    with pytest.raises(OffsetOutOfRange):
        log.read(0, 100)
    assert append(log, make_batch(records=2)) == 1000
    log.close()
    reopened = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert (reopened.log_start_offset, reopened.next_offset, reopened.segment_count) == (1000, 1002, 1)
    assert len(list(read_all(reopened))) == 1
    with pytest.raises(OffsetOutOfRange):
        reopened.read(999, 100)
    reopened.close()


def _state(directory: Path) -> tuple[int, int, int]:
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    try:
        return log.log_start_offset, log.next_offset, len(list(read_all(log)))
    finally:
        log.close(clean=False)


def test_a_crash_between_the_steps_reopens_the_old_log_or_the_reset_one(log_dir: Path, tmp_path: Path) -> None:
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    fill(log, 100, records=3, value_bytes=300)
    log.close()
    old = _state(log_dir)
    assert old[2] == 100
    reset = (500, 500, 0)
    # each step of reset_to done by hand on a copy, in its order, as a crash would leave it
    crash = tmp_path / "crash"
    shutil.copytree(log_dir, crash)
    assert _state(crash) == old  # before the start file: the old log
    shutil.rmtree(crash)
    shutil.copytree(log_dir, crash)
    atomic_write(crash / START_FILE, b"500\n")
    shutil.copytree(crash, tmp_path / "written")
    assert _state(tmp_path / "written") == reset  # the start file written, no segment deleted
    segments = sorted(p for p in crash.iterdir() if p.name.endswith(LOG_SUFFIX))
    assert len(segments) >= 2
    for i, seg in enumerate(reversed(segments)):  # newest first, as _start_empty deletes them
        for f in crash.glob(seg.name.removesuffix(LOG_SUFFIX) + ".*"):
            f.unlink()
        step = tmp_path / f"deleted-{i}"
        shutil.copytree(crash, step)
        assert _state(step) == reset
    # and the log as reset_to leaves it
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    log.reset_to(500, now_ms=0)
    log.close(clean=False)
    assert _state(log_dir) == reset
