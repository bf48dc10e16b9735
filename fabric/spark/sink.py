"""The ``fabric`` sink: ``df.write`` / ``df.writeStream.format("fabric")``, each row stored once.

Theory of operation (the argument in full is in docs/spark.md)
--------------------------------------------------------------
Every Spark task that writes has an identity that its replays share: ``W = writer/batch/task``
(``writer`` is the streaming query's id, which lives in its checkpoint, or a fresh id per batch
write job; ``batch`` the micro-batch id; ``task`` the Spark partition id). The task sorts its rows
into a canonical order per target partition, so that row ``i`` of ``(W, p)`` is the same row on
every attempt, and stores each with the header ``x-spark-write: W#i``. Two marker records per task
in the writer's own marker queue (``spark-sink.<writer>``, kept by size, never by age) say how far
it got: ``begin`` (written before any row is sent; it holds every target partition's high
watermark, below which no row of ``W`` can be) and ``done`` (written after every row was
acknowledged). An attempt that finds ``done`` stores nothing; one that finds ``begin`` reads each
partition from the recorded watermark, collects the ``i`` already stored for ``W``, and sends only
the others. So a row is sent by an attempt only when no earlier attempt stored it, and within an
attempt the idempotent producer stores each send at most once: every row is stored exactly once,
however long after the crash the replay comes, because nothing here depends on the node's
idempotence window or a dedup window.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from fabric.client import Admin, Producer
from fabric.errors import BadParameter, ConnectionFailed, Timeout, UnknownQueue
from fabric.protocol.batch import crc32c

log = logging.getLogger("fabric.spark.sink")

WRITE_HEADER = "x-spark-write"
MARKER_PREFIX = "spark-sink."
MARKER_SETTINGS = {
    "partitions": 1,
    "retention_ms": 0,  # never by age: a replay may come any time later
    "retention_bytes": 64 << 20,  # by size: keeps at least the newest ~63 MiB of markers
    "segment_bytes": 1 << 20,
    "fsync": "always",
}
MARKER_WINDOW = 512  # markers read per step when scanning back


@dataclass
class SinkCommit(WriterCommitMessage):
    task: int
    stored: int  # rows this attempt sent
    skipped: int  # rows an earlier attempt had stored
    replay: bool  # an earlier attempt of this task had begun
    per_partition: dict[int, int] = field(default_factory=dict)


class SinkOptions:
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        o = {k.lower(): v for k, v in options.items()}
        self.endpoint: str | None = o.get("endpoint") or None
        self.queue = o.get("queue") or o.get("path") or ""
        if not self.queue:
            raise BadParameter("the fabric sink needs option('queue', NAME)")
        names = {f.name.lower() for f in schema.fields}
        if "value" not in names:
            raise BadParameter(f"the fabric sink needs a 'value' column (binary or string); got {sorted(names)}")
        self.acks = o.get("acks", "leader")
        self.timeout_s = int(o.get("timeoutms", "120000")) / 1000
        self.batch_bytes = int(o.get("batchbytes", str(1 << 20)))


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i).to_pylist()


def _rows(batches: Iterator[pa.RecordBatch]) -> list[tuple[bytes, bytes | None, dict[str, bytes], int | None]]:
    """(value, key, headers, explicit partition) per row, strings encoded as UTF-8."""
    out: list[tuple[bytes, bytes | None, dict[str, bytes], int | None]] = []
    for batch in batches:
        n = batch.num_rows
        values = _column(batch, "value") or []
        keys = _column(batch, "key") or [None] * n
        headers = _column(batch, "headers") or [None] * n
        parts = _column(batch, "partition") or [None] * n
        for v, k, h, p in zip(values, keys, headers, parts):
            if v is None:
                raise BadParameter("a null value cannot be written to fabric")
            out.append(
                (
                    v.encode() if isinstance(v, str) else v,
                    k.encode() if isinstance(k, str) else k,
                    {a: b.encode() if isinstance(b, str) else b for a, b in (h or ()) if b is not None},
                    p,
                )
            )
    return out


def _canonical(row: tuple[bytes, bytes | None, dict[str, bytes], int | None]) -> tuple:
    v, k, h, _ = row
    return (k is not None, k or b"", v, sorted(h.items()))


class _Markers:
    """The writer's marker queue: ``begin`` and ``done`` records per task attempt identity."""

    def __init__(self, admin: Admin, writer: str) -> None:
        self.admin = admin
        self.queue = MARKER_PREFIX + writer
        admin.create_queue(self.queue, if_not_exists=True, **MARKER_SETTINGS)

    def find(self, batch: int, task: int) -> tuple[dict | None, dict | None]:
        """The ``begin`` and ``done`` markers of (batch, task). The markers of a batch all come
        after those of earlier batches (a micro-batch starts once the one before is committed),
        so reading back from the end stops at the first window holding an earlier batch."""
        info = self.admin.list_offsets(self.queue, 0, "latest")
        end, first = info["high_watermark"], info["log_start_offset"]
        begin = done = None
        while end > first:
            lo = max(first, end - MARKER_WINDOW)
            older = False
            for m in self._read(lo, end):
                if m["b"] < batch:
                    older = True
                elif m["b"] == batch and m["t"] == task:
                    if m["k"] == "begin" and begin is None:
                        begin = m
                    elif m["k"] == "done":
                        done = m
            if older:
                break
            end = lo
        return begin, done

    def _read(self, lo: int, hi: int) -> list[dict]:
        out = []
        offset = lo
        while offset < hi:
            batches, _ = self.admin.fetch(self.queue, 0, offset, max_bytes=1 << 20)
            if not batches:
                break
            for b in batches:
                for i, v in enumerate(b.values):
                    if b.base_offset + i < hi:
                        out.append(json.loads(v))
                offset = b.base_offset + len(b.values)
        return out

    def append(self, producer: Producer, marker: dict) -> None:
        producer.send(self.queue, json.dumps(marker).encode(), partition=0).result(timeout=60)


