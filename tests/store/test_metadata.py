"""NodeMetadata: queue records and committed offsets in sqlite, JSON-encoded (never pickle)."""

from __future__ import annotations

import errno
import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.errors import BadParameter, DiskFull
from fabric.store.journal import encode, encode_offsets
from fabric.store.metadata import JOURNAL_FILE, META_FILE, NodeMetadata


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[NodeMetadata]:
    store = NodeMetadata(tmp_path)
    yield store
    store.close()


RECORD = {"settings": {"partitions": 2}, "created_ms": 5, "id": "abc"}


def test_queues_round_trip_and_survive_reopen(tmp_path: Path, meta: NodeMetadata) -> None:
    meta.put_queue("orders", RECORD)
    meta.put_queue("events.v2", {**RECORD, "id": "def"})
    assert meta.queues() == {"orders": RECORD, "events.v2": {**RECORD, "id": "def"}}
    meta.close()
    again = NodeMetadata(tmp_path)
    assert set(again.queues()) == {"orders", "events.v2"}
    again.close()


def test_offsets_merge_per_partition(meta: NodeMetadata) -> None:
    meta.put_queue("orders", RECORD)
    meta.commit("orders", "billing", {0: 10, 1: 20})
    meta.commit("orders", "billing", {1: 25})
    meta.commit("orders", "audit", {0: 3})
    assert meta.committed("orders", "billing") == {0: 10, 1: 25}
    assert meta.committed("orders", "nobody") == {}
    assert meta.groups("orders") == ["audit", "billing"]


def test_delete_queue_drops_its_offsets(tmp_path: Path, meta: NodeMetadata) -> None:
    meta.put_queue("orders", RECORD)
    meta.put_queue("orders2", RECORD)
    meta.commit("orders", "billing", {0: 10})
    meta.commit("orders2", "billing", {0: 7})
    meta.delete_queue("orders")
    assert "orders" not in meta.queues()
    assert meta.committed("orders", "billing") == {} and meta.groups("orders") == []
    assert meta.committed("orders2", "billing") == {0: 7}  # a queue whose name extends it is untouched


def test_orphan_offsets_are_purged_at_open(tmp_path: Path, meta: NodeMetadata) -> None:
    meta.put_queue("orders", RECORD)
    meta.commit("orders", "billing", {0: 10})
    # a crash between dropping the record and its offsets
    del meta._queues["orders"]
    meta._queues.commit()
    meta.close()
    again = NodeMetadata(tmp_path)
    assert again.groups("orders") == []
    again.close()


def test_stored_as_json_not_pickle(tmp_path: Path, meta: NodeMetadata) -> None:
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


def test_pickled_value_is_not_unpickled(tmp_path: Path, meta: NodeMetadata) -> None:
    meta.close()
    db = sqlite3.connect(tmp_path / META_FILE)
    db.execute("INSERT INTO queues (key, value) VALUES (?, ?)", ("evil", b"\x80\x04\x95cos\nsystem\n."))
    db.commit()
    db.close()
    again = NodeMetadata(tmp_path)
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
def test_commit_validates_input(meta: NodeMetadata, queue: str, group: str, offsets: dict) -> None:
    with pytest.raises(BadParameter):
        meta.commit(queue, group, offsets)


# ------------------------------------------------------------------ the journal


@pytest.mark.parametrize(
    "key, offsets",
    [("q/g", {"0": 5}), ("__usage/a:b-c.d_e", {"0": 0, "12": 2**63 - 1, "65535": 7}), ("x/y", {})],
)
def test_a_commit_record_is_formatted_as_the_json_encoder_would(key: str, offsets: dict[str, int]) -> None:
    assert encode_offsets(key, offsets) == encode(key, offsets)


