"""Reading one offset range of one partition into Arrow record batches (runs in Spark's workers).

The range ``[start, end)`` is read with FETCH (no subscription, nothing held on the node) through
the public client; each reply's whole batches come back as columns (``ReceivedBatch``), which are
turned into one Arrow record batch per reply, column by column, without a Python object per row
except the values themselves. A node that goes away while a range is read (a restart, ``kill
-9``) is waited for up to ``timeout_s``: the connection is opened again and reading goes on from
the next offset not yet yielded, so nothing is repeated or skipped.
"""

from __future__ import annotations

import itertools
import logging
import time
from array import array
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from fabric.client import Admin, ReceivedBatch
from fabric.errors import ConnectionFailed, FabricError, OffsetOutOfRange, Timeout

log = logging.getLogger("fabric.spark")

SCHEMA_DDL = (
    "queue string, partition int, offset bigint, key binary, value binary, "
    "headers map<string,binary>, timestamp timestamp"
)
ARROW_SCHEMA = pa.schema(
    [
        ("queue", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.map_(pa.string(), pa.binary())),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
_HEADERS = pa.map_(pa.string(), pa.binary())
_TS_MS = pa.timestamp("ms", tz="UTC")
_TS_US = pa.timestamp("us", tz="UTC")
RETRYABLE = (ConnectionFailed, Timeout)


class DataLoss(FabricError):
    """Records the query still needed were deleted (retention) before it read them."""

    code = 0


def _int64(values: array) -> pa.Array:
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def to_arrow(queue: str, partition: int, batches: list[ReceivedBatch]) -> pa.RecordBatch:
    """Column batches of one partition, in offset order -> one Arrow record batch. Offsets and
    timestamps are filled by C loops (``array``), values by one ``pa.array`` call."""
    n = sum(len(b.values) for b in batches)
    values = pa.array(list(itertools.chain.from_iterable(b.values for b in batches)), pa.binary())
    offsets = array("q")
    stamps = array("q")
    for b in batches:
        k = len(b.values)
        offsets.extend(range(b.base_offset, b.base_offset + k))
        if b.timestamps is not None:
            stamps.extend(b.timestamps)
        else:
            stamps.extend(array("q", [b.first_timestamp_ms]) * k)
    if any(b.keys is not None for b in batches):
        keys = pa.array(
            list(itertools.chain.from_iterable(b.keys if b.keys is not None else [None] * len(b) for b in batches)),
            pa.binary(),
        )
    else:
        keys = pa.nulls(n, pa.binary())
    if any(b.headers is not None for b in batches):
        rows = itertools.chain.from_iterable(b.headers if b.headers is not None else [None] * len(b) for b in batches)
        headers = pa.array([list(h.items()) if h else None for h in rows], _HEADERS)
    else:
        headers = pa.nulls(n, _HEADERS)
    timestamps = pc.cast(_int64(stamps).cast(_TS_MS), _TS_US)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(queue, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            _int64(offsets),
            keys,
            values,
            headers,
            timestamps,
        ],
        schema=ARROW_SCHEMA,
    )


def read_range(
    endpoint: str | None,
    queue: str,
    partition: int,
    start: int,
    end: int,
    *,
    fail_on_data_loss: bool = True,
    timeout_s: float = 120.0,
    fetch_bytes: int = 8 << 20,
) -> Iterator[pa.RecordBatch]:
    """Yield the records ``start <= offset < end`` of one partition as Arrow record batches."""
    offset = start
    admin: Admin | None = None
    deadline = time.monotonic() + timeout_s
    try:
        while offset < end:
            try:
                if admin is None:
                    admin = Admin(endpoint, timeout_ms=10_000)
                batches, info = admin.fetch(queue, partition, offset, max_bytes=fetch_bytes, wait_ms=500)
            except OffsetOutOfRange:
                first = _log_start(admin, queue, partition)
                if first is None or first <= offset:
                    raise
                if fail_on_data_loss:
                    raise DataLoss(
                        f"{queue}/{partition}: offsets {offset}..{first - 1} were deleted before the query "
                        "read them (retention); set failOnDataLoss=false to skip them"
                    ) from None
                log.warning(
                    "%s/%d: offsets %d..%d deleted before they were read: skipped", queue, partition, offset, first - 1
                )
                offset = first
                continue
            except RETRYABLE as exc:
                if time.monotonic() > deadline:
                    raise
                log.info("%s/%d: %s; trying again", queue, partition, exc)
                if admin is not None:
                    admin.close()
                    admin = None
                time.sleep(0.2)
                continue
            kept = _cut(batches, end)
            if kept:
                yield to_arrow(queue, partition, kept)
                last = kept[-1]
                offset = last.base_offset + len(last.values)
                deadline = time.monotonic() + timeout_s
            elif info.get("high_watermark", 0) >= end and not batches:
                raise FabricError(f"{queue}/{partition}: no records at {offset} although the range ends at {end}")
            elif time.monotonic() > deadline:
                raise Timeout(
                    f"{queue}/{partition}: offset {offset} (range end {end}) not readable in {timeout_s:.0f} s"
                )
    finally:
        if admin is not None:
            admin.close()


def _cut(batches: list[ReceivedBatch], end: int) -> list[ReceivedBatch]:
    out = []
    for b in batches:
        if b.base_offset >= end:
            break
        if b.base_offset + len(b.values) > end:
            k = end - b.base_offset
            b = ReceivedBatch(
                b.queue,
                b.partition,
                b.base_offset,
                b.values[:k],
                b.keys[:k] if b.keys is not None else None,
                b.headers[:k] if b.headers is not None else None,
                b.timestamps[:k] if b.timestamps is not None else None,
                b.first_timestamp_ms,
            )
        out.append(b)
    return out


def _log_start(admin: Admin | None, queue: str, partition: int) -> int | None:
    if admin is None:
        return None
    info: dict[str, Any] = admin.list_offsets(queue, partition, "earliest")
    return int(info["log_start_offset"])
