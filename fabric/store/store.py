"""The store: every queue a node holds, each a set of partition logs, plus their metadata.

Layout of a data directory::

    data_dir/meta.sqlite                   queues and committed offsets (NodeMetadata)
    data_dir/queues/<queue>/<partition>/   one PartitionLog per partition
    data_dir/queues/.deleted-<queue>-<id>  a queue being deleted (removed at open)
    data_dir/queues/.orphan-<queue>-<id>   a directory found without a queue record, set aside

A queue with ``encrypt = true`` has its batches sealed on disk with the node's at-rest keys
(``at_rest``, from ``[security] at_rest_key_file``); a node without them refuses to create one,
and at open serves none of an existing one (its partitions are ``refused``, their files kept).

Creating a queue writes its record first and its directories second, so a
crash in between leaves a record whose partitions are created empty at open.
Deleting a queue renames its directory to ``.deleted-*`` first (one atomic
rename, fsynced), then drops the record, then removes the files: a crash at any
point never brings the data back. At open, a ``.deleted-*`` directory whose
queue still has a record and no live directory finishes its deletion.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from fabric.errors import (
    BadParameter,
    DiskFull,
    FabricError,
    QueueExists,
    QueueFull,
    StorageError,
    UnknownPartition,
    UnknownQueue,
)
from fabric.protocol.ops import QUEUE_NAME
from fabric.security.at_rest import AtRestKeys
from fabric.settings import QueueSettings, alter_problem, grow_problem
from fabric.store.files import fsync_dir, remove_tree, storage_error
from fabric.store.idempotence import ProducerIds, load_states, save_states
from fabric.store.log import TAIL_CACHE_BYTES, PartitionLog
from fabric.store.metadata import NodeMetadata
from fabric.store.producers import ProducerStates
from fabric.store.recovery import RecoveryReport

log = logging.getLogger("fabric.store")
RETENTION_HOLD_PREFIX = "spark."  # consumer groups whose committed offsets hold retention

QUEUES_DIR = "queues"
CLOSE_SNAPSHOT_RECORDS = 1000  # a clean close snapshots producer state this far behind its log
LOCK_FILE = ".lock"
DELETED_PREFIX = ".deleted-"
ORPHAN_PREFIX = ".orphan-"


class Store:
    """The queues of one node."""

    def __init__(
        self,
        data_dir: Path,
        *,
        defaults: QueueSettings,
        now_ms: int,
        tail_cache_bytes: int = TAIL_CACHE_BYTES,
        at_rest: AtRestKeys | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.defaults = defaults
        self.tail_cache_bytes = tail_cache_bytes
        self.at_rest = at_rest  # the keys encrypted queues are sealed with (None: no key file configured)
        self.problems: list[str] = []  # what opening found that needs a human (orphans, bad records)
        self._queues_dir = self.data_dir / QUEUES_DIR
        try:
            self._queues_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error(exc, f"creating {self._queues_dir}") from None
        self._lock_fd = self._lock_data_dir()
        try:
            self.meta = NodeMetadata(self.data_dir)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._records: dict[str, dict[str, Any]] = {}
        self._settings: dict[str, QueueSettings] = {}
        self._expandable: set[str] = set()  # queues whose auto_partitions_max is above their partitions
        self._shrinkable: set[str] = set()  # queues with auto_partitions_max that may shrink (idle_ms set)
        self._live: dict[str, int] = {}  # queues shrinking: the partitions that still take writes
        self._logs: dict[str, list[PartitionLog]] = {}
        self._producer_states: dict[tuple[str, int], ProducerStates] = {}
        self._producer_dirty: set[tuple[str, int]] = set()
        self._grown = 0  # queues created and partitions added since open (see ``shape``)
        self._deleted = 0
        # per partition, at its last snapshot: (the active segment's base offset, the end it covered)
        self._producer_saved: dict[tuple[str, int], tuple[int, int]] = {}
        self.producer_ids = ProducerIds(self.data_dir)
        try:
            records = self.meta.queues()
            self._finish_deletions(records)
            for name, record in sorted(records.items()):
                self._open_queue(name, record, now_ms)
            self._note_orphans()
        except BaseException:
            self.close(clean=False)
            raise

    # ------------------------------------------------------------------ open

    def _lock_data_dir(self) -> int:
        """Hold an exclusive lock on the data directory: two stores on one directory would corrupt it."""
        path = self.data_dir / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise storage_error(exc, f"opening {path}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StorageError(f"data directory {self.data_dir} is in use by another store") from None
        return fd

    def _finish_deletions(self, records: dict[str, dict[str, Any]]) -> None:
        for entry in os.scandir(self._queues_dir):
            if not entry.name.startswith(DELETED_PREFIX):
                continue
            name = entry.name[len(DELETED_PREFIX) :].rsplit("-", 1)[0]
            if name in records and not (self._queues_dir / name).exists():
                self.meta.delete_queue(name)
                del records[name]
            remove_tree(self._queues_dir / entry.name)

    def _note_orphans(self) -> None:
        for entry in os.scandir(self._queues_dir):
            if entry.is_dir() and not entry.name.startswith(".") and entry.name not in self._logs:
                problem = f"directory {entry.path} has no queue record; left untouched"
                self.problems.append(problem)
                log.warning(problem)

    def _open_queue(self, name: str, record: dict[str, Any], now_ms: int) -> None:
        try:
            settings = QueueSettings.from_dict(record["settings"], base=self.defaults)  # defaults fill keys added since
        except FabricError as exc:
            problem = f"queue {name!r} has unusable settings ({exc.message}); not opened"
            self.problems.append(problem)
            log.error(problem)
            return
        logs: list[PartitionLog] = []
        at_rest = self.at_rest if settings.encrypt else None
        try:
            for p in range(settings.log_partitions):
                directory = self._queues_dir / name / str(p)
                logs.append(
                    PartitionLog.open(
                        directory, settings, now_ms=now_ms, tail_cache_bytes=self.tail_cache_bytes, at_rest=at_rest
                    )
                )
        except BaseException:
            for opened in logs:
                opened.close(clean=False)
            raise
        if settings.encrypt and self.at_rest is None:
            for plog in logs:
                plog.refuse(
                    f"queue {name!r} is encrypted at rest and this node has no [security] at_rest_key_file: "
                    "not served; configure the key file that holds its keys and restart the node"
                )
        for p, plog in enumerate(logs):
            if plog.refused:
                self.problems.append(plog.refused)
                log.error("queue %r partition %d: %s", name, p, plog.refused)
        self._records[name] = record
        self._set_settings(name, settings)
        self._logs[name] = logs
        live = record.get("live_partitions")
        if type(live) is int and 1 <= live < settings.partitions:
            self._live[name] = live
        self._remove_retired_dirs(name, settings.log_partitions)

    def _remove_retired_dirs(self, name: str, partitions: int) -> None:
        """Partition directories numbered at or past the queue's count: partitions that shrinking
        removed (their record was written first, then the crash), or empty logs of a growth whose
        record was never written. Nothing reads them; a later growth must start those empty."""
        try:
            entries = list(os.scandir(self._queues_dir / name))
        except OSError:
            return
        for entry in entries:
            if entry.name.isdigit() and int(entry.name) >= partitions and entry.is_dir(follow_symlinks=False):
                log.info("queue %r: removing the directory of retired partition %s", name, entry.name)
                remove_tree(Path(entry.path))

    # ---------------------------------------------------------------- queues

    def create_queue(self, name: str, settings: QueueSettings, now_ms: int) -> dict[str, Any]:
        """Create a queue with ``settings``; return its record. ``QueueExists`` if present."""
        if not isinstance(name, str) or not QUEUE_NAME.match(name):
            raise BadParameter(f"invalid queue name {name!r}")
        if name in self._logs or self.meta.has_queue(name):
            raise QueueExists(f"queue {name!r} already exists")
        problem = settings.problem()
        if problem:
            raise BadParameter(f"queue settings: {problem[0]!r} {problem[1]}")
        if settings.encrypt and self.at_rest is None:
            raise BadParameter(
                f"queue {name!r}: 'encrypt' needs an at-rest key file on the node, and it has none: create one "
                "with `fabric auth at-rest-key init FILE` and set [security] at_rest_key_file = FILE in its config"
            )
        live = self._queues_dir / name
        if live.exists():  # never adopt data nobody created through this store
            aside = self._queues_dir / f"{ORPHAN_PREFIX}{name}-{uuid.uuid4().hex}"
            os.replace(live, aside)
            self.problems.append(f"directory {live} had no queue record; moved to {aside.name}")
        record = {"settings": settings.to_dict(), "created_ms": now_ms, "id": uuid.uuid4().hex}
        self.meta.put_queue(name, record)
        try:
            self._open_queue(name, record, now_ms)
            fsync_dir(self._queues_dir)
        except BaseException:
            self.meta.delete_queue(name)
            remove_tree(live)
            raise
        self._grown += 1
        return record

    def add_partitions(self, name: str, partitions: int, now_ms: int) -> QueueSettings:
        """Grow queue ``name`` to ``partitions`` partitions: new empty logs numbered after the
        existing ones, which keep their numbers and data. The same count again is a no-op (a
        cluster node may hear it twice). Returns the queue's settings after."""
        settings = self.settings(name)
        problem = grow_problem(settings, partitions)
        if problem:
            raise BadParameter(f"queue {name!r}: {problem}")
        if partitions == settings.partitions:
            return settings
        if name in self._live:
            raise BadParameter(
                f"queue {name!r} is shrinking to {self._live[name]} partitions (docs/architecture.md "
                '"Shrinking"): partitions can be added once its retired partitions are gone'
            )
        if settings.encrypt and self.at_rest is None:
            raise BadParameter(f"queue {name!r} is encrypted at rest and this node has no at-rest key file")
        grown = dataclasses.replace(settings, partitions=partitions)
        at_rest = self.at_rest if grown.encrypt else None
        record = {**self._records[name], "settings": grown.to_dict()}
        opened: list[PartitionLog] = []
        try:
            for p in range(settings.log_partitions, grown.log_partitions):
                directory = self._queues_dir / name / str(p)
                opened.append(
                    PartitionLog.open(
                        directory, grown, now_ms=now_ms, tail_cache_bytes=self.tail_cache_bytes, at_rest=at_rest
                    )
                )
            fsync_dir(self._queues_dir / name)
            self.meta.put_queue(name, record)  # the record last: a crash before it leaves empty logs unopened
        except BaseException:
            for plog in opened:
                plog.close(clean=False)
            raise
        self._logs[name].extend(opened)
        self._grown += 1
        self._set_settings(name, grown)
        self._records[name] = record
        return grown

    def retire_partitions(self, name: str, live: int) -> None:
        """Start shrinking queue ``name`` to ``live`` partitions: the ones numbered from ``live``
        on take no new writes from now on (saved in the queue's record, so a restart keeps it).
        ``live`` must divide the count (a key on a retired partition ``p`` moves to ``p % live``,
        where ``crc32c(key) % live`` puts it). The same count again is a no-op."""
        settings = self.settings(name)
        n = settings.partitions
        if self._live.get(name) == live:
            return
        if name in self._live:
            raise BadParameter(f"queue {name!r} is already shrinking to {self._live[name]} partitions")
        if settings.priority_levels != 1 or type(live) is not int or not 1 <= live < n or n % live:
            raise BadParameter(
                f"queue {name!r}: cannot shrink {n} -> {live!r} partitions (the new count must divide the old one, "
                "and priority queues do not shrink)"
            )
        record = {**self._records[name], "live_partitions": live}
        self.meta.put_queue(name, record)
        self._records[name] = record
        self._live[name] = live

    def live_partitions(self, name: str) -> int:
        """The partitions of ``name`` that take writes: all of them unless it is shrinking."""
        live = self._live.get(name)
        return live if live is not None else self.settings(name).partitions

    def retiring(self) -> dict[str, int]:
        """The queues shrinking now, with the partition count each shrinks to."""
        return dict(self._live)

    def remove_partitions(self, name: str) -> QueueSettings:
        """Finish shrinking ``name``: its retired partitions go with their data (the caller checked
        that every group consumed them). The record is written first (the count drops), then the
        directories go; a crash between leaves directories that opening removes. Returns the
        settings after."""
        live = self._live.get(name)
        if live is None:
            raise BadParameter(f"queue {name!r} is not shrinking")
        settings = self.settings(name)
        shrunk = dataclasses.replace(settings, partitions=live)
        record = {k: v for k, v in self._records[name].items() if k != "live_partitions"}
        record["settings"] = shrunk.to_dict()
        self.meta.put_queue(name, record)
        self._records[name] = record
        del self._live[name]
        logs = self._logs[name]
        gone, self._logs[name] = logs[live:], logs[:live]
        for p, plog in enumerate(gone, start=live):
            plog.close(clean=False)
            self._producer_states.pop((name, p), None)
            self._producer_dirty.discard((name, p))
            self._producer_saved.pop((name, p), None)
        self._deleted += 1
        self._set_settings(name, shrunk)
        self._remove_retired_dirs(name, live)
        return shrunk

    def shrinkable(self) -> list[tuple[str, QueueSettings]]:
        """The queues that may shrink (``auto_partitions_max`` set, ``auto_partitions_idle_ms`` not
        0, more partitions than ``auto_partitions_min``), with their settings."""
        return [(n, self._settings[n]) for n in self._shrinkable]

    def alter_settings(self, name: str, changes: dict[str, Any]) -> QueueSettings:
        """Change settings of queue ``name`` that may change live (``fabric queue alter --set``):
        saved in its record, then applied to its partition logs. Raises BadParameter naming the
        key (one fixed at create says why), UnknownQueue. Returns the settings after."""
        settings = self.settings(name)
        problem = alter_problem(settings, changes)
        if problem:
            raise BadParameter(f"queue {name!r}: {problem}")
        altered = QueueSettings.from_dict(changes, base=settings)
        record = {**self._records[name], "settings": altered.to_dict()}
        self.meta.put_queue(name, record)
        self._records[name] = record
        self._set_settings(name, altered)
        for plog in self._logs[name]:
            plog.apply_settings(altered)
        return altered

    def delete_queue(self, name: str) -> None:
        """Delete a queue, its data and its committed offsets."""
        logs = self._logs.pop(name, None)
        if logs is None:
            raise UnknownQueue(f"queue {name!r} does not exist")
        self._deleted += 1
        for key in [k for k in self._producer_states if k[0] == name]:
            del self._producer_states[key]
            self._producer_dirty.discard(key)
            self._producer_saved.pop(key, None)
        self._records.pop(name, None)
        self._settings.pop(name, None)
        self._expandable.discard(name)
        self._shrinkable.discard(name)
        self._live.pop(name, None)
        for partition_log in logs:
            partition_log.close(clean=False)
        live = self._queues_dir / name
        doomed = self._queues_dir / f"{DELETED_PREFIX}{name}-{uuid.uuid4().hex}"
        try:
            if live.exists():
                os.replace(live, doomed)
                fsync_dir(self._queues_dir)
        except OSError as exc:
            raise storage_error(exc, f"deleting queue {name}") from None
        try:
            self.meta.delete_queue(name)
        except DiskFull:
            # A full disk: the metadata change needs space that the doomed data holds. Free it
            # first (the data is already out of the queue's place), then record the deletion.
            remove_tree(doomed)
            self.meta.delete_queue(name)
            return
        remove_tree(doomed)

    def producer_states(self, name: str, partition: int, now_ms: int) -> ProducerStates:
        """Idempotent-producer state of a partition (loaded on first use)."""
        key = (name, partition)
        states = self._producer_states.get(key)
        if states is None:
            plog = self.partition(name, partition)
            states = self._producer_states[key] = load_states(plog, now_ms)
            self._producer_saved[key] = (plog.active_base_offset, states.end_offset)  # replayed to here
        self._producer_dirty.add(key)
        return states

    def save_producer_states(self, *, closing: bool = False) -> None:
        """Snapshot the producer state of partitions written since their last snapshot whose log
        has rolled a segment since (as Kafka does): a snapshot is a cache of what the log holds
        (``load_states`` replays the log past its ``end_offset``, cuts one past the log's end,
        and rebuilds from the log start when it is unreadable), so this bounds the replay at
        start to about one segment without a file written each second for every partition
        written that second (ten thousand queues with a message each made ten thousand files).
        These snapshots are not fsynced: a stale or missing one costs a longer replay, never a
        wrong state. ``closing``: a clean close also snapshots, fsynced, the partitions with
        ``CLOSE_SNAPSHOT_RECORDS`` or more records past their snapshot, so a restart replays
        little; the rest replay a few batch headers on first use."""
        due: list[tuple[str, int, ProducerStates, int]] = []
        settled: list[tuple[str, int]] = []
        for key in self._producer_dirty:
            name, p = key
            states = self._producer_states.get(key)
            logs = self._logs.get(name)
            if states is None or logs is None or p >= len(logs):
                settled.append(key)
                continue
            base = logs[p].active_base_offset
            saved_base, saved_end = self._producer_saved.get(key, (0, 0))
            behind = states.end_offset - saved_end >= CLOSE_SNAPSHOT_RECORDS
            if (base != saved_base) if not closing else behind:
                due.append((name, p, states, base))
            elif not closing and not behind:
                # not rolled and not far behind: nothing to do until it is written again (which
                # marks it again). Kept, ten thousand partitions written once each were looked at
                # every PRODUCER_SAVE_MS for ever: ~15 ms of the node's loop each time.
                settled.append(key)
        self._producer_dirty.difference_update(settled)
        for name, p, states, base in due:
            save_states(self.partition(name, p), states, durable=closing)
            self._producer_saved[(name, p)] = (base, states.end_offset)
            self._producer_dirty.discard((name, p))

    def shape(self) -> tuple[int, int]:
        """How many times queues were created or grew, and were deleted, since the store opened:
        it moves whenever the set of partitions does (the node's heap keeper watches it)."""
        return self._grown, self._deleted

    def queue_names(self) -> list[str]:
        return sorted(self._logs)

    def _set_settings(self, name: str, settings: QueueSettings) -> None:
        self._settings[name] = settings
        if settings.auto_partitions_max > settings.partitions:
            self._expandable.add(name)
        else:
            self._expandable.discard(name)
        if (
            settings.auto_partitions_max
            and settings.auto_partitions_idle_ms
            and settings.partitions > max(1, settings.auto_partitions_min)
        ):
            self._shrinkable.add(name)
        else:
            self._shrinkable.discard(name)

    def expandable(self) -> list[tuple[str, QueueSettings]]:
        """The queues that may still grow (``auto_partitions_max`` above their partitions), with
        their settings, kept as settings change: thousands of other queues cost nothing here."""
        return [(n, self._settings[n]) for n in self._expandable]

    def has_queue(self, name: str) -> bool:
        return name in self._logs

    def settings(self, name: str) -> QueueSettings:
        try:
            return self._settings[name]
        except KeyError:
            raise UnknownQueue(f"queue {name!r} does not exist") from None

    def record(self, name: str) -> dict[str, Any]:
        try:
            return self._records[name]
        except KeyError:
            raise UnknownQueue(f"queue {name!r} does not exist") from None

    def partitions(self, name: str) -> list[PartitionLog]:
        try:
            return self._logs[name]
        except KeyError:
            raise UnknownQueue(f"queue {name!r} does not exist") from None

    def partition(self, name: str, partition: int) -> PartitionLog:
        logs = self.partitions(name)
        if type(partition) is not int or not 0 <= partition < len(logs):
            raise UnknownPartition(f"queue {name!r} has partitions 0..{len(logs) - 1}, not {partition!r}")
        return logs[partition]

    # ---------------------------------------------------------------- limits

    def usage(self, name: str) -> tuple[int, int]:
        """``(messages, bytes)`` the queue holds: offsets between log start and end, bytes on disk."""
        logs = self.partitions(name)
        return sum(p.message_count for p in logs), sum(p.size_bytes for p in logs)

    def check_capacity(self, name: str, records: int, nbytes: int) -> None:
        """Raise ``QueueFull`` if appending ``records`` messages of ``nbytes`` would pass the queue's limits."""
        settings = self.settings(name)
        if not settings.max_messages and not settings.max_bytes:
            return
        messages, size = self.usage(name)
        if settings.max_messages and messages + records > settings.max_messages:
            room = max(0, settings.max_messages - messages)
            raise QueueFull(
                f"queue {name!r} is full: max_messages {settings.max_messages}, {messages} messages stored, "
                f"room for {room}, this request has {records}"
            )
        if settings.max_bytes and size + nbytes > settings.max_bytes:
            room = max(0, settings.max_bytes - size)
            raise QueueFull(
                f"queue {name!r} is full: max_bytes {settings.max_bytes}, {size} bytes stored, "
                f"room for {room}, this request has {nbytes}"
            )

    # -------------------------------------------------------------- overview

    def describe(self, name: str) -> dict[str, Any]:
        logs = self.partitions(name)
        record = self._records[name]
        partitions = [
            {
                "partition": p,
                "log_start_offset": pl.log_start_offset,
                "next_offset": pl.next_offset,
                "messages": pl.message_count,
                "size_bytes": pl.size_bytes,
                "segments": pl.segment_count,
            }
            for p, pl in enumerate(logs)
        ]
        return {
            "name": name,
            "id": record.get("id"),
            "created_ms": record.get("created_ms"),
            "settings": self._settings[name].to_dict(),
            "partitions": partitions,
            "messages": sum(p["messages"] for p in partitions),
            "size_bytes": sum(p["size_bytes"] for p in partitions),
            "segments": sum(p["segments"] for p in partitions),
        }

    def recovery_reports(self) -> dict[tuple[str, int], RecoveryReport]:
        return {(name, p): pl.recovery for name, logs in self._logs.items() for p, pl in enumerate(logs)}

    def retention_holds(self, name: str, groups: list[str] | None = None) -> dict[int, int]:
        """Per partition, the smallest offset committed by a group named ``spark.*`` (a streaming
        query's registration, docs/spark.md): retention keeps every segment at or after it.
        ``groups``: the queue's ``spark.*`` groups when the caller knows them."""
        holds: dict[int, int] = {}
        if groups is None:
            groups = [g for g in self.meta.groups(name) if g.startswith(RETENTION_HOLD_PREFIX)]
        for group in groups:
            for p, offset in self.meta.committed(name, group).items():
                holds[p] = min(offset, holds.get(p, offset))
        return holds

    def retention_holders(self) -> dict[str, list[str]]:
        """Every queue's ``spark.*`` groups, whose commits hold retention back (one pass over the
        group tables: it reads sqlite, so a caller going slice by slice reads it once a round)."""
        return self.meta.groups_by_queue(RETENTION_HOLD_PREFIX)

    def enforce_retention(
        self, now_ms: int, names: list[str] | None = None, holders: dict[str, list[str]] | None = None
    ) -> int:
        """Apply the retention of every queue (or of ``names``, those still there), short of what a
        ``spark.*`` group still needs (``holders``: ``retention_holders()``, read now if not
        given); return the bytes deleted. A failing partition is logged and skipped."""
        deleted = 0
        if holders is None:
            holders = self.retention_holders()  # one pass, not one per queue
        chosen = self._logs.items() if names is None else ((n, self._logs[n]) for n in names if n in self._logs)
        for name, logs in chosen:
            holds = self.retention_holds(name, holders[name]) if name in holders else {}
            for p, partition_log in enumerate(logs):
                if partition_log.refused:
                    continue  # not served (logged at open): nothing is deleted either
                try:
                    deleted += partition_log.enforce_retention(now_ms, keep_from=holds.get(p))
                except StorageError as exc:
                    log.error("retention of %s/%d failed: %s", name, p, exc)
        return deleted

    def close(self, clean: bool = True) -> None:
        """Close every partition (``clean``: fsync and write clean-shutdown markers) and the metadata."""
        errors: list[BaseException] = []
        if clean:
            try:
                self.save_producer_states(closing=True)
            except Exception as exc:
                errors.append(exc)
        for logs in self._logs.values():
            for partition_log in logs:
                try:
                    partition_log.close(clean=clean)
                except Exception as exc:  # close the others regardless
                    errors.append(exc)
        self._logs.clear()
        self.meta.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1
        if errors:
            raise errors[0]
