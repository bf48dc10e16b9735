"""The delay store: batches kept in SQLite until due, in (due_ms, id) order, surviving kill -9."""

from __future__ import annotations

import array
import multiprocessing
import os
import shutil
import signal
import sqlite3
import tempfile
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fabric.errors import BadParameter, DiskFull, StorageError
from fabric.store import delays
from fabric.store.delays import DUE_MS_MAX, DelayedBatch, DelayStore

from ..conftest import tmpfs


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data" / delays.DELAYS_FILE


@pytest.fixture
def store(path: Path) -> Iterator[DelayStore]:
    with DelayStore(path) as s:
        yield s


def everything(s: DelayStore) -> list[DelayedBatch]:
    return s.due(DUE_MS_MAX, limit=delays.DUE_LIMIT_MAX, max_bytes=1 << 40)


# ---------------------------------------------------------------- round trip


def test_add_returns_increasing_ids_and_due_orders_by_due_then_id(store: DelayStore) -> None:
    ids = store.add([(50, "a", 0, b"one"), (10, "b", 3, b"two"), (50, "a", 1, b"three")], durable=True)
    assert ids == sorted(ids) and len(set(ids)) == 3
    more = store.add([(10, "a", 2, b"four")], durable=False)
    assert more[0] > ids[-1]
    got = store.due(50)
    assert [(b.due_ms, b.id) for b in got] == [(10, ids[1]), (10, more[0]), (50, ids[0]), (50, ids[2])]
    assert got[0] == DelayedBatch(ids[1], 10, "b", 3, b"two")
    assert [b.id for b in store.due(49)] == [ids[1], more[0]]
    assert store.due(9) == [] and store.due(-5) == []
    assert store.add([], durable=True) == []


def test_due_honours_limit_and_max_bytes(store: DelayStore) -> None:
    ids = store.add([(i, "q", 0, bytes(10 * (i + 1))) for i in range(5)], durable=False)  # 10, 20, .. 50 bytes
    assert [b.id for b in store.due(100, limit=2)] == ids[:2]
    assert [b.id for b in store.due(100, max_bytes=30)] == ids[:2]  # 10 + 20 fit, + 30 would not
    assert [b.id for b in store.due(100, max_bytes=29)] == ids[:1]
    assert [b.id for b in store.due(100, max_bytes=1)] == ids[:1]  # the first due row, whatever its size
    assert [b.id for b in store.due(100, limit=3, max_bytes=10_000)] == ids[:3]
    store.remove(ids[:1])
    assert [b.id for b in store.due(100, max_bytes=1)] == ids[1:2]


def test_batches_come_back_byte_for_byte(store: DelayStore) -> None:
    every_byte = bytes(range(256)) * 3
    ints = array.array("i", [1, -2, 3])
    store.add(
        [(1, "q", 0, every_byte), (2, "q", 0, bytearray(b"\x00\x00")), (3, "q", 0, memoryview(ints))], durable=True
    )
    got = store.due(10)
    assert [b.batch for b in got] == [every_byte, b"\x00\x00", ints.tobytes()]
    assert all(type(b.batch) is bytes for b in got)
    assert "batch" not in repr(got[0])  # a 16 MiB batch never ends up in a log line


def test_remove_counts_only_rows_that_existed(store: DelayStore) -> None:
    ids = store.add([(1, "q", 0, b"x"), (2, "q", 0, b"y"), (3, "q", 0, b"z")], durable=False)
    assert store.remove([ids[0], ids[0], 999_999]) == 1
    assert store.remove(i for i in ids) == 2
    assert store.remove([]) == 0
    assert store.count() == 0 and store.next_due_ms() is None


def test_next_due_count_stats_and_drop_queue(store: DelayStore) -> None:
    assert (store.next_due_ms(), store.count(), store.stats()) == (None, 0, {})
    store.add([(300, "a", 0, b"aaa"), (100, "b", 1, b"bb"), (200, "a", 2, b"a")], durable=True)
    assert store.next_due_ms() == 100
    assert (store.count(), store.count("a"), store.count("b"), store.count("c")) == (3, 2, 1, 0)
    assert store.stats() == {
        "a": {"batches": 2, "bytes": 4, "next_due_ms": 200},
        "b": {"batches": 1, "bytes": 2, "next_due_ms": 100},
    }
    assert store.drop_queue("b") == 1
    assert store.drop_queue("b") == 0
    assert store.next_due_ms() == 200 and store.count() == 2
    assert [b.queue for b in everything(store)] == ["a", "a"]


