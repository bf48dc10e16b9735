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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from fabric.client import Admin, Producer
from fabric.errors import BadParameter, ConnectionFailed, MessageTooLarge, Timeout, UnknownQueue
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
BAD_DEDUP_MS = 7 * 24 * 3600 * 1000  # a badRecordsQueue the sink creates drops a replay's repeats this long


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
        self.preserve_order = o.get("preserveorder", "false").lower() == "true"
        self.bad_records_queue: str | None = o.get("badrecordsqueue") or None
        if self.bad_records_queue == self.queue:
            raise BadParameter("the fabric sink's badRecordsQueue must be another queue than its queue")


CHUNK_ROWS = 20_000  # rows per record batch the sink sends (fixed: a replay must cut the same chunks)
CHUNK_BYTES = 2 << 20


@dataclass
class _Rows:
    """A task's rows as columns (strings encoded as UTF-8, headers as dicts or None), with each
    row's sizes as numpy arrays, so that measuring rows and cutting chunks need no Python per row."""

    values: list[bytes]
    keys: list[bytes | None] | None
    headers: list[dict[str, bytes] | None] | None
    partitions: list[int | None] | None
    sources: list[str] | None = None  # "queue/partition@offset" when the rows carry the source's columns
    value_lens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    key_lens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # 0 for no key
    header_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # encoded; 0 without the column

    def __post_init__(self) -> None:
        n = len(self.values)
        if len(self.value_lens) != n:
            self.value_lens = np.fromiter(map(len, self.values), np.int64, n)
        if len(self.key_lens) != n:
            ks = self.keys
            self.key_lens = (
                np.zeros(n, np.int64) if ks is None else np.fromiter((len(k or b"") for k in ks), np.int64, n)
            )
        if len(self.header_bytes) != n:
            hs = self.headers
            self.header_bytes = (
                np.zeros(n, np.int64) if hs is None else np.fromiter(map(_header_bytes, hs), np.int64, n)
            )

    def record_bytes(self) -> np.ndarray:
        """Each row as the node measures a record against ``max_message_bytes``."""
        return self.value_lens + self.key_lens + self.header_bytes


def _header_bytes(h: dict[str, bytes] | None) -> int:
    return 2 + sum(6 + len(k.encode()) + len(v) for k, v in (h or {}).items())


def _lengths(col: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(pc.binary_length(col), 0).to_numpy(zero_copy_only=False), np.int64)


def _utf8(xs: list[Any]) -> list[Any]:
    return [x.encode() if isinstance(x, str) else x for x in xs]


def _columns(batches: Iterator[pa.RecordBatch]) -> _Rows:
    values: list[bytes] = []
    keys: list[bytes | None] = []
    headers: list[dict[str, bytes] | None] = []
    parts: list[int | None] = []
    sources: list[str] = []
    value_lens: list[np.ndarray] = []
    key_lens: list[np.ndarray] = []
    has_keys = has_headers = has_parts = False
    for batch in batches:
        n = batch.num_rows
        names = batch.schema.names
        v = batch.column(names.index("value"))
        if v.null_count:
            raise BadParameter("a null value cannot be written to fabric")
        value_lens.append(_lengths(v))
        got = v.to_pylist()
        values.extend(got if pa.types.is_binary(v.type) else _utf8(got))
        key_lens.append(_lengths(batch.column(names.index("key"))) if "key" in names else np.zeros(n, np.int64))
        for name, out in (("key", keys), ("partition", parts)):
            if name in names:
                col = batch.column(names.index(name)).to_pylist()
                out.extend(_utf8(col) if name == "key" else col)
                if name == "key":
                    has_keys = True
                else:
                    has_parts = True
            else:
                out.extend([None] * n)
        if "queue" in names and "offset" in names and "partition" in names:
            sources.extend(
                f"{q}/{p}@{o}"
                for q, p, o in zip(
                    batch.column(names.index("queue")).to_pylist(),
                    batch.column(names.index("partition")).to_pylist(),
                    batch.column(names.index("offset")).to_pylist(),
                    strict=True,
                )
            )
        if "headers" in names:
            has_headers = True
            headers.extend(
                {a: b.encode() if isinstance(b, str) else b for a, b in h if b is not None} if h else None
                for h in batch.column(names.index("headers")).to_pylist()
            )
        else:
            headers.extend([None] * n)
    return _Rows(
        values,
        keys if has_keys else None,
        headers if has_headers else None,
        parts if has_parts else None,
        sources if len(sources) == len(values) else None,
        np.concatenate(value_lens) if value_lens else np.zeros(0, np.int64),
        np.concatenate(key_lens) if key_lens else np.zeros(0, np.int64),
    )


