"""Node metadata: the queues a store holds and the offsets consumer groups committed.

One sqlite file, ``meta.sqlite`` in the data directory, through sqlitedict with
JSON encoding (never pickle: the records hold client input, and unpickling
them would run code). Two tables:

``queues``   name -> ``{"settings": {...}, "created_ms": int, "id": str}``
``offsets``  ``"<queue>/<group>"`` -> ``{"<partition>": offset, ...}``

Queue and group names cannot contain ``/`` (they are validated against the
protocol's name patterns), so the offsets key splits unambiguously.

Queue records are committed before the method returns: one sqlite transaction
each (they change at the rate of admin commands). Offsets and consumer group
states change at the rate of the data, so they never wait for sqlite on the
caller's thread: the offsets live in memory (loaded at open), a commit is one
append to the journal (:mod:`fabric.store.journal`) and the journal is applied
to sqlite in the background, many commits per transaction; group states are
handed to the same background writer, and read back from it until written.
What sqlite holds is never newer than memory, and at open the journal is
replayed on top of it, so a crash loses nothing a method returned from.

Deleting a queue removes its record first and its offsets second; offsets whose
queue no longer exists (a crash between the two) are purged at open, so a queue
created again under the same name never inherits old offsets.
"""

from __future__ import annotations

import json
import logging
import queue as queue_mod
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlitedict import SqliteDict

from fabric.errors import BadParameter, DiskFull, FabricError, StorageError
from fabric.protocol.ops import GROUP_NAME, QUEUE_NAME
from fabric.store.journal import Journal, encode_offsets

log = logging.getLogger("fabric.store.metadata")

META_FILE = "meta.sqlite"
JOURNAL_FILE = "meta.journal"
RETRY_S = 1.0  # a background write that failed (disk full) is tried again after this
PARTITIONS_MAX = 65536
OFFSET_MAX = 2**63 - 1


def _offsets_key(queue: str, group: str) -> str:
    return f"{queue}/{group}"


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """sqlite's errors, as the store's: a full disk is ``DiskFull``, the rest ``StorageError``."""
    try:
        yield
    except (sqlite3.Error, RuntimeError, OSError) as exc:
        text = str(exc)
        if "full" in text.lower():
            raise DiskFull(f"metadata {what}: {text}") from None
        raise StorageError(f"metadata {what}: {text}") from None


