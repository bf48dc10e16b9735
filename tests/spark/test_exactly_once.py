"""Exactly once end to end: fabric -> Spark -> fabric, with the query stopped and the node killed."""

from __future__ import annotations

import collections
import time

import pytest
from pyspark.errors import StreamingQueryException

from tests.conftest import kill9
from tests.spark.conftest import RestartableNode, produce, read_all, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def start_copy(spark, ep: str, src: str, dst: str, checkpoint: str, *, max_rows: int, available_now: bool):
    """src -> dst, one output row "<partition>:<offset>" per input record."""
    w = (
        spark.readStream.format("fabric")
        .option("endpoint", ep)
        .option("queue", src)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", str(max_rows))
        .load()
        .selectExpr("concat(cast(partition as string), ':', cast(offset as string)) as value")
        .writeStream.format("fabric")
        .option("endpoint", ep)
        .option("queue", dst)
        .option("checkpointLocation", checkpoint)
    )
    return (w.trigger(availableNow=True) if available_now else w.trigger(processingTime="0 seconds")).start()


def finished(q) -> bool:
    """Wait for an availableNow query; True if it ended without an error."""
    try:
        return bool(q.awaitTermination(180))
    except StreamingQueryException:
        return False


def assert_once(ep: str, src: str, dst: str, total: int) -> None:
    from fabric.client import Admin

    with Admin(ep) as a:
        hw = {r["partition"]: r["high_watermark"] for r in a.describe_queue(src)["partition_detail"]}
    assert sum(hw.values()) == total
    counts = collections.Counter(v.decode() for _, _, _, v, _ in read_all(ep, dst))
    dup = [k for k, n in counts.items() if n > 1]
    assert not dup, f"{len(dup)} records stored more than once, e.g. {dup[:5]}"
    want = {f"{p}:{o}" for p, n in hw.items() for o in range(n)}
    missing = want - set(counts)
    assert not missing, f"{len(missing)} records never stored, e.g. {sorted(missing)[:5]}"
    assert len(counts) == total


def test_100k_messages_query_stopped_mid_run_and_restarted(spark, fabric_node, tmp_path):
    ep = fabric_node.endpoint
    produce(ep, "s100k", 100_000, partitions=4)
    ck = str(tmp_path / "ck")
    q = start_copy(spark, ep, "s100k", "s100k.out", ck, max_rows=50_000, available_now=False)
    assert wait_for(lambda: q.recentProgress and q.recentProgress[-1]["numInputRows"] > 0, 90)
    q.stop()  # mid-run: the next batch may be planned, running or half written
    first = sum(p["numInputRows"] for p in q.recentProgress)
    assert 0 < first < 100_000
    q = start_copy(spark, ep, "s100k", "s100k.out", ck, max_rows=50_000, available_now=True)
    assert q.awaitTermination(180)
    assert q.exception() is None
    assert_once(ep, "s100k", "s100k.out", 100_000)


def test_node_killed_mid_run_query_resumes_exactly_once(spark, tmp_path):
    node = RestartableNode(str(tmp_path / "data"))
    try:
        ep = node.endpoint
        produce(ep, "k9", 12_000, partitions=4)
        ck = str(tmp_path / "ck")
        q = start_copy(spark, ep, "k9", "k9.out", ck, max_rows=3000, available_now=True)
        assert wait_for(lambda: len(q.recentProgress) >= 1, 90)
        kill9(node.node)
        time.sleep(0.5)
        node.restart()
        restarts = 0
        while not finished(q) and restarts < 2:  # a task out of attempts: restart from the checkpoint
            restarts += 1
            q = start_copy(spark, ep, "k9", "k9.out", ck, max_rows=3000, available_now=True)
        assert finished(q)
        assert_once(ep, "k9", "k9.out", 12_000)
    finally:
        node.stop()
