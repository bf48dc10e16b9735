"""Example pipeline: orders -> enrich -> enriched orders, and a streaming aggregation of the result.

    fabric up &                                   # a node on tcp://127.0.0.1:7420
    python spark/examples/orders.py               # 20,000 sample orders, then 30 s of streaming

It uses queues of its own, ``spark-example-orders`` and ``spark-example-orders-enriched``, so it
does not read what the README's shell section put on ``orders``; a record that is not an order
(not JSON with order_id, customer, amount and currency) is counted, skipped and reported.

1. Puts sample orders on ``spark-example-orders`` (JSON: order_id, customer, amount, currency).
2. Query ``spark-example-orders-enrich``: reads the orders as a stream, joins each with a small
   customer table (tier, country), converts the amount to EUR, and writes JSON to
   ``spark-example-orders-enriched`` with the fabric sink (each row stored once, replays included).
   Registered under its name: ``fabric spark queries`` shows its retention hold.
3. Query ``orders-by-tier``: reads the enriched orders as a stream and keeps a running total per
   customer tier (a streaming aggregation, complete mode) in a memory table printed at the end.

Both queries have a trigger (1 s): without one an idle query asks the node for new offsets about
100 times a second. Checkpoints go to ``--checkpoints`` (default ``./orders-checkpoints``): run it
again and both queries go on where they stopped. ``--available-now`` processes what is there and
stops (the tests use it).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from fabric.client import Admin, Producer

ORDERS = "spark-example-orders"
ENRICHED = "spark-example-orders-enriched"
ENRICH_QUERY = "spark-example-orders-enrich"
CUSTOMERS = [(f"c{i:03d}", ("gold", "silver", "bronze")[i % 3], ("FR", "DE", "US", "JP")[i % 4]) for i in range(60)]
RATES = {"EUR": 1.0, "USD": 0.92, "JPY": 0.0061}


def put_orders(endpoint: str, count: int, seed: int = 7) -> None:
    """``count`` sample orders on ``ORDERS`` (3 partitions, keyed by customer)."""
    rng = random.Random(seed)
    with Admin(endpoint) as admin:
        admin.create_queue(ORDERS, partitions=3, if_not_exists=True)
        admin.create_queue(ENRICHED, partitions=3, if_not_exists=True)
        start = sum(p["high_watermark"] for p in admin.describe_queue(ORDERS)["partition_detail"])
    with Producer(endpoint) as producer:
        for i in range(start, start + count):
            customer = rng.choice(CUSTOMERS)[0]
            order = {
                "order_id": i,
                "customer": customer,
                "amount": round(rng.uniform(5, 500), 2),
                "currency": rng.choice(list(RATES)),
            }
            producer.send(ORDERS, json.dumps(order).encode(), key=customer.encode())
        producer.flush(60)


ORDER_SCHEMA = "order_id long, customer string, amount double, currency string"
ENRICHED_SCHEMA = "order_id long, customer string, tier string, country string, amount_eur double"


def _trigger(w: Any, available_now: bool) -> Any:
    return w.trigger(availableNow=True) if available_now else w.trigger(processingTime="1 second")


def _parsed(records: Any, schema: str, name: str, required: list[str]) -> Any:
    """``records``' values parsed as JSON of ``schema`` into column ``name``, keeping only those
    with every ``required`` field; the others are counted by the observed metric ``name`` (see
    ``skipped``): plain text, other JSON."""
    from pyspark.sql import functions as F

    parsed = records.select("key", F.from_json(F.col("value").cast("string"), schema).alias(name))
    complete = F.lit(True)
    for field in required:
        complete = complete & F.col(f"{name}.{field}").isNotNull()
    observed = parsed.observe(name, F.count(F.when(~complete, 1)).alias("skipped"))
    return observed.where(complete)


def skipped(query: Any, name: str) -> int:
    """Records a query skipped because they did not parse (the ``name`` metric of ``_parsed``),
    summed over its batches (the last 100 a query keeps: spark.sql.streaming.numRecentProgressUpdates)."""
    per_batch = {p.batchId: p.observedMetrics.get(name) for p in query.recentProgress}
    return sum(int(row["skipped"]) for row in per_batch.values() if row is not None)


def start_enrich(spark: Any, endpoint: str, checkpoints: Path, *, available_now: bool) -> Any:
    """ORDERS -> join customers and rates -> ENRICHED (exactly once); skips what is not an order."""
    from pyspark.sql import functions as F

    customers = spark.createDataFrame(CUSTOMERS, "customer string, tier string, country string")
    rates = spark.createDataFrame(list(RATES.items()), "currency string, eur_rate double")
    orders = (
        spark.readStream.format("fabric")
        .option("endpoint", endpoint)
        .option("queue", ORDERS)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", 50_000)
        .option("queryName", ENRICH_QUERY)
        .load()
    )
    orders = _parsed(orders, ORDER_SCHEMA, "o", ["order_id", "customer", "amount", "currency"]).select("key", "o.*")
    enriched = (
        orders.join(F.broadcast(customers), "customer", "left")
        .join(F.broadcast(rates), "currency", "left")
        .withColumn("amount_eur", F.round(F.col("amount") * F.col("eur_rate"), 2))
        .select("key", F.to_json(F.struct("order_id", "customer", "tier", "country", "amount_eur")).alias("value"))
    )
    w = (
        enriched.writeStream.format("fabric")
        .option("endpoint", endpoint)
        .option("queue", ENRICHED)
        .option("checkpointLocation", str(checkpoints / "enrich"))
    )
    return _trigger(w, available_now).start()


def start_totals(spark: Any, endpoint: str, checkpoints: Path, *, available_now: bool) -> Any:
    """ENRICHED -> running count and EUR total per customer tier (memory table orders_by_tier)."""
    from pyspark.sql import functions as F

    enriched = (
        spark.readStream.format("fabric")
        .option("endpoint", endpoint)
        .option("queue", ENRICHED)
        .option("startingOffsets", "earliest")
        .load()
    )
    by_tier = (
        _parsed(enriched, ENRICHED_SCHEMA, "e", ["order_id", "amount_eur"])
        .groupBy("e.tier")
        .agg(F.count("*").alias("orders"), F.round(F.sum("e.amount_eur"), 2).alias("eur"))
    )
    w = (
        by_tier.writeStream.outputMode("complete")
        .format("memory")
        .queryName("orders_by_tier")
        .option("checkpointLocation", str(checkpoints / "by-tier"))
    )
    return _trigger(w, available_now).start()


def main(argv: list[str] | None = None) -> list[Any]:
    ap = argparse.ArgumentParser(description=f"{ORDERS} -> enrich -> {ENRICHED}, with a streaming aggregation")
    ap.add_argument("--endpoint", "-e", default="tcp://127.0.0.1:7420")
    ap.add_argument("--orders", type=int, default=20_000, help="sample orders to put on the queue first (0: none)")
    ap.add_argument("--seconds", type=float, default=30, help="how long to stream before stopping")
    ap.add_argument("--checkpoints", default="orders-checkpoints")
    ap.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    args = ap.parse_args(argv)
    from fabric.spark.session import local_session

    if args.orders:
        put_orders(args.endpoint, args.orders)
    spark = local_session("fabric-orders-example")
    checkpoints = Path(args.checkpoints)
    if args.available_now:  # one after the other: the totals see everything the enrich query wrote
        enrich = start_enrich(spark, args.endpoint, checkpoints, available_now=True)
        enrich.awaitTermination()
        totals = start_totals(spark, args.endpoint, checkpoints, available_now=True)
        totals.awaitTermination()
    else:
        enrich = start_enrich(spark, args.endpoint, checkpoints, available_now=False)
        totals = start_totals(spark, args.endpoint, checkpoints, available_now=False)
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline and enrich.isActive and totals.isActive:
            time.sleep(1)
        enrich.stop()
        totals.processAllAvailable()
        totals.stop()
    rows = spark.sql("select * from orders_by_tier order by tier").collect()
    print(f"{'tier':<8} {'orders':>8} {'eur':>14}")
    for r in rows:
        print(f"{r.tier!s:<8} {r.orders:>8} {r.eur or 0:>14,.2f}")
    bad = skipped(enrich, "o") + skipped(totals, "e")
    if bad:
        print(f"skipped {bad} record(s) that are not orders (JSON with order_id, customer, amount, currency)")
    return list(rows)


if __name__ == "__main__":
    main()