class NodeMetadata:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / META_FILE
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            self._queues = self._table("queues")
            self._offsets = self._table("offsets")
            self._groups = self._table("groups")
            self._acls = self._table("acls")
            self._quotas = self._table("quotas")
            self._offsets_mem = self._load_offsets()
        except FabricError:
            raise
        except Exception as exc:  # sqlite3 and sqlitedict raise assorted errors
            raise StorageError(f"cannot open metadata {self.path}: {exc}") from None
        self._journal.open()
        self._dirty: dict[str, dict[str, int] | None] = {}  # offsets changed since the last rotation
        self._lock = threading.Lock()  # _pending_groups: written by the caller, cleared by the writer
        self._pending_groups: dict[str, dict[str, Any] | None] = {}  # not yet in sqlite (None: deleted)
        self._writer = _Writer()

    def _table(self, name: str) -> SqliteDict:
        return SqliteDict(
            str(self.path), tablename=name, autocommit=False, encode=json.dumps, decode=json.loads, outer_stack=False
        )

    def _load_offsets(self) -> dict[str, dict[str, int]]:
        """sqlite's offsets with the journal replayed on top; the result written back to sqlite
        and the journal removed. Offsets of queues that no longer exist (a crash between
        dropping a queue's record and its offsets) are purged."""
        self._journal = Journal(self.path.with_name(JOURNAL_FILE))
        mem: dict[str, dict[str, int]] = {}
        for key in list(self._offsets.keys()):
            value = self._get(self._offsets, key)
            if isinstance(value, dict):
                mem[key] = value
        changed: set[str] = set()
        for key, value in self._journal.replay():
            changed.add(key)
            if value is None:
                mem.pop(key, None)
            elif isinstance(value, dict):
                mem[key] = {**mem.get(key, {}), **value}
        names = set(self._queues.keys())
        for key in [k for k in mem if k.split("/", 1)[0] not in names]:
            del mem[key]
            changed.add(key)
        if changed:
            with _translated("applying the journal"):
                for key in changed:
                    if key in mem:
                        self._offsets[key] = mem[key]
                    elif key in self._offsets:
                        del self._offsets[key]
                self._offsets.commit()
        self._journal.remove_all()
        return mem

    # ----------------------------------------------------------------- queues

    def has_queue(self, name: str) -> bool:
        """Is there a record for queue ``name`` (one lookup, not a read of every record)?"""
        with _translated(f"reading queue {name}"):
            return name in self._queues

    def queues(self) -> dict[str, dict[str, Any]]:
        """Every queue record, by name."""
        out = {}
        for name in list(self._queues.keys()):
            record = self._get(self._queues, name)
            if isinstance(record, dict) and isinstance(record.get("settings"), dict):
                out[name] = record
            else:
                log.error("metadata: queue record %r is not a valid JSON record; ignored", name)
        return out

    @staticmethod
    def _get(table: SqliteDict, key: str) -> Any:
        """A value, or None when it is missing or not JSON (never unpickled, never a crash)."""
        try:
            return table.get(key)
        except (ValueError, TypeError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            return None

    def acls(self) -> list[dict[str, str]]:
        """The authorization rules (``[{"principal", "operation", "resource"}]``)."""
        rules = self._get(self._acls, "rules")
        return rules if isinstance(rules, list) else []

    def put_acls(self, rules: list[dict[str, str]]) -> None:
        with _translated("writing the ACLs"):
            self._acls["rules"] = rules
            self._acls.commit()

    def quotas(self) -> list[dict[str, Any]]:
        """Quotas set at runtime (``[{"target", "messages_per_s", "bytes_per_s", "burst_ms"}]``)."""
        rows = self._get(self._quotas, "all")
        return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []

    def put_quotas(self, rows: list[dict[str, Any]]) -> None:
        with _translated("writing the quotas"):
            self._quotas["all"] = rows
            self._quotas.commit()

    def put_queue(self, name: str, record: dict[str, Any]) -> None:
        if not QUEUE_NAME.match(name):
            raise BadParameter(f"invalid queue name {name!r}")
        with _translated(f"writing queue {name}"):
            self._queues[name] = record
            self._queues.commit()

    def delete_queue(self, name: str) -> None:
        """Remove the queue's record and every offset committed for it."""
        with _translated(f"deleting queue {name}"):
            if name in self._queues:
                del self._queues[name]
                self._queues.commit()
            prefix = _offsets_key(name, "")
            for key in [k for k in self._offsets_mem if k.startswith(prefix)]:
                self._drop_offsets(key)
            with self._lock:
                keys = {k for k in self._groups if k.startswith(prefix)}
                keys.update(k for k in self._pending_groups if k.startswith(prefix))
            self._put_group_records(dict.fromkeys(keys))

    # ------------------------------------------------------------- group state

    def group_state(self, queue: str, group: str) -> dict[str, Any] | None:
        """A consumer group's saved state (kind, lease tables), or None."""
        key = _offsets_key(queue, group)
        with self._lock:
            if key in self._pending_groups:
                return self._pending_groups[key]
        record = self._get(self._groups, key)
        return record if isinstance(record, dict) else None

    def put_group_states(self, states: dict[tuple[str, str], dict[str, Any]], *, wait: bool = False) -> None:
        """Save several groups' states (the node checkpoints them together): in one background
        transaction, read back by ``group_state`` at once. With ``wait`` (an ack the client asked
        to be durable) return only once they are in sqlite; raises StorageError/DiskFull if not."""
        if states:
            self._put_group_records({_offsets_key(q, g): state for (q, g), state in states.items()}, wait=wait)

    def _put_group_records(self, records: dict[str, dict[str, Any] | None], *, wait: bool = False) -> None:
        if not records:
            return
        with self._lock:
            self._pending_groups.update(records)
        if not wait:
            self._writer.submit(lambda: self._write_groups(records))
            return
        failure: list[BaseException] = []

        def job() -> None:
            try:
                self._write_groups(records)
            except BaseException as exc:
                failure.append(exc)
                raise

        self._writer.submit(job, retry=False)
        if not self._writer.drain(30.0):
            raise StorageError("metadata: saving consumer group state timed out")
        if failure:
            exc = failure[0]
            raise exc if isinstance(exc, FabricError) else StorageError(f"metadata: {exc}")

    def _write_groups(self, records: dict[str, dict[str, Any] | None]) -> None:
        """On the writer thread: put (or delete, for None) group records in one transaction."""
        with _translated("saving consumer group state"):
            _apply(self._groups, records)
        with self._lock:
            for key, state in records.items():
                if key in self._pending_groups and self._pending_groups[key] is state:
                    del self._pending_groups[key]

    def delete_group(self, queue: str, group: str) -> None:
        key = _offsets_key(queue, group)
        self._drop_offsets(key)
        self._put_group_records({key: None})

    # ---------------------------------------------------------------- offsets

    def commit(self, queue: str, group: str, offsets: dict[int, int]) -> None:
        """Merge ``{partition: offset}`` into the group's committed offsets."""
        if not QUEUE_NAME.match(queue):
            raise BadParameter(f"invalid queue name {queue!r}")
        if not GROUP_NAME.match(group):
            raise BadParameter(f"invalid group name {group!r}")
        for partition, offset in offsets.items():
            if type(partition) is not int or not 0 <= partition < PARTITIONS_MAX:
                raise BadParameter(f"partition must be an integer 0..{PARTITIONS_MAX - 1}, got {partition!r}")
            if type(offset) is not int or not 0 <= offset <= OFFSET_MAX:
                raise BadParameter(f"offset must be a non-negative integer, got {offset!r}")
        key = _offsets_key(queue, group)
        delta = {str(p): o for p, o in offsets.items()}
        # the names matched QUEUE_NAME and GROUP_NAME above: the key needs no JSON escaping
        self._journal.write(encode_offsets(key, delta))  # raises DiskFull/StorageError: then nothing changed
        merged = {**self._offsets_mem.get(key, {}), **delta}  # a new dict: the writer may hold the old
        self._offsets_mem[key] = merged
        self._dirty[key] = merged
        self._maybe_rotate()

    def forget_partitions(self, queue: str, group: str, below: int) -> None:
        """Drop the group's committed offsets of partitions ``below`` and up (shrinking removed
        them: a partition added again later starts empty, at offset 0)."""
        key = _offsets_key(queue, group)
        kept = {p: o for p, o in self.committed(queue, group).items() if p < below}
        if len(kept) == len(self.committed(queue, group)):
            return
        self._drop_offsets(key)
        if kept:
            self.commit(queue, group, kept)

    def _drop_offsets(self, key: str) -> None:
        if key not in self._offsets_mem and key not in self._dirty:
            return
        self._journal.append(key, None)
        self._offsets_mem.pop(key, None)
        self._dirty[key] = None
        self._maybe_rotate()

    def _maybe_rotate(self) -> None:
        """When the journal is large, start a new one and have the writer put the offsets that
        changed into sqlite, then delete the old journal."""
        if not self._journal.wants_rotation:
            return
        changes, self._dirty = self._dirty, {}
        try:
            self._journal.rotate()
        except StorageError:
            self._dirty = {**changes, **self._dirty}
            log.exception("metadata: could not rotate the journal; it keeps growing until it can")
            return
        self._writer.submit(lambda: self._write_offsets(changes, remove=self._journal.old_path))

    def _write_offsets(self, changes: dict[str, dict[str, int] | None], *, remove: Path | None) -> None:
        """On the writer thread: offsets changed since a rotation into sqlite, then the journal
        that recorded them can go."""
        with _translated("saving committed offsets"):
            _apply(self._offsets, changes)
        if remove is not None:
            remove.unlink(missing_ok=True)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every change handed to the writer is in sqlite (tests, close)."""
        return self._writer.drain(timeout_s)

    def committed(self, queue: str, group: str) -> dict[int, int]:
        """The group's committed offsets, ``{partition: offset}`` (empty if none)."""
        record = self._offsets_mem.get(_offsets_key(queue, group))
        out: dict[int, int] = {}
        if isinstance(record, dict):
            for partition, offset in record.items():
                if isinstance(partition, str) and partition.isdigit() and type(offset) is int:
                    out[int(partition)] = offset
        return out

    def groups(self, queue: str) -> list[str]:
        prefix = _offsets_key(queue, "")
        names = {k[len(prefix) :] for k in self._offsets_mem if k.startswith(prefix)}
        with self._lock:
            pending = dict(self._pending_groups)
        names.update(k[len(prefix) :] for k in self._groups if k.startswith(prefix) and k not in pending)
        names.update(k[len(prefix) :] for k, v in pending.items() if k.startswith(prefix) and v is not None)
        return sorted(names)

    def groups_by_queue(self, prefix: str = "") -> dict[str, list[str]]:
        """Every queue's groups whose name starts with ``prefix``, in one pass over the keys (one
        ``groups(queue)`` per queue would read them all once per queue)."""
        with self._lock:
            pending = dict(self._pending_groups)
        keys = set(self._offsets_mem)
        keys.update(k for k in self._groups if k not in pending)
        keys.update(k for k, v in pending.items() if v is not None)
        out: dict[str, list[str]] = {}
        for k in keys:
            queue, sep, group = k.partition("/")
            if sep and group.startswith(prefix):
                out.setdefault(queue, []).append(group)
        return {q: sorted(gs) for q, gs in out.items()}

    def close(self) -> None:
        """Write what is pending to sqlite and remove the journal (if that fails, the journal
        stays and is replayed at the next open)."""
        if getattr(self, "_closed", False):  # closing twice is harmless
            return
        self._closed = True
        writer = getattr(self, "_writer", None)
        if writer is not None:
            changes, self._dirty = self._dirty, {}
            writer.submit(lambda: self._write_offsets(changes, remove=None), retry=False)
            if writer.drain(30.0) and not writer.failed:
                self._journal.remove_all()
            else:
                self._journal.close()
                log.error("metadata: pending changes could not be written; the journal keeps them")
            writer.stop()
        for table in (self._queues, self._offsets, self._groups, self._acls, self._quotas):
            try:
                table.close()
            except Exception:  # closing twice or after a failed open is harmless
                pass


def _apply(table: SqliteDict, changes: Mapping[str, Any]) -> None:
    """Put every value (delete the key for None) and commit: one transaction."""
    for key, value in changes.items():
        if value is not None:
            table[key] = value
        elif key in table:
            del table[key]
    table.commit()


class _Writer:
    """One background thread running metadata writes in the order they were handed over. A write
    that fails (a full disk) is logged and tried again until it succeeds or the writer stops."""

    def __init__(self) -> None:
        self._jobs: queue_mod.SimpleQueue[tuple[Callable[[], None], bool] | None] = queue_mod.SimpleQueue()
        self._idle = threading.Condition()
        self._queued = 0
        self._stopping = threading.Event()
        self.failed = False  # the last job failed (and was given up)
        self._thread = threading.Thread(target=self._run, name="fabric-meta-writer", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None], *, retry: bool = True) -> None:
        with self._idle:
            self._queued += 1
        self._jobs.put((job, retry))

    def drain(self, timeout_s: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._queued == 0, timeout_s)

    def stop(self) -> None:
        self._stopping.set()
        self._jobs.put(None)
        self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, retry = item
            while True:
                try:
                    job()
                    self.failed = False
                    break
                except Exception:
                    log.exception("metadata: a background write failed%s", "; trying again" if retry else "")
                    self.failed = True
                    if not retry or self._stopping.wait(RETRY_S):
                        break
            with self._idle:
                self._queued -= 1
                self._idle.notify_all()
