"""The cluster controller: one elected process that places queues and elects partition leaders.

Theory of operation
-------------------
Election. Every candidate's ``step`` tries, at most every ``retry_ms``, to create
``/fabric/controller`` under a fresh lease with a txn guarded by ``Compare.absent``. The winner's
epoch is that key's create_revision; it keeps the lease alive every ttl/3. Losers stay standby
and try again once the key has vanished (the winner's lease lapsed or was revoked). The
election itself is ``fabric.cluster.election.Election``, shared with the federation manager.

Fencing. Every write the controller makes is one txn that checks
``Compare.created_at(CONTROLLER_KEY, epoch)``: a deposed controller (paused, cut off, its lease
gone) cannot write, whatever it believes. Partition writes also check
``Compare.modified_at(key, mod_revision read)``, so a leader's concurrent ISR change is never
overwritten: the controller re-reads and decides again on its next step. When a txn fails
because the controller key is not ours any more, or keepalive says the lease is gone, the
controller steps down at once and campaigns again like any standby.

Reconciling (a ``step`` while controller). A whole pass when its watch on ``/fabric/`` saw a
node come or go, a replica move or the controller key change, when the watch was lost, or every
``RESYNC_MS``: it reads ``/fabric/nodes/`` (live nodes and their node epochs) and
``/fabric/partitions/`` and, per partition, ``plan``s one change. When only partition records
were written (a queue created, an ISR changed), just those are planned: creating thousands of
queues does not read every record after each one.

* A node is *fresh* for a record when it registered before the record's last write (node epoch <
  mod_revision): a node that restarted since then is named there by an older incarnation.
* Leader fresh: drop every non-fresh member from the ISR (the leader stays). No change else.
* Leader dead, restarted or absent: ``elect`` among fresh nodes; if that leaves the partition
  offline, among every live node (an ISR member that restarted is still the best copy there
  is); if still offline and the queue's settings say ``unclean_leader_election``, any live
  replica. An offline partition (leader None) keeps its ISR and comes back when a member does.

``elect`` is pure: the first replica in ``replicas`` order that is in the ISR and live, with
``leader_epoch`` and ``partition_epoch`` bumped and the ISR cut to its live members.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Set
from typing import Any

from fabric.cluster.election import Election
from fabric.cluster.keys import (
    CONTROLLER_KEY,
    MOVES_PREFIX,
    NODES_PREFIX,
    PARTITIONS_PREFIX,
    ROOT,
    controller_value,
    group_states_prefix,
    groups_prefix,
    parse_move_key,
    parse_node,
    parse_partition_key,
    partition_key,
    partitions_prefix,
    queue_key,
)
from fabric.cluster.meta import (
    Compare,
    Delete,
    Get,
    KeyValue,
    MetaStore,
    MetaUnavailable,
    Put,
    TxnResult,
    Watch,
    cancel_quietly,
)
from fabric.cluster.moves import Move, step_move
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.placement import place
from fabric.errors import BadParameter, NotLeader, QueueExists, UnknownQueue
from fabric.settings import QueueSettings, alter_problem, grow_problem

log = logging.getLogger(__name__)
# the whole pass's period with no event to cause it: a safety net behind the watch, and a pass reads
# every partition record (10,000 queues: ~20,000 keys through etcd's JSON gateway, most of etcd's
# CPU on an idle cluster when it ran every 30 s)
RESYNC_MS = 300_000

UNCLEAN_SETTING = "unclean_leader_election"  # queue setting that allows electing a non-ISR replica


def elect(record: PartitionRecord, live: Set[str], *, unclean: bool = False) -> PartitionRecord | None:
    """The record after electing a leader among ``live``; None when nothing changes (the leader
    is live, or the partition is offline and stays offline).

    The new leader is the first replica in ``replicas`` order that is in the ISR and live; with
    ``unclean`` and no such replica, the first live replica. Both epochs are bumped, the ISR
    becomes its live members (just the leader after an unclean election). Without any electable
    replica the partition goes offline: leader None, epochs bumped, ISR kept as it was so that
    whichever member comes back first can lead again."""
    if record.leader is not None and record.leader in live:
        return None
    leader = next((r for r in record.replicas if r in record.isr and r in live), None)
    if leader is not None:
        isr = tuple(r for r in record.isr if r in live)
    elif unclean:
        leader = next((r for r in record.replicas if r in live), None)
        isr = (leader,) if leader is not None else record.isr
    else:
        isr = record.isr
    if leader is None and record.leader is None:
        return None
    return PartitionRecord(
        replicas=record.replicas,
        leader=leader,
        leader_epoch=record.leader_epoch + 1,
        isr=isr,
        partition_epoch=record.partition_epoch + 1,
    )


def plan(
    record: PartitionRecord, mod_revision: int, live: Mapping[str, int], *, unclean: bool = False
) -> PartitionRecord | None:
    """The one change the controller makes to a partition (None: none). ``live`` maps each
    registered node to its node epoch; ``mod_revision`` is the record's (see module doc)."""
    fresh = {n for n, epoch in live.items() if epoch < mod_revision}
    if record.leader is not None and record.leader in fresh:
        isr = tuple(n for n in record.isr if n in fresh)
        if isr == record.isr:
            return None
        return dataclasses.replace(record, isr=isr, partition_epoch=record.partition_epoch + 1)
    offline = elect(record, fresh)
    if offline is not None and offline.leader is not None:
        return offline
    vacant = dataclasses.replace(record, leader=None)
    for dirty in (False, True) if unclean else (False,):
        again = elect(vacant, set(live), unclean=dirty)
        if again is not None and again.leader is not None:
            return again
    return offline


