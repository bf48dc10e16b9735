"""The simulation's invariants, checked after every event (see ``Checker``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fabric.cluster.controller import Controller
from fabric.cluster.keys import CONTROLLER_KEY, PARTITIONS_PREFIX, partition_key
from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.meta import KeyValue, Watch, WatchCompacted
from fabric.cluster.partition import PartitionRecord

if TYPE_CHECKING:
    from tests.cluster.sim.world import SimNode


class Violation(AssertionError):
    """An invariant broke."""


class Checker:
    """Follows every write of a partition record (its own watch on the model) and checks:

    * records are well formed: the ISR is a non-empty subset of the replicas, the leader (if
      any) is in the ISR; a new partition starts at epochs 0;
    * per partition, leader_epoch never goes back and partition_epoch goes up with every write;
      one leader per leader_epoch, ever (a *grant* is the first write of an epoch);
    * a controller write succeeds only while the writer's epoch is the controller key's;
    * a node acts as leader (its agent says is_leader) only for an epoch granted to it, after
      its current registration, and never two nodes for the same partition and epoch.
    """

    def __init__(self, etcd: MemoryEtcd) -> None:
        self.etcd = etcd
        self.seen = etcd.revision
        self.watch: Watch | None = None
        self.current: dict[str, tuple[int, PartitionRecord]] = {}  # key -> (create_revision, record)
        self.grants: dict[tuple[str, int, int], tuple[str | None, int]] = {}  # (key, cr, epoch) -> leader, rev
        self.incarnation: dict[tuple[str, int], int] = {}  # (key, mod_revision) -> create_revision
        self.writes = 0

    def poll(self) -> None:
        if not self.etcd.available:
            self.watch = None
            return
        if self.watch is None:
            self.watch = self.etcd.watch(PARTITIONS_PREFIX, self.seen + 1)
        try:
            events = self.watch.poll(0)
        except WatchCompacted as e:
            raise AssertionError(f"harness: the checker fell behind etcd's history ({e})") from e
        self.seen = self.etcd.revision
        for ev in events:
            kv = ev.kv
            if ev.type == "delete":
                self.current.pop(kv.key, None)
                continue
            self.writes += 1
            self._check_write(kv, PartitionRecord.from_json(kv.value))

    def _check_write(self, kv: KeyValue, rec: PartitionRecord) -> None:
        where = f"{kv.key}@{kv.mod_revision}"
        if not rec.isr or not set(rec.isr) <= set(rec.replicas):
            raise Violation(f"{where}: ISR {rec.isr} not a non-empty subset of {rec.replicas}")
        if rec.leader is not None and rec.leader not in rec.isr:
            raise Violation(f"{where}: leader {rec.leader} not in its ISR {rec.isr}")
        prev = self.current.get(kv.key)
        if prev is None or prev[0] != kv.create_revision:
            if (rec.leader_epoch, rec.partition_epoch) != (0, 0):
                raise Violation(f"{where}: new partition does not start at epoch 0: {rec}")
        else:
            old = prev[1]
            if rec.leader_epoch < old.leader_epoch:
                raise Violation(f"{where}: leader_epoch went back {old.leader_epoch} -> {rec.leader_epoch}")
            if rec.partition_epoch <= old.partition_epoch:
                raise Violation(f"{where}: partition_epoch {old.partition_epoch} -> {rec.partition_epoch}")
        grant = self.grants.setdefault((kv.key, kv.create_revision, rec.leader_epoch), (rec.leader, kv.mod_revision))
        if grant[0] != rec.leader:
            raise Violation(f"{where}: leader_epoch {rec.leader_epoch} had leader {grant[0]}, now {rec.leader}")
        self.current[kv.key] = (kv.create_revision, rec)
        self.incarnation[(kv.key, kv.mod_revision)] = kv.create_revision

    def controller_wrote(self, controller: Controller) -> None:
        held = self.etcd.get(CONTROLLER_KEY)
        if held is None or held.create_revision != controller.epoch:
            now = held.create_revision if held else None
            raise Violation(f"controller {controller.name} wrote with epoch {controller.epoch}; current epoch {now}")

    def check_nodes(self, nodes: Sequence[SimNode]) -> None:
        acting: dict[tuple[str, int, int], str] = {}
        for node in nodes:
            if not node.up or node.agent is None or node.paused:  # a paused process is mid-step
                continue
            for where, rep in node.replicas.items():
                if not rep.is_leader:
                    continue
                key = partition_key(*where)
                cr = self.incarnation.get((key, rep.mod_revision))
                grant = self.grants.get((key, cr, rep.record.leader_epoch)) if cr is not None else None
                if grant is None or grant[0] != node.name:
                    raise Violation(f"{node.name} leads {where} at epoch {rep.record.leader_epoch}: granted {grant}")
                if not node.agent.registered or grant[1] <= node.agent.epoch:
                    raise Violation(
                        f"{node.name} (node epoch {node.agent.epoch}, registered {node.agent.registered}) leads"
                        f" {where} with a grant made at revision {grant[1]}"
                    )
                other = acting.setdefault((key, cr, rep.record.leader_epoch), node.name)  # type: ignore[arg-type]
                if other != node.name:
                    raise Violation(f"{where}: {other} and {node.name} both lead epoch {rep.record.leader_epoch}")

    def check_controllers(self, nodes: Sequence[SimNode]) -> None:
        held = self.etcd.get(CONTROLLER_KEY) if self.etcd.available else None
        if held is None:
            return
        current = [n.name for n in nodes if n.controller and n.controller.epoch == held.create_revision]
        if len(current) > 1:
            raise Violation(f"controllers {current} share epoch {held.create_revision}")
