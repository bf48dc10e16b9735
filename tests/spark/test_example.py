"""spark/examples/orders.py runs against a real node and its totals add up."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from fabric.client import Producer
from tests.spark.conftest import read_all

pytestmark = [pytest.mark.spark, pytest.mark.integration]

EXAMPLE = Path(__file__).resolve().parents[2] / "spark" / "examples" / "orders.py"


def load_example():
    spec = importlib.util.spec_from_file_location("orders_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def test_the_enrich_query_skips_and_counts_what_is_not_an_order(spark, fabric_node, tmp_path):
    """Issue 33: the README's shell section puts plain text on `orders`; the example has queues of
    its own, and a plain-text record on its input is counted and skipped, not a crash."""
    example = load_example()
    ep = fabric_node.endpoint
    example.put_orders(ep, 5)
    with Producer(ep) as producer:
        producer.send(example.ORDERS, b"first order")
        producer.flush(10)
    query = example.start_enrich(spark, ep, tmp_path / "ck", available_now=True)
    query.awaitTermination()
    enriched = [json.loads(v) for _, _, _, v, _ in read_all(ep, example.ENRICHED)]
    assert sorted(e["order_id"] for e in enriched) == list(range(5))
    assert example.skipped(query, "o") == 1


# slow: two more queries with a join and a stateful aggregation cost ~15 s, past the spark tests'
# share of the suite's time budget; run with `python -m pytest -m slow tests/spark`
@pytest.mark.slow
def test_orders_example_enriches_every_order_once_and_totals_them(spark, tmp_path):
    from tests.spark.conftest import RestartableNode

    example = load_example()
    node = RestartableNode(str(tmp_path / "data"))
    try:
        ep = node.endpoint
        rows = example.main(["-e", ep, "--orders", "3000", "--available-now", "--checkpoints", str(tmp_path / "ck")])
        orders = [json.loads(v) for _, _, _, v, _ in read_all(ep, example.ORDERS)]
        enriched = [json.loads(v) for _, _, _, v, _ in read_all(ep, example.ENRICHED)]
    finally:
        node.stop()
    assert len(orders) == 3000
    assert sorted(e["order_id"] for e in enriched) == sorted(o["order_id"] for o in orders)
    tiers = {c: t for c, t, _ in example.CUSTOMERS}
    want: dict[str, list[float]] = {}
    for o in orders:
        w = want.setdefault(tiers[o["customer"]], [0, 0.0])
        w[0] += 1
        w[1] += round(o["amount"] * example.RATES[o["currency"]], 2)
    assert {r.tier: r.orders for r in rows} == {t: n for t, (n, _) in want.items()}
    assert all(abs(r.eur - want[r.tier][1]) < 0.05 for r in rows)
