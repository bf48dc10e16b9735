"""Helpers for the store tests: batches built with the real codec."""

from __future__ import annotations

from collections.abc import Iterator

from fabric.protocol.batch import BatchHeader, encode_batch, iter_batches, parse_header
from fabric.settings import QueueSettings
from fabric.store.log import PartitionLog

KIB = 1024

# small segments and dense indexes so that a few hundred KiB exercise rolls and index lookups
SMALL = QueueSettings(segment_bytes=64 * KIB, index_interval_bytes=512, fsync="never", retention_ms=0)


def make_batch(records: int = 1, value_bytes: int = 100, ts: int = 1_000, *, tag: int = 0) -> bytearray:
    """A batch of ``records`` values; ``tag`` makes its bytes distinct."""
    value = (tag.to_bytes(4, "little") * (value_bytes // 4 + 1))[:value_bytes]
    return bytearray(encode_batch([value] * records, first_timestamp=ts, max_timestamp=ts))


def append(log: PartitionLog, batch: bytearray, now_ms: int = 1_000) -> int:
    return log.append(batch, parse_header(batch), now_ms=now_ms)


def fill(log: PartitionLog, count: int, *, records: int = 3, value_bytes: int = 200, ts: int = 1_000) -> list[bytes]:
    """Append ``count`` batches; return their stamped bytes in order."""
    out = []
    for i in range(count):
        batch = make_batch(records, value_bytes, ts + i, tag=i)
        append(log, batch, now_ms=ts + i)
        out.append(bytes(batch))
    return out


def headers(data: bytes) -> list[BatchHeader]:
    return [h for _pos, h in iter_batches(data)]


def read_all(log: PartitionLog, max_bytes: int = 1 << 20) -> Iterator[bytes]:
    """Every batch from the log start to the end, one by one, via ``read``."""
    offset = log.log_start_offset
    while offset < log.next_offset:
        data = log.read(offset, max_bytes)
        assert data, f"empty read at {offset} before the end {log.next_offset}"
        for pos, h in iter_batches(data):
            yield data[pos : pos + h.size]
            offset = h.next_offset
