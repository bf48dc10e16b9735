"""PartitionLog: append, read, roll, timestamps, retention, truncation, close and reopen."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from pathlib import Path

import pytest

from fabric.errors import CorruptBatch, OffsetOutOfRange, StorageError
from fabric.protocol.batch import check_batch, parse_header
from fabric.store.log import SEALED_FDS_MAX, PartitionLog
from tests.store.helpers import KIB, SMALL, append, fill, headers, make_batch, read_all


def test_open_creates_directory_and_first_segment(log_dir: Path) -> None:
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert log_dir.is_dir()
    assert (log.log_start_offset, log.next_offset, log.size_bytes, log.segment_count) == (0, 0, 0, 1)
    assert log.read(0, 100) == b""
    assert log.first_timestamp_ms is None and log.last_timestamp_ms is None
    log.close()


def test_append_stamps_the_callers_bytes_in_place(small_log: PartitionLog) -> None:
    first = make_batch(records=5)
    second = make_batch(records=2)
    assert append(small_log, first) == 0
    assert append(small_log, second) == 5
    assert parse_header(second).base_offset == 5
    check_batch(second)  # the stamp does not touch CRC-covered bytes
    assert small_log.next_offset == 7
    assert small_log.read(5, 10_000) == bytes(second)
    assert small_log.last_append_ms == 1_000


def test_append_rejects_a_header_that_does_not_match(small_log: PartitionLog) -> None:
    batch = make_batch()
    header = parse_header(batch)
    with pytest.raises(CorruptBatch):
        small_log.append(batch + b"x", header, now_ms=0)
    assert small_log.next_offset == 0


def test_read_contract(small_log: PartitionLog) -> None:
    batches = fill(small_log, 20, records=3)
    size = len(batches[0])
    data = small_log.read(4, max_bytes=2 * size)
    assert [h.base_offset for h in headers(data)] == [3, 6]
    assert small_log.read(4, max_bytes=1) == batches[1]  # first batch always whole
    assert small_log.read(small_log.next_offset, 100) == b""
    with pytest.raises(OffsetOutOfRange):
        small_log.read(small_log.next_offset + 1, 100)
    with pytest.raises(OffsetOutOfRange):
        small_log.read(-1, 100)


def test_disk_reads_equal_cache_reads(log_dir: Path) -> None:
    cached = PartitionLog.open(log_dir, SMALL, now_ms=0)
    batches = fill(cached, 400, records=2, value_bytes=300)
    assert cached.segment_count > 3
    uncached = PartitionLog.open(log_dir.parent / "1", SMALL, now_ms=0, tail_cache_bytes=0)
    fill(uncached, 400, records=2, value_bytes=300)
    for offset in range(0, cached.next_offset, 37):
        for max_bytes in (1, 5 * KIB, 60 * KIB):
            from_disk, from_cache = uncached.read(offset, max_bytes), cached.read(offset, max_bytes)
            # the disk path may stop at a segment boundary: it is always a prefix of the cache's answer
            assert from_cache.startswith(from_disk) and from_disk
            assert len(from_cache) <= max(max_bytes, len(headers(from_cache)) and headers(from_cache)[0].size)
    assert list(read_all(uncached)) == batches
    cached.close()
    uncached.close()


def test_tail_cache_is_bounded(log_dir: Path) -> None:
    log = PartitionLog.open(log_dir, SMALL, now_ms=0, tail_cache_bytes=8 * KIB)
    fill(log, 200, value_bytes=500)
    assert log._cache.size_bytes <= 8 * KIB
    assert list(read_all(log))  # old offsets come from disk
    log.close()


def test_roll_by_size(small_log: PartitionLog) -> None:
    fill(small_log, 300, value_bytes=500)
    segments = small_log.segments()
    assert len(segments) > 2
    assert all(s["size_bytes"] <= SMALL.segment_bytes for s in segments)
    for earlier, later in itertools.pairwise(segments):
        assert earlier["next_offset"] == later["base_offset"]
    assert sorted(p.name for p in small_log.directory.glob("*.log")) == [
        f"{s['base_offset']:020d}.log" for s in segments
    ]


def test_batch_larger_than_a_segment_gets_its_own(small_log: PartitionLog) -> None:
    fill(small_log, 2)
    big = make_batch(records=1, value_bytes=SMALL.segment_bytes * 2)
    base = append(small_log, big)
    fill(small_log, 1)
    assert small_log.read(base, 1) == bytes(big)
    assert [s["base_offset"] for s in small_log.segments()] == [0, 6, 7]


def test_roll_by_age(log_dir: Path) -> None:
    settings = dataclasses.replace(SMALL, segment_ms=10_000)
    log = PartitionLog.open(log_dir, settings, now_ms=0)
    append(log, make_batch(), now_ms=0)
    append(log, make_batch(), now_ms=9_999)
    assert log.segment_count == 1
    append(log, make_batch(), now_ms=10_000)
    assert log.segment_count == 2
    log.close()


def test_offset_for_timestamp(small_log: PartitionLog) -> None:
    fill(small_log, 300, records=2, ts=10_000)  # batch i: offsets 2i, 2i+1; timestamp 10_000 + i
    assert small_log.segment_count > 1
    assert small_log.offset_for_timestamp(0) == 0
    assert small_log.offset_for_timestamp(10_000) == 0
    assert small_log.offset_for_timestamp(10_001) == 2
    assert small_log.offset_for_timestamp(10_250) == 500
    assert small_log.offset_for_timestamp(10_299) == 598
    assert small_log.offset_for_timestamp(10_300) == small_log.next_offset
    assert small_log.first_timestamp_ms == 10_000 and small_log.last_timestamp_ms == 10_299


def test_retention_by_time_deletes_old_sealed_segments(log_dir: Path) -> None:
    settings = dataclasses.replace(SMALL, retention_ms=1_000)
    log = PartitionLog.open(log_dir, settings, now_ms=0)
    fill(log, 150, value_bytes=500, ts=0)  # timestamps 0..149
    fill(log, 150, value_bytes=500, ts=5_000)  # timestamps 5000..5149
    before = log.size_bytes
    assert log.enforce_retention(now_ms=1_000) == 0  # nothing older than 1 s yet
    deleted = log.enforce_retention(now_ms=5_000)
    assert deleted > 0 and log.size_bytes == before - deleted
    start = log.log_start_offset
    assert start > 0 and log.read(start, 1)
    with pytest.raises(OffsetOutOfRange):
        log.read(0, 100)
    # what is left starts with the first segment holding anything newer than now - retention
    assert headers(log.read(start, 1))[0].max_timestamp < 4_000
    assert log._segments[0].max_timestamp >= 4_000
    # once everything is expired even the active segment goes
    deleted = log.enforce_retention(now_ms=100_000)
    assert log.size_bytes == 0 and log.log_start_offset == log.next_offset == 300 * 3
    assert log.read(log.next_offset, 100) == b""
    assert append(log, make_batch()) == 900
    log.close()


def test_retention_by_bytes(log_dir: Path) -> None:
    settings = dataclasses.replace(SMALL, retention_bytes=150 * KIB)
    log = PartitionLog.open(log_dir, settings, now_ms=0)
    fill(log, 1_000, value_bytes=500)
    deleted = log.enforce_retention(now_ms=0)
    assert deleted > 0 and log.size_bytes <= 150 * KIB
    assert log.size_bytes > 150 * KIB - SMALL.segment_bytes
    assert len(list(read_all(log))) == (log.next_offset - log.log_start_offset) // 3
    log.close()


def test_retention_zero_keeps_everything(small_log: PartitionLog) -> None:
    fill(small_log, 300, value_bytes=500, ts=0)
    assert small_log.enforce_retention(now_ms=10**15) == 0


@pytest.mark.parametrize("cut", [0, 1, 3, 299, 450, 897, 899])
def test_truncate_to(log_dir: Path, cut: int) -> None:
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    batches = fill(log, 300, records=3, value_bytes=300)
    new_end = log.truncate_to(cut)
    assert new_end == cut - cut % 3  # cut at the start of the batch holding `cut`
    assert list(read_all(log)) == batches[: new_end // 3]
    assert append(log, make_batch(records=3)) == new_end
    log.close()
    reopened = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert reopened.recovery.lossless
    assert reopened.next_offset == new_end + 3
    assert list(read_all(reopened))[: new_end // 3] == batches[: new_end // 3]
    reopened.close()


def test_truncate_to_out_of_range(small_log: PartitionLog) -> None:
    fill(small_log, 3)
    with pytest.raises(OffsetOutOfRange):
        small_log.truncate_to(small_log.next_offset + 1)
    assert small_log.truncate_to(small_log.next_offset) == 9


def test_close_and_reopen_keeps_everything(log_dir: Path) -> None:
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    batches = fill(log, 250, value_bytes=400)
    end, start, size = log.next_offset, log.log_start_offset, log.size_bytes
    log.close()
    with pytest.raises(StorageError):
        append(log, make_batch())
    reopened = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert (reopened.next_offset, reopened.log_start_offset, reopened.size_bytes) == (end, start, size)
    assert reopened.recovery.clean_shutdown and reopened.recovery.lossless
    assert list(read_all(reopened)) == batches
    assert append(reopened, make_batch()) == end
    reopened.close()


def test_delete_removes_the_directory(log_dir: Path) -> None:
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    fill(log, 10)
    log.delete()
    assert not log_dir.exists()


def test_sync_from_another_thread_while_appending_and_rolling(log_dir: Path) -> None:
    settings = dataclasses.replace(SMALL, fsync="always")
    log = PartitionLog.open(log_dir, settings, now_ms=0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def syncer() -> None:
        while not stop.is_set():
            try:
                log.sync()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
                return

    thread = threading.Thread(daemon=True, target=syncer)
    thread.start()
    try:
        batches = fill(log, 600, value_bytes=500)
        log.enforce_retention(now_ms=0)
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert log.segment_count > 3 and log.syncs > 0
    assert list(read_all(log)) == batches
    log.close()
    log.sync()  # after close: a no-op, not an error


def test_open_files_for_sealed_segments_are_bounded(log_dir: Path) -> None:
    log = PartitionLog.open(log_dir, SMALL, now_ms=0, tail_cache_bytes=0)
    batches = fill(log, 2_000, value_bytes=500)
    assert log.segment_count > 3 * SEALED_FDS_MAX
    assert list(read_all(log)) == batches  # reads every sealed segment in turn
    open_fds = sum(1 for seg in log._segments if seg.fd >= 0)
    assert open_fds <= SEALED_FDS_MAX + 1
    log.close()


def test_retention_uses_append_time_not_producer_timestamps(log_dir: Path) -> None:
    """A producer replaying old data (or with a wrong clock) must not see it deleted at once."""
    settings = dataclasses.replace(SMALL, retention_ms=60_000)
    log = PartitionLog.open(log_dir, settings, now_ms=10_000_000)
    for i in range(300):
        append(log, make_batch(3, 500, 0, tag=i), now_ms=10_000_000 + i)  # producer timestamps of 1970
    assert log.segment_count > 1
    assert log.enforce_retention(now_ms=10_000_000 + 1_000) == 0
    assert log.log_start_offset == 0
    # once the appends themselves are older than the retention, the segments go
    assert log.enforce_retention(now_ms=10_000_000 + 300 + 60_001) > 0
    log.close()


def test_advance_start_trims_the_front_and_survives_reopening(log_dir: Path) -> None:
    log = PartitionLog.open(log_dir, SMALL, now_ms=1_000)
    fill(log, 300, records=3, value_bytes=500)  # 900 records over several segments
    segments_before = log.segment_count
    second = log.segments()[1]["base_offset"]
    cut = second + 3  # a batch boundary inside the second segment
    assert log.advance_start(cut) == cut
    assert log.log_start_offset == cut and log.message_count == 900 - cut
    assert log.segment_count == segments_before - 1  # the first segment was wholly below: deleted
    with pytest.raises(OffsetOutOfRange):
        log.read(cut - 1, 1000)
    assert parse_header(log.read(cut, 1000)).base_offset == cut
    assert log.advance_start(cut - 3) == cut  # never backwards
    with pytest.raises(OffsetOutOfRange):
        log.advance_start(901)
    log.close()
    again = PartitionLog.open(log_dir, SMALL, now_ms=2_000)
    try:
        assert again.log_start_offset == cut and again.next_offset == 900
        assert parse_header(again.read(cut, 1000)).base_offset == cut
    finally:
        again.close()


def test_batches_walks_checked_batches_across_segments_up_to_an_end(small_log: PartitionLog) -> None:
    fill(small_log, 300, records=3, value_bytes=500)  # several segments
    assert small_log.segment_count > 2
    walked = [(h.base_offset, h.record_count) for _, _, h in small_log.batches(4, 600, read_bytes=2000)]
    assert walked == [(o, 3) for o in range(3, 600, 3)]  # from the batch holding offset 4, before 600
    data, pos, h = next(small_log.batches(0, 900))
    assert check_batch(data, pos) == h
    assert list(small_log.batches(900, 1000)) == []