def _record_bytes(rows: _Rows, i: int) -> int:
    """Row ``i`` as the node measures a record against ``max_message_bytes``: key, encoded
    headers and value."""
    return int(rows.value_lens[i] + rows.key_lens[i] + rows.header_bytes[i])


def _tag_bytes(ident: str, n: int) -> int:
    """The most the ``x-spark-write: W#i`` header adds to a record of a task of ``n`` rows."""
    return 2 + 6 + len(WRITE_HEADER) + len(ident) + 1 + len(str(n))


def _too_large(rows: _Rows, ident: str, limit: int) -> list[int]:
    """The rows that, with the sink's header, are over the target's ``max_message_bytes``."""
    tag = _tag_bytes(ident, len(rows.values))
    return [int(i) for i in np.flatnonzero(rows.record_bytes() + tag > limit)]


def _without(rows: _Rows, drop: list[int]) -> _Rows:
    mask = np.ones(len(rows.values), bool)
    mask[drop] = False
    keep = np.flatnonzero(mask)

    def pick(xs: list[Any] | None) -> list[Any] | None:
        return [xs[i] for i in keep] if xs is not None else None

    return _Rows(
        [rows.values[i] for i in keep],
        pick(rows.keys),
        pick(rows.headers),
        pick(rows.partitions),
        None,
        rows.value_lens[keep],
        rows.key_lens[keep],
        rows.header_bytes[keep],
    )


def _position(rows: _Rows, i: int, ident: str) -> str:
    """Where row ``i`` came from: its source record when the rows carry the source's queue,
    partition and offset columns, and always its place in the Spark task."""
    spark = f"row {i} of Spark task {ident} (writer/batch/task)"
    return f"source record {rows.sources[i]}, {spark}" if rows.sources is not None else spark


def _plan(rows: _Rows, nparts: int, task: int, preserve_order: bool) -> dict[int, list[int]]:
    """Row numbers per target partition, in the order they are written: the canonical order
    (sorted by key, value, headers), the same on every attempt whatever order Spark gives them in,
    unless ``preserve_order`` (then the input's order, which must itself be deterministic)."""
    n = len(rows.values)
    keys, parts = rows.keys, rows.partitions
    if parts is None and keys is None:
        groups = {task % nparts: list(range(n))}
    else:
        groups = {}
        for i in range(n):
            p = parts[i] if parts is not None else None
            if p is None:
                key = keys[i] if keys is not None else None
                p = crc32c(key) % nparts if key is not None else task % nparts
            groups.setdefault(p, []).append(i)
    if not preserve_order:
        v, k, h = rows.values, rows.keys, rows.headers
        for idx in groups.values():
            if k is None and h is None:
                idx.sort(key=v.__getitem__)
            else:
                idx.sort(
                    key=lambda i: (
                        k is not None and k[i] is not None,
                        (k[i] or b"") if k is not None else b"",
                        v[i],
                        sorted((h[i] or {}).items()) if h is not None else [],
                    )
                )
    return groups


