"""The Python data source path's own cost: a source that reads nothing (benchmarks only).

``spark.readStream.format("fabric_floor")`` yields, in each of ``partitions`` tasks, Arrow record
batches of the ``fabric`` source's schema and shape (``batchRows`` records of ``valueBytes`` bytes
per batch, built once per task with :mod:`fabric.spark.arrow_records` from an encoded record batch,
then yielded again and again from memory) until ``rows`` records in all are read, in one
micro-batch. What it costs is what Spark's Python data source path (planning through Python
workers, Arrow IPC from the worker, Arrow to rows in the JVM) costs the ``fabric`` source with
no node, FETCH or decoding behind it: ``python -m fabric.spark.bench`` reports it beside the source.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

from fabric.protocol.batch import encode_batch
from fabric.spark.arrow_records import decode_fetched
from fabric.spark.reading import SCHEMA_DDL


class FloorShare(InputPartition):
    def __init__(self, rows: int, batch_rows: int, value_bytes: int) -> None:
        super().__init__((rows, batch_rows, value_bytes))
        self.rows, self.batch_rows, self.value_bytes = rows, batch_rows, value_bytes


def floor_batches(rows: int, batch_rows: int, value_bytes: int) -> Iterator[pa.RecordBatch]:
    """``rows`` records as Arrow record batches of ``batch_rows``, one batch built and reused."""
    n = min(rows, batch_rows)
    if n <= 0:
        return
    body = b"x" * max(0, value_bytes - 8)
    batch, _ = decode_fetched("floor", 0, [encode_batch([b"%08d" % i + body for i in range(n)])], 0, n)
    assert batch is not None
    left = rows
    while left > 0:
        k = min(n, left)
        yield batch if k == n else batch.slice(0, k)
        left -= k


class FloorStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        o = {k.lower(): v for k, v in options.items()}
        self.rows = int(o.get("rows", "1000000"))
        self.partitions_n = int(o.get("partitions", "4"))
        self.batch_rows = int(o.get("batchrows", "70000"))
        self.value_bytes = int(o.get("valuebytes", "100"))

    def initialOffset(self) -> dict:
        return {"rows": 0}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return {"rows": self.rows}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        n = end["rows"] - start["rows"]
        k = self.partitions_n
        return [FloorShare(n // k + (i < n % k), self.batch_rows, self.value_bytes) for i in range(k)] if n else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FloorShare)
        return floor_batches(partition.rows, partition.batch_rows, partition.value_bytes)

    def commit(self, end: dict) -> None:
        pass


class FloorDataSource(DataSource):
    """``spark.readStream.format("fabric_floor")``: options ``rows``, ``partitions``, ``batchRows``,
    ``valueBytes``."""

    @classmethod
    def name(cls) -> str:
        return "fabric_floor"

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FloorStreamReader(dict(self.options))