def _describe(admin: Admin, queue: str) -> dict[str, Any]:
    """The target queue's description, creating it from the node's defaults if it does not exist."""
    try:
        return admin.describe_queue(queue)
    except UnknownQueue:
        return admin.create_queue(queue, if_not_exists=True)


def _stored(admin: Admin, queue: str, start: dict[str, int], ident: str, timeout_s: float) -> dict[int, set[int]]:
    """For each partition, the row numbers of ``ident`` stored at or after ``start`` (its ``begin``
    watermarks), reading up to the log's end as it is now (waiting for the high watermark to
    cover what an earlier attempt appended)."""
    prefix = ident + "#"
    detail = {r["partition"]: r for r in admin.describe_queue(queue)["partition_detail"]}
    out: dict[int, set[int]] = {}
    for ps, offset in start.items():
        p = int(ps)
        seen = out.setdefault(p, set())
        end = detail[p]["next_offset"]
        offset = max(offset, detail[p]["log_start_offset"])
        deadline = time.monotonic() + timeout_s
        while offset < end:
            batches, _ = admin.fetch(queue, p, offset, max_bytes=8 << 20, wait_ms=200)
            if not batches:
                if time.monotonic() > deadline:
                    raise Timeout(f"{queue}/{p}: could not read up to {end} to find what {ident} stored")
                continue
            for b in batches:
                if b.headers is not None:
                    for h in b.headers:
                        tag = h.get(WRITE_HEADER) if h else None
                        if tag is not None and tag.startswith(prefix.encode()):
                            seen.add(int(tag[len(prefix) :]))
                offset = b.base_offset + len(b.values)
    return out


