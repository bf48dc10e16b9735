"""The `fabric` source against a real node: batch reads, startingOffsets, admission control, availableNow."""

from __future__ import annotations

import json
import time

import pytest

from tests.spark.conftest import produce

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_batch_read_over_an_offset_range_and_a_time_range(spark, fabric_node):
    ep = fabric_node.endpoint
    produce(ep, "br", 1000, partitions=2)
    time.sleep(0.05)
    since_ms = int(time.time() * 1000)
    produce(ep, "br", 500, partitions=2, start=1000)

    def load(**options):
        r = spark.read.format("fabric").option("endpoint", ep).option("queue", "br")
        for k, v in options.items():
            r = r.option(k, v)
        return r.load()

    assert load().count() == 1500
    rows = load(startingOffsets='{"0": 100, "1": 0}', endingOffsets='{"0": 200, "1": 50}').collect()
    got = sorted((r.partition, r.offset) for r in rows)
    assert got == [(0, o) for o in range(100, 200)] + [(1, o) for o in range(50)]
    assert all(r.queue == "br" and r.value.startswith(b"m") and r.key.startswith(b"k") for r in rows)
    later = load(startingOffsets=f"timestamp:{since_ms}").collect()
    assert sorted(int(r.value[1:]) for r in later) == list(range(1000, 1500))
    assert all(r.timestamp.timestamp() * 1000 >= since_ms - 1 for r in later)


def test_starting_offsets_max_records_per_trigger_and_available_now(spark, fabric_node, tmp_path):
    ep = fabric_node.endpoint
    produce(ep, "opts", 2000, partitions=4)
    from fabric.client import Admin

    with Admin(ep) as a:
        hw = {r["partition"]: r["high_watermark"] for r in a.describe_queue("opts")["partition_detail"]}
    q = (
        spark.readStream.format("fabric")
        .option("endpoint", ep)
        .option("queue", "opts")
        .option("startingOffsets", json.dumps({"0": 10, "1": -2, "2": -1, "3": 5}))
        .option("maxRecordsPerTrigger", "600")
        .option("queryName", "opts")
        .load()
        .selectExpr("partition", "offset")
        .writeStream.format("memory")
        .queryName("opts_mem")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(120)
    got = sorted((r.partition, r.offset) for r in spark.sql("select * from opts_mem").collect())
    want = sorted(
        [(0, o) for o in range(10, hw[0])] + [(1, o) for o in range(hw[1])] + [(3, o) for o in range(5, hw[3])]
    )
    assert got == want
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert all(n <= 600 for n in sizes) and sum(sizes) == len(want)
    assert len(sizes) == -(-len(want) // 600)  # every batch full but the last
    # the query holds retention from what Spark committed (commit() is a batch late, so behind the end)
    with Admin(ep) as a:
        held = a.committed("opts", "spark.opts")
    assert set(held) == {0, 1, 2, 3} and held[0] >= 10 and held[3] >= 5
    assert all(held[p] <= hw[p] for p in held) and sum(held.values()) < sum(hw.values())
