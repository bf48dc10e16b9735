"""A full disk: a failed append leaves the log exactly as it was, and it works again once space returns."""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from fabric.errors import DiskFull, StorageError
from fabric.protocol.batch import parse_header
from fabric.store.log import PartitionLog
from tests.store.helpers import SMALL, append, fill, make_batch, read_all


class Disk:
    """Wraps ``os.write`` so a test can fill the disk for one file descriptor."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real_write: Callable[[int, bytes], int] = os.write
        self.full_fds: set[int] = set()
        self.partial = 0  # bytes a write may still land before ENOSPC
        self.error = errno.ENOSPC
        self.everything = False  # every write fails (segments and indexes alike)
        monkeypatch.setattr(os, "write", self.write)

    def write(self, fd: int, data: bytes) -> int:
        if self.everything or fd in self.full_fds:
            if self.partial:
                n = self.real_write(fd, bytes(memoryview(data)[: self.partial]))
                self.partial = 0
                return n
            raise OSError(self.error, os.strerror(self.error))
        return self.real_write(fd, data)


@pytest.mark.parametrize("partial", [0, 10, 1000])
def test_enospc_on_append_keeps_the_log_consistent(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch, partial: int
) -> None:
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    batches = fill(log, 50)
    end, size = log.next_offset, log.size_bytes
    disk = Disk(monkeypatch)
    disk.full_fds.add(log._active.fd)
    disk.partial = partial
    batch = make_batch(records=2, value_bytes=3000)
    with pytest.raises(DiskFull, match="disk full"):
        append(log, batch)
    assert (log.next_offset, log.size_bytes) == (end, size)
    assert os.path.getsize(log._active.path) == log._active.size
    assert list(read_all(log)) == batches
    disk.full_fds.clear()  # space returns
    assert append(log, batch) == end
    assert list(read_all(log)) == [*batches, bytes(batch)]
    log.close(clean=False)
    reopened = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert reopened.recovery.lossless and list(read_all(reopened)) == [*batches, bytes(batch)]
    reopened.close()


def test_other_write_errors_are_storage_errors(log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    fill(log, 3)
    disk = Disk(monkeypatch)
    disk.full_fds.add(log._active.fd)
    disk.error = errno.EIO
    with pytest.raises(StorageError) as info:
        append(log, make_batch())
    assert not isinstance(info.value, DiskFull) and "errno 5" in info.value.message
    disk.full_fds.clear()
    assert append(log, make_batch()) == 9
    log.close()


def test_disk_full_for_a_while_under_load(log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Appends keep failing while the disk is full (indexes too), then resume; nothing is lost or torn."""
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    disk = Disk(monkeypatch)
    accepted: list[bytes] = []
    for i in range(600):
        disk.everything = 200 <= i < 260
        batch = make_batch(records=1, value_bytes=700, tag=i)
        try:
            append(log, batch)
        except DiskFull:
            assert 200 <= i < 260
            continue
        accepted.append(bytes(batch))
    assert log.next_offset == len(accepted)
    assert list(read_all(log)) == accepted
    log.close()
    reopened = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert reopened.recovery.lossless and list(read_all(reopened)) == accepted
    reopened.close()


def test_enospc_while_rolling_leaves_the_old_segment_active(log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = dataclasses.replace(SMALL, fsync="always")
    log = PartitionLog.open(log_dir, settings, now_ms=0)
    batches = fill(log, 3, value_bytes=5000)  # 45 KiB of a 64 KiB segment
    real_open = os.open

    def no_space_for_new_files(path: object, flags: int, *args: int) -> int:
        if flags & os.O_CREAT and str(path).endswith(".log"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", no_space_for_new_files)
    big = make_batch(records=1, value_bytes=SMALL.segment_bytes // 2)
    with pytest.raises(DiskFull):
        log.append(big, parse_header(big), now_ms=0)
    monkeypatch.undo()
    assert log.segment_count == 1 and list(read_all(log)) == batches
    assert append(log, big) == 9 and log.segment_count == 2
    log.close()
