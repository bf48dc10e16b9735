"""The Spark source and sink of another build beside this one's, in one SparkSession and run.

    python -m tools.spark_before_after cbcb8e6                  # 2,000,000 messages, 3 rounds
    python -m tools.spark_before_after cbcb8e6 --messages 500000 --rounds 2

Copies ``fabric/spark`` of the given git revision into a temporary package (``fabric_before``,
its data source renamed ``fabric_before``), starts one ``fabric up`` node and one local
SparkSession, fills a queue as ``python -m fabric.spark.bench`` does, and times, interleaved
round by round: the source before and now (``Trigger.AvailableNow`` into ``noop``), Spark
streaming the same rows from Parquet, the empty reader (``fabric_floor``), then the sink before
and now (a batch write job) and Spark writing Parquet. Prints one JSON object: every round's
rows/s and the best of each as a ratio to Parquet. The two builds share this build's client.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from fabric.client import Admin
from fabric.spark.bench import fill, timed
from fabric.spark.floor import FloorDataSource
from fabric.spark.session import local_session
from fabric.testing import Node


def before_package(rev: str, root: str) -> str:
    """``fabric/spark`` at ``rev`` as the package ``fabric_before`` under ``root``; returns root."""
    pkg = os.path.join(root, "fabric_before")
    os.makedirs(pkg)
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{rev}:fabric/spark"], check=True, capture_output=True, text=True
    ).stdout.split()
    for name in names:
        if not name.endswith(".py"):
            continue
        text = subprocess.run(
            ["git", "show", f"{rev}:fabric/spark/{name}"], check=True, capture_output=True, text=True
        ).stdout
        text = re.sub(r"\bfabric\.spark\b", "fabric_before", text)
        text = text.replace('return "fabric"', 'return "fabric_before"')
        with open(os.path.join(pkg, name), "w") as f:
            f.write(text)
    return root


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="git revision whose fabric/spark is 'before'")
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="fabric-spark-ba-")
    root = before_package(args.rev, os.path.join(work, "before"))
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])  # Spark's workers
    from fabric_before.source import FabricDataSource as Before  # type: ignore[import-not-found]

    node = Node(os.path.join(work, "data"))
    n = args.messages
    out: dict[str, Any] = {
        "before": args.rev,
        "messages": n,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        ep = node.endpoint
        fill(ep, "bench", n, args.partitions, args.value_bytes)
        spark = local_session("fabric-before-after")
        spark.dataSource.register(Before)
        spark.dataSource.register(FloorDataSource)
        runs = iter(range(1_000_000))

        def stream(fmt: str, **options: Any) -> Any:
            def go() -> None:
                r = spark.readStream.format(fmt)
                for k, v in options.items():
                    r = r.option(k, v)
                q = (
                    r.load()
                    .writeStream.format("noop")
                    .option("checkpointLocation", os.path.join(work, f"ck-{next(runs)}"))
                    .trigger(availableNow=True)
                    .start()
                )
                q.awaitTermination()
                got = sum(p["numInputRows"] for p in q.recentProgress)
                assert got == n, f"{fmt}: read {got} rows, expected {n}"

            return go

        parquet = os.path.join(work, "parquet")
        spark.read.format("fabric").option("endpoint", ep).option("queue", "bench").load().write.parquet(parquet)
        schema = spark.read.parquet(parquet).schema

        def parquet_stream() -> None:
            q = (
                spark.readStream.schema(schema)
                .parquet(parquet)
                .writeStream.format("noop")
                .option("checkpointLocation", os.path.join(work, f"ck-{next(runs)}"))
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination()

        src = {"endpoint": ep, "queue": "bench", "startingOffsets": "earliest"}
        reads = {
            "source_before": stream("fabric_before", **src),
            "source_now": stream("fabric", **src),
            "parquet": parquet_stream,
            "floor": stream("fabric_floor", rows=n, partitions=args.partitions, valueBytes=args.value_bytes),
        }
        rows = spark.read.parquet(parquet).select("value")

        def sink(fmt: str) -> Any:
            def go() -> None:
                rows.write.format(fmt).option("endpoint", ep).option("queue", f"out.{fmt}").mode("append").save()

            return go

        def parquet_write() -> None:
            rows.write.mode("overwrite").parquet(os.path.join(work, "parquet-out"))

        writes = {"sink_before": sink("fabric_before"), "sink_now": sink("fabric"), "parquet": parquet_write}
        for cases, key in ((reads, "read"), (writes, "write")):
            for fn in cases.values():
                fn()  # warm-up, not timed
            times: dict[str, list[float]] = {k: [] for k in cases}
            for _ in range(args.rounds):
                for name, fn in cases.items():
                    times[name].append(timed(fn))
            out[f"{key}_rounds_rows_per_s"] = {k: [round(n / t) for t in v] for k, v in times.items()}
            out[f"{key}_vs_parquet"] = {k: round(min(times["parquet"]) / min(v), 2) for k, v in times.items()}
        with Admin(ep) as a:
            for fmt in ("fabric_before", "fabric"):
                stored = a.describe_queue(f"out.{fmt}")["messages"]
                assert stored == n * (args.rounds + 1), f"{fmt} stored {stored}"
        out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        spark.stop()
    finally:
        node.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