def _chunks(rows: _Rows, order: list[int], max_bytes: int, record_max: int | None = None) -> list[tuple[int, int]]:
    """Cut a partition's ordered rows into record batches: ``(first, end)`` positions in ``order``,
    each at most CHUNK_ROWS rows and ``max_bytes`` (a row larger than that alone). With
    ``record_max`` (the target's ``max_message_bytes`` less the sink's header), a batch also ends
    where its largest key plus largest headers plus largest value would pass it: the node bounds a
    batch's largest record by that sum, so two rows that each fit must not be refused together.
    Depends only on the rows and the limits, so every attempt cuts the same chunks."""
    at = np.asarray(order, np.int64)
    cum = np.zeros(len(order) + 1, np.int64)
    np.cumsum(rows.value_lens[at] + rows.key_lens[at] + 64, out=cum[1:])
    out = []
    start, n = 0, len(order)
    while start < n:
        end = int(np.searchsorted(cum, cum[start] + max_bytes, side="right")) - 1
        end = min(max(end, start + 1), start + CHUNK_ROWS, n)
        if record_max is not None:
            end = _record_cut(rows, at, start, end, record_max)
        out.append((start, end))
        start = end
    return out


def _record_cut(rows: _Rows, order: np.ndarray, start: int, end: int, record_max: int) -> int:
    """The end (at most ``end``, at least ``start + 1``) of a batch from ``start`` whose largest
    key + largest headers + largest value stays within ``record_max``."""
    at = order[start:end]
    big = (
        np.maximum.accumulate(rows.value_lens[at])
        + np.maximum.accumulate(rows.key_lens[at])
        + np.maximum.accumulate(rows.header_bytes[at])
    )
    over = np.flatnonzero(big[1:] > record_max)
    return start + 1 + int(over[0]) if len(over) else end


def _set_aside(admin: Admin, opts: SinkOptions, rows: _Rows, bad: list[int], ident: str, limit: int) -> _Rows:
    """Rows too large for the target queue: without ``badRecordsQueue`` the task fails at once,
    naming the first; with it, they go there (headers say why and from where) and the others on."""
    what = f"over queue {opts.queue!r} max_message_bytes {limit} with the sink's x-spark-write header"
    if opts.bad_records_queue is None:
        first = bad[0]
        raise MessageTooLarge(
            f"{len(bad)} row(s) {what} ({_record_bytes(rows, first)} bytes and more); the first: "
            f"{_position(rows, first, ident)}. Make them smaller, raise max_message_bytes, or send them "
            "elsewhere with option('badRecordsQueue', NAME)"
        )
    bq = opts.bad_records_queue
    try:
        settings = admin.describe_queue(bq)["settings"]
    except UnknownQueue:
        # room for the rows the target refused; a replayed task's rows are dropped as repeats
        big = min(64 << 20, max(2 * limit, 1 << 20))
        made = admin.create_queue(
            bq, if_not_exists=True, max_message_bytes=big, max_batch_bytes=big, dedup_window_ms=BAD_DEDUP_MS
        )
        settings = made.get("settings") or admin.describe_queue(bq)["settings"]
    dedup = bool(settings.get("dedup_window_ms"))  # a queue of the user's without a window: at least once
    with Producer(opts.endpoint, acks=opts.acks, linger_ms=0) as producer:
        futures = []
        for i in bad:
            hdrs: dict[str, bytes | str] = dict(rows.headers[i] or {}) if rows.headers is not None else {}
            hdrs.update(
                {
                    "x-spark-bad-reason": f"{_record_bytes(rows, i)} bytes {what}",
                    "x-spark-bad-target": opts.queue,
                    "x-spark-bad-position": _position(rows, i, ident),
                }
            )
            key = rows.keys[i] if rows.keys is not None else None
            futures.append(
                producer.send(bq, rows.values[i], key=key, headers=hdrs, dedup_id=f"{ident}#{i}" if dedup else None)
            )
        producer.flush(timeout=opts.timeout_s)
        for f in futures:
            f.result(timeout=opts.timeout_s)
    log.warning("%s: %d row(s) %s went to %r", ident, len(bad), what, bq)
    return _without(rows, bad)


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


