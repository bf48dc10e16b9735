"""Producer-state snapshots are written when a partition's log rolls a segment (and at a clean close
for partitions far behind), not every second for every partition written: a partition that got a
few messages costs no file. Whatever was not snapshotted is replayed from the log on first use."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fabric.protocol.batch import encode_batch, parse_header
from fabric.store.idempotence import SNAPSHOT
from fabric.store.store import CLOSE_SNAPSHOT_RECORDS, Store
from tests.store.helpers import SMALL


def _send(store: Store, queue: str, seq: int, records: int = 1, *, pid: int = 7) -> int:
    """One idempotent batch, as the produce path does it: check, append, record."""
    batch = bytearray(
        encode_batch([b"x" * 100] * records, producer_id=pid, producer_epoch=0, base_sequence=seq, first_timestamp=1)
    )
    header = parse_header(batch)
    states = store.producer_states(queue, 0, 1_000)
    assert states.check(pid, 0, seq, records, 1_000) is None  # not a duplicate
    plog = store.partition(queue, 0)
    base = plog.append(batch, header, now_ms=1_000)
    states.record(pid, 0, seq, records, base, 1_000)
    return base


def _snapshot(tmp_path: Path, queue: str) -> Path:
    return next((tmp_path / "queues").glob(f"{queue}*")) / "0" / SNAPSHOT


def test_a_partition_written_a_little_writes_no_snapshot(tmp_path: Path) -> None:
    store = Store(tmp_path, defaults=SMALL, now_ms=0)
    try:
        store.create_queue("q", SMALL, 0)
        for seq in range(5):
            _send(store, "q", seq)
        store.save_producer_states()
        assert not _snapshot(tmp_path, "q").exists()
    finally:
        store.close()
    assert not _snapshot(tmp_path, "q").exists()  # a clean close skips one a few batches behind
    again = Store(tmp_path, defaults=SMALL, now_ms=0)
    try:  # replayed from the log: the next sequence is known, a retried batch is a duplicate
        states = again.producer_states("q", 0, 2_000)
        assert states.next_sequence(7) == 5
        assert states.check(7, 0, 4, 1, 2_000) is not None
    finally:
        again.close()


def test_a_roll_snapshots_the_partition_and_restart_replays_only_after_it(tmp_path: Path) -> None:
    store = Store(tmp_path, defaults=SMALL, now_ms=0)
    try:
        store.create_queue("q", SMALL, 0)
        seq = 0
        while store.partition("q", 0).segment_count < 2:  # 64 KiB segments
            _send(store, "q", seq, 10)
            seq += 10
        store.save_producer_states()
        path = _snapshot(tmp_path, "q")
        assert path.exists()
        first = path.stat().st_mtime_ns
        _send(store, "q", seq, 10)
        seq += 10
        store.save_producer_states()  # written to, not rolled again: not rewritten
        assert path.stat().st_mtime_ns == first
    finally:
        store.close(clean=False)  # a crash: the snapshot is behind the log
    again = Store(tmp_path, defaults=SMALL, now_ms=0)
    try:
        assert again.producer_states("q", 0, 2_000).next_sequence(7) == seq
    finally:
        again.close()


def test_a_clean_close_snapshots_partitions_far_behind(tmp_path: Path) -> None:
    big = dataclasses.replace(SMALL, segment_bytes=64 << 20)
    store = Store(tmp_path, defaults=big, now_ms=0)
    try:
        store.create_queue("q", big, 0)
        for seq in range(0, CLOSE_SNAPSHOT_RECORDS, 100):
            _send(store, "q", seq, 100)
        store.save_producer_states()
        assert not _snapshot(tmp_path, "q").exists()
    finally:
        store.close()
    assert _snapshot(tmp_path, "q").exists()
    again = Store(tmp_path, defaults=SMALL, now_ms=0)
    try:
        assert again.producer_states("q", 0, 2_000).next_sequence(7) == CLOSE_SNAPSHOT_RECORDS
    finally:
        again.close()


def test_partitions_with_nothing_to_snapshot_leave_the_scan_until_written_again(tmp_path: Path) -> None:
    """The periodic scan looks only at partitions that may need a snapshot: one written a little
    and not rolled drops out (ten thousand of them were looked at every 10 s for ever), and its
    next write brings it back; one far behind stays for the close."""
    big = dataclasses.replace(SMALL, segment_bytes=64 << 20)
    store = Store(tmp_path, defaults=big, now_ms=0)
    try:
        store.create_queue("few", big, 0)
        store.create_queue("many", big, 0)
        _send(store, "few", 0)
        for seq in range(0, CLOSE_SNAPSHOT_RECORDS, 100):
            _send(store, "many", seq, 100)
        store.save_producer_states()
        assert store._producer_dirty == {("many", 0)}
        _send(store, "few", 1)
        assert ("few", 0) in store._producer_dirty
    finally:
        store.close()
    assert _snapshot(tmp_path, "many").exists()
    assert not _snapshot(tmp_path, "few").exists()
    again = Store(tmp_path, defaults=big, now_ms=0)
    try:
        assert again.producer_states("few", 0, 2_000).next_sequence(7) == 2
    finally:
        again.close()
