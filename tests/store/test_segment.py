"""One segment file: append, locate, read, timestamps, scan."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fabric.protocol.batch import parse_header, stamp
from fabric.store.segment import Segment, SegmentDamage, walk_batches
from tests.store.helpers import headers, make_batch


def new_segment(tmp_path: Path, base: int = 100, interval: int = 512) -> Segment:
    return Segment.create(tmp_path, base, index_interval=interval, now_ms=0)


def put(seg: Segment, records: int = 2, value_bytes: int = 100, ts: int = 1000) -> bytes:
    batch = make_batch(records, value_bytes, ts, tag=seg.next_offset)
    header = parse_header(batch)
    stamp(batch, seg.next_offset)
    seg.append(batch, seg.next_offset, header.record_count, header.max_timestamp)
    return bytes(batch)


def test_append_tracks_offsets_sizes_and_timestamps(tmp_path: Path) -> None:
    seg = new_segment(tmp_path)
    a = put(seg, records=2, ts=5000)
    b = put(seg, records=3, ts=4000)
    assert seg.next_offset == 105 and seg.size == len(a) + len(b)
    assert seg.max_timestamp == 5000 and seg.last_batch_base == 102
    assert seg.path.read_bytes() == a + b
    assert seg.path.name == "00000000000000000100.log"
    seg.close()


def test_sparse_index_gets_an_entry_per_interval(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, interval=512)
    batches = [put(seg, records=1, value_bytes=200) for _ in range(40)]
    size = len(batches[0])
    assert len(seg.offset_index) == pytest.approx(40 * size / 512, abs=3)
    for rel, pos in zip(seg.offset_index.rels, seg.offset_index.positions):
        assert pos == rel * size  # every entry points at the start of the batch it names
    seg.close()


def test_read_returns_whole_batches_from_the_containing_one(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, base=0)
    batches = [put(seg, records=4) for _ in range(30)]  # offsets 0..119, 4 per batch
    data = seg.read(41, max_bytes=3 * len(batches[0]))
    assert [h.base_offset for h in headers(data)] == [40, 44, 48]
    assert data == b"".join(batches[10:13])
    # the first batch is whole even when max_bytes is smaller
    assert seg.read(7, max_bytes=1) == batches[1]
    assert seg.read(119, 10**6) == batches[-1]
    assert seg.read(120, 10**6) == b""
    seg.close()


def test_find_timestamp(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, base=0)
    for i in range(50):
        put(seg, records=1, ts=1000 + 10 * i)
    assert seg.find_timestamp(0) == 0
    assert seg.find_timestamp(1000) == 0
    assert seg.find_timestamp(1001) == 1
    assert seg.find_timestamp(1250) == 25
    assert seg.find_timestamp(1490) == 49
    assert seg.find_timestamp(1491) is None
    seg.close()


def test_scan_rebuilds_the_same_indexes(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, base=7)
    for i in range(60):
        put(seg, records=1 + i % 3, value_bytes=150, ts=1000 + i)
    rels, positions, stamps = list(seg.offset_index.rels), list(seg.offset_index.positions), list(seg.time_index.stamps)
    size, next_offset = seg.size, seg.next_offset
    result = seg.scan(verify=True)
    assert result.damage is None and result.batches == 60
    assert (seg.size, seg.next_offset) == (size, next_offset)
    assert list(seg.offset_index.rels) == rels and list(seg.offset_index.positions) == positions
    assert list(seg.time_index.stamps) == stamps
    seg.close()


def test_scan_stops_at_crc_damage(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, base=0)
    batches = [put(seg) for _ in range(10)]
    size = len(batches[0])
    with open(seg.path, "r+b") as f:
        f.seek(4 * size + 100)
        f.write(b"\xff")
    result = seg.scan(verify=True)
    assert result.batches == 4 and result.damage is not None
    assert result.damage.position == 4 * size and not result.damage.torn
    assert seg.size == 4 * size and seg.next_offset == 8
    seg.close()


def test_walk_reports_torn_tail(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, base=0)
    batches = [put(seg) for _ in range(3)]
    end = sum(map(len, batches)) - 5
    with pytest.raises(SegmentDamage) as info:
        list(walk_batches(seg.fd, seg.path, 0, end, verify=True))
    assert info.value.torn and info.value.position == 2 * len(batches[0])
    seg.close()


def test_failed_write_is_cut_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seg = new_segment(tmp_path, base=0)
    put(seg)
    size = seg.size
    real_write = os.write

    def half_then_fail(fd: int, data: bytes) -> int:
        if fd == seg.fd and len(data) > 100:
            real_write(fd, bytes(data[:100]))  # the kernel took part of it, then the disk filled
            return 100
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_fail)
    with pytest.raises(Exception, match="disk full"):
        put(seg)
    monkeypatch.undo()
    assert seg.size == size and os.path.getsize(seg.path) == size
    put(seg)
    assert seg.scan(verify=True).damage is None
    seg.close()
