"""Recovery at open: torn tails, flipped bytes, lost or garbage indexes, clean shutdown, .bad files."""

from __future__ import annotations

import dataclasses
import os
import random
import time
from pathlib import Path

import pytest

from fabric.protocol.batch import encode_batch, parse_header
from fabric.store.files import segment_path
from fabric.store.log import PartitionLog
from fabric.store.recovery import CLEAN_MARKER
from tests.store.helpers import KIB, SMALL, append, fill, make_batch, read_all

EPOCH_FIELD = range(12, 16)  # leader_epoch: not covered by the CRC, so a flip there cannot be seen


def crashed_log(log_dir: Path, batches: int = 300, **kw: int) -> list[bytes]:
    """Write ``batches`` batches and close without the clean-shutdown marker (as after kill -9)."""
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    out = fill(log, batches, **kw)
    log.close(clean=False)
    return out


def segment_files(log_dir: Path) -> list[Path]:
    return sorted(log_dir.glob("*.log"))


def in_last_segment(log_dir: Path, batches: list[bytes]) -> tuple[Path, int, list[bytes]]:
    """The last segment file, the index of its first batch in ``batches``, and its batches."""
    last = segment_files(log_dir)[-1]
    first_offset = int(last.name[:20])
    index = next(i for i, b in enumerate(batches) if parse_header(b).base_offset == first_offset)
    return last, index, batches[index:]


def flip(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0x5A]))


# --------------------------------------------------------------- torn tails


@pytest.mark.parametrize("seed", range(12))
def test_torn_tail_is_truncated_to_the_last_whole_batch(log_dir: Path, seed: int) -> None:
    batches = crashed_log(log_dir, 300)
    last, first, tail = in_last_segment(log_dir, batches)
    rng = random.Random(seed)
    cut = rng.randrange(0, last.stat().st_size)
    os.truncate(last, cut)
    survivors, pos = 0, 0
    while survivors < len(tail) and pos + len(tail[survivors]) <= cut:
        pos += len(tail[survivors])
        survivors += 1
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    report = log.recovery
    assert report.bytes_truncated == cut - pos
    assert not report.clean_shutdown and report.segments_scanned == 1
    assert report.bad_segments == []
    assert list(read_all(log)) == batches[: first + survivors]
    # the log is usable at once, and the next open finds nothing wrong
    assert append(log, make_batch()) == parse_header(batches[first + survivors - 1]).next_offset
    log.close(clean=False)
    again = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert again.recovery.lossless
    again.close()


# ------------------------------------------------------------- flipped bytes


@pytest.mark.parametrize("seed", range(12))
def test_flipped_byte_drops_the_damaged_batch_and_everything_after(log_dir: Path, seed: int) -> None:
    batches = crashed_log(log_dir, 300)
    last, first, tail = in_last_segment(log_dir, batches)
    size = len(tail[0])  # all batches have the same size here
    rng = random.Random(seed)
    while True:  # a byte after the first batch, outside the one field the CRC does not cover
        position = rng.randrange(size, last.stat().st_size)
        if position % size not in EPOCH_FIELD:
            break
    flip(last, position)
    damaged = position // size
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    report = log.recovery
    assert last.stat().st_size == damaged * size
    assert report.bytes_truncated == len(tail) * size - damaged * size
    assert report.problems and report.bad_segments == []
    assert list(read_all(log)) == batches[: first + damaged]
    log.close()


def test_flip_in_a_sealed_segment_without_index_leaves_a_gap(log_dir: Path) -> None:
    batches = crashed_log(log_dir, 300)
    files = segment_files(log_dir)
    assert len(files) >= 3
    victim = files[1]
    size = len(batches[0])
    segment_path(log_dir, int(victim.name[:20]), ".index").unlink()
    flip(victim, 5 * size + 30)
    original = victim.stat().st_size
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert log.recovery.bytes_truncated == original - 5 * size and victim.stat().st_size == 5 * size
    lost_from = int(victim.name[:20]) + 5 * 3
    lost_to = int(files[2].name[:20])
    expected = [b for b in batches if not lost_from <= parse_header(b).base_offset < lost_to]
    assert list(read_all(log)) == expected  # later segments survive; reads skip the gap
    assert [parse_header(b).base_offset for b in [log.read(lost_from, 1)]] == [lost_to]
    log.close()


