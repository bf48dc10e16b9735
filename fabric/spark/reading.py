"""Reading one offset range of one partition into Arrow record batches (runs in Spark's workers).

The range ``[start, end)`` is read with FETCH (no subscription, nothing held on the node) through
the public client, undecoded (``Admin.fetch_raw``); each reply's record batches are checked (CRC)
and turned into one Arrow record batch, column by column, straight from their records regions
(:mod:`fabric.spark.arrow_records`: no Python object per record). A node that goes away while a
range is read (a restart, ``kill -9``) is waited for up to ``timeout_s``: the connection is opened
again and reading goes on from the next offset not yet yielded, so nothing is repeated or skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from fabric.client import Admin
from fabric.errors import ConnectionFailed, FabricError, OffsetOutOfRange, Timeout
from fabric.spark.arrow_records import ARROW_SCHEMA, decode_fetched

log = logging.getLogger("fabric.spark")

SCHEMA_DDL = (
    "queue string, partition int, offset bigint, key binary, value binary, "
    "headers map<string,binary>, timestamp timestamp"
)
__all__ = ["ARROW_SCHEMA", "SCHEMA_DDL", "DataLoss", "read_range"]
RETRYABLE = (ConnectionFailed, Timeout)


class DataLoss(FabricError):
    """Records the query still needed were deleted (retention) before it read them."""

    code = 0


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
                chunks, info = admin.fetch_raw(queue, partition, offset, max_bytes=fetch_bytes, wait_ms=500)
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
            batch, nxt = decode_fetched(queue, partition, chunks, offset, end)
            if batch is not None:
                yield batch
                offset = nxt
                deadline = time.monotonic() + timeout_s
            elif info.get("high_watermark", 0) >= end and not any(len(c) for c in chunks):
                raise FabricError(f"{queue}/{partition}: no records at {offset} although the range ends at {end}")
            elif time.monotonic() > deadline:
                raise Timeout(
                    f"{queue}/{partition}: offset {offset} (range end {end}) not readable in {timeout_s:.0f} s"
                )
    finally:
        if admin is not None:
            admin.close()


def _log_start(admin: Admin | None, queue: str, partition: int) -> int | None:
    if admin is None:
        return None
    info: dict[str, Any] = admin.list_offsets(queue, partition, "earliest")
    return int(info["log_start_offset"])