class Controller:
    """One controller candidate. Call ``step(now_ms)`` periodically (every few hundred ms)."""

    def __init__(
        self, meta: MetaStore, name: str, endpoint: str, *, lease_ttl_s: int = 10, retry_ms: int | None = None
    ) -> None:
        self._meta = meta
        self.name = name
        self.endpoint = endpoint
        self._election = Election(
            meta,
            CONTROLLER_KEY,
            controller_value(name, endpoint),
            role="controller",
            name=name,
            log=log,
            lease_ttl_s=lease_ttl_s,
            retry_ms=retry_ms,
            on_won=self._on_won,
            on_step_down=self._drop_watch,
        )
        self._unclean: dict[str, bool] = {}
        # a whole pass at least this often even with no event (the watch brings every change; this
        # is the belt to its braces, and a pass reads every partition record)
        self._resync_ms = max(RESYNC_MS, lease_ttl_s * 1000)
        self._resync_due = 0
        self._watch: Watch | None = None  # changes since the last full read

    @property
    def is_controller(self) -> bool:
        return self._election.epoch > 0

    @property
    def epoch(self) -> int:
        """The controller epoch (create_revision of ``/fabric/controller``); 0 when standby."""
        return self._election.epoch

    @property
    def _lease(self) -> int:
        """Our lease, held while controller or while a campaign's outcome is unknown."""
        return self._election.lease

    def step(self, now_ms: int) -> list[tuple[str, int, PartitionRecord]]:
        """Keep the lease, campaign if standby, reconcile if controller. Returns the partition
        records this step wrote. Never raises MetaUnavailable: it tries again next step."""
        try:
            self._election.step(now_ms)
            if self.epoch:
                what = self._changes(now_ms)
                if what is True:
                    return self._reconcile()
                if what:
                    return self._reconcile_some(what)
        except MetaUnavailable as e:
            log.debug("controller %s: metadata unavailable: %s", self.name, e)
            self._drop_watch()
        return []

    def create_queue(
        self,
        queue: str,
        settings_json: Mapping[str, Any] | str | bytes,
        partitions: int,
        rf: int,
        *,
        leader_hint: str | None = None,
    ) -> list[PartitionRecord]:
        """Place the queue on the live nodes and write its queue key and every partition record
        in one fenced txn (leader = first replica, ISR = all replicas, epochs 0). Raises
        NotLeader (not the controller), QueueExists, NotEnoughReplicas, BadParameter,
        MetaUnavailable (outcome unknown: retrying may answer QueueExists)."""
        self._require_controller()
        if not queue or "/" in queue:
            raise BadParameter(f"queue name {queue!r} is not valid")
        settings = json.loads(settings_json) if isinstance(settings_json, str | bytes) else dict(settings_json)
        nodes = [n for n in (parse_node(kv) for kv in self._meta.get_prefix(NODES_PREFIX)[0]) if n is not None]
        replicas = place(queue, partitions, [n.name for n in nodes], rf, {n.name: n.zone for n in nodes})
        if leader_hint is not None:  # first replica = first leader
            replicas = [(leader_hint, *(x for x in r if x != leader_hint)) if leader_hint in r else r for r in replicas]
        records = [PartitionRecord(r, r[0], 0, r, 0) for r in replicas]
        value = json.dumps({"settings": settings, "partitions": partitions, "replication_factor": rf}, sort_keys=True)
        puts = [Put(partition_key(queue, p), rec.to_json()) for p, rec in enumerate(records)]
        result = self._fenced_txn([Compare.absent(queue_key(queue))], [Put(queue_key(queue), value.encode()), *puts])
        if not result.succeeded:
            raise QueueExists(f"queue {queue!r} exists")
        self._unclean[queue] = bool(settings.get(UNCLEAN_SETTING, False))
        return records

    def alter_queue(self, queue: str, partitions: int) -> list[PartitionRecord]:
        """Grow ``queue`` to ``partitions`` partitions: the new ones are placed like a created
        queue's (rendezvous per partition, so the existing ones stay where they are) and written
        with the queue key's new count in one fenced txn that also checks the queue key has not
        changed since it was read. Returns the new partitions' records (none: it already had that
        many). Raises NotLeader, UnknownQueue, BadParameter (it would shrink, a direct or priority
        queue), NotEnoughReplicas, MetaUnavailable (also when the queue changed meanwhile: retry)."""
        self._require_controller()
        kv = self._meta.get(queue_key(queue))
        if kv is None:
            raise UnknownQueue(f"queue {queue!r} does not exist")
        value = json.loads(kv.value)
        settings = dict(value["settings"])
        problem = grow_problem(QueueSettings.from_dict(settings, where=f"queue {queue!r} settings"), partitions)
        if problem:
            raise BadParameter(f"queue {queue!r}: {problem}")
        old = int(value["partitions"])
        if partitions <= old:
            return []
        rf = int(value["replication_factor"])
        nodes = [n for n in (parse_node(kv) for kv in self._meta.get_prefix(NODES_PREFIX)[0]) if n is not None]
        replicas = place(queue, partitions, [n.name for n in nodes], rf, {n.name: n.zone for n in nodes})[old:]
        records = [PartitionRecord(r, r[0], 0, r, 0) for r in replicas]
        settings["partitions"] = partitions
        grown = json.dumps({**value, "settings": settings, "partitions": partitions}, sort_keys=True)
        puts = [Put(partition_key(queue, old + i), rec.to_json()) for i, rec in enumerate(records)]
        result = self._fenced_txn(
            [Compare.modified_at(queue_key(queue), kv.mod_revision)], [Put(queue_key(queue), grown.encode()), *puts]
        )
        if not result.succeeded:
            raise MetaUnavailable(f"queue {queue!r} changed while its partitions were being added; retry")
        return records

    def alter_settings(self, queue: str, changes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Change settings of ``queue`` that may change live (``fabric queue alter --set``): checked
        by ``alter_problem`` against the queue key's settings and written to it in one fenced txn
        that checks the key has not changed since it was read; every node holding the queue applies
        them from its watch. Returns every setting before and after. Raises NotLeader, UnknownQueue,
        BadParameter (naming the key), MetaUnavailable (also when the queue changed meanwhile)."""
        self._require_controller()
        kv = self._meta.get(queue_key(queue))
        if kv is None:
            raise UnknownQueue(f"queue {queue!r} does not exist")
        value = json.loads(kv.value)
        settings = QueueSettings.from_dict(value["settings"], where=f"queue {queue!r} settings")
        problem = alter_problem(settings, changes)
        if problem:
            raise BadParameter(f"queue {queue!r}: {problem}")
        after = {**value["settings"], **changes}
        altered = json.dumps({**value, "settings": after}, sort_keys=True)
        result = self._fenced_txn(
            [Compare.modified_at(queue_key(queue), kv.mod_revision)], [Put(queue_key(queue), altered.encode())]
        )
        if not result.succeeded:
            raise MetaUnavailable(f"queue {queue!r} changed while its settings were being altered; retry")
        return dict(value["settings"]), after

    def delete_queue(self, queue: str) -> None:
        """Delete the queue key and its partition records in one fenced txn. Raises NotLeader,
        UnknownQueue, MetaUnavailable."""
        self._require_controller()
        result = self._fenced_txn(
            [Compare(queue_key(queue), "create_revision", ">", 0)],
            [
                Delete(queue_key(queue)),
                Delete(partitions_prefix(queue), prefix=True),
                Delete(groups_prefix(queue), prefix=True),
                Delete(group_states_prefix(queue), prefix=True),
            ],
        )
        if not result.succeeded:
            raise UnknownQueue(f"queue {queue!r} does not exist")
        self._unclean.pop(queue, None)

    # --- internals ----------------------------------------------------------------------------

    def _on_won(self) -> None:
        self._unclean.clear()

    def _require_controller(self) -> None:
        if not self.epoch:
            raise NotLeader(f"{self.name} is not the controller")

    def _fence(self, key: str, mod_revision: int) -> list[Compare]:
        """The compares guarding a write of ``key`` read at ``mod_revision``."""
        return [self._election.fence(), Compare.modified_at(key, mod_revision)]

    def _fenced_txn(self, compares: list[Compare], ops: list[Put | Delete]) -> TxnResult:
        """A write guarded by our epoch; steps down (and raises NotLeader) if it is not ours."""
        result = self._election.fenced_txn(compares, ops)
        if not result.succeeded:
            self._require_controller()
        return result

    def _changes(self, now_ms: int) -> bool | list[KeyValue]:
        """What to reconcile: everything (True) when a node came or went, a replica move or the
        controller key changed, the watch is lost or ``resync_ms`` passed; else the partition
        records written since the last look (a queue created, an ISR changed), which are all a
        change of theirs can need. With thousands of partitions, reading all of them after every
        create would make creating them quadratic."""
        if self._watch is None or now_ms >= self._resync_due:
            self._drop_watch()
            self._resync_due = now_ms + self._resync_ms
            return True
        try:
            events = self._watch.poll(0)
        except MetaUnavailable:  # WatchCompacted too
            self._drop_watch()
            return True
        written: dict[str, KeyValue] = {}
        for event in events:
            key = event.kv.key
            if key.startswith((NODES_PREFIX, MOVES_PREFIX)) or key == CONTROLLER_KEY:
                return True
            if event.type == "put" and parse_partition_key(key) is not None:
                written[key] = event.kv  # the newest write of each
        if written and self._meta.get_prefix(MOVES_PREFIX)[0]:
            return True  # moves under way step on their partitions' records: the whole pass
        return list(written.values())

    def _drop_watch(self) -> None:
        cancel_quietly(self._watch)
        self._watch = None

    def _reconcile_some(self, kvs: list[KeyValue]) -> list[tuple[str, int, PartitionRecord]]:
        """Plan the partitions whose records were just written (the watch stays)."""
        live = {n.name: n.epoch for n in (parse_node(kv) for kv in self._meta.get_prefix(NODES_PREFIX)[0]) if n}
        written: list[tuple[str, int, PartitionRecord]] = []
        for kv in kvs:
            change = self._plan_one(kv, live)
            if change is None:
                continue
            epoch = self.epoch
            result = self._meta.txn(
                self._fence(kv.key, kv.mod_revision), [Put(kv.key, change[2].to_json())], [Get(CONTROLLER_KEY)]
            )
            if result.succeeded:
                written.append(change)
            else:
                self._election.check_still(result, epoch)
                if not self.epoch:
                    break
        return written

    def _reconcile(self) -> list[tuple[str, int, PartitionRecord]]:
        self._drop_watch()
        node_kvs, revision = self._meta.get_prefix(NODES_PREFIX)
        self._watch = self._meta.watch(ROOT, revision + 1)  # whatever happens from here on: next step
        nodes = [n for n in (parse_node(kv) for kv in node_kvs) if n is not None]
        live = {n.name: n.epoch for n in nodes}
        written: list[tuple[str, int, PartitionRecord]] = []
        partition_kvs = self._meta.get_prefix(PARTITIONS_PREFIX)[0]
        for kv in partition_kvs:
            change = self._plan_one(kv, live)
            if change is None:
                continue
            record = change[2]
            epoch = self.epoch
            result = self._meta.txn(
                self._fence(kv.key, kv.mod_revision), [Put(kv.key, record.to_json())], [Get(CONTROLLER_KEY)]
            )
            if result.succeeded:
                written.append(change)
            else:
                self._election.check_still(result, epoch)
                if not self.epoch:
                    break  # deposed: not one more write
        if self.epoch and not written:  # a record written above is read again before its move steps
            written.extend(self._step_moves({kv.key: kv for kv in partition_kvs}, set(live)))
        return written

    def _step_moves(self, partitions: Mapping[str, KeyValue], live: Set[str]) -> list[tuple[str, int, PartitionRecord]]:
        """One step of every replica move under way (``fabric.cluster.moves``), each a fenced txn."""
        written: list[tuple[str, int, PartitionRecord]] = []
        for mkv in self._meta.get_prefix(MOVES_PREFIX)[0]:
            where = parse_move_key(mkv.key)
            if where is None:
                continue
            pkv = partitions.get(partition_key(*where))
            try:
                move = Move.from_json(where[0], where[1], mkv.value)
            except (ValueError, KeyError, TypeError) as e:
                log.warning("controller %s: dropping unreadable move %s: %s", self.name, mkv.key, e)
                move = None
            if move is None or pkv is None:  # unreadable, or its queue is gone
                self._fenced_txn([Compare.modified_at(mkv.key, mkv.mod_revision)], [Delete(mkv.key)])
                continue
            record = PartitionRecord.from_json(pkv.value)
            new, done = step_move(move, record, live)
            if new is None and not done:
                continue
            ops: list[Put | Delete] = [Put(pkv.key, new.to_json())] if new is not None else []
            if done:
                ops.append(Delete(mkv.key))
            result = self._meta.txn(
                [*self._fence(pkv.key, pkv.mod_revision), Compare.modified_at(mkv.key, mkv.mod_revision)],
                ops,
                [Get(CONTROLLER_KEY)],
            )
            if not result.succeeded:
                self._election.check_still(result, self.epoch)
                if not self.epoch:
                    break
                continue
            if done:
                log.info(
                    "controller %s: %s %s/%d: replicas %s",
                    self.name,
                    "cancelled the move of" if move.cancel else "moved",
                    *where,
                    ",".join(move.original if move.cancel else move.target),
                )
            if new is not None:
                written.append((where[0], where[1], new))
        return written

    def _plan_one(self, kv: KeyValue, live: Mapping[str, int]) -> tuple[str, int, PartitionRecord] | None:
        where = parse_partition_key(kv.key)
        if where is None:
            return None
        try:
            record = PartitionRecord.from_json(kv.value)
        except (ValueError, KeyError, TypeError) as e:
            log.warning("controller %s: cannot read %s: %s", self.name, kv.key, e)
            return None
        new = plan(record, kv.mod_revision, live)
        if new is not None and new.leader is None and self._queue_unclean(where[0]):
            new = plan(record, kv.mod_revision, live, unclean=True)
        return None if new is None else (where[0], where[1], new)

    def _queue_unclean(self, queue: str) -> bool:
        if queue not in self._unclean:
            kv = self._meta.get(queue_key(queue))
            settings: Any = {}
            if kv is not None:
                try:
                    settings = json.loads(kv.value).get("settings", {})
                except (ValueError, AttributeError):
                    settings = {}
            self._unclean[queue] = bool(isinstance(settings, dict) and settings.get(UNCLEAN_SETTING, False))
        return self._unclean[queue]
