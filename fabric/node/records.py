"""The records of stored batches, decoded: for the node's own copies (dead letters, redrive,
TTL expiry) and for reading past a log start that falls mid-batch."""

from __future__ import annotations

from fabric.protocol.batch import check_batch, decode_records, iter_batches


def records_of(data: bytes, pos: int) -> list[tuple[int, bytes, bytes | None, dict[str, bytes], int]]:
    """(offset, value, key, headers, timestamp) of every record of the batch at ``pos``."""
    h = check_batch(data, pos)
    return records_in(data[pos : pos + h.size], h.base_offset, h.next_offset)


def records_in(data: bytes, start: int, end: int) -> list[tuple[int, bytes, bytes | None, dict[str, bytes], int]]:
    """(offset, value, key, headers, timestamp) of the records in [start, end) of whole batches."""
    out = []
    for pos, h in iter_batches(data):
        if h.base_offset >= end:
            break
        if h.next_offset <= start:
            continue
        check_batch(data, pos)
        r = decode_records(data, pos)
        keys = r.keys or [None] * len(r.values)
        headers = r.headers or [{} for _ in r.values]
        for i, value in enumerate(r.values):
            offset = h.base_offset + i
            if start <= offset < end:
                out.append((offset, value, keys[i], dict(headers[i]), r.timestamps[i]))
    return out
