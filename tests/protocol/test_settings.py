"""QueueSettings and parse_config: every rejection names the key."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.errors import BadParameter, ConfigError, FabricError
from fabric.settings import Limits, NodeConfig, QueueSettings, parse_config

from .helpers import MEDIUM, json_values

KEYS = [f.name for f in dataclasses.fields(QueueSettings)]
INT_KEYS = [
    k
    for k in KEYS
    if k
    not in (
        "fsync",
        "dead_letter_queue",
        "on_expire",
        "overflow",
        "ordering",
        "unclean_leader_election",
        "mode",
        "encrypt",
        "sealed",
    )
]

# (key, lowest good, highest good or None) straight from QueueSettings.problem()
RANGES = [
    ("partitions", 1, 4096),
    ("max_message_bytes", 1, 64 * 1024 * 1024),
    ("max_batch_bytes", 1024, 64 * 1024 * 1024),
    ("max_messages", 0, None),
    ("max_bytes", 0, None),
    ("retention_ms", 0, None),
    ("retention_bytes", 0, None),
    ("fsync_interval_ms", 1, 60_000),
    ("segment_bytes", 64 * 1024, 1024 * 1024 * 1024),
    ("segment_ms", 1000, None),
    ("index_interval_bytes", 512, 1024 * 1024),
    ("visibility_timeout_ms", 1, 12 * 3600 * 1000),
    ("max_receive_count", 0, 1000),
    ("dedup_window_ms", 0, 7 * 24 * 3600 * 1000),
    ("default_ttl_ms", 0, 0xFFFFFFFF),
    ("priority_levels", 1, 10),
    ("ordering_window_ms", 1, 60_000),
    ("replication_factor", 0, 16),
    ("auto_partitions_max", 0, 4096),
    ("auto_partitions_bytes_per_s", 1, None),
    ("auto_partitions_after_ms", 1000, 24 * 3600 * 1000),
    ("auto_partitions_min", 0, 4096),
    ("auto_partitions_idle_ms", 0, 7 * 24 * 3600 * 1000),
]


def test_auto_partitions_min_defaults_to_the_count_at_create_and_stays_below_the_maximum() -> None:
    s = QueueSettings.from_dict({"partitions": 3, "auto_partitions_max": 12})
    assert s.auto_partitions_min == 3  # 0 = the count at create: kept as it grows (dataclasses.replace)
    assert QueueSettings.from_dict({"partitions": 12}, base=s).auto_partitions_min == 3
    assert QueueSettings.from_dict({"partitions": 3}).auto_partitions_min == 0  # no auto-expand: no minimum
    with pytest.raises(BadParameter, match="'auto_partitions_min' must be <= auto_partitions_max"):
        QueueSettings.from_dict({"auto_partitions_max": 4, "auto_partitions_min": 8})
    with pytest.raises(BadParameter, match="'auto_partitions_idle_ms' must be 0"):
        QueueSettings.from_dict({"auto_partitions_idle_ms": 500})


def test_defaults_are_valid_and_round_trip() -> None:
    d = QueueSettings()
    assert d.problem() is None
    assert QueueSettings.from_dict({}) == d
    assert QueueSettings.from_dict(d.to_dict()) == d
    assert set(d.to_dict()) == set(KEYS)
    assert sorted(k for k, _, _ in RANGES) == sorted(INT_KEYS)


def test_unknown_key_is_named() -> None:
    with pytest.raises(BadParameter, match="unknown key 'partition'"):
        QueueSettings.from_dict({"partition": 3})


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("bad", [True, "3", 3.0, None, [1]])
def test_int_keys_reject_other_types(key: str, bad: Any) -> None:
    with pytest.raises(BadParameter, match=f"'{key}' must be int"):
        QueueSettings.from_dict({key: bad})


@pytest.mark.parametrize("bad", [1, True, None])
def test_fsync_must_be_a_string(bad: Any) -> None:
    with pytest.raises(BadParameter, match="'fsync' must be str"):
        QueueSettings.from_dict({"fsync": bad})


@pytest.mark.parametrize(("key", "low", "high"), RANGES)
def test_ranges(key: str, low: int, high: int | None) -> None:
    assert getattr(QueueSettings.from_dict({key: low}), key) == low
    with pytest.raises(BadParameter, match=f"'{key}' must be"):
        QueueSettings.from_dict({key: low - 1})
    if high is not None:
        assert getattr(QueueSettings.from_dict({key: high}), key) == high
        with pytest.raises(BadParameter, match=f"'{key}' must be"):
            QueueSettings.from_dict({key: high + 1})


def test_fsync_choices() -> None:
    for policy in ("always", "interval", "never"):
        assert QueueSettings.from_dict({"fsync": policy}).fsync == policy
    with pytest.raises(BadParameter, match="'fsync' must be one of"):
        QueueSettings.from_dict({"fsync": "sometimes"})


def test_base_and_error_class_and_where() -> None:
    base = QueueSettings(partitions=8)
    assert QueueSettings.from_dict({"fsync": "never"}, base=base) == QueueSettings(partitions=8, fsync="never")
    with pytest.raises(ConfigError, match=r"^here: 'partitions'"):
        QueueSettings.from_dict({"partitions": 0}, where="here", error=ConfigError)


@MEDIUM
@given(st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), json_values, max_size=4))
def test_random_settings_validate_or_name_the_key(data: dict[str, Any]) -> None:
    try:
        settings = QueueSettings.from_dict(data)
    except BadParameter as exc:
        assert any(f"'{k}'" in str(exc) or repr(k) in str(exc) for k in data)
    else:
        assert settings.problem() is None
        assert all(getattr(settings, k) == v for k, v in data.items())


def test_parse_config_empty_is_the_defaults() -> None:
    assert parse_config({}) == NodeConfig()


def test_parse_config_full_document() -> None:
    doc = tomllib.loads(
        """
        [node]
        id = "n2"
        listen = "tcp://0.0.0.0:7421"
        data_dir = "/var/lib/fabric"
        log_level = "debug"

        [limits]
        session_timeout_ms = 10000

        [queue_defaults]
        partitions = 4
        fsync = "interval"

        [queues.orders]
        partitions = 16

        [queues."audit.log"]
        retention_ms = 0
        """
    )
    cfg = parse_config(doc)
    assert (cfg.node_id, cfg.listen, cfg.data_dir, cfg.log_level) == (
        "n2",
        "tcp://0.0.0.0:7421",
        "/var/lib/fabric",
        "debug",
    )
    assert cfg.limits == Limits(session_timeout_ms=10_000)
    assert cfg.queue_defaults == QueueSettings(partitions=4, fsync="interval")
    assert cfg.queues["orders"] == QueueSettings(partitions=16, fsync="interval")  # inherits queue_defaults
    assert cfg.queues["audit.log"] == QueueSettings(partitions=4, fsync="interval", retention_ms=0)


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"nodes": {}}, "'nodes'"),
        ({"partitions": 3}, "'partitions'"),
        ({"node": {"name": "x"}}, "'node.name'"),
        ({"node": {"id": 3}}, "'node.id'"),
        ({"node": {"id": ""}}, "'node.id'"),
        ({"node": {"log_level": "loud"}}, "'node.log_level'"),
        ({"node": {"listen": "http://x"}}, "'node.listen'"),
        ({"limits": {"max_client": 1}}, "'limits.max_client'"),
        ({"limits": {"max_clients": 0}}, "'limits.max_clients'"),
        ({"limits": {"max_clients": True}}, "'limits.max_clients'"),
        ({"limits": {"max_clients": "10"}}, "'limits.max_clients'"),
        ({"queue_defaults": {"partitions": "3"}}, "'partitions'"),
        ({"queue_defaults": {"parts": 3}}, "'parts'"),
        ({"queue_defaults": {"segment_ms": 1}}, "'segment_ms'"),
        ({"queues": {"orders": {"fsync": "x"}}}, "'fsync'"),
        ({"queues": {"orders": {"fsync": "x"}}}, "[queues.orders]"),
        ({"queues": {"orders": 3}}, "[queues.orders]"),
        ({"queues": {"bad name": {}}}, "[queues.bad name]"),
        ({"node": {"stream_listen": "tcp://127.0.0.1:1"}}, "'node.stream_listen'"),
        ({"node": {"stream_listen": 7421}}, "'node.stream_listen'"),
        ({"node": {"idle_poll_us": -1}}, "'node.idle_poll_us'"),
        ({"node": {"idle_poll_us": 10_001}}, "'node.idle_poll_us'"),
        ({"node": {"idle_poll_us": "200"}}, "'node.idle_poll_us'"),
        ({"node": {"idle_poll_us": True}}, "'node.idle_poll_us'"),
    ],
)
def test_parse_config_rejects_and_names_the_key(raw: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, source="fabric.toml")
    assert named in str(info.value)
    assert str(info.value).startswith("fabric.toml")


@MEDIUM
@given(
    st.dictionaries(
        st.sampled_from(["node", "limits", "queue_defaults", "queues", "x"]),
        st.dictionaries(st.text(max_size=6), json_values, max_size=3) | json_values,
        max_size=4,
    )
)
def test_parse_config_never_raises_outside_the_error_tree(raw: dict[str, Any]) -> None:
    try:
        cfg = parse_config(raw)
    except FabricError as exc:
        assert isinstance(exc, ConfigError)
    else:
        assert isinstance(cfg, NodeConfig)


@pytest.mark.parametrize(("raw", "named"), [({"node": "n1"}, "[node]"), ({"queues": []}, "[queues]")])
def test_parse_config_non_table_is_named(raw: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        parse_config(raw, source="fabric.toml")


def test_parse_config_non_table_names_the_source() -> None:
    with pytest.raises(ConfigError, match=r"^fabric\.toml"):
        parse_config({"limits": 3}, source="fabric.toml")


def test_on_expire_choices_and_priority_partition_product() -> None:
    assert QueueSettings.from_dict({"on_expire": "drop"}).on_expire == "drop"
    assert QueueSettings.from_dict({"overflow": "dead_letter_oldest"}).overflow == "dead_letter_oldest"
    with pytest.raises(BadParameter, match="'overflow' must be one of reject, dead_letter_oldest"):
        QueueSettings.from_dict({"overflow": "drop_newest"})
    with pytest.raises(BadParameter, match="'on_expire' must be one of dead_letter, drop"):
        QueueSettings.from_dict({"on_expire": "keep"})
    s = QueueSettings.from_dict({"partitions": 4, "priority_levels": 3})
    assert s.log_partitions == 12
    with pytest.raises(BadParameter, match="'partitions' times priority_levels must be <= 4096"):
        QueueSettings.from_dict({"partitions": 4096, "priority_levels": 2})


def test_the_single_node_config_sets_every_queue_setting_to_its_default() -> None:
    import tomllib
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "configs" / "single-node.toml"
    raw = tomllib.loads(path.read_text())
    assert set(raw["queue_defaults"]) == set(KEYS), "configs/single-node.toml must show every queue setting"
    assert QueueSettings.from_dict(raw["queue_defaults"]) == QueueSettings()


def test_stream_listen_is_off_by_default_and_takes_a_fabric_endpoint() -> None:
    assert parse_config({}).stream_listen == ""
    assert parse_config({"node": {"stream_listen": ""}}).stream_listen == ""
    cfg = parse_config({"node": {"stream_listen": "fabric://127.0.0.1:7421"}})
    assert cfg.stream_listen == "fabric://127.0.0.1:7421"


def test_idle_poll_is_on_by_default_and_zero_turns_it_off() -> None:
    assert parse_config({}).idle_poll_us == 200
    assert parse_config({"node": {"idle_poll_us": 0}}).idle_poll_us == 0
    assert parse_config({"node": {"idle_poll_us": 10_000}}).idle_poll_us == 10_000


def test_a_federation_config_lists_cluster_configs_and_each_is_checked(tmp_path) -> None:
    from fabric.settings import load_federation_config

    root = Path(__file__).resolve().parents[2]
    loaded = load_federation_config(root / "configs" / "federation-2x3.toml")
    assert loaded is not None
    assert [c.cluster.name for _, c in loaded if c.cluster] == ["east", "west"]
    assert all(c.cluster and len(c.cluster.nodes) == 3 and c.cluster.replication_factor == 3 for _, c in loaded)
    assert load_federation_config(root / "configs" / "cluster-3.toml") is None

    east = (root / "configs" / "federation-2x3" / "east.toml").read_text()
    (tmp_path / "east.toml").write_text(east)
    (tmp_path / "plain.toml").write_text(east.replace("federation_report_ms = 2000", ""))
    (tmp_path / "far.toml").write_text(east.replace("23890", "23999").replace('name = "east"', 'name = "far"'))
    cases = {
        "[federation]\nclusters = []\n": "'federation.clusters' must be a non-empty list",
        '[federation]\nclusters = ["east.toml"]\nport = 1\n': "unknown key 'port'",
        '[federation]\nclusters = ["east.toml"]\n[node]\n': "holds nothing else",
        '[federation]\nclusters = ["plain.toml"]\n': "needs \\[cluster\\] with federation_report_ms > 0",
        '[federation]\nclusters = ["east.toml", "east.toml"]\n': "two clusters called 'east'",
        '[federation]\nclusters = ["east.toml", "far.toml"]\n': "shares no etcd URL",
        '[federation]\nclusters = ["missing.toml"]\n': "does not exist",
    }
    for text, error in cases.items():
        (tmp_path / "fed.toml").write_text(text)
        with pytest.raises(ConfigError, match=error):
            load_federation_config(tmp_path / "fed.toml")
