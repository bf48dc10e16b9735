"""MetaStore: queue records and committed offsets in sqlite, JSON-encoded (never pickle)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.errors import BadParameter
from fabric.store.metadata import META_FILE, MetaStore


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[MetaStore]:
    store = MetaStore(tmp_path)
    yield store
    store.close()


RECORD = {"settings": {"partitions": 2}, "created_ms": 5, "id": "abc"}


def test_queues_round_trip_and_survive_reopen(tmp_path: Path, meta: MetaStore) -> None:
    meta.put_queue("orders", RECORD)
    meta.put_queue("events.v2", {**RECORD, "id": "def"})
    assert meta.queues() == {"orders": RECORD, "events.v2": {**RECORD, "id": "def"}}
    meta.close()
    again = MetaStore(tmp_path)
    assert set(again.queues()) == {"orders", "events.v2"}
    again.close()


def test_offsets_merge_per_partition(meta: MetaStore) -> None:
    meta.put_queue("orders", RECORD)
    meta.commit("orders", "billing", {0: 10, 1: 20})
    meta.commit("orders", "billing", {1: 25})
    meta.commit("orders", "audit", {0: 3})
    assert meta.committed("orders", "billing") == {0: 10, 1: 25}
    assert meta.committed("orders", "nobody") == {}
    assert meta.groups("orders") == ["audit", "billing"]


def test_delete_queue_drops_its_offsets(tmp_path: Path, meta: MetaStore) -> None:
    meta.put_queue("orders", RECORD)
    meta.put_queue("orders2", RECORD)
    meta.commit("orders", "billing", {0: 10})
    meta.commit("orders2", "billing", {0: 7})
    meta.delete_queue("orders")
    assert "orders" not in meta.queues()
    assert meta.committed("orders", "billing") == {} and meta.groups("orders") == []
    assert meta.committed("orders2", "billing") == {0: 7}  # a queue whose name extends it is untouched


def test_orphan_offsets_are_purged_at_open(tmp_path: Path, meta: MetaStore) -> None:
    meta.put_queue("orders", RECORD)
    meta.commit("orders", "billing", {0: 10})
    # a crash between dropping the record and its offsets
    del meta._queues["orders"]
    meta._queues.commit()
    meta.close()
    again = MetaStore(tmp_path)
    assert again.groups("orders") == []
    again.close()


def test_stored_as_json_not_pickle(tmp_path: Path, meta: MetaStore) -> None:
    meta.put_queue("orders", RECORD)
    meta.commit("orders", "billing", {3: 42})
    meta.close()
    db = sqlite3.connect(tmp_path / META_FILE)
    try:
        (queue_value,) = db.execute("SELECT value FROM queues WHERE key = 'orders'").fetchone()
        (offset_value,) = db.execute("SELECT value FROM offsets WHERE key = 'orders/billing'").fetchone()
    finally:
        db.close()
    assert isinstance(queue_value, str) and json.loads(queue_value) == RECORD
    assert json.loads(offset_value) == {"3": 42}
    assert not str(queue_value).startswith("\x80")  # a pickle would start with the PROTO opcode


def test_pickled_value_is_not_unpickled(tmp_path: Path, meta: MetaStore) -> None:
    meta.close()
    db = sqlite3.connect(tmp_path / META_FILE)
    db.execute("INSERT INTO queues (key, value) VALUES (?, ?)", ("evil", b"\x80\x04\x95cos\nsystem\n."))
    db.commit()
    db.close()
    again = MetaStore(tmp_path)
    assert again.queues() == {}  # ignored (and logged), never unpickled
    again.close()


@pytest.mark.parametrize(
    ("queue", "group", "offsets"),
    [
        ("bad/name", "g", {0: 1}),
        ("q", "bad/group", {0: 1}),
        ("q", "g", {-1: 1}),
        ("q", "g", {0: -5}),
        ("q", "g", {"0": 5}),
    ],
)
def test_commit_validates_input(meta: MetaStore, queue: str, group: str, offsets: dict) -> None:
    with pytest.raises(BadParameter):
        meta.commit(queue, group, offsets)
