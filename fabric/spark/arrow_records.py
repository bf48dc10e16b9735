"""Record batches as stored -> one Arrow record batch of the source's schema, without a Python
object per record.

The records region is columnar already (docs/protocol.md, "The records region"): length columns
of ``n`` little-endian u32/i32, then the keys, headers and values concatenated. So an Arrow
binary column is the region's blob plus offsets that numpy computes from the length column (a
cumulative sum), and the timestamps are ``first_timestamp`` plus the delta column. Python work is
per record batch (header, CRC, lz4, a few numpy calls), never per record, except for records that
carry headers (a map column: each non-empty header blob is decoded). The blobs of the batches of
one FETCH reply are joined once into the Arrow buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from fabric.errors import CorruptBatch
from fabric.protocol.batch import (
    HAS_HEADERS,
    HAS_KEYS,
    HAS_TIMESTAMPS,
    BatchHeader,
    check_batch,
    decode_headers,
    records_region,
)

HEADERS_TYPE = pa.map_(pa.string(), pa.binary())
ARROW_SCHEMA = pa.schema(
    [
        ("queue", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADERS_TYPE),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
_U32 = np.dtype("<u4")
_I32 = np.dtype("<i4")
_OFFSETS_MAX = 2**31 - 1  # pa.binary()'s int32 offsets


@dataclass
class _Part:
    """Records ``[a, z)`` of one record batch, as views into its region."""

    first: int  # offset of record a
    count: int
    stamps_ms: np.ndarray  # int64
    key_lens: np.ndarray | None  # int32, -1 = no key
    keys: Any  # bytes-like blob of the part's keys
    header_blobs: list[tuple[int, bytes]]  # (row in the part, encoded headers) of rows with headers
    value_lens: np.ndarray  # uint32
    values: Any  # bytes-like blob of the part's values


def _part(chunk: Any, pos: int, h: BatchHeader, a: int, z: int) -> _Part:
    region = records_region(chunk, h, pos)
    n, attrs = h.record_count, h.attributes
    ncols = 1 + bool(attrs & HAS_TIMESTAMPS) + bool(attrs & HAS_KEYS) + bool(attrs & HAS_HEADERS)
    if len(region) < 4 * n * ncols:
        raise CorruptBatch("records region shorter than its length columns")
    cur = 0
    if attrs & HAS_TIMESTAMPS:
        stamps = np.frombuffer(region, _U32, n, cur)[a:z].astype(np.int64) + h.first_timestamp
        cur += 4 * n
    else:
        stamps = np.full(z - a, h.first_timestamp, np.int64)
    key_lens = hdr_lens = None
    if attrs & HAS_KEYS:
        key_lens = np.frombuffer(region, _I32, n, cur)
        cur += 4 * n
        if int(key_lens.min()) < -1:
            raise CorruptBatch("negative key length")
    if attrs & HAS_HEADERS:
        hdr_lens = np.frombuffer(region, _U32, n, cur)
        cur += 4 * n
    value_lens = np.frombuffer(region, _U32, n, cur)
    cur += 4 * n
    key_sizes = np.maximum(key_lens, 0).astype(np.int64) if key_lens is not None else None
    key_total = int(key_sizes.sum()) if key_sizes is not None else 0
    hdr_total = int(hdr_lens.sum(dtype=np.int64)) if hdr_lens is not None else 0
    value_total = int(value_lens.sum(dtype=np.int64))
    if cur + key_total + hdr_total + value_total != len(region):
        raise CorruptBatch("record lengths do not add up to the records region")
    view = memoryview(region)
    keys: Any = b""
    if key_sizes is not None:
        k0 = cur + int(key_sizes[:a].sum())
        keys = view[k0 : k0 + int(key_sizes[a:z].sum())]
    cur += key_total
    header_blobs: list[tuple[int, bytes]] = []
    if hdr_lens is not None:
        ends = np.cumsum(hdr_lens, dtype=np.int64) + cur
        for i in np.flatnonzero(hdr_lens[a:z] > 2):  # 2 bytes: a count of 0, no headers
            j = a + int(i)
            header_blobs.append((int(i), bytes(view[int(ends[j]) - int(hdr_lens[j]) : int(ends[j])])))
    cur += hdr_total
    v0 = cur + int(value_lens[:a].sum(dtype=np.int64))
    values = view[v0 : v0 + int(value_lens[a:z].sum(dtype=np.int64))]
    return _Part(
        h.base_offset + a,
        z - a,
        stamps,
        key_lens[a:z] if key_lens is not None else None,
        keys,
        header_blobs,
        value_lens[a:z],
        values,
    )


def _binary(lens: np.ndarray, blob: bytes, valid: np.ndarray | None = None) -> pa.Array:
    n = len(lens)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    if offsets[-1] > _OFFSETS_MAX:
        raise CorruptBatch(f"{offsets[-1]} bytes in one column of one Arrow batch (more than 2 GiB)")
    bitmap = None
    if valid is not None and not valid.all():
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), n, [bitmap, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(blob)])


def _headers(parts: list[_Part], n: int) -> pa.Array:
    if not any(p.header_blobs for p in parts):
        return pa.nulls(n, HEADERS_TYPE)
    counts = np.zeros(n, np.int32)
    names: list[str] = []
    values: list[bytes] = []
    row = 0
    for p in parts:
        for i, blob in p.header_blobs:
            h = decode_headers(blob)
            counts[row + i] = len(h)
            names.extend(h)
            values.extend(h.values())
        row += p.count
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.MapArray.from_arrays(
        pa.array(offsets),
        pa.array(names, pa.string()),
        pa.array(values, pa.binary()),
        type=HEADERS_TYPE,
        mask=pa.array(counts == 0),
    )


def to_arrow(queue: str, partition: int, parts: list[_Part]) -> pa.RecordBatch:
    """The parts of one partition, in offset order -> one Arrow record batch (ARROW_SCHEMA)."""
    n = sum(p.count for p in parts)
    offsets = np.concatenate([np.arange(p.first, p.first + p.count, dtype=np.int64) for p in parts])
    value_lens = np.concatenate([p.value_lens for p in parts])
    values = _binary(value_lens, b"".join(p.values for p in parts))
    if any(p.key_lens is not None for p in parts):
        key_lens = np.concatenate(
            [p.key_lens if p.key_lens is not None else np.full(p.count, -1, np.int32) for p in parts]
        )
        keys = _binary(np.maximum(key_lens, 0), b"".join(p.keys for p in parts), key_lens >= 0)
    else:
        keys = pa.nulls(n, pa.binary())
    stamps_us = np.concatenate([p.stamps_ms for p in parts]) * 1000
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(queue, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
            keys,
            values,
            _headers(parts, n),
            pa.Array.from_buffers(ARROW_SCHEMA.field("timestamp").type, n, [None, pa.py_buffer(stamps_us)]),
        ],
        schema=ARROW_SCHEMA,
    )


def decode_fetched(
    queue: str, partition: int, chunks: list[Any], start: int, end: int
) -> tuple[pa.RecordBatch | None, int]:
    """The records ``start <= offset < end`` of a FETCH reply's chunks (each batch's CRC checked)
    as one Arrow record batch (None when there are none), and the offset to read next."""
    parts: list[_Part] = []
    position = start
    for chunk in chunks:
        pos, size = 0, len(chunk)
        while pos < size:
            h = check_batch(chunk, pos)  # end-to-end integrity: the producer's CRC
            if h.base_offset >= end:
                break
            if h.next_offset > position:
                a = max(0, position - h.base_offset)
                z = min(h.record_count, end - h.base_offset)
                parts.append(_part(chunk, pos, h, a, z))
                position = h.base_offset + z
            pos += h.size
    if not parts:
        return None, position
    return to_arrow(queue, partition, parts), position