def test_durable_chooses_the_synchronous_level(store: DelayStore) -> None:
    def synchronous() -> int:
        assert store._db is not None
        level: int = store._db.execute("PRAGMA synchronous").fetchone()[0]
        return level

    assert store._db is not None and store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.add([(1, "q", 0, b"x")], durable=True)
    assert synchronous() == 2  # FULL: the WAL is fsynced at commit
    store.add([(1, "q", 0, b"x")], durable=False)
    assert synchronous() == 1  # NORMAL


def test_due_and_next_due_use_the_due_index(store: DelayStore) -> None:
    store.add([(i * 7 % 1000, f"q{i % 5}", 0, b"x") for i in range(2000)], durable=False)
    assert store._db is not None
    store._db.execute("ANALYZE")
    for sql, args in [(delays._DUE_SIZES_SQL, (500, 10)), (delays._DUE_ROWS_SQL, (500, 10))]:
        plan = " | ".join(row[3] for row in store._db.execute("EXPLAIN QUERY PLAN " + sql, args))
        assert "INDEX delayed_due (held=? AND due_ms<?)" in plan, plan
        assert "TEMP B-TREE" not in plan and "SCAN" not in plan, plan
    plan = " | ".join(row[3] for row in store._db.execute("EXPLAIN QUERY PLAN " + delays._NEXT_DUE_SQL))
    assert "INDEX delayed_due" in plan and "SCAN" not in plan, plan


# ---------------------------------------------------------------- persistence


def test_rows_survive_close_and_reopen_and_ids_are_never_reused(path: Path) -> None:
    with DelayStore(path) as s:
        ids = s.add([(5, "q", 1, b"one"), (6, "r", 2, b"two")], durable=True)
        before = everything(s)
        s.remove(ids[1:])  # the newest id: AUTOINCREMENT must not hand it out again
    with DelayStore(path) as s:
        assert everything(s) == before[:1]
        (new,) = s.add([(1, "q", 0, b"three")], durable=False)
        assert new > ids[1]
    s.close()  # idempotent
    with pytest.raises(StorageError, match="closed"):
        s.count()


def _add_then_die(path: str, conn: Connection) -> None:
    """Child process: add, report the ids, then kill -9 itself before any clean close."""
    s = DelayStore(path)
    relaxed = s.add([(10, "q", 0, b"relaxed-1"), (20, "q", 1, b"relaxed-2")], durable=False)
    durable = s.add([(5, "r", 2, b"durable")], durable=True)
    conn.send(relaxed + durable)
    os.kill(os.getpid(), signal.SIGKILL)


def _add_forever(path: str, conn: Connection) -> None:
    """Child process: add batches of 3 rows in a loop, reporting each committed batch of ids."""
    s = DelayStore(path)
    for i in range(1_000_000):
        ids = s.add([(i, "q", j, f"{i}/{j}".encode()) for j in range(3)], durable=i % 2 == 0)
        conn.send(ids)


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


@pytest.mark.faults
def test_kill9_right_after_add_loses_nothing(path: Path) -> None:
    ctx = _context()
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_add_then_die, args=(str(path), child))
    proc.start()
    ids = parent.recv()
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    with DelayStore(path) as s:
        assert [b.id for b in everything(s)] == [ids[2], ids[0], ids[1]]
        assert [b.batch for b in everything(s)] == [b"durable", b"relaxed-1", b"relaxed-2"]


@pytest.mark.faults
def test_kill9_in_the_middle_of_adds_keeps_every_acknowledged_add_whole(path: Path) -> None:
    ctx = _context()
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_add_forever, args=(str(path), child))
    proc.start()
    acknowledged: list[int] = []
    while len(acknowledged) < 3 * 40:
        acknowledged += parent.recv()
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)  # our own child, by its pid
    proc.join(30)
    while parent.poll(0.1):
        acknowledged += parent.recv()
    with DelayStore(path) as s:
        rows = everything(s)
    stored = {b.id for b in rows}
    assert set(acknowledged) <= stored
    assert len(stored) % 3 == 0  # an add is one transaction: all of its rows or none
    for b in rows:
        assert b.batch == f"{b.due_ms}/{b.partition}".encode()