# ------------------------------------------------------------------- indexes


@pytest.mark.parametrize("damage", ["delete", "garbage", "empty", "time-garbage"])
def test_damaged_index_of_a_sealed_segment_is_rebuilt(log_dir: Path, damage: str) -> None:
    batches = crashed_log(log_dir, 300)
    victim = segment_files(log_dir)[0]
    index = victim.with_suffix(".index")
    time_index = victim.with_suffix(".timeindex")
    good_index, good_time = index.read_bytes(), time_index.read_bytes()
    if damage == "delete":
        index.unlink()
    elif damage == "garbage":
        index.write_bytes(random.Random(1).randbytes(len(good_index) + 3))
    elif damage == "empty":
        index.write_bytes(b"")  # sane but empty: trusted, the tail walk covers the whole segment
    else:
        time_index.write_bytes(random.Random(2).randbytes(120))
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    if damage != "empty":
        assert log.recovery.indexes_rebuilt == 2  # the victim and the (unclean) active segment
        assert index.read_bytes() == good_index and time_index.read_bytes() == good_time
    assert log.recovery.lossless
    assert list(read_all(log)) == batches
    assert log.offset_for_timestamp(1_100) == 300
    log.close()


def test_stray_temp_files_and_orphan_indexes_are_removed(log_dir: Path) -> None:
    crashed_log(log_dir, 20)
    (log_dir / "00000000000000000000.log.tmp").write_bytes(b"junk")
    (log_dir / "00000000000000099999.index").write_bytes(b"12345678")
    (log_dir / "notes.txt").write_bytes(b"left alone")
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    names = set(os.listdir(log_dir))
    assert "00000000000000000000.log.tmp" not in names and "00000000000000099999.index" not in names
    assert "notes.txt" in names
    log.close()


# ----------------------------------------------------------- clean shutdown


def test_clean_shutdown_marker_skips_the_scan(log_dir: Path) -> None:
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    batches = fill(log, 300)
    log.close()
    assert (log_dir / CLEAN_MARKER).exists()
    clean = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert clean.recovery.clean_shutdown and clean.recovery.segments_scanned == 0
    assert clean.recovery.batches_checked < 30  # only tails after the last index entries
    assert not (log_dir / CLEAN_MARKER).exists()  # removed before any append
    assert list(read_all(clean)) == batches
    clean.close(clean=False)
    crashed = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert not crashed.recovery.clean_shutdown and crashed.recovery.segments_scanned == 1
    crashed.close()


def test_marker_that_disagrees_with_the_file_is_ignored(log_dir: Path) -> None:
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    batches = fill(log, 100)
    log.close()
    last = segment_files(log_dir)[-1]
    with open(last, "ab") as f:
        f.write(b"\x00" * 100)  # a torn write after the marker (cannot happen, but must not be trusted)
    reopened = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert not reopened.recovery.clean_shutdown and reopened.recovery.bytes_truncated == 100
    assert list(read_all(reopened)) == batches
    reopened.close()


def test_garbage_marker_is_ignored(log_dir: Path) -> None:
    crashed_log(log_dir, 10)
    (log_dir / CLEAN_MARKER).write_bytes(b'{"version": 1, "segment": "0"}')
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert not log.recovery.clean_shutdown and log.recovery.segments_scanned == 1
    log.close()


# -------------------------------------------------------------------- .bad


