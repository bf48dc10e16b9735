"""Delayed delivery: record batches kept on disk until their due time, then handed back.

Theory of operation
-------------------
A producer may ask for a batch to be delivered at ``due_ms`` (seconds to months
ahead). The node keeps such batches in a ``DelayStore`` and, on each tick, asks
``due(now_ms)`` for the batches whose time has come, appends them to their
queue partition and then ``remove``s them. A crash between the append and the
remove delivers the batch again: delayed delivery is at-least-once.

Everything lives in one SQLite file (``delays.sqlite3`` in the data directory)
in WAL mode; nothing is kept in memory per batch, so memory stays flat (SQLite's
page cache, about 2 MiB) whether one or millions of batches wait. Schema
(``schema_version`` 2 in ``meta``; a version 1 file gains the last three columns at open)::

    meta(key TEXT PRIMARY KEY, value INTEGER)             ('schema_version', 2)
    delayed(id INTEGER PRIMARY KEY AUTOINCREMENT, due_ms INTEGER, queue TEXT,
            partition INTEGER, batch BLOB,
            delay_id INTEGER NULL,      cluster: the row's id in its partition (None: this node's own)
            held INTEGER DEFAULT 0,     1: a replica's copy while this node does not lead: not due
            appended_at INTEGER NULL)   follower: the offset of the leader's append of it in our log
    delayed_due     ON delayed(held, due_ms, id)  due(), next_due_ms(): a range scan, never a full scan
    delayed_queue   ON delayed(queue, due_ms)     count(queue), drop_queue()
    delayed_replica UNIQUE ON delayed(queue, partition, delay_id)   one row per delay id

``AUTOINCREMENT`` makes ids increase in insertion order and never come back,
even after the newest row was removed, across restarts. The indexes are derived
data: one that is missing is rebuilt at open. A single node never sets the three
cluster columns (``fabric.cluster.delayed`` says what they are for).

Durability
----------
Every method is one transaction. ``add(durable=True)`` commits with
``synchronous=FULL`` (the WAL is fsynced before it returns); ``durable=False``
commits with ``synchronous=NORMAL``, which survives a crash of the process
(``kill -9``) but maybe not of the machine. ``remove`` is ``NORMAL`` (a removal
lost to a power cut means one more delivery, which at-least-once allows);
``drop_queue`` is ``FULL``, so a deleted queue's batches never come back into a
queue created again under the same name.

``due`` reads in one read transaction: first the sizes (``length(batch)`` does
not read the blob), to decide how many rows fit ``max_bytes``, then exactly
those rows, so no batch is read only to be thrown away.

Errors
------
Arguments out of range raise ``BadParameter`` naming the argument. SQLite's
errors are translated at the boundary: a full disk (``SQLITE_FULL``) is
``DiskFull``, anything else ``StorageError``, each naming the file; the failed
transaction is rolled back, so the store is as it was and usable. A file that is
not a SQLite database, or a database that is not a delay store of this schema
version, fails at open with ``StorageError`` naming the path, and is left as it was.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from fabric.errors import BadParameter, DiskFull, StorageError
from fabric.protocol.batch import BATCH_BYTES_MAX
from fabric.store.files import fsync_dir

log = logging.getLogger("fabric.store.delays")

DELAYS_FILE = "delays.sqlite3"
SCHEMA_VERSION = 2
DUE_MS_MAX = 2**62
PARTITION_MAX = 65535
QUEUE_CHARS_MAX = 255
ID_MAX = 2**63 - 1
DUE_LIMIT_MAX = 100_000  # rows one due() call may return

_COLUMNS_V1 = [("id", "INTEGER"), ("due_ms", "INTEGER"), ("queue", "TEXT"), ("partition", "INTEGER"), ("batch", "BLOB")]
_COLUMNS = [*_COLUMNS_V1, ("delay_id", "INTEGER"), ("held", "INTEGER"), ("appended_at", "INTEGER")]
_CREATE_TABLES = (
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE delayed(id INTEGER PRIMARY KEY AUTOINCREMENT, due_ms INTEGER NOT NULL, queue TEXT NOT NULL,"
    " partition INTEGER NOT NULL, batch BLOB NOT NULL, delay_id INTEGER, held INTEGER NOT NULL DEFAULT 0,"
    " appended_at INTEGER)",
)
_UPGRADE_V1 = (
    "ALTER TABLE delayed ADD COLUMN delay_id INTEGER",
    "ALTER TABLE delayed ADD COLUMN held INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE delayed ADD COLUMN appended_at INTEGER",
    "DROP INDEX IF EXISTS delayed_due",
    "UPDATE meta SET value = 2 WHERE key = 'schema_version'",
)
_CREATE_INDEXES = (
    "CREATE INDEX IF NOT EXISTS delayed_due ON delayed(held, due_ms, id)",
    "CREATE INDEX IF NOT EXISTS delayed_queue ON delayed(queue, due_ms)",
    "CREATE UNIQUE INDEX IF NOT EXISTS delayed_replica ON delayed(queue, partition, delay_id)",
)
_DUE_SIZES_SQL = "SELECT length(batch) FROM delayed WHERE held = 0 AND due_ms <= ? ORDER BY due_ms, id LIMIT ?"
_DUE_ROWS_SQL = (
    "SELECT id, due_ms, queue, partition, batch, delay_id FROM delayed WHERE held = 0 AND due_ms <= ?"
    " ORDER BY due_ms, id LIMIT ?"
)
_NEXT_DUE_SQL = "SELECT MIN(due_ms) FROM delayed WHERE held = 0"
_PENDING_SQL = (
    "SELECT id, due_ms, queue, partition, batch, delay_id FROM delayed WHERE queue = ? AND partition = ?"
    " AND delay_id IS NOT NULL AND appended_at IS NULL AND id > ? ORDER BY id LIMIT ?"
)
_STATS_SQL = "SELECT queue, COUNT(*), SUM(length(batch)), MIN(due_ms) FROM delayed GROUP BY queue"
_SYNCHRONOUS_FULL = 2
_SYNCHRONOUS_NORMAL = 1


@dataclass(frozen=True, slots=True)
class DelayedBatch:
    """One waiting batch: deliver ``batch`` to ``queue``/``partition`` at ``due_ms``."""

    id: int  # unique, increasing in insertion order, never reused
    due_ms: int
    queue: str
    partition: int
    batch: bytes = field(repr=False)  # the raw record batch, byte for byte as added
    delay_id: int | None = None  # cluster: its id in the partition, the same on every replica


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_row(i: int, item: object) -> tuple[int, str, int, bytes]:
    """One ``(due_ms, queue, partition, batch)`` row of ``add``, validated; BadParameter names the field."""
    if not isinstance(item, tuple | list) or len(item) != 4:
        raise BadParameter(f"items[{i}] must be a (due_ms, queue, partition, batch) tuple, got {item!r:.80}")
    due_ms, queue, partition, batch = item
    if not _is_int(due_ms) or not 0 <= due_ms <= DUE_MS_MAX:
        raise BadParameter(f"items[{i}]: due_ms must be an int in 0..2**62, got {due_ms!r:.80}")
    _check_queue(queue, f"items[{i}]: queue")
    if not _is_int(partition) or not 0 <= partition <= PARTITION_MAX:
        raise BadParameter(f"items[{i}]: partition must be an int in 0..{PARTITION_MAX}, got {partition!r:.80}")
    if not isinstance(batch, bytes | bytearray | memoryview):
        raise BadParameter(f"items[{i}]: batch must be bytes, bytearray or memoryview, got {type(batch).__name__}")
    size = batch.nbytes if isinstance(batch, memoryview) else len(batch)
    if not 0 < size <= BATCH_BYTES_MAX:
        raise BadParameter(f"items[{i}]: batch must hold 1..{BATCH_BYTES_MAX} bytes, got {size}")
    return due_ms, queue, partition, bytes(batch)


def _check_queue(queue: object, name: str = "queue") -> str:
    if not isinstance(queue, str) or not 0 < len(queue) <= QUEUE_CHARS_MAX:
        raise BadParameter(f"{name} must be a str of 1..{QUEUE_CHARS_MAX} characters, got {queue!r:.80}")
    try:
        queue.encode("utf-8")
    except UnicodeEncodeError:
        raise BadParameter(f"{name} is not valid unicode: {queue!r:.80}") from None
    return queue


def _check_positive(value: object, name: str, high: int | None = None) -> int:
    if not _is_int(value) or value < 1 or (high is not None and value > high):
        bounds = f"1..{high}" if high is not None else "at least 1"
        raise BadParameter(f"{name} must be an int {bounds}, got {value!r:.80}")
    return value


def _is_disk_full(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_FULL:
        return True
    return "database or disk is full" in str(exc)


class DelayStore:
    """Batches waiting for their due time, in one SQLite file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._db: sqlite3.Connection | None = None
        self._synchronous = -1  # the PRAGMA synchronous last set on the connection
        self._upgrade = False  # a schema version 1 file: gains the cluster columns at open
        created = not self.path.exists()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StorageError(f"cannot open delay store {self.path}: {exc}") from None
        try:
            self._open(db)
            if created:
                fsync_dir(self.path.parent)
        except sqlite3.Error as exc:  # "file is not a database", "database disk image is malformed", ...
            db.close()
            if _is_disk_full(exc):
                raise DiskFull(f"cannot open delay store {self.path}: {exc}") from None
            raise StorageError(f"cannot open delay store {self.path}: {exc}") from None
        except OSError as exc:
            db.close()
            raise StorageError(f"cannot open delay store {self.path}: {exc}") from None
        except BaseException:
            db.close()
            raise
        self._db = db

    def _open(self, db: sqlite3.Connection) -> None:
        """Check the schema (create it in an empty file), switch to WAL, rebuild missing indexes."""
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables:
            self._check_schema(db, tables)  # before anything is written: a foreign file stays as it was
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StorageError(f"cannot open delay store {self.path}: WAL mode unavailable (journal_mode {mode})")
        db.execute("BEGIN IMMEDIATE")
        try:
            if not tables:
                for sql in _CREATE_TABLES:
                    db.execute(sql)
                db.execute("INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
            elif self._upgrade:
                for sql in _UPGRADE_V1:
                    db.execute(sql)
            for sql in _CREATE_INDEXES:
                db.execute(sql)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _check_schema(self, db: sqlite3.Connection, tables: set[str]) -> None:
        if "meta" not in tables or "delayed" not in tables:
            raise StorageError(f"{self.path} is a SQLite database but not a delay store (tables {sorted(tables)})")
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None or row[0] not in (1, SCHEMA_VERSION):
            found = None if row is None else row[0]
            raise StorageError(f"delay store {self.path} has schema version {found!r}, expected {SCHEMA_VERSION}")
        columns = [(r[1], str(r[2]).upper()) for r in db.execute("PRAGMA table_info(delayed)")]
        if columns != (_COLUMNS_V1 if row[0] == 1 else _COLUMNS):
            raise StorageError(f"delay store {self.path}: table 'delayed' has unexpected columns {columns}")
        self._upgrade = row[0] == 1

    # ------------------------------------------------------------ plumbing

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StorageError(f"delay store {self.path} is closed")
        return self._db

    @contextmanager
    def _translated(self, what: str) -> Iterator[None]:
        """SQLite's errors as the store's: a full disk is ``DiskFull``, the rest ``StorageError``."""
        try:
            yield
        except sqlite3.Error as exc:
            if _is_disk_full(exc):
                raise DiskFull(f"delay store {self.path}: disk full while {what}: {exc}") from None
            raise StorageError(f"delay store {self.path}: {what} failed: {exc}") from None

    @contextmanager
    def _write(self, what: str, *, full: bool) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed with synchronous FULL or NORMAL; rolled back on any error."""
        db = self._conn()
        with self._translated(what):
            wanted = _SYNCHRONOUS_FULL if full else _SYNCHRONOUS_NORMAL
            if self._synchronous != wanted:
                db.execute(f"PRAGMA synchronous={wanted}")
                self._synchronous = wanted
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                self._rollback(db)
                raise

    @contextmanager
    def _read(self, what: str) -> Iterator[sqlite3.Connection]:
        """One read transaction: every query in it sees the same snapshot."""
        db = self._conn()
        with self._translated(what):
            db.execute("BEGIN")
            try:
                yield db
            finally:
                self._rollback(db)  # nothing was written: ending a read transaction

    def _rollback(self, db: sqlite3.Connection) -> None:
        """End the open transaction, if SQLite has not already rolled it back itself."""
        if db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error as exc:  # the error being raised already says what went wrong
                log.error("delay store %s: rollback failed: %s", self.path, exc)

    # ------------------------------------------------------------ the API

    def add(
        self, items: Sequence[tuple[int, str, int, bytes]], *, durable: bool, delay_ids: Sequence[int] | None = None
    ) -> list[int]:
        """Store ``(due_ms, queue, partition, batch)`` rows in one transaction; return their ids in order.
        ``delay_ids`` (a cluster leader's rows): one per row, unique in its partition.

        ``durable=True`` fsyncs before returning; ``durable=False`` survives a
        process crash but maybe not a power cut. Nothing is stored if any row
        is invalid (``BadParameter``) or the disk is full (``DiskFull``).
        """
        if isinstance(items, str | bytes) or not isinstance(items, Sequence):
            raise BadParameter(f"items must be a sequence of (due_ms, queue, partition, batch), got {items!r:.80}")
        if not isinstance(durable, bool):
            raise BadParameter(f"durable must be a bool, got {durable!r:.80}")
        rows = [_check_row(i, item) for i, item in enumerate(items)]
        if not rows:
            return []
        if delay_ids is not None and len(delay_ids) != len(rows):
            raise BadParameter(f"{len(delay_ids)} delay ids for {len(rows)} rows")
        ids: list[int] = []
        with self._write(f"adding {len(rows)} batches", full=durable) as db:
            for i, row in enumerate(rows):
                if delay_ids is None:
                    cursor = db.execute("INSERT INTO delayed(due_ms, queue, partition, batch) VALUES (?, ?, ?, ?)", row)
                else:
                    cursor = db.execute(
                        "INSERT INTO delayed(due_ms, queue, partition, batch, delay_id) VALUES (?, ?, ?, ?, ?)",
                        (*row, delay_ids[i]),
                    )
                assert cursor.lastrowid is not None
                ids.append(cursor.lastrowid)
        return ids

    def due(self, now_ms: int, *, limit: int = 1000, max_bytes: int = 16 << 20) -> list[DelayedBatch]:
        """Batches with ``due_ms <= now_ms``, ordered by (due_ms, id).

        At most ``limit`` rows, and no more batch bytes than ``max_bytes``,
        except that the first due row is always returned whatever its size.
        """
        if not _is_int(now_ms):
            raise BadParameter(f"now_ms must be an int, got {now_ms!r:.80}")
        limit = _check_positive(limit, "limit", DUE_LIMIT_MAX)
        max_bytes = _check_positive(max_bytes, "max_bytes")
        now = min(max(now_ms, -1), DUE_MS_MAX)
        with self._read("reading due batches") as db:
            count = total = 0
            cursor = db.execute(_DUE_SIZES_SQL, (now, limit))
            for (size,) in cursor:
                if count and total + size > max_bytes:
                    break
                count += 1
                total += size
            cursor.close()
            if not count:
                return []
            rows = db.execute(_DUE_ROWS_SQL, (now, count)).fetchall()
        return [DelayedBatch(*row) for row in rows]

    # ------------------------------------------------------------ cluster: replicated rows

    def add_replicated(
        self, queue: str, partition: int, rows: Sequence[tuple[int, int, bytes]], *, held: bool, durable: bool
    ) -> list[int]:
        """Store ``(delay_id, due_ms, batch)`` rows of one partition; a delay id already held is
        kept as it is (idempotent). Returns the ids of the rows now holding them, in order."""
        checked = [_check_row(i, (due, queue, partition, batch)) for i, (_, due, batch) in enumerate(rows)]
        for i, (delay_id, _, _) in enumerate(rows):
            if not _is_int(delay_id) or not 0 <= delay_id <= ID_MAX:
                raise BadParameter(f"rows[{i}]: delay_id must be an int in 0..{ID_MAX}, got {delay_id!r:.80}")
        if not checked:
            return []
        ids: list[int] = []
        with self._write(f"adding {len(checked)} replicated batches", full=durable) as db:
            for (due, q, p, batch), (delay_id, _, _) in zip(checked, rows, strict=True):
                db.execute(
                    "INSERT OR IGNORE INTO delayed(due_ms, queue, partition, batch, delay_id, held)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (due, q, p, batch, delay_id, int(held)),
                )
                found = db.execute(
                    "SELECT id FROM delayed WHERE queue = ? AND partition = ? AND delay_id = ?", (q, p, delay_id)
                ).fetchone()
                ids.append(found[0])
        return ids

    def pending(
        self, queue: str, partition: int, after_id: int, *, limit: int, max_bytes: int
    ) -> tuple[list[DelayedBatch], bool]:
        """The partition's replicated rows not appended, with ids above ``after_id``, by id: at
        most ``limit`` and ``max_bytes`` (the first row always); True when no row is left out."""
        limit = _check_positive(limit, "limit", DUE_LIMIT_MAX)
        out: list[DelayedBatch] = []
        total = 0
        with self._read("reading replicated batches") as db:
            for row in db.execute(_PENDING_SQL, (queue, partition, after_id, limit + 1)):
                if len(out) == limit or (out and total + len(row[4]) > max_bytes):
                    return out, False
                total += len(row[4])
                out.append(DelayedBatch(*row))
        return out, True

    def has_replicated(self) -> bool:
        """Does any row carry a delay id (a cluster's replicated row)?"""
        with self._translated("reading replicated batches"):
            return (
                self._conn().execute("SELECT 1 FROM delayed WHERE delay_id IS NOT NULL LIMIT 1").fetchone() is not None
            )

    def highest(self, queue: str, partition: int) -> tuple[int, int | None]:
        """(the largest row id, the largest delay id) of the partition's replicated rows (0, None: none)."""
        with self._translated("reading replicated batches"):
            row = (
                self._conn()
                .execute(
                    "SELECT MAX(id), MAX(delay_id) FROM delayed WHERE queue = ? AND partition = ?"
                    " AND delay_id IS NOT NULL",
                    (queue, partition),
                )
                .fetchone()
            )
        return (row[0] or 0), row[1]

    def hold_all(self) -> int:
        """Hold every replicated row (a cluster node starts leading nothing); returns how many changed."""
        with self._write("holding replicated batches", full=False) as db:
            return db.execute("UPDATE delayed SET held = 1 WHERE delay_id IS NOT NULL AND held = 0").rowcount

    def hold(self, queue: str, partition: int, held: bool) -> int:
        """Hold (a replica's copies, never due here) or release the partition's replicated rows.
        Returns how many changed."""
        with self._write("holding replicated batches", full=False) as db:
            return db.execute(
                "UPDATE delayed SET held = ? WHERE queue = ? AND partition = ? AND delay_id IS NOT NULL AND held != ?",
                (int(held), queue, partition, int(held)),
            ).rowcount

    def marks(self, queue: str, partition: int) -> list[tuple[int, int]]:
        """``(appended_at, delay_id)`` of the partition's rows whose append this replica's log holds."""
        with self._translated("reading appended batches"):
            rows = (
                self._conn()
                .execute(
                    "SELECT appended_at, delay_id FROM delayed WHERE queue = ? AND partition = ?"
                    " AND delay_id IS NOT NULL AND appended_at IS NOT NULL",
                    (queue, partition),
                )
                .fetchall()
            )
        return [(a, d) for a, d in rows]

    def mark(self, queue: str, partition: int, marks: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Record ``(offset, delay_id)``: the append of that row is at that offset of this replica's
        log. Returns the marks that named a row here (the others are not held here)."""
        done: list[tuple[int, int]] = []
        with self._write(f"marking {len(marks)} appended batches", full=False) as db:
            for offset, delay_id in marks:
                n = db.execute(
                    "UPDATE delayed SET appended_at = ? WHERE queue = ? AND partition = ? AND delay_id = ?",
                    (offset, queue, partition, delay_id),
                ).rowcount
                if n:
                    done.append((offset, delay_id))
        return done

    def unmark(self, queue: str, partition: int, delay_ids: Sequence[int]) -> None:
        """Those rows' appends were truncated from this replica's log: they wait again."""
        with self._write(f"unmarking {len(delay_ids)} batches", full=False) as db:
            db.executemany(
                "UPDATE delayed SET appended_at = NULL WHERE queue = ? AND partition = ? AND delay_id = ?",
                [(queue, partition, d) for d in delay_ids],
            )

    def remove_replicated(self, queue: str, partition: int, delay_ids: Sequence[int] | None = None) -> int:
        """Delete the partition's rows with these delay ids (None: every replicated row of it)."""
        with self._write("removing replicated batches", full=False) as db:
            if delay_ids is None:
                return db.execute(
                    "DELETE FROM delayed WHERE queue = ? AND partition = ? AND delay_id IS NOT NULL", (queue, partition)
                ).rowcount
            cursor = db.executemany(
                "DELETE FROM delayed WHERE queue = ? AND partition = ? AND delay_id = ?",
                [(queue, partition, d) for d in delay_ids],
            )
            return cursor.rowcount

    def remove(self, ids: Iterable[int]) -> int:
        """Delete the batches with these ids in one transaction; return how many existed."""
        if isinstance(ids, str | bytes):
            raise BadParameter(f"ids must be an iterable of ints, got {ids!r:.80}")
        try:
            wanted = list(ids)
        except TypeError:
            raise BadParameter(f"ids must be an iterable of ints, got {ids!r:.80}") from None
        for i in wanted:
            if not _is_int(i) or not 0 <= i <= ID_MAX:
                raise BadParameter(f"ids must be ints in 0..{ID_MAX}, got {i!r:.80}")
        if not wanted:
            return 0
        with self._write(f"removing {len(wanted)} batches", full=False) as db:
            cursor = db.executemany("DELETE FROM delayed WHERE id = ?", [(i,) for i in wanted])
            return cursor.rowcount

    def next_due_ms(self) -> int | None:
        """The earliest due time of any batch, None when there is none."""
        with self._translated("reading the next due time"):
            value: int | None = self._conn().execute(_NEXT_DUE_SQL).fetchone()[0]
        return value

    def count(self, queue: str | None = None) -> int:
        """How many batches wait, in all or in ``queue``."""
        with self._translated("counting batches"):
            if queue is None:
                cursor = self._conn().execute("SELECT COUNT(*) FROM delayed")
            else:
                cursor = self._conn().execute("SELECT COUNT(*) FROM delayed WHERE queue = ?", (_check_queue(queue),))
            n: int = cursor.fetchone()[0]
        return n

    def stats(self) -> dict[str, dict[str, int]]:
        """Per queue: ``{"batches": n, "bytes": total batch bytes, "next_due_ms": earliest}`` (a full scan)."""
        with self._translated("reading stats"):
            rows: list[Any] = self._conn().execute(_STATS_SQL).fetchall()
        return {queue: {"batches": n, "bytes": size, "next_due_ms": first} for queue, n, size, first in rows}

    def drop_queue(self, queue: str) -> int:
        """Delete every batch of ``queue`` (the queue was deleted), durably; return how many."""
        _check_queue(queue)
        with self._write(f"dropping queue {queue}", full=True) as db:
            return db.execute("DELETE FROM delayed WHERE queue = ?", (queue,)).rowcount

    def close(self) -> None:
        """Close the file (idempotent); any later call raises ``StorageError``."""
        db, self._db = self._db, None
        if db is not None:
            with self._translated("closing"):
                db.close()

    def __enter__(self) -> DelayStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._db is None else "open"
        return f"DelayStore({str(self.path)!r}, {state})"
