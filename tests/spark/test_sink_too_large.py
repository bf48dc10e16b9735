"""A row the sink cannot store in its target (over max_message_bytes once the sink's own header is
on it) fails the write at once naming the row, or goes to the sink's badRecordsQueue."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, MapType, StringType, StructField, StructType

from fabric.client import Admin, Producer
from fabric.errors import MessageTooLarge
from fabric.spark import sink
from tests.spark.conftest import read_all

pytestmark = [pytest.mark.spark, pytest.mark.integration]

LIMIT = 4096
SCHEMA = StructType([StructField("value", BinaryType())])


def _rows(values: list[bytes]):
    yield pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], names=["value"])


def test_a_row_at_the_limit_fails_the_task_at_once_naming_it(fabric_node):
    ep = fabric_node.endpoint
    with Admin(ep) as a:
        a.create_queue("tl.out", max_message_bytes=LIMIT)
    opts = sink.SinkOptions({"endpoint": ep, "queue": "tl.out"}, SCHEMA)
    values = [b"small-%d" % i for i in range(5)] + [b"x" * LIMIT]  # fits the queue, not with the sink's header
    t0 = time.monotonic()
    with pytest.raises(MessageTooLarge, match=r"1 row\(s\) over queue 'tl.out' max_message_bytes 4096.* row 5 of"):
        sink.write_task(opts, "w-tl", 0, 3, _rows(values))
    assert time.monotonic() - t0 < 10  # no retries
    assert read_all(ep, "tl.out") == []  # nothing of the task stored


def test_rows_too_large_go_to_the_bad_records_queue_and_the_rest_is_stored_once(fabric_node):
    ep = fabric_node.endpoint
    with Admin(ep) as a:
        a.create_queue("tb.out", max_message_bytes=LIMIT)
    schema = StructType([*SCHEMA.fields, StructField("headers", MapType(StringType(), BinaryType()))])
    opts = sink.SinkOptions({"endpoint": ep, "queue": "tb.out", "badRecordsQueue": "tb.bad"}, schema)
    # a value just under the limit beside rows with a large header: each fits alone, but the node
    # bounds a batch's largest record by its largest value plus its largest headers
    values = [b"y" * (LIMIT - 200), *(b"small-%d" % i for i in range(50)), b"x" * LIMIT, b"z" * (2 * LIMIT)]
    headers = [None, *([("note", b"n" * 500)] for _ in range(50)), None, None]

    def rows():
        yield pa.RecordBatch.from_arrays(
            [pa.array(values, pa.binary()), pa.array(headers, pa.map_(pa.string(), pa.binary()))],
            names=["value", "headers"],
        )

    for _ in range(2):  # the replay of the task stores nothing twice, in either queue
        sink.write_task(opts, "w-tb", 0, 0, rows())
    good = sorted(v for _, _, _, v, _ in read_all(ep, "tb.out"))
    assert good == sorted(values[:51])
    bad = read_all(ep, "tb.bad")
    assert sorted(v for _, _, _, v, _ in bad) == [b"x" * LIMIT, b"z" * (2 * LIMIT)]
    for _, _, _, _, headers in bad:
        assert headers["x-spark-bad-target"] == b"tb.out"
        assert b"max_message_bytes 4096" in headers["x-spark-bad-reason"]
        assert headers["x-spark-bad-position"].startswith(b"row ")


def test_a_spark_job_reports_the_source_record_of_a_row_too_large(spark, fabric_node):
    ep = fabric_node.endpoint
    with Admin(ep) as a:
        a.create_queue("ts.src", max_message_bytes=LIMIT)
        a.create_queue("ts.out", max_message_bytes=LIMIT)
    with Producer(ep, acks="all") as p:
        for i in range(3):
            p.send("ts.src", b"ok-%d" % i).result(10)
        p.send("ts.src", b"x" * LIMIT).result(10)  # exactly the limit: stored in the source
    df = spark.read.format("fabric").option("endpoint", ep).option("queue", "ts.src").load()
    t0 = time.monotonic()
    with pytest.raises(Exception, match=r"source record ts.src/0@3") as caught:
        df.select("queue", "partition", "offset", "value").write.format("fabric").option("endpoint", ep).option(
            "queue", "ts.out"
        ).mode("append").save()
    assert "badRecordsQueue" in str(caught.value)
    assert time.monotonic() - t0 < 60  # failed at once, not after minutes of retries