# ---------------------------------------------------------------- bad input


GOOD = (1, "q", 0, b"x")


@pytest.mark.parametrize(
    ("item", "named"),
    [
        ((-1, "q", 0, b"x"), "due_ms"),
        ((2**62 + 1, "q", 0, b"x"), "due_ms"),
        ((1.5, "q", 0, b"x"), "due_ms"),
        ((True, "q", 0, b"x"), "due_ms"),
        (("1", "q", 0, b"x"), "due_ms"),
        ((1, "", 0, b"x"), "queue"),
        ((1, b"q", 0, b"x"), "queue"),
        ((1, None, 0, b"x"), "queue"),
        ((1, "q" * 256, 0, b"x"), "queue"),
        ((1, "q\udc80", 0, b"x"), "queue"),
        ((1, "q", -1, b"x"), "partition"),
        ((1, "q", 65536, b"x"), "partition"),
        ((1, "q", "0", b"x"), "partition"),
        ((1, "q", False, b"x"), "partition"),
        ((1, "q", 0, b""), "batch"),
        ((1, "q", 0, "x"), "batch"),
        ((1, "q", 0, None), "batch"),
        ((1, "q", 0, memoryview(b"")), "batch"),
        ((1, "q", 0), "items"),
        ("abcd", "items"),
        (None, "items"),
    ],
)
def test_a_bad_row_is_refused_and_nothing_of_its_add_is_stored(store: DelayStore, item: Any, named: str) -> None:
    with pytest.raises(BadParameter, match=named):
        store.add([GOOD, item], durable=True)
    assert store.count() == 0


def test_bad_arguments_name_themselves(store: DelayStore) -> None:
    cases: list[tuple[Any, str]] = [
        (lambda: store.add(None, durable=True), "items"),  # type: ignore[arg-type]
        (lambda: store.add("abc", durable=True), "items"),  # type: ignore[arg-type]
        (lambda: store.add([GOOD], durable=1), "durable"),  # type: ignore[arg-type]
        (lambda: store.due(1.0), "now_ms"),  # type: ignore[arg-type]
        (lambda: store.due(None), "now_ms"),  # type: ignore[arg-type]
        (lambda: store.due(1, limit=0), "limit"),
        (lambda: store.due(1, limit=delays.DUE_LIMIT_MAX + 1), "limit"),
        (lambda: store.due(1, max_bytes=0), "max_bytes"),
        (lambda: store.due(1, max_bytes=True), "max_bytes"),
        (lambda: store.remove(5), "ids"),  # type: ignore[arg-type]
        (lambda: store.remove(["1"]), "ids"),  # type: ignore[list-item]
        (lambda: store.remove([-1]), "ids"),
        (lambda: store.remove([2**63]), "ids"),
        (lambda: store.drop_queue(""), "queue"),
        (lambda: store.count(""), "queue"),
        (lambda: store.count(3), "queue"),  # type: ignore[arg-type]
    ]
    for call, named in cases:
        with pytest.raises(BadParameter, match=named):
            call()


def test_a_file_that_is_not_sqlite_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "delays.sqlite3"
    junk = b"this is not a database, just text\n" * 200
    path.write_bytes(junk)
    with pytest.raises(StorageError, match=str(path)) as info:
        DelayStore(path)
    assert "not a database" in info.value.message
    assert path.read_bytes() == junk


def test_a_foreign_sqlite_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users(name TEXT)")
    db.close()
    before = path.read_bytes()
    with pytest.raises(StorageError, match=f"{path}.*not a delay store"):
        DelayStore(path)
    assert path.read_bytes() == before  # not even switched to WAL


