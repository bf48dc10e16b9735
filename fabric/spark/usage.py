"""The usage report: a PySpark batch job over the node's ``__usage`` queue (audit and billing).

Reads every usage record (``fabric.node.usage``: one JSON object per principal, queue and
operation per interval) through the ``fabric`` data source, keeps those that ended at or after
``since_ms``, and sums them per principal, queue and hour (the hour the interval ended in):
messages and bytes produced and consumed. Writes the result as Parquet (``usage.parquet/``) and
CSV (``usage.csv/``, one file with a header) under ``out_dir``, draws the busiest queues by bytes
(produced + consumed) into ``busiest_queues.png`` (matplotlib), and returns the rows, busiest first.
``fabric usage report --since 24h --out DIR`` runs it and prints the top rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

USAGE_QUEUE = "__usage"
SCHEMA = (
    "principal string, queue string, operation string, messages long, bytes long, "
    "start_ms long, end_ms long, node string"
)
CHART_QUEUES = 10


def report(spark: Any, endpoint: str, since_ms: int, out_dir: str | Path) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if _recorded(endpoint):
        raw = (
            spark.read.format("fabric")
            .option("endpoint", endpoint)
            .option("queue", USAGE_QUEUE)
            .option("startingOffsets", "earliest")
            .load()
        )
        records = raw.select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("u")).select("u.*")
    else:  # a node that has recorded nothing yet: a report of no usage, not UNKNOWN_QUEUE
        records = spark.createDataFrame([], SCHEMA)
    usage = records.where(F.col("end_ms") >= F.lit(since_ms)).withColumn(
        "hour", F.date_trunc("hour", F.timestamp_millis(F.col("end_ms")))
    )

    def total(op: str, col: str) -> Any:
        return F.coalesce(F.sum(F.when(F.col("operation") == op, F.col(col))), F.lit(0)).alias(f"{op}d_{col}")

    table = (
        usage.groupBy("principal", "queue", "hour")
        .agg(
            total("produce", "messages"),
            total("produce", "bytes"),
            total("consume", "messages"),
            total("consume", "bytes"),
        )
        .orderBy("hour", "principal", "queue")
    )
    table.write.mode("overwrite").parquet(str(out / "usage.parquet"))
    table.coalesce(1).write.mode("overwrite").option("header", True).csv(str(out / "usage.csv"))
    rows = [r.asDict() for r in table.collect()]
    rows.sort(key=lambda r: -(r["produced_bytes"] + r["consumed_bytes"]))
    _chart(rows, out / "busiest_queues.png")
    return rows


def _recorded(endpoint: str) -> bool:
    """Whether the node has a ``__usage`` queue yet (it makes it with its first usage record)."""
    from fabric.client import Admin
    from fabric.errors import UnknownQueue

    with Admin(endpoint) as admin:
        try:
            admin.describe_queue(USAGE_QUEUE)
        except UnknownQueue:
            return False
    return True


def _chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display
    import matplotlib.pyplot as plt

    by_queue: dict[str, list[int]] = {}
    for r in rows:
        t = by_queue.setdefault(r["queue"], [0, 0])
        t[0] += r["produced_bytes"]
        t[1] += r["consumed_bytes"]
    top = sorted(by_queue.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:CHART_QUEUES][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.5 * max(len(top), 2) + 1.5))
    names = [q for q, _ in top]
    ax.barh(names, [t[0] / 1e6 for _, t in top], label="produced")
    ax.barh(names, [t[1] / 1e6 for _, t in top], left=[t[0] / 1e6 for _, t in top], label="consumed")
    ax.set_xlabel("MB")
    ax.set_title("fabric: busiest queues by bytes")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
