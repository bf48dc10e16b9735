"""configs/reference.toml names every key of every section and loads as it is."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

from fabric.settings import (
    _CLUSTER_INTS,
    ClusterNodeConfig,
    ClusterRouterConfig,
    EtcdMemberConfig,
    Limits,
    QueueSettings,
    load_config,
)

REFERENCE = Path(__file__).resolve().parents[2] / "configs" / "reference.toml"


def test_the_reference_config_loads_and_names_every_key() -> None:
    config = load_config(REFERENCE)
    assert config.cluster is not None and config.cluster.routers and config.cluster.nodes
    raw = tomllib.loads(REFERENCE.read_text())
    assert set(raw["queue_defaults"]) == {f.name for f in dataclasses.fields(QueueSettings)}
    assert set(raw["limits"]) == {f.name for f in dataclasses.fields(Limits)}
    assert set(raw["cluster"]) >= {"name", "etcd", "data_dir", *_CLUSTER_INTS}
    renamed = {"node_id": "id", "router_id": "id"}
    for table, cls in (("nodes", ClusterNodeConfig), ("routers", ClusterRouterConfig)):
        assert set(raw["cluster"][table][0]) == {renamed.get(f.name, f.name) for f in dataclasses.fields(cls)}
    assert set(raw["cluster"]["etcd_members"][0]) == {f.name for f in dataclasses.fields(EtcdMemberConfig)}
    assert {"id", "listen", "stream_listen", "data_dir", "log_level", "log_format", "auto_create_queues"} <= set(
        raw["node"]
    )
    assert set(raw["metrics"]) == {"listen"}