def test_sealed_segment_with_no_good_batch_is_renamed_bad(log_dir: Path) -> None:
    batches = crashed_log(log_dir, 300)
    files = segment_files(log_dir)
    victim = files[1]
    victim.with_suffix(".index").unlink()
    flip(victim, 40)  # inside the first batch's CRC-covered bytes
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    bad = victim.name + ".bad"
    assert log.recovery.bad_segments == [bad] and (log_dir / bad).exists()
    assert not victim.exists() and not victim.with_suffix(".index").exists()
    lost = range(int(victim.name[:20]), int(files[2].name[:20]))
    assert list(read_all(log)) == [b for b in batches if parse_header(b).base_offset not in lost]
    log.close()
    again = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert again.recovery.lossless and (log_dir / bad).exists()  # kept for a human, not re-reported
    again.close()


def test_active_segment_with_garbage_is_set_aside_and_replaced(log_dir: Path) -> None:
    batches = crashed_log(log_dir, 300)
    last, first, _tail = in_last_segment(log_dir, batches)
    base = int(last.name[:20])
    last.write_bytes(random.Random(3).randbytes(5000))
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert log.recovery.bad_segments == [last.name + ".bad"]
    assert log.next_offset == base and last.exists() and last.stat().st_size == 0
    assert list(read_all(log)) == batches[:first]
    assert append(log, make_batch()) == base
    log.close()


def test_overlapping_segment_is_set_aside(log_dir: Path) -> None:
    crashed_log(log_dir, 300)
    files = segment_files(log_dir)
    stray = segment_path(log_dir, int(files[1].name[:20]) - 3, ".log")
    stray.write_bytes(files[1].read_bytes())  # claims offsets the segment before it already holds
    log = PartitionLog.open(log_dir, SMALL, now_ms=0)
    assert stray.name + ".bad" in log.recovery.bad_segments
    log.close()


# ----------------------------------------------------------- restart speed


def build_big_log(log_dir: Path, total_bytes: int, segment_bytes: int, batch_bytes: int) -> int:
    settings = dataclasses.replace(SMALL, segment_bytes=segment_bytes, index_interval_bytes=4096)
    log = PartitionLog.open(log_dir, settings, now_ms=0, tail_cache_bytes=0)
    raw = encode_batch([b"r" * (batch_bytes // 4)] * 4, first_timestamp=1)
    header = parse_header(raw)
    buf = bytearray(raw)
    for i in range(total_bytes // len(raw)):
        log.append(buf, header, now_ms=i // 1000)
    end = log.next_offset
    log.close(clean=False)
    return end


def timed_open(log_dir: Path, segment_bytes: int) -> tuple[PartitionLog, float]:
    settings = dataclasses.replace(SMALL, segment_bytes=segment_bytes, index_interval_bytes=4096)
    started = time.perf_counter()
    log = PartitionLog.open(log_dir, settings, now_ms=0)
    return log, time.perf_counter() - started


def test_restart_reads_only_indexes_and_the_active_segment(log_dir: Path) -> None:
    end = build_big_log(log_dir, 24 * 1024 * KIB, segment_bytes=2 * 1024 * KIB, batch_bytes=16 * KIB)
    log, seconds = timed_open(log_dir, 2 * 1024 * KIB)
    assert log.next_offset == end and log.segment_count >= 12
    assert log.recovery.segments_scanned == 1 and log.recovery.lossless
    assert log.recovery.batches_checked < (2 * 1024 // 16) + 12 * 2
    assert seconds < 2.0
    log.close()


@pytest.mark.slow
def test_restart_with_256_mib_of_64_mib_segments(log_dir: Path) -> None:
    seg = 64 * 1024 * KIB
    end = build_big_log(log_dir, 256 * 1024 * KIB, segment_bytes=seg, batch_bytes=64 * KIB)
    log, seconds = timed_open(log_dir, seg)  # unclean: the whole active segment is CRC-checked
    assert log.next_offset == end and log.recovery.segments_scanned == 1
    assert seconds < 2.0, f"unclean restart took {seconds:.2f} s"
    log.close()
    log, seconds = timed_open(log_dir, seg)
    assert log.recovery.clean_shutdown and seconds < 0.5, f"clean restart took {seconds:.2f} s"
    log.close()
