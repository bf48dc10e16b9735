"""The ``fabric`` PySpark data source: batch and streaming reads, batch and streaming writes.

Theory of operation
-------------------
Spark keeps the source's progress, not fabric: a source offset is ``{"<partition>": next
offset}`` (:mod:`fabric.spark.offsets`), checkpointed by Spark in its offset log before a
micro-batch runs, so a restarted query replays exactly the ranges it had planned. The driver side
(:class:`FabricStreamReader`) only asks the node for watermarks (DESCRIBE_QUEUE, LIST_OFFSETS);
the records are read by the tasks, one offset range each (:func:`fabric.spark.reading.read_range`),
with FETCH, which holds nothing on the node. ``commit(end)`` arrives a batch late and not at all
for the last ``availableNow`` batch, so it is never the record of progress: it only moves the
query's retention hold (:mod:`fabric.spark.queries`). Readers are pickled to the workers: no
socket is opened in ``__init__``, and the driver's connection is dropped from the pickle.

Writes: :mod:`fabric.spark.sink`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from fabric.client import Admin
from fabric.errors import BadParameter, ConnectionFailed, Timeout
from fabric.spark import offsets as off
from fabric.spark.queries import hold_retention
from fabric.spark.reading import SCHEMA_DDL, read_range

log = logging.getLogger("fabric.spark")
T = TypeVar("T")


class FabricRange(InputPartition):
    """One Spark task's share of a batch: records ``start <= offset < end`` of one partition."""

    def __init__(self, queue: str, partition: int, start: int, end: int) -> None:
        super().__init__((queue, partition, start, end))
        self.queue, self.partition, self.start, self.end = queue, partition, start, end


class Options:
    """The source's and sink's options, checked once on the driver."""

    def __init__(self, options: dict[str, str]) -> None:
        o = {k.lower(): v for k, v in options.items()}
        self.endpoint: str | None = o.get("endpoint") or None
        self.queue = o.get("queue") or o.get("path") or ""
        if not self.queue:
            raise BadParameter("the fabric data source needs option('queue', NAME)")
        self.starting = o.get("startingoffsets")
        self.ending = o.get("endingoffsets")
        self.max_rows = _int(o, "maxrecordspertrigger", None) or _int(o, "maxoffsetspertrigger", None)
        self.max_bytes = _int(o, "maxbytespertrigger", None)
        self.min_partitions = _int(o, "minpartitions", 0) or 0
        self.max_records_per_partition = _int(o, "maxrecordsperpartition", 1_000_000) or 1_000_000
        self.fail_on_data_loss = o.get("failondataloss", "true").lower() != "false"
        self.timeout_s = (_int(o, "timeoutms", 120_000) or 120_000) / 1000
        self.query_name = o.get("queryname") or None
        self.fetch_bytes = _int(o, "fetchbytes", 8 << 20) or (8 << 20)
        self.options = o


def _int(o: dict[str, str], key: str, default: int | None) -> int | None:
    if key not in o:
        return default
    try:
        v = int(o[key])
    except ValueError:
        raise BadParameter(f"option {key} must be an integer, got {o[key]!r}") from None
    if v <= 0:
        raise BadParameter(f"option {key} must be > 0, got {v}")
    return v