def write_task(opts: SinkOptions, writer: str, batch: int, task: int, data: Iterator[pa.RecordBatch]) -> SinkCommit:
    """Store one Spark task's rows exactly once (see the module's docstring)."""
    ident = f"{writer}/{batch}/{task}"
    deadline = time.monotonic() + opts.timeout_s
    while True:
        try:
            admin = Admin(opts.endpoint, timeout_ms=10_000)
            break
        except (ConnectionFailed, Timeout):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    producer: Producer | None = None
    try:
        markers = _Markers(admin, writer)
        begin, done = markers.find(batch, task)
        if done is not None:
            for _ in data:  # Spark expects the input consumed
                pass
            return SinkCommit(task, 0, sum(done["n"].values()), True, {int(p): n for p, n in done["n"].items()})
        rows = _rows(data)
        nparts = len(_describe(admin, opts.queue)["partition_detail"]) if rows else 1
        by_part: dict[int, list] = {}
        for r in rows:
            v, k, h, p = r
            if p is None:
                p = crc32c(k) % nparts if k is not None else task % nparts
            by_part.setdefault(p, []).append(r)
        for lst in by_part.values():
            lst.sort(key=_canonical)
        producer = Producer(opts.endpoint, acks=opts.acks, batch_bytes=opts.batch_bytes, linger_ms=5)
        if begin is None:
            detail = _describe(admin, opts.queue)["partition_detail"] if rows else []
            begin = {
                "k": "begin",
                "b": batch,
                "t": task,
                "start": {str(r["partition"]): r["high_watermark"] for r in detail},
            }
            markers.append(producer, begin)
            already: dict[int, set[int]] = {}
            replay = False
        else:
            already = _stored(admin, opts.queue, begin["start"], ident, opts.timeout_s)
            replay = True
        sent = skipped = 0
        last = {}
        for p, lst in by_part.items():
            have = already.get(p, set())
            for i, (v, k, h, _) in enumerate(lst):
                if i in have:
                    skipped += 1
                    continue
                headers = dict(h)
                headers[WRITE_HEADER] = f"{ident}#{i}".encode()
                last[p] = producer.send(opts.queue, v, key=k, headers=headers, partition=p)
                sent += 1
        producer.flush(timeout=opts.timeout_s)
        for f in last.values():
            f.result(timeout=opts.timeout_s)  # raises if the partition's sends failed
        counts = {p: len(lst) for p, lst in by_part.items()}
        markers.append(producer, {"k": "done", "b": batch, "t": task, "n": {str(p): n for p, n in counts.items()}})
        return SinkCommit(task, sent, skipped, replay, counts)
    finally:
        if producer is not None:
            producer.close()
        admin.close()


def _task_context() -> tuple[int, str | None, str | None]:
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        raise RuntimeError("the fabric sink's write() runs in a Spark task")
    return tc.partitionId(), tc.getLocalProperty("sql.streaming.queryId"), tc.getLocalProperty("streaming.sql.batchId")


class FabricBatchWriter(DataSourceArrowWriter):
    """``df.write.format("fabric")``: a write job with its own id; a retried task stores its rows once."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = SinkOptions(options, schema)
        self.writer = "batch-" + uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        task, _, _ = _task_context()
        return write_task(self.opts, self.writer, 0, task, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._drop_markers()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._drop_markers()

    def _drop_markers(self) -> None:
        with Admin(self.opts.endpoint) as admin:
            admin.delete_queue(MARKER_PREFIX + self.writer, if_exists=True)


class FabricStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("fabric")``: each micro-batch's rows stored once, replays included."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = SinkOptions(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        task, query, batch = _task_context()
        if query is None or batch is None:
            raise RuntimeError("no streaming query id / batch id in the task's properties")
        return write_task(self.opts, query, int(batch), task, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        replays = [m for m in messages if isinstance(m, SinkCommit) and m.replay]
        if replays:
            log.info(
                "batch %d: %d task(s) replayed; %d row(s) were already stored and not sent again",
                batchId,
                len(replays),
                sum(m.skipped for m in replays),
            )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
