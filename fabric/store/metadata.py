"""Node metadata: the queues a store holds and the offsets consumer groups committed.

One sqlite file, ``meta.sqlite`` in the data directory, through sqlitedict with
JSON encoding (never pickle: the records hold client input, and unpickling
them would run code). Two tables:

``queues``   name -> ``{"settings": {...}, "created_ms": int, "id": str}``
``offsets``  ``"<queue>/<group>"`` -> ``{"<partition>": offset, ...}``

Queue and group names cannot contain ``/`` (they are validated against the
protocol's name patterns), so the offsets key splits unambiguously. Every change
is committed before the method returns: one sqlite transaction each.

Deleting a queue removes its record first and its offsets second; offsets whose
queue no longer exists (a crash between the two) are purged at open, so a queue
created again under the same name never inherits old offsets.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlitedict import SqliteDict

from fabric.errors import BadParameter, DiskFull, StorageError
from fabric.protocol.ops import GROUP_NAME, QUEUE_NAME

log = logging.getLogger("fabric.store.metadata")

META_FILE = "meta.sqlite"
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


class MetaStore:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / META_FILE
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            self._queues = self._table("queues")
            self._offsets = self._table("offsets")
            self._groups = self._table("groups")
        except Exception as exc:  # sqlite3 and sqlitedict raise assorted errors
            raise StorageError(f"cannot open metadata {self.path}: {exc}") from None
        self._purge_orphan_offsets()

    def _table(self, name: str) -> SqliteDict:
        return SqliteDict(
            str(self.path), tablename=name, autocommit=False, encode=json.dumps, decode=json.loads, outer_stack=False
        )

    def _purge_orphan_offsets(self) -> None:
        names = set(self._queues.keys())
        orphans = [k for k in self._offsets if k.split("/", 1)[0] not in names]
        for key in orphans:
            del self._offsets[key]
        if orphans:
            self._offsets.commit()

    # ----------------------------------------------------------------- queues

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
            keys = [k for k in self._offsets if k.startswith(prefix)]
            for key in keys:
                del self._offsets[key]
            if keys:
                self._offsets.commit()
            keys = [k for k in self._groups if k.startswith(prefix)]
            for key in keys:
                del self._groups[key]
            if keys:
                self._groups.commit()

    # ------------------------------------------------------------- group state

    def group_state(self, queue: str, group: str) -> dict[str, Any] | None:
        """A consumer group's saved state (kind, lease tables), or None."""
        record = self._get(self._groups, _offsets_key(queue, group))
        return record if isinstance(record, dict) else None

    def put_group_states(self, states: dict[tuple[str, str], dict[str, Any]]) -> None:
        """Save several groups' states in one transaction (the node checkpoints them together)."""
        if not states:
            return
        with _translated("saving consumer group state"):
            for (queue, group), state in states.items():
                self._groups[_offsets_key(queue, group)] = state
            self._groups.commit()

    def delete_group(self, queue: str, group: str) -> None:
        key = _offsets_key(queue, group)
        with _translated(f"deleting group {key}"):
            for table in (self._groups, self._offsets):
                if key in table:
                    del table[key]
                    table.commit()

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
        with _translated(f"committing offsets of {key}"):
            current = self._get(self._offsets, key)
            merged = dict(current) if isinstance(current, dict) else {}
            merged.update({str(p): o for p, o in offsets.items()})
            self._offsets[key] = merged
            self._offsets.commit()

    def committed(self, queue: str, group: str) -> dict[int, int]:
        """The group's committed offsets, ``{partition: offset}`` (empty if none)."""
        record = self._get(self._offsets, _offsets_key(queue, group))
        out: dict[int, int] = {}
        if isinstance(record, dict):
            for partition, offset in record.items():
                if isinstance(partition, str) and partition.isdigit() and type(offset) is int:
                    out[int(partition)] = offset
        return out

    def groups(self, queue: str) -> list[str]:
        prefix = _offsets_key(queue, "")
        names = {k[len(prefix) :] for k in self._offsets if k.startswith(prefix)}
        names.update(k[len(prefix) :] for k in self._groups if k.startswith(prefix))
        return sorted(names)

    def close(self) -> None:
        for table in (self._queues, self._offsets, self._groups):
            try:
                table.close()
            except Exception:  # closing twice or after a failed open is harmless
                pass