class FabricDataSource(DataSource):
    """``spark.read/readStream.format("fabric")`` and ``df.write/writeStream.format("fabric")``."""

    @classmethod
    def name(cls) -> str:
        return "fabric"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return FabricBatchReader(dict(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FabricStreamReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from fabric.spark.sink import FabricBatchWriter

        if overwrite:
            raise BadParameter("a fabric queue is appended to: use mode('append')")
        return FabricBatchWriter(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from fabric.spark.sink import FabricStreamWriter

        return FabricStreamWriter(dict(self.options), schema)


class _Driver:
    """What the driver side of a reader asks the node, with retries while the node is away."""

    def __init__(self, options: dict[str, str]) -> None:
        self.opts = Options(options)
        self._admin: Admin | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_admin"] = None  # a socket is never pickled to the workers
        return state

    def _call(self, fn: Callable[[Admin], T]) -> T:
        deadline = time.monotonic() + self.opts.timeout_s
        while True:
            try:
                if self._admin is None:
                    self._admin = Admin(self.opts.endpoint, timeout_ms=5000)
                return fn(self._admin)
            except (ConnectionFailed, Timeout):
                if self._admin is not None:
                    self._admin.close()
                    self._admin = None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _detail(self) -> list[dict[str, Any]]:
        return list(self._call(lambda a: a.describe_queue(self.opts.queue))["partition_detail"])

    def resolve(self, spec: off.Spec) -> off.Offsets:
        """Every partition's offset for a parsed starting/ending spec."""
        out = {}
        for row in self._detail():
            p = row["partition"]
            want = spec.per_partition.get(p, spec.at)
            if want == off.EARLIEST or want == "earliest":
                out[p] = row["log_start_offset"]
            elif want == off.LATEST or want == "latest":
                out[p] = row["high_watermark"]
            elif isinstance(want, str):
                raise BadParameter(f"bad offset {want!r}")
            elif p in spec.per_partition:
                out[p] = min(max(want, row["log_start_offset"]), row["high_watermark"])
            else:  # a timestamp for every partition
                out[p] = self._offset_at(p, want)
        return off.encode(out)

    def _offset_at(self, partition: int, timestamp_ms: int) -> int:
        """The first offset of ``partition`` stamped at or after ``timestamp_ms`` (the end if none)."""
        return int(self._call(lambda a: a.list_offsets(self.opts.queue, partition, timestamp_ms))["offset"])

    def latest(self) -> tuple[off.Offsets, float]:
        """High watermarks and the mean stored bytes per record."""
        detail = self._detail()
        messages = sum(r["messages"] for r in detail)
        size = sum(r["size_bytes"] for r in detail)
        return off.encode({r["partition"]: r["high_watermark"] for r in detail}), size / max(1, messages)

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None


def _read(opts: Options, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    assert isinstance(partition, FabricRange)
    yield from read_range(
        opts.endpoint,
        partition.queue,
        partition.partition,
        partition.start,
        partition.end,
        fail_on_data_loss=opts.fail_on_data_loss,
        timeout_s=opts.timeout_s,
        fetch_bytes=opts.fetch_bytes,
    )


def _ranges(opts: Options, start: dict, end: dict) -> list[FabricRange]:
    return [
        FabricRange(opts.queue, p, a, b)
        for p, a, b in off.split(
            start, end, min_partitions=opts.min_partitions, max_records=opts.max_records_per_partition
        )
    ]


class FabricBatchReader(_Driver, DataSourceReader):
    """``spark.read.format("fabric")``: ``startingOffsets`` (default earliest) up to
    ``endingOffsets`` (default latest), each earliest | latest | JSON | timestamp:<ms>."""

    def partitions(self) -> Sequence[InputPartition]:
        start = self.resolve(off.parse_spec(self.opts.starting, "earliest"))
        end = self.resolve(off.parse_spec(self.opts.ending, "latest"))
        self.close()
        return _ranges(self.opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)


class FabricStreamReader(_Driver, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("fabric")``: micro-batches of offset ranges, with admission control
    (``maxRecordsPerTrigger``, ``maxBytesPerTrigger``) and ``Trigger.AvailableNow``."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._target: off.Offsets | None = None  # Trigger.AvailableNow: never read past this

    def initialOffset(self) -> dict:
        start = self.resolve(off.parse_spec(self.opts.starting, "latest"))
        if self.opts.query_name:
            self._call(lambda a: hold_retention(a, self.opts.queue, self.opts.query_name or "", start))
        return start

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_rows:
            return ReadMaxRows(self.opts.max_rows)
        if self.opts.max_bytes:
            return ReadMaxBytes(self.opts.max_bytes)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest, record_bytes = self.latest()
        start = {p: start.get(p, 0) for p in latest}  # a partition added since starts at 0
        end = latest if self._target is None else off.clamp(latest, self._target)
        if not isinstance(limit, ReadAllAvailable):
            if isinstance(limit, ReadMaxRows):
                end = off.cap_rows(start, end, limit.max_rows)
            elif isinstance(limit, ReadMaxBytes):
                end = off.cap_bytes(start, end, limit.max_bytes, record_bytes)
            if self.opts.max_rows:  # both options set: the stricter one wins
                end = off.cap_rows(start, end, self.opts.max_rows)
            if self.opts.max_bytes:
                end = off.cap_bytes(start, end, self.opts.max_bytes, record_bytes)
        return {p: max(end[p], start[p]) for p in end}

    def reportLatestOffset(self) -> dict | None:
        return self.latest()[0]

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.latest()[0]

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return _ranges(self.opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)

    def commit(self, end: dict) -> None:
        """Spark will not ask for offsets before ``end`` again: move the retention hold there."""
        if self.opts.query_name:
            self._call(lambda a: hold_retention(a, self.opts.queue, self.opts.query_name or "", end))

    def stop(self) -> None:
        self.close()
