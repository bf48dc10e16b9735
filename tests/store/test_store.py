"""Store: queues of partition logs with their metadata; create, delete, reopen, limits."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.errors import BadParameter, QueueExists, QueueFull, StorageError, UnknownPartition, UnknownQueue
from fabric.settings import QueueSettings
from fabric.store.store import DELETED_PREFIX, Store
from tests.store.helpers import SMALL, append, fill, make_batch, read_all

THREE = dataclasses.replace(SMALL, partitions=3)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path, defaults=QueueSettings(), now_ms=0)
    yield s
    s.close(clean=False)


def test_create_describe_and_layout(tmp_path: Path, store: Store) -> None:
    record = store.create_queue("orders", THREE, now_ms=42)
    assert record["created_ms"] == 42 and record["settings"]["partitions"] == 3 and record["id"]
    assert store.queue_names() == ["orders"]
    assert store.settings("orders") == THREE
    for p in range(3):
        assert (tmp_path / "queues" / "orders" / str(p)).is_dir()
    fill(store.partition("orders", 1), 4)
    info = store.describe("orders")
    assert [p["next_offset"] for p in info["partitions"]] == [0, 12, 0]
    assert info["messages"] == 12 and info["size_bytes"] == store.partition("orders", 1).size_bytes
    assert info["settings"]["segment_bytes"] == SMALL.segment_bytes
    assert (tmp_path / "meta.sqlite").exists()


def test_errors(store: Store) -> None:
    store.create_queue("orders", THREE, now_ms=0)
    with pytest.raises(QueueExists):
        store.create_queue("orders", THREE, now_ms=0)
    with pytest.raises(UnknownQueue):
        store.partition("nope", 0)
    with pytest.raises(UnknownPartition):
        store.partition("orders", 3)
    with pytest.raises(UnknownQueue):
        store.delete_queue("nope")
    for bad in ["../etc", ".deleted-x", "", "a/b", "x" * 201]:
        with pytest.raises(BadParameter):
            store.create_queue(bad, THREE, now_ms=0)


def test_reopen_restores_queues_and_data(tmp_path: Path) -> None:
    store = Store(tmp_path, defaults=QueueSettings(), now_ms=0)
    store.create_queue("a", THREE, now_ms=0)
    store.create_queue("b", SMALL, now_ms=0)
    batches = fill(store.partition("a", 2), 50)
    store.meta.commit("a", "g", {2: 30})
    store.close()
    again = Store(tmp_path, defaults=QueueSettings(), now_ms=0)
    assert again.queue_names() == ["a", "b"]
    assert list(read_all(again.partition("a", 2))) == batches
    assert again.meta.committed("a", "g") == {2: 30}
    reports = again.recovery_reports()
    assert len(reports) == 4 and all(r.clean_shutdown and r.lossless for r in reports.values())
    again.close()


def test_delete_queue_removes_data_and_offsets(tmp_path: Path, store: Store) -> None:
    store.create_queue("orders", THREE, now_ms=0)
    fill(store.partition("orders", 0), 10)
    store.meta.commit("orders", "g", {0: 5})
    store.delete_queue("orders")
    assert store.queue_names() == []
    assert os.listdir(tmp_path / "queues") == []
    assert store.meta.groups("orders") == []
    # the name is free again, and the new queue starts empty
    store.create_queue("orders", THREE, now_ms=0)
    assert store.partition("orders", 0).next_offset == 0


def test_crash_mid_delete_never_resurrects_data(tmp_path: Path) -> None:
    store = Store(tmp_path, defaults=QueueSettings(), now_ms=0)
    store.create_queue("orders", THREE, now_ms=0)
    fill(store.partition("orders", 0), 10)
    store.close()
    # the crash: the directory was renamed aside, the record was not yet dropped
    queues = tmp_path / "queues"
    os.replace(queues / "orders", queues / f"{DELETED_PREFIX}orders-0123abcd")
    again = Store(tmp_path, defaults=QueueSettings(), now_ms=0)
    assert again.queue_names() == []
    assert os.listdir(queues) == []
    again.close()


def test_leftover_deleted_dirs_are_removed_and_orphans_reported(tmp_path: Path) -> None:
    queues = tmp_path / "queues"
    (queues / f"{DELETED_PREFIX}old-ffff" / "0").mkdir(parents=True)
    (queues / "stray" / "0").mkdir(parents=True)
    store = Store(tmp_path, defaults=QueueSettings(), now_ms=0)
    assert sorted(os.listdir(queues)) == ["stray"]  # unknown data is never deleted
    assert any("stray" in p for p in store.problems)
    # creating a queue of that name sets the stray directory aside instead of adopting it
    store.create_queue("stray", SMALL, now_ms=0)
    assert store.partition("stray", 0).next_offset == 0
    assert any(name.startswith(".orphan-stray-") for name in os.listdir(queues))
    store.close()


def test_record_without_directories_opens_empty(tmp_path: Path) -> None:
    store = Store(tmp_path, defaults=QueueSettings(), now_ms=0)
    store.meta.put_queue("q", {"settings": SMALL.to_dict(), "created_ms": 0, "id": "x"})
    store.close()
    again = Store(tmp_path, defaults=QueueSettings(), now_ms=0)
    assert again.partition("q", 0).next_offset == 0
    again.close()


def test_queue_limits(store: Store) -> None:
    store.create_queue("capped", dataclasses.replace(THREE, max_messages=10, max_bytes=10_000), now_ms=0)
    store.check_capacity("capped", 10, 100)
    append(store.partition("capped", 0), make_batch(records=4))
    append(store.partition("capped", 2), make_batch(records=4))
    assert store.usage("capped")[0] == 8
    store.check_capacity("capped", 2, 100)
    with pytest.raises(QueueFull, match="messages"):
        store.check_capacity("capped", 3, 100)
    with pytest.raises(QueueFull, match="bytes"):
        store.check_capacity("capped", 1, 10_000)
    store.create_queue("free", SMALL, now_ms=0)
    store.check_capacity("free", 10**9, 10**12)


def test_retention_across_queues(store: Store) -> None:
    store.create_queue("short", dataclasses.replace(THREE, retention_ms=1_000), now_ms=0)
    store.create_queue("forever", THREE, now_ms=0)
    for name in ("short", "forever"):
        fill(store.partition(name, 0), 300, value_bytes=500, ts=0)
    deleted = store.enforce_retention(now_ms=10_000)
    assert deleted > 0
    assert store.partition("short", 0).size_bytes == 0
    assert store.partition("forever", 0).log_start_offset == 0


def test_one_store_per_data_directory(tmp_path: Path, store: Store) -> None:
    with pytest.raises(StorageError, match="in use"):
        Store(tmp_path, defaults=QueueSettings(), now_ms=0)
    store.close()
    Store(tmp_path, defaults=QueueSettings(), now_ms=0).close()  # free again after close


def test_alter_settings_applies_to_the_logs_at_once_and_survives_reopen(tmp_path: Path) -> None:
    store = Store(tmp_path, defaults=QueueSettings(), now_ms=0)
    store.create_queue("orders", THREE, now_ms=0)
    altered = store.alter_settings("orders", {"retention_ms": 5000, "segment_bytes": 128 * 1024, "fsync": "never"})
    assert altered == dataclasses.replace(THREE, retention_ms=5000, segment_bytes=128 * 1024, fsync="never")
    assert store.settings("orders") == altered
    assert all(store.partition("orders", p).settings == altered for p in range(3))
    for key, value, reason in [
        ("partitions", 4, "--partitions"),
        ("encrypt", True, "chosen at create"),
        ("retention_ms", -1, "'retention_ms' must be >= 0"),
        ("retention_ms", "1", "must be int"),
        ("nope", 1, "unknown key 'nope'"),
    ]:
        with pytest.raises(BadParameter, match=reason):
            store.alter_settings("orders", {key: value})
    store.alter_settings("orders", {"partitions": 3})  # a fixed key at its own value changes nothing
    with pytest.raises(UnknownQueue):
        store.alter_settings("missing", {"retention_ms": 1})
    store.close(clean=True)
    reopened = Store(tmp_path, defaults=QueueSettings(), now_ms=0)
    try:
        assert reopened.settings("orders") == altered
    finally:
        reopened.close(clean=False)
