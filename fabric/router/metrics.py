"""What a router's Prometheus endpoint serves (``[[cluster.routers]] metrics_listen``; the
HTTP server is fabric/metrics_http.py, shared with the nodes).

Read on prometheus-client's HTTP thread from counters the router's loop keeps (plain ints in a
dict: a scrape may see one request more or less, never a torn value); nothing per message beyond
the counting the loop does anyway.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class RouterCollector(Collector):
    def __init__(self, router: Any) -> None:
        self.router = router

    def collect(self) -> Iterator[Metric]:
        r = self.router
        name = r.name
        for key, help_text in (
            ("requests", "client requests received"),
            ("replies", "replies and pushes sent to clients"),
            ("refused", "client requests refused by the router itself (malformed, internal ops, no node)"),
            ("unroutable", "client requests no storage node could take"),
            ("failed_over", "forwarded requests refused on the client's behalf (link to the node lost, leader moved)"),
            ("links_lost", "links to storage nodes lost (closed, or silent past the heartbeat timeout)"),
        ):
            c = CounterMetricFamily(f"fabric_router_{key}", help_text, labels=["router"])
            c.add_metric([name], r.stats.get(key, 0))
            yield c
        fwd = CounterMetricFamily(
            "fabric_router_forwarded", "requests sent on to each storage node", labels=["router", "node"]
        )
        for node, n in list(r.forwarded.items()):
            fwd.add_metric([name, node], n)
        yield fwd
        g = GaugeMetricFamily("fabric_router_clients", "clients the router remembers", labels=["router"])
        g.add_metric([name], len(r.clients))
        yield g
        g = GaugeMetricFamily("fabric_router_in_flight", "forwarded requests waiting for a reply", labels=["router"])
        g.add_metric([name], r.inflight.size)
        yield g
        g = GaugeMetricFamily("fabric_router_nodes", "storage nodes the router routes to", labels=["router"])
        g.add_metric([name], len(r.backends))
        yield g
        c = CounterMetricFamily("fabric_router_map_updates", "cluster maps received from etcd", labels=["router"])
        c.add_metric([name], r.follower.maps)
        yield c
