"""The flusher thread: group commit, monotonic generations, interval policy, failures."""

from __future__ import annotations

import dataclasses
import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fabric.errors import StorageError
from fabric.store.flusher import Flusher
from fabric.store.log import PartitionLog
from tests.store.helpers import SMALL, append, make_batch

ALWAYS = dataclasses.replace(SMALL, fsync="always")


class SlowDisk:
    """Counts fdatasync calls and makes each take ``delay_s`` (a disk slower than the appender)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, delay_s: float = 0.002) -> None:
        self.calls = 0
        self.delay_s = delay_s
        self.fail = False
        self._real: Callable[[int], None] = os.fdatasync
        monkeypatch.setattr(os, "fdatasync", self.fdatasync)

    def fdatasync(self, fd: int) -> None:
        self.calls += 1
        time.sleep(self.delay_s)
        if self.fail:
            raise OSError(errno.EIO, "Input/output error")
        self._real(fd)


class Recorder:
    def __init__(self) -> None:
        self.synced: list[int] = []
        self.failed: list[tuple[int, BaseException]] = []
        self.event = threading.Event()
        self.want = 0

    def on_synced(self, generation: int) -> None:
        self.synced.append(generation)
        if generation >= self.want:
            self.event.set()

    def on_error(self, generation: int, exc: BaseException) -> None:
        self.failed.append((generation, exc))
        self.event.set()


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[list[PartitionLog]]:
    opened = [PartitionLog.open(tmp_path / str(p), ALWAYS, now_ms=0) for p in range(3)]
    yield opened
    for pl in opened:
        pl.close(clean=False)


def test_group_commit_coalesces_many_requests(logs: list[PartitionLog], monkeypatch: pytest.MonkeyPatch) -> None:
    disk = SlowDisk(monkeypatch)
    rec = Recorder()
    flusher = Flusher(rec.on_synced, on_error=rec.on_error)
    flusher.start()
    last = 0
    for i in range(2_000):
        pl = logs[i % 3]
        append(pl, make_batch(tag=i))
        last = flusher.request(pl)
    rec.want = last
    assert rec.event.wait(10)
    flusher.stop()
    assert rec.synced[-1] == last == 2_000
    assert rec.synced == sorted(set(rec.synced))  # strictly increasing
    assert not rec.failed
    assert disk.calls < 2_000 / 5, f"{disk.calls} fdatasyncs for 2000 requests"
    assert flusher.rounds == len(rec.synced)
    assert not any(pl.dirty for pl in logs)


def test_every_request_is_covered_by_a_later_callback(
    logs: list[PartitionLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    SlowDisk(monkeypatch, delay_s=0.0005)
    rec = Recorder()
    flusher = Flusher(rec.on_synced)
    flusher.start()
    generations = []
    for i in range(300):
        append(logs[0], make_batch(tag=i))
        generations.append(flusher.request(logs[0]))
        if i % 50 == 0:
            time.sleep(0.003)
    flusher.stop()  # stop drains: everything requested before it is synced
    assert generations == list(range(1, 301))
    assert rec.synced and rec.synced[-1] == 300
    assert len(rec.synced) > 1


def test_interval_policy_syncs_only_dirty_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = SlowDisk(monkeypatch, delay_s=0)
    settings = dataclasses.replace(SMALL, fsync="interval", fsync_interval_ms=5)
    pl = PartitionLog.open(tmp_path / "0", settings, now_ms=0)
    rec = Recorder()
    flusher = Flusher(rec.on_synced)
    flusher.track(pl)
    flusher.start()
    time.sleep(0.05)
    assert disk.calls == 0  # nothing appended: nothing synced
    append(pl, make_batch())
    deadline = time.monotonic() + 5
    while pl.dirty and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not pl.dirty and disk.calls == 1
    assert rec.synced == []  # interval syncs promise no generation
    flusher.forget(pl)
    flusher.stop()
    pl.close()


def test_failed_fdatasync_is_reported_not_confirmed(logs: list[PartitionLog], monkeypatch: pytest.MonkeyPatch) -> None:
    disk = SlowDisk(monkeypatch, delay_s=0)
    disk.fail = True
    rec = Recorder()
    flusher = Flusher(rec.on_synced, on_error=rec.on_error)
    flusher.start()
    append(logs[0], make_batch())
    generation = flusher.request(logs[0])
    assert rec.event.wait(5)
    flusher.stop()
    assert rec.synced == [] and rec.failed[0][0] == generation
    # the kernel may have dropped the pages: the log refuses appends until reopened
    with pytest.raises(StorageError, match="fdatasync"):
        append(logs[0], make_batch())


def test_request_on_a_closed_log_is_harmless(tmp_path: Path) -> None:
    pl = PartitionLog.open(tmp_path / "0", ALWAYS, now_ms=0)
    append(pl, make_batch())
    pl.close()
    rec = Recorder()
    flusher = Flusher(rec.on_synced, on_error=rec.on_error)
    flusher.start()
    rec.want = flusher.request(pl)
    assert rec.event.wait(5)
    flusher.stop()
    assert rec.synced == [1] and not rec.failed


# ------------------------------------------------------------------ inline rounds (the node's mode)


def test_inline_round_syncs_on_the_callers_thread_without_callbacks(logs: list[PartitionLog]) -> None:
    rec = Recorder()
    flusher = Flusher(rec.on_synced, on_error=rec.on_error, inline_max_logs=2)
    flusher.start()
    append(logs[0], make_batch(tag=1))
    g1 = flusher.request(logs[0])
    append(logs[0], make_batch(tag=2))
    g2 = flusher.request(logs[0])
    assert flusher.pending
    time.sleep(0.05)
    assert not logs[0].syncs  # the thread was not woken: the owner syncs
    assert flusher.sync_pending(consumed=0) == (g2, None)
    assert g1 < g2 and logs[0].syncs == 1 and not logs[0].dirty
    assert not flusher.pending and flusher.sync_pending(consumed=0) is None
    flusher.stop()
    assert rec.synced == [] and rec.failed == []


def test_inline_round_reports_a_failure_to_the_caller(
    logs: list[PartitionLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = SlowDisk(monkeypatch, delay_s=0)
    disk.fail = True
    rec = Recorder()
    flusher = Flusher(rec.on_synced, on_error=rec.on_error, inline_max_logs=2)
    append(logs[0], make_batch(tag=1))
    g = flusher.request(logs[0])
    result = flusher.sync_pending(consumed=0)
    assert result is not None and result[0] == g and isinstance(result[1], StorageError)
    assert rec.synced == []


def test_more_dirty_logs_than_inline_max_go_to_the_thread_in_order(
    logs: list[PartitionLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    SlowDisk(monkeypatch, delay_s=0.01)
    rec = Recorder()
    flusher = Flusher(rec.on_synced, on_error=rec.on_error, inline_max_logs=2)
    flusher.start()
    for pl in logs:  # three dirty logs: more than 2
        append(pl, make_batch(tag=1))
        last = flusher.request(pl)
    rec.want = last
    assert flusher.sync_pending(consumed=0) is None  # handed to the thread
    append(logs[0], make_batch(tag=2))
    later = flusher.request(logs[0])  # while the thread owns the round: the thread takes it too
    assert flusher.sync_pending(consumed=0) is None
    deadline = time.monotonic() + 5
    while (not rec.synced or rec.synced[-1] < later) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert rec.synced[-1] == later and rec.synced == sorted(set(rec.synced)) and not rec.failed
    # the owner has not taken the thread's last report yet: no inline round may overtake it
    append(logs[1], make_batch(tag=3))
    newest = flusher.request(logs[1])
    assert flusher.sync_pending(consumed=0) is None
    result = None
    while result is None and rec.synced[-1] < newest and time.monotonic() < deadline:
        result = flusher.sync_pending(consumed=later)  # now it may (unless the thread took it)
        time.sleep(0.005)
    assert (result is not None and result == (newest, None)) or rec.synced[-1] == newest
    assert not logs[1].dirty
    flusher.stop()


def test_stop_syncs_what_inline_rounds_left(logs: list[PartitionLog]) -> None:
    rec = Recorder()
    flusher = Flusher(rec.on_synced, on_error=rec.on_error, inline_max_logs=2)
    flusher.start()
    append(logs[0], make_batch(tag=1))
    g = flusher.request(logs[0])
    flusher.stop()
    assert rec.synced == [g] and not logs[0].dirty


def test_a_large_round_goes_to_the_thread(logs: list[PartitionLog]) -> None:
    """More than inline_max_bytes to write back: a long fdatasync, better overlapped with the
    owner's next appends than run on its thread."""
    rec = Recorder()
    flusher = Flusher(rec.on_synced, on_error=rec.on_error, inline_max_logs=2, inline_max_bytes=10_000)
    flusher.start()
    append(logs[0], make_batch(records=2, value_bytes=6_000, tag=1))
    assert logs[0].unsynced_bytes > 10_000
    rec.want = flusher.request(logs[0])
    assert flusher.sync_pending(consumed=0) is None
    assert rec.event.wait(5) and rec.synced == [rec.want] and logs[0].unsynced_bytes == 0
    flusher.stop()


def test_a_background_request_goes_to_the_thread_never_inline(logs: list[PartitionLog]) -> None:
    """A follower's copy: nothing on the owner's loop waits for it, so its fdatasync must not
    hold the loop (the next fetch answer) up."""
    rec = Recorder()
    flusher = Flusher(rec.on_synced, on_error=rec.on_error, inline_max_logs=2)
    flusher.start()
    append(logs[0], make_batch(tag=1))
    rec.want = flusher.request(logs[0], background=True)
    assert flusher.sync_pending(consumed=0) is None
    assert rec.event.wait(5) and rec.synced == [rec.want] and logs[0].syncs == 1
    flusher.stop()