def test_an_unknown_schema_version_or_layout_is_refused(path: Path) -> None:
    DelayStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = 3 WHERE key = 'schema_version'")
    db.close()
    with pytest.raises(StorageError, match=f"{path}.*schema version 3, expected 2"):
        DelayStore(path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = 2 WHERE key = 'schema_version'")
        db.execute("ALTER TABLE delayed ADD COLUMN extra TEXT")
    db.close()
    with pytest.raises(StorageError, match=f"{path}.*unexpected columns"):
        DelayStore(path)


def test_a_missing_index_is_rebuilt_at_open(path: Path) -> None:
    with DelayStore(path) as s:
        s.add([(1, "q", 0, b"x")], durable=True)
    with sqlite3.connect(path) as db:
        db.execute("DROP INDEX delayed_due")
    db.close()
    with DelayStore(path) as s:
        assert s._db is not None
        names = {r[0] for r in s._db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"delayed_due", "delayed_queue"} <= names
        assert len(s.due(1)) == 1


def test_a_directory_in_the_way_is_a_storage_error(tmp_path: Path) -> None:
    (tmp_path / "delays.sqlite3").mkdir()
    with pytest.raises(StorageError, match=str(tmp_path / "delays.sqlite3")):
        DelayStore(tmp_path / "delays.sqlite3")


# ---------------------------------------------------------------- a really full disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for the test (needs root; skipped otherwise)."""
    with tmpfs(tmp_path / "disk", "1m") as mnt:
        yield mnt


@pytest.mark.faults
def test_a_full_disk_is_disk_full_and_leaves_the_store_as_it_was(small_disk: Path) -> None:
    path = small_disk / delays.DELAYS_FILE
    filler = small_disk / "filler"
    filler.write_bytes(bytes(256 * 1024))
    with DelayStore(path) as s:
        committed: list[int] = []
        with pytest.raises(DiskFull, match=str(path)):
            for i in range(10_000):
                committed += s.add([(i, "q", 0, os.urandom(2000)), (i, "q", 1, os.urandom(2000))], durable=i % 2 == 0)
        assert len(committed) > 10
        rows = everything(s)
        assert [b.id for b in rows] == committed  # the failed add left nothing behind
        assert s.count() == len(committed) and s.next_due_ms() == 0
        filler.unlink()  # space returns
        (new,) = s.add([(0, "q", 2, b"after")], durable=True)
        assert new > committed[-1]
    with DelayStore(path) as s:
        assert everything(s) == [*rows[:2], DelayedBatch(new, 0, "q", 2, b"after"), *rows[2:]]


# ---------------------------------------------------------------- against a model


QUEUES = ("a", "b", "c")


class DelayMachine(RuleBasedStateMachine):
    """The store against a dict of rows; reopened now and then, so every step also tests the file."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="delays-")
        self.path = os.path.join(self.dir, delays.DELAYS_FILE)
        self.store = DelayStore(self.path)
        self.rows: dict[int, tuple[int, str, int, bytes]] = {}
        self.last_id = 0
        self.last_due: list[int] = []

    def expected_due(self, now: int, limit: int, max_bytes: int) -> list[DelayedBatch]:
        due = sorted((row[0], i) for i, row in self.rows.items() if row[0] <= now)
        out: list[DelayedBatch] = []
        total = 0
        for _, i in due[:limit]:
            size = len(self.rows[i][3])
            if out and total + size > max_bytes:
                break
            out.append(DelayedBatch(i, *self.rows[i]))
            total += size
        return out

    @rule(
        items=st.lists(
            st.tuples(
                st.integers(0, 100), st.sampled_from(QUEUES), st.integers(0, 3), st.binary(min_size=1, max_size=20)
            ),
            max_size=5,
        ),
        durable=st.booleans(),
    )
    def add(self, items: list[tuple[int, str, int, bytes]], durable: bool) -> None:
        ids = self.store.add(items, durable=durable)
        assert len(ids) == len(items)
        assert all(i > self.last_id for i in ids) and ids == sorted(set(ids))
        if ids:
            self.last_id = ids[-1]
        self.rows.update(zip(ids, items))

    @rule(now=st.integers(-1, 110), limit=st.integers(1, 6), max_bytes=st.integers(1, 60))
    def due(self, now: int, limit: int, max_bytes: int) -> None:
        got = self.store.due(now, limit=limit, max_bytes=max_bytes)
        assert got == self.expected_due(now, limit, max_bytes)
        self.last_due = [b.id for b in got]

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        known = sorted(self.rows)
        ids = data.draw(st.lists(st.sampled_from(self.last_due)) if self.last_due else st.just([]))
        ids += data.draw(st.lists(st.sampled_from(known), max_size=3) if known else st.just([]))
        ids += data.draw(st.lists(st.integers(0, self.last_id + 5), max_size=2))
        existed = {i for i in ids if i in self.rows}
        assert self.store.remove(ids) == len(existed)
        for i in existed:
            del self.rows[i]

    @rule(queue=st.sampled_from(QUEUES))
    def drop_queue(self, queue: str) -> None:
        gone = [i for i, row in self.rows.items() if row[1] == queue]
        assert self.store.drop_queue(queue) == len(gone)
        for i in gone:
            del self.rows[i]

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = DelayStore(self.path)

    @invariant()
    def counts_and_next_due_agree(self) -> None:
        assert self.store.count() == len(self.rows)
        assert self.store.next_due_ms() == min((row[0] for row in self.rows.values()), default=None)
        for q in QUEUES:
            assert self.store.count(q) == sum(1 for row in self.rows.values() if row[1] == q)

    @invariant()
    def everything_comes_back_in_order(self) -> None:
        assert everything(self.store) == self.expected_due(DUE_MS_MAX, len(self.rows) or 1, 1 << 40)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


DelayMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
test_delay_store_against_a_model = DelayMachine.TestCase


# ---------------------------------------------------------------- cluster: replicated rows


def test_a_version_1_file_gains_the_cluster_columns_and_keeps_its_rows(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        db.execute(
            "CREATE TABLE delayed(id INTEGER PRIMARY KEY AUTOINCREMENT, due_ms INTEGER NOT NULL,"
            " queue TEXT NOT NULL, partition INTEGER NOT NULL, batch BLOB NOT NULL)"
        )
        db.execute("CREATE INDEX delayed_due ON delayed(due_ms, id)")
        db.execute("INSERT INTO meta VALUES ('schema_version', 1)")
        db.execute("INSERT INTO delayed(due_ms, queue, partition, batch) VALUES (5, 'q', 0, x'01')")
    db.close()
    with DelayStore(path) as s:
        assert [(r.id, r.due_ms, r.batch, r.delay_id) for r in s.due(10)] == [(1, 5, b"\x01", None)]
        assert s.add([(6, "q", 0, b"x")], durable=False) == [2]
    with DelayStore(path) as s:  # reopened as version 2
        assert s._db is not None
        assert s._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == 2
        assert len(s.due(10)) == 2


def test_replicated_rows_are_idempotent_by_delay_id_and_held_rows_are_never_due(store: DelayStore) -> None:
    ids = store.add_replicated("q", 0, [(7, 5, b"a"), (8, 6, b"b")], held=True, durable=False)
    again = store.add_replicated("q", 0, [(8, 6, b"b"), (9, 7, b"c")], held=True, durable=False)
    assert again[0] == ids[1] and store.count("q") == 3
    assert store.due(100) == [] and store.next_due_ms() is None  # a follower's copies
    assert store.hold("q", 0, False) == 3
    assert [r.delay_id for r in store.due(100)] == [7, 8, 9] and store.next_due_ms() == 5
    assert store.highest("q", 0) == (again[1], 9) and store.highest("q", 1) == (0, None)
    rows, complete = store.pending("q", 0, ids[0], limit=10, max_bytes=1 << 20)
    assert [r.delay_id for r in rows] == [8, 9] and complete
    rows, complete = store.pending("q", 0, 0, limit=2, max_bytes=1 << 20)
    assert [r.delay_id for r in rows] == [7, 8] and not complete
    rows, complete = store.pending("q", 0, 0, limit=10, max_bytes=1)  # the first row always comes
    assert [r.delay_id for r in rows] == [7] and not complete
    assert store.has_replicated() and store.hold_all() == 3 and store.due(100) == []
    store.add([(1, "q", 0, b"own")], durable=False)  # a node's own row (no delay id) is never held
    assert [r.batch for r in store.due(100)] == [b"own"]


def test_marked_rows_leave_pending_until_unmarked_and_go_when_removed(store: DelayStore) -> None:
    store.add_replicated("q", 0, [(1, 5, b"a"), (2, 6, b"b")], held=True, durable=False)
    assert store.mark("q", 0, [(40, 1), (41, 99)]) == [(40, 1)]  # 99: not held here
    assert store.marks("q", 0) == [(40, 1)]
    assert [r.delay_id for r in store.pending("q", 0, 0, limit=10, max_bytes=1 << 20)[0]] == [2]
    store.unmark("q", 0, [1])
    assert store.marks("q", 0) == [] and len(store.pending("q", 0, 0, limit=10, max_bytes=1 << 20)[0]) == 2
    assert store.remove_replicated("q", 0, [1]) == 1 and store.count("q") == 1
    assert store.remove_replicated("q", 0) == 1 and store.count("q") == 0
