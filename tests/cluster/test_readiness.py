"""When `fabric up --config` says a cluster is ready (fabric/cluster/readiness.py): the rule over
what etcd holds (the in-memory etcd) and a router probe, and what it names while not ready."""

from __future__ import annotations

from fabric.cluster.keys import CONTROLLER_KEY, NODES_PREFIX, controller_value, node_value, router_key
from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.readiness import Readiness, View, judge, read_view
from fabric.settings import ClusterConfig, ClusterNodeConfig, ClusterRouterConfig

CLUSTER = ClusterConfig(
    etcd=("http://127.0.0.1:1",),
    nodes=tuple(ClusterNodeConfig(f"s{i}", f"tcp://127.0.0.1:{10 + i}", f"/d/s{i}") for i in range(1, 4)),
    routers=tuple(ClusterRouterConfig(f"r{i}", f"tcp://127.0.0.1:{20 + i}") for i in range(1, 3)),
)
STORES = {f"s{i}": f"tcp://127.0.0.1:{10 + i}" for i in range(1, 4)}
ROUTERS = {f"r{i}": f"tcp://127.0.0.1:{20 + i}" for i in range(1, 3)}


def test_ready_needs_every_store_a_controller_and_every_router_reaching_every_store() -> None:
    probed: list[tuple[str, str]] = []

    def reaches(endpoint: str, store: str) -> bool:
        probed.append((endpoint, store))
        return True

    state = judge(CLUSTER, View(STORES, ROUTERS, "s2"), reaches)
    assert state.ready and state.missing() == ""
    assert sorted(probed) == sorted((e, s) for e in ROUTERS.values() for s in STORES)


def test_what_is_missing_is_named() -> None:
    stores = {k: v for k, v in STORES.items() if k != "s3"}
    routers = {"r1": ROUTERS["r1"]}
    state = judge(CLUSTER, View(stores, routers, None), lambda e, s: s != "s2")
    assert not state.ready
    assert state.missing() == (
        "stores not registered: s3; no controller elected; routers not registered: r2; router r1 does not reach s2"
    )
    assert not judge(CLUSTER, View(STORES, ROUTERS, "s1"), lambda e, s: e != ROUTERS["r2"]).ready
    # without a probe (authentication on and no client credentials): registration alone
    assert judge(CLUSTER, View(STORES, ROUTERS, "s1"), None).ready
    assert not Readiness(etcd_error="connection refused").ready


def test_read_view_reads_registrations_and_the_controller() -> None:
    etcd = MemoryEtcd()
    assert read_view(etcd) == View({}, {}, None)
    lease = etcd.lease_grant(2)
    for name, endpoint in STORES.items():
        etcd.put(NODES_PREFIX + name, node_value(name, endpoint, None), lease)
    etcd.put(router_key("r1"), controller_value("r1", ROUTERS["r1"]), lease)
    etcd.put(CONTROLLER_KEY, controller_value("s2", STORES["s2"]), lease)
    etcd.put(router_key("junk"), b"not json")
    view = read_view(etcd)
    assert view == View(STORES, {"r1": ROUTERS["r1"]}, "s2")