def _stored(admin: Admin, queue: str, start: dict[str, int], ident: str, timeout_s: float) -> dict[int, set[int]]:
    """For each partition, the chunks of ``ident`` stored at or after ``start`` (its ``begin``
    watermarks), by their first position, reading up to the log's end as it is now (waiting for
    the high watermark to cover what an earlier attempt appended)."""
    prefix = (ident + "#").encode()
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
                        if tag is not None and tag.startswith(prefix):
                            seen.add(int(tag[len(prefix) :]))
                offset = b.base_offset + len(b.values)
    return out


def _describe(admin: Admin, queue: str) -> dict[str, Any]:
    """The target queue's description, creating it from the node's defaults if it does not exist."""
    try:
        return admin.describe_queue(queue)
    except UnknownQueue:
        return admin.create_queue(queue, if_not_exists=True)


def _connect(opts: SinkOptions) -> Admin:
    deadline = time.monotonic() + opts.timeout_s
    while True:
        try:
            admin = Admin(opts.endpoint, timeout_ms=10_000)
            admin.ping()
            return admin
        except (ConnectionFailed, Timeout):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def write_task(opts: SinkOptions, writer: str, batch: int, task: int, data: Iterator[pa.RecordBatch]) -> SinkCommit:
    """Store one Spark task's rows exactly once (see the module's docstring)."""
    ident = f"{writer}/{batch}/{task}"
    admin = _connect(opts)
    producer: Producer | None = None
    try:
        markers = _Markers(admin, writer)
        begin, done = markers.find(batch, task)
        if done is not None:
            for _ in data:  # Spark expects the input consumed
                pass
            return SinkCommit(task, 0, sum(done["n"].values()), True, {int(p): n for p, n in done["n"].items()})
        rows = _columns(data)
        desc = _describe(admin, opts.queue)
        nparts = len(desc["partition_detail"])
        chunk_bytes = min(CHUNK_BYTES, desc["settings"]["max_batch_bytes"] // 2)
        limit = desc["settings"]["max_message_bytes"]
        bad = _too_large(rows, ident, limit)
        if bad:
            rows = _set_aside(admin, opts, rows, bad, ident, limit)
        plan = _plan(rows, nparts, task, opts.preserve_order) if rows.values else {}
        producer = Producer(opts.endpoint, acks=opts.acks, linger_ms=0)
        if begin is None:
            start = {str(r["partition"]): r["high_watermark"] for r in desc["partition_detail"]} if plan else {}
            begin = {"k": "begin", "b": batch, "t": task, "start": start}
            markers.append(producer, begin)
            stored: dict[int, set[int]] = {}
            replay = False
        else:
            stored = _stored(admin, opts.queue, begin["start"], ident, opts.timeout_s)
            replay = True
        sent = skipped = 0
        last = []
        v, k, h = rows.values, rows.keys, rows.headers
        for p, order in plan.items():
            have = stored.get(p, set())
            for a, z in _chunks(rows, order, chunk_bytes, limit - _tag_bytes(ident, len(rows.values))):
                if a in have:
                    skipped += z - a
                    continue
                idx = order[a:z]
                hdrs: list[dict[str, bytes] | None] = [h[i] for i in idx] if h is not None else [None] * len(idx)
                first = dict(hdrs[0] or {})
                first[WRITE_HEADER] = b"%s#%d" % (ident.encode(), a)
                hdrs[0] = first
                last.append(
                    producer.send_batch(
                        opts.queue,
                        [v[i] for i in idx],
                        partition=p,
                        keys=[k[i] for i in idx] if k is not None else None,
                        headers=hdrs,
                    )
                )
                sent += z - a
        producer.flush(timeout=opts.timeout_s)
        for f in last:
            f.result(timeout=opts.timeout_s)  # raises if a chunk failed: the task fails, its replay resumes
        counts = {p: len(order) for p, order in plan.items()}
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
