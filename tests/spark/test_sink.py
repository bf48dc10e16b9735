"""The sink stores a replayed batch once: a failed micro-batch run again, and a task that crashed mid-write."""

from __future__ import annotations

import collections

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StructField, StructType

from fabric.client import Admin, Producer
from fabric.spark import sink
from tests.spark.conftest import produce, read_all

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_a_failed_micro_batch_replayed_from_the_checkpoint_is_stored_once(spark, fabric_node, tmp_path):
    ep = fabric_node.endpoint
    produce(ep, "wr", 4000, partitions=2)
    flag = tmp_path / "fail"
    flag.write_text("1")
    path = str(flag)

    def maybe_fail(value, partition):
        import os

        if partition == 1 and os.path.exists(path):
            raise RuntimeError("injected failure in the task of partition 1")
        return value

    fail = F.udf(maybe_fail, BinaryType())

    def start():
        return (
            spark.readStream.format("fabric")
            .option("endpoint", ep)
            .option("queue", "wr")
            .option("startingOffsets", "earliest")
            .load()
            .select(fail("value", "partition").alias("value"), "key")
            .writeStream.format("fabric")
            .option("endpoint", ep)
            .option("queue", "wr.out")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )

    q = start()
    with pytest.raises(StreamingQueryException, match="injected failure"):
        q.awaitTermination(120)  # the batch failed after the other task had written its rows
    partial = len(read_all(ep, "wr.out"))
    assert 0 < partial < 4000
    flag.unlink()
    q = start()  # the same batch id again, from the checkpoint
    assert q.awaitTermination(120) and q.exception() is None
    values = collections.Counter(v for _, _, _, v, _ in read_all(ep, "wr.out"))
    assert sum(values.values()) == 4000 and all(n == 1 for n in values.values())
    assert set(values) == {b"m%d" % i for i in range(4000)}


def test_a_task_that_crashed_mid_write_sends_only_what_is_missing(fabric_node, monkeypatch):
    """An attempt stored `begin` and some of its chunks (not even a prefix: a chunk that failed
    left a hole), then died; the next attempt sends exactly the chunks that are missing."""
    monkeypatch.setattr(sink, "CHUNK_ROWS", 50)
    ep = fabric_node.endpoint
    with Admin(ep) as a:
        a.create_queue("pt.out", partitions=3)
    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
    opts = sink.SinkOptions({"endpoint": ep, "queue": "pt.out"}, schema)
    keys = [b"k%d" % (i % 31) for i in range(900)]
    values = [b"v%d" % i for i in range(900)]

    def data(reverse: bool):
        k, v = (keys[::-1], values[::-1]) if reverse else (keys, values)
        yield pa.RecordBatch.from_arrays([pa.array(k), pa.array(v)], names=["key", "value"])

    # what the crashed attempt (rows in another order) left: its begin marker, chunks 0 and 2 of each partition
    ident = "w1/7/0"
    rows = sink._columns(data(reverse=True))
    early = 0
    with Admin(ep) as a, Producer(ep) as p:
        markers = sink._Markers(a, "w1")
        start = {str(r["partition"]): r["high_watermark"] for r in a.describe_queue("pt.out")["partition_detail"]}
        markers.append(p, {"k": "begin", "b": 7, "t": 0, "start": start})
        for part, order in sink._plan(rows, 3, 0, preserve_order=False).items():
            chunks = sink._chunks(rows, order, 1 << 20)
            assert len(chunks) >= 3
            for a_, z in (chunks[0], chunks[2]):
                idx = order[a_:z]
                hdrs = [{sink.WRITE_HEADER: b"%s#%d" % (ident.encode(), a_)}] + [None] * (len(idx) - 1)
                p.send_batch(
                    "pt.out",
                    [rows.values[i] for i in idx],
                    partition=part,
                    keys=[rows.keys[i] for i in idx],
                    headers=hdrs,
                )
                early += len(idx)
        p.flush(30)
    done = sink.write_task(opts, "w1", 7, 0, data(reverse=False))
    assert done.replay and done.skipped == early and done.stored == 900 - early
    again = sink.write_task(opts, "w1", 7, 0, data(reverse=False))  # after `done`: nothing is sent
    assert again.stored == 0 and again.skipped == 900
    stored = collections.Counter(v for _, _, _, v, _ in read_all(ep, "pt.out"))
    assert sum(stored.values()) == 900 and set(stored) == set(values)
