"""PartitionRecord: JSON encoding, validation, next records."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.cluster.partition import PartitionRecord

REC = PartitionRecord(("a", "b", "c"), "b", 3, ("a", "b"), 7)


def test_json_round_trip_and_layout() -> None:
    data = REC.to_json()
    assert json.loads(data) == {
        "replicas": ["a", "b", "c"],
        "leader": "b",
        "leader_epoch": 3,
        "isr": ["a", "b"],
        "partition_epoch": 7,
    }
    assert PartitionRecord.from_json(data) == REC
    leaderless = PartitionRecord(("a",), None, 0, (), 0)
    assert PartitionRecord.from_json(leaderless.to_json()) == leaderless


def test_unknown_json_keys_are_ignored() -> None:
    doc = json.loads(REC.to_json()) | {"added_later": 1}
    assert PartitionRecord.from_json(json.dumps(doc).encode()) == REC


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"replicas": []}, "replicas is empty"),
        ({"replicas": ["a", "a"]}, "names a node twice"),
        ({"replicas": ["a", ""]}, "not a node name"),
        ({"replicas": ["a", 1]}, "not a node name"),
        ({"replicas": "abc"}, "replicas must be a list"),
        ({"isr": ["a", "d"], "leader": "a"}, r"isr members \['d'\] are not replicas"),
        ({"isr": ["a", "a"], "leader": "a"}, "isr names a node twice"),
        ({"leader": "c"}, "leader 'c' is not in the isr"),
        ({"leader": 5}, "leader must be a node name or null"),
        ({"leader_epoch": -1}, "leader_epoch must be an int >= 0"),
        ({"leader_epoch": True}, "leader_epoch must be an int >= 0"),
        ({"partition_epoch": 1.5}, "partition_epoch must be an int >= 0"),
        ({"partition_epoch": None}, "partition_epoch must be an int >= 0"),
    ],
)
def test_invalid_records_say_which_field(change: dict[str, object], message: str) -> None:
    doc = json.loads(REC.to_json()) | change
    with pytest.raises(ValueError, match=message):
        PartitionRecord.from_json(json.dumps(doc).encode())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff", "not UTF-8 JSON"),
        (b"{", "not UTF-8 JSON"),
        (b"[1]", "must be a JSON object, not list"),
        (b'{"replicas": ["a"]}', "missing field 'leader'"),
    ],
)
def test_bad_bytes(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PartitionRecord.from_json(data)


def test_constructor_validates_too() -> None:
    with pytest.raises(ValueError, match="tuple of node names"):
        PartitionRecord(["a"], "a", 0, ("a",), 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not in the isr"):
        PartitionRecord(("a", "b"), "b", 0, ("a",), 0)


def test_with_isr_bumps_the_partition_epoch_and_keeps_replica_order() -> None:
    nxt = REC.with_isr(["c", "b"])
    assert nxt == PartitionRecord(("a", "b", "c"), "b", 3, ("b", "c"), 8)
    with pytest.raises(ValueError, match="not in the isr"):
        REC.with_isr(["a"])  # drops the leader
    with pytest.raises(ValueError, match="not replicas"):
        REC.with_isr(["b", "x"])


def test_with_leader_bumps_both_epochs() -> None:
    assert REC.with_leader("a") == PartitionRecord(("a", "b", "c"), "a", 4, ("a", "b"), 8)
    assert REC.with_leader(None, ["a"]) == PartitionRecord(("a", "b", "c"), None, 4, ("a",), 8)
    with pytest.raises(ValueError, match="not in the isr"):
        REC.with_leader("c")


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=60) | st.from_regex(rb'\{"(replicas|leader|isr)".{0,40}\}', fullmatch=True))
def test_any_bytes_give_a_record_or_a_value_error(data: bytes) -> None:
    try:
        rec = PartitionRecord.from_json(data)
    except ValueError:
        return
    assert PartitionRecord.from_json(rec.to_json()) == rec
