"""Throughput of the fabric source and sink beside Spark's Parquet, in one run.

    python -m fabric.spark.bench                       # 2,000,000 messages of 100 bytes, 4 partitions
    python -m fabric.spark.bench --messages 200000     # a quick look
    python -m fabric.spark.bench --decode-only         # the source's Python side alone, no Spark, no node

Starts its own ``fabric up`` on a free loopback port and a local SparkSession, fills a queue, then
times (wall clock, session start and a warm-up query excluded; each case ``--rounds`` times,
interleaved, the best kept, every round printed): the source with ``Trigger.AvailableNow`` into
the ``noop`` sink, Spark streaming the same rows from a Parquet copy into ``noop``, the empty
reader (``fabric_floor``, :mod:`fabric.spark.floor`: the same Arrow batches from memory, so the
Python data source path's own cost), the fabric sink writing them (a batch write job), and Spark
writing them as Parquet. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from typing import Any

from fabric.client import Admin, Producer
from fabric.protocol.batch import encode_batch, stamp
from fabric.spark.arrow_records import decode_fetched
from fabric.spark.floor import FloorDataSource
from fabric.spark.session import local_session
from fabric.testing import Node


def fill(endpoint: str, queue: str, messages: int, partitions: int, value_bytes: int) -> float:
    with Admin(endpoint) as a:
        a.create_queue(queue, partitions=partitions, if_not_exists=True)
    body = b"x" * max(0, value_bytes - 8)
    t = time.perf_counter()
    with Producer(endpoint, linger_ms=5, batch_bytes=1 << 20) as p:
        for i in range(messages):
            p.send(queue, b"%08d" % (i % 100_000_000) + body)
        p.flush(300)
    return messages / (time.perf_counter() - t)


def decode_only(messages: int, value_bytes: int, rounds: int) -> dict[str, Any]:
    """Rows/s of one process turning FETCH replies (8 MiB of 1 MiB record batches, as ``fill``
    makes them) into the source's Arrow batches: CRC checks, columns, Arrow buffers."""
    body = b"x" * max(0, value_bytes - 8)
    per_batch = max(1, (1 << 20) // (value_bytes + 4))
    replies: list[bytes] = []
    base = 0
    while base < messages:
        parts = []
        for _ in range(8):
            k = min(per_batch, messages - base)
            if k <= 0:
                break
            b = bytearray(encode_batch([b"%08d" % ((base + i) % 100_000_000) + body for i in range(k)]))
            stamp(b, base)
            parts.append(bytes(b))
            base += k
        replies.append(b"".join(parts))
    best = float("inf")
    rates = []
    for _ in range(rounds):
        t = time.perf_counter()
        offset = 0
        for r in replies:
            _, offset = decode_fetched("bench", 0, [r], offset, messages)
        dt = time.perf_counter() - t
        rates.append(round(messages / dt))
        best = min(best, dt)
    return {"decode_rows_per_s": round(messages / best), "decode_rounds_rows_per_s": rates}


def timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--cores", type=int, default=None)
    ap.add_argument("--decode-only", action="store_true", help="time the source's Python side alone and stop")
    ap.add_argument("--rounds", type=int, default=3, help="timed runs of each case (interleaved; the best is kept)")
    args = ap.parse_args(argv)
    if args.decode_only:
        got = {"messages": args.messages, "value_bytes": args.value_bytes, "load_average": os.getloadavg()[0]}
        got.update(decode_only(args.messages, args.value_bytes, args.rounds))
        print(json.dumps(got, indent=2))
        return got
    work = tempfile.mkdtemp(prefix="fabric-spark-bench-")
    node = Node(os.path.join(work, "data"))
    out: dict[str, Any] = {
        "messages": args.messages,
        "partitions": args.partitions,
        "value_bytes": args.value_bytes,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        ep = node.endpoint
        out["produce_msgs_per_s"] = round(fill(ep, "bench", args.messages, args.partitions, args.value_bytes))
        spark = local_session("fabric-bench", cores=args.cores)
        spark.dataSource.register(FloorDataSource)
        import pyspark

        out["spark"] = pyspark.__version__
        n = args.messages

        runs = iter(range(1_000_000))

        def source(queue: str = "bench", expect: int = n) -> None:
            q = (
                spark.readStream.format("fabric")
                .option("endpoint", ep)
                .option("queue", queue)
                .option("startingOffsets", "earliest")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", os.path.join(work, f"ck-src-{next(runs)}"))
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination()
            got = sum(p["numInputRows"] for p in q.recentProgress)
            assert got == expect, f"read {got} rows, expected {expect}"

        parquet = os.path.join(work, "parquet")
        read = spark.read.format("fabric").option("endpoint", ep).option("queue", "bench").load()
        out["fabric_batch_to_parquet_s"] = round(timed(lambda: read.write.parquet(parquet)), 2)
        schema = spark.read.parquet(parquet).schema

        def parquet_source() -> None:
            q = (
                spark.readStream.schema(schema)
                .parquet(parquet)
                .writeStream.format("noop")
                .option("checkpointLocation", os.path.join(work, f"ck-pq-{next(runs)}"))
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination()

        with Admin(ep) as a:  # the rows of one of the source's Arrow batches (one FETCH reply)
            chunks, _ = a.fetch_raw("bench", 0, 0, max_bytes=8 << 20)
        first, _ = decode_fetched("bench", 0, chunks, 0, n)
        batch_rows = first.num_rows if first is not None else 1
        out["source_batch_rows"] = batch_rows

        def floor() -> None:
            q = (
                spark.readStream.format("fabric_floor")
                .option("rows", n)
                .option("partitions", args.partitions)
                .option("batchRows", batch_rows)
                .option("valueBytes", args.value_bytes)
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", os.path.join(work, f"ck-floor-{next(runs)}"))
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination()
            got = sum(p["numInputRows"] for p in q.recentProgress)
            assert got == n, f"floor read {got} rows, expected {n}"

        fill(ep, "warm", 20_000, 2, args.value_bytes)
        source("warm", 20_000)  # the first streaming query of a session pays the JVM's warm-up
        parquet_source()
        floor()
        src: list[float] = []
        pq: list[float] = []
        flo: list[float] = []
        for _ in range(args.rounds):  # interleaved; the best of each
            src.append(timed(source))
            pq.append(timed(parquet_source))
            flo.append(timed(floor))
        out["source_rows_per_s"] = round(n / min(src))
        out["parquet_stream_rows_per_s"] = round(n / min(pq))
        out["floor_rows_per_s"] = round(n / min(flo))
        out["source_vs_parquet"] = round(min(pq) / min(src), 2)
        out["floor_vs_parquet"] = round(min(pq) / min(flo), 2)
        out["source_vs_floor"] = round(min(flo) / min(src), 2)
        out["read_rounds_rows_per_s"] = {
            "source": [round(n / t) for t in src],
            "parquet": [round(n / t) for t in pq],
            "floor": [round(n / t) for t in flo],
        }

        rows = spark.read.parquet(parquet).select("value")

        def sink() -> None:
            rows.write.format("fabric").option("endpoint", ep).option("queue", "bench.out").mode("append").save()

        def parquet_sink() -> None:
            rows.write.mode("overwrite").parquet(os.path.join(work, "parquet-out"))

        snk, pqw = [], []
        for _ in range(args.rounds):
            snk.append(timed(sink))
            pqw.append(timed(parquet_sink))
        with Admin(ep) as a:
            stored = a.describe_queue("bench.out")["messages"]
        assert stored == n * args.rounds, f"sink stored {stored} rows, expected {n * args.rounds}"
        out["sink_rows_per_s"] = round(n / min(snk))
        out["parquet_write_rows_per_s"] = round(n / min(pqw))
        out["sink_vs_parquet"] = round(min(pqw) / min(snk), 2)
        out["write_rounds_rows_per_s"] = {"sink": [round(n / t) for t in snk], "parquet": [round(n / t) for t in pqw]}
        out["rounds"] = args.rounds
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
        spark.stop()
    finally:
        node.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
