"""The federation directory's documents: round trips, and every bad field refused by name."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.federation.directory import ClusterReport, QueuePlacement, QueueRequest, cluster_key, queue_key
from tests.federation.reports import report

names = st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True)


@given(
    name=names,
    stores=st.integers(0, 100),
    under=st.integers(0, 10_000),
    rate=st.floats(0, 1e12, allow_nan=False),
    used=st.integers(0, 2**50),
    free=st.integers(0, 2**50),
)
def test_a_report_round_trips(name: str, stores: int, under: int, rate: float, used: int, free: int) -> None:
    r = report(name, stores=stores, under=under, in_bps=rate, used=used, free=free)
    assert ClusterReport.from_json(r.to_json()) == r


@given(queue=names, parts=st.lists(names, min_size=1, max_size=30), created=st.integers(0, 2**62))
def test_a_placement_round_trips(queue: str, parts: list[str], created: int) -> None:
    p = QueuePlacement(queue, tuple(parts), created)
    assert QueuePlacement.from_json(p.to_json()) == p
    assert p.clusters == tuple(dict.fromkeys(parts))
    assert sorted(x for c in p.clusters for x in p.partitions_on(c)) == list(range(len(parts)))


def _mutated(path: tuple[str, ...], value: object) -> bytes:
    doc = json.loads(report("a").to_json())
    inner = doc
    for k in path[:-1]:
        inner = inner[k]
    inner[path[-1]] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("name",), "a/b", "'a/b' is not a valid name"),
        (("routers",), "tcp://x:1", "'routers'"),
        (("health", "stores"), -1, "'stores'"),
        (("health", "controller"), 3, "'health.controller'"),
        (("utilisation", "in_bytes_per_s"), "fast", "'in_bytes_per_s'"),
        (("utilisation", "out_messages_per_s"), float("inf"), "'out_messages_per_s'"),
        (("utilisation", "disk_free_bytes"), 1.5, "'disk_free_bytes'"),
        (("published_ms",), None, "'published_ms'"),
        (("version",), 99, "newer"),
    ],
)
def test_a_bad_report_is_refused_naming_the_field(path: tuple[str, ...], value: object, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        ClusterReport.from_json(_mutated(path, value))


@pytest.mark.parametrize(
    "doc",
    [
        {"queue": "q", "partitions": [], "created_ms": 1},
        {"queue": "q", "partitions": ["a", "b/c"], "created_ms": 1},
        {"queue": "", "partitions": ["a"], "created_ms": 1},
        {"queue": "q", "partitions": ["a"], "created_ms": -1},
        {"queue": "q", "partitions": "a", "created_ms": 1},
        {"queue": "q", "partitions": ["a", "b"], "clusters": ["b", "a"], "created_ms": 1},
    ],
)
def test_a_bad_placement_is_refused(doc: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        QueuePlacement.from_json(json.dumps(doc))


def test_keys_sit_beside_the_clusters() -> None:
    assert cluster_key("eu") == "/federation/clusters/eu"
    assert queue_key("orders") == "/federation/queues/orders"


def test_a_queue_request_round_trips_and_bad_ones_are_refused() -> None:
    r = QueueRequest("orders", 12, 3, 2, {"partitions": 12, "fsync": "never"})
    assert QueueRequest.from_json(r.to_json()) == r
    answered = QueueRequest("orders", 1, 1, 1, {}, error="NOT_ENOUGH_REPLICAS: no room")
    assert QueueRequest.from_json(answered.to_json()).error == "NOT_ENOUGH_REPLICAS: no room"
    for bad in (
        {"queue": "q", "partitions": 0, "clusters": 1, "rf": 1},
        {"queue": "q", "partitions": 1, "clusters": "2", "rf": 1},
        {"queue": "q/x", "partitions": 1, "clusters": 1, "rf": 1},
        {"queue": "q", "partitions": 1, "clusters": 1, "rf": 1, "settings": []},
        {"queue": "q", "partitions": 1, "clusters": 1, "rf": 1, "error": 5},
    ):
        with pytest.raises(ValueError):
            QueueRequest.from_json(json.dumps(bad))