def _crash_after(tmp_path: Path, code: str) -> None:
    """Run ``code`` against a NodeMetadata in a child process that exits without closing it."""
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from fabric.store.metadata import NodeMetadata\n"
        f"meta = NodeMetadata(Path({str(tmp_path)!r}))\n"
        f"{code}\n"
        "os._exit(0)\n"  # no close, no flush: as kill -9 would leave it
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_commits_survive_a_crash_through_the_journal(tmp_path: Path) -> None:
    _crash_after(
        tmp_path,
        "meta.put_queue('orders', {'settings': {}, 'created_ms': 1, 'id': 'x'})\n"
        "for i in range(2000):\n"
        "    meta.commit('orders', 'billing', {i % 4: i})\n"
        "meta.commit('orders', 'gone', {0: 1})\n"
        "meta.delete_group('orders', 'gone')",
    )
    assert (tmp_path / JOURNAL_FILE).exists()
    again = NodeMetadata(tmp_path)
    try:
        assert again.committed("orders", "billing") == {0: 1996, 1: 1997, 2: 1998, 3: 1999}
        assert again.groups("orders") == ["billing"]  # the deleted group stays deleted
        assert (tmp_path / JOURNAL_FILE).stat().st_size == 0  # applied to sqlite at open, a new one begun
    finally:
        again.close()
    db = sqlite3.connect(tmp_path / META_FILE)
    try:
        (value,) = db.execute("SELECT value FROM offsets WHERE key = 'orders/billing'").fetchone()
    finally:
        db.close()
    assert json.loads(value) == {"0": 1996, "1": 1997, "2": 1998, "3": 1999}


def test_a_torn_journal_tail_keeps_every_whole_record(tmp_path: Path) -> None:
    _crash_after(
        tmp_path,
        "meta.put_queue('orders', {'settings': {}, 'created_ms': 1, 'id': 'x'})\n"
        "meta.commit('orders', 'billing', {0: 5})\n"
        "meta.commit('orders', 'billing', {0: 6})",
    )
    journal = tmp_path / JOURNAL_FILE
    whole = journal.read_bytes()
    journal.write_bytes(whole + encode("orders/billing", {"0": 99})[:-3])  # a crash mid-append
    again = NodeMetadata(tmp_path)
    try:
        assert again.committed("orders", "billing") == {0: 6}
    finally:
        again.close()


def test_rotation_moves_offsets_into_sqlite_off_the_callers_thread(tmp_path: Path, meta: NodeMetadata) -> None:
    meta.put_queue("orders", RECORD)
    meta._journal.rotate_bytes = 4096
    for i in range(3000):
        meta.commit("orders", "billing", {0: i})
    assert meta.flush(10)
    # While the writer applies one rotation the journal grows on (how far depends on the disk);
    # the first commit after the writer is done rotates whatever grew meanwhile.
    meta.commit("orders", "billing", {0: 3000})
    assert meta.flush(10)
    written = 3001 * len(encode("orders/billing", {"0": 2999}))
    assert meta._journal.size < written // 4  # rotated
    assert not meta._journal.old_path.exists()  # the writer applied and removed it
    assert meta._offsets.get("orders/billing") is not None  # in sqlite without a close
    assert meta.committed("orders", "billing") == {0: 3000}


def test_group_states_are_read_back_before_and_after_the_background_write(tmp_path: Path, meta: NodeMetadata) -> None:
    meta.put_queue("orders", RECORD)
    meta.put_group_states({("orders", "workers"): {"kind": "queue", "n": 1}})
    assert meta.group_state("orders", "workers") == {"kind": "queue", "n": 1}
    assert meta.flush(10)
    assert meta.group_state("orders", "workers") == {"kind": "queue", "n": 1}
    meta.delete_group("orders", "workers")
    assert meta.group_state("orders", "workers") is None and meta.groups("orders") == []
    meta.close()
    again = NodeMetadata(tmp_path)
    try:
        assert again.group_state("orders", "workers") is None
    finally:
        again.close()


def test_a_failed_journal_write_changes_nothing(monkeypatch: pytest.MonkeyPatch, meta: NodeMetadata) -> None:
    meta.put_queue("orders", RECORD)
    meta.commit("orders", "billing", {0: 1})

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("fabric.store.journal.os.write", full)
    with pytest.raises(DiskFull):
        meta.commit("orders", "billing", {0: 2})
    monkeypatch.undo()
    assert meta.committed("orders", "billing") == {0: 1}
    meta.commit("orders", "billing", {0: 3})
    assert meta.committed("orders", "billing") == {0: 3}


def test_a_durable_group_checkpoint_waits_and_reports_a_full_disk(
    monkeypatch: pytest.MonkeyPatch, meta: NodeMetadata
) -> None:
    meta.put_queue("orders", RECORD)
    meta.put_group_states({("orders", "workers"): {"kind": "queue", "n": 1}}, wait=True)
    assert meta._groups.get("orders/workers") == {"kind": "queue", "n": 1}  # in sqlite on return

    def full() -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(meta._groups, "commit", full)
    with pytest.raises(DiskFull):
        meta.put_group_states({("orders", "workers"): {"kind": "queue", "n": 2}}, wait=True)
