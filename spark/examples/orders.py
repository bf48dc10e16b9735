"""Example pipeline: orders -> enrich -> orders_enriched, and a streaming aggregation of the result.

    fabric up &                                   # a node on tcp://127.0.0.1:7420
    python spark/examples/orders.py               # 20,000 sample orders, then 30 s of streaming

1. Puts sample orders on the queue ``orders`` (JSON: order_id, customer, amount, currency).
2. Query ``orders-enrich``: reads ``orders`` as a stream, joins each order with a small customer
   table (tier, country), converts the amount to EUR, and writes JSON to ``orders_enriched`` with
   the fabric sink (each row stored once, replays included). Registered as ``orders-enrich``:
   ``fabric spark queries`` shows its retention hold.
3. Query ``orders-by-tier``: reads ``orders_enriched`` as a stream and keeps a running total per
   customer tier (a streaming aggregation, update mode) in a memory table printed at the end.

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

CUSTOMERS = [(f"c{i:03d}", ("gold", "silver", "bronze")[i % 3], ("FR", "DE", "US", "JP")[i % 4]) for i in range(60)]
RATES = {"EUR": 1.0, "USD": 0.92, "JPY": 0.0061}


def put_orders(endpoint: str, count: int, seed: int = 7) -> None:
    """``count`` sample orders on ``orders`` (3 partitions, keyed by customer)."""
    rng = random.Random(seed)
    with Admin(endpoint) as admin:
        admin.create_queue("orders", partitions=3, if_not_exists=True)
        admin.create_queue("orders_enriched", partitions=3, if_not_exists=True)
        start = sum(p["high_watermark"] for p in admin.describe_queue("orders")["partition_detail"])
    with Producer(endpoint) as producer:
        for i in range(start, start + count):
            customer = rng.choice(CUSTOMERS)[0]
            order = {
                "order_id": i,
                "customer": customer,
                "amount": round(rng.uniform(5, 500), 2),
                "currency": rng.choice(list(RATES)),
            }
            producer.send("orders", json.dumps(order).encode(), key=customer.encode())
        producer.flush(60)


ORDER_SCHEMA = "order_id long, customer string, amount double, currency string"
ENRICHED_SCHEMA = "order_id long, customer string, tier string, country string, amount_eur double"


def _trigger(w: Any, available_now: bool) -> Any:
    return w.trigger(availableNow=True) if available_now else w.trigger(processingTime="1 second")


def start_enrich(spark: Any, endpoint: str, checkpoints: Path, *, available_now: bool) -> Any:
    """orders -> join customers and rates -> orders_enriched (exactly once)."""
    from pyspark.sql import functions as F

    customers = spark.createDataFrame(CUSTOMERS, "customer string, tier string, country string")
    rates = spark.createDataFrame(list(RATES.items()), "currency string, eur_rate double")
    orders = (
        spark.readStream.format("fabric")
        .option("endpoint", endpoint)
        .option("queue", "orders")
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", 50_000)
        .option("queryName", "orders-enrich")
        .load()
        .select("key", F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("o"))
        .select("key", "o.*")
    )
    enriched = (
        orders.join(F.broadcast(customers), "customer", "left")
        .join(F.broadcast(rates), "currency", "left")
        .withColumn("amount_eur", F.round(F.col("amount") * F.col("eur_rate"), 2))
        .select("key", F.to_json(F.struct("order_id", "customer", "tier", "country", "amount_eur")).alias("value"))
    )
    w = (
        enriched.writeStream.format("fabric")
        .option("endpoint", endpoint)
        .option("queue", "orders_enriched")
        .option("checkpointLocation", str(checkpoints / "enrich"))
    )
    return _trigger(w, available_now).start()


def start_totals(spark: Any, endpoint: str, checkpoints: Path, *, available_now: bool) -> Any:
    """orders_enriched -> running count and EUR total per customer tier (memory table orders_by_tier)."""
    from pyspark.sql import functions as F

    by_tier = (
        spark.readStream.format("fabric")
        .option("endpoint", endpoint)
        .option("queue", "orders_enriched")
        .option("startingOffsets", "earliest")
        .load()
        .select(F.from_json(F.col("value").cast("string"), ENRICHED_SCHEMA).alias("e"))
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
    ap = argparse.ArgumentParser(description="orders -> enrich -> orders_enriched, with a streaming aggregation")
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
        start_enrich(spark, args.endpoint, checkpoints, available_now=True).awaitTermination()
        start_totals(spark, args.endpoint, checkpoints, available_now=True).awaitTermination()
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
        print(f"{r.tier!s:<8} {r.orders:>8} {r.eur:>14,.2f}")
    return list(rows)


if __name__ == "__main__":
    main()
