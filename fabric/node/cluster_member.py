"""A cluster node's link to the metadata store: a thread beside the event loop.

Theory of operation
-------------------
etcd answers over HTTP, and a call may take a while (or time out while a member is down); the
node's event loop must never wait for it. So one thread, ``ClusterMember``, owns the etcd
client, the ``NodeAgent`` (registration under a lease, the watched map, this node's roles) and
a ``Controller`` candidate (every node stands; etcd elects one). Every ``STEP_MS`` it steps
both and runs the loop's requests (queue create and delete, ISR compare-and-swaps).

What it learns goes to the loop as events through a queue, with a wake-up on the loop's
inproc socket: role changes (with the queue's settings the first time a queue is seen), the
node map, ISR results, answers to queue requests. The loop applies them in order on its own
thread, so the store keeps its single writer. ``metadata()`` answers METADATA from a snapshot
the thread publishes (an immutable dict swapped whole; reading it needs no lock).

The cluster's ACLs and quotas live in etcd (``fabric/cluster/policy.py``): ACL and quota changes
are written there from this thread, and a poll brings every node's copy up to date ("policy"
events).

Queue creation goes through the controller: a node that is not the controller forwards the
request to the one that is (its endpoint is in ``/fabric/controller``), once.
"""

from __future__ import annotations

import json
import logging
import queue as queue_mod
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fabric.cluster.agent import NodeAgent, RoleChange
from fabric.cluster.controller import Controller
from fabric.cluster.etcd import EtcdClient
from fabric.cluster.group_offsets import GroupOffsets
from fabric.cluster.group_states import GroupStates
from fabric.cluster.keys import CONTROLLER_KEY, QUEUES_PREFIX, queue_key
from fabric.cluster.meta import Compare, Put
from fabric.cluster.namespace import Namespaced, cluster_prefix
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.policy import Policy
from fabric.cluster.replica import settle_isr_swap
from fabric.errors import FabricError, InternalError, MetaUnavailable, NotLeader, QueueExists, UnknownQueue
from fabric.federation.copier import MoveWorker
from fabric.federation.directory import CLUSTERS_PREFIX
from fabric.federation.manager import Manager, read_deletions, read_table
from fabric.federation.move_local import apply_moves
from fabric.federation.report import LOAD_PREFIX, ClusterReporter, Counters, LoadMeter
from fabric.settings import ClusterConfig, QueueSettings

log = logging.getLogger("fabric.cluster")
STEP_MS = 100
PRODUCER_IDS_KEY = "/fabric/producer-ids"  # {"next": n}: the first producer id no node has taken
# in a federation, one counter for every cluster on the etcd (un-namespaced): a queue moved between
# clusters carries its producers' ids and sequences in its batches, so an id handed out on the
# destination must never be one the source handed out
FEDERATION_PRODUCER_IDS_KEY = "/federation/producer-ids"
PRODUCERS_PREFIX = "/fabric/producers/"  # <name> -> {"producer_id", "epoch"} of named producers
PRODUCER_ID_BLOCK = 1000
CATCH_UP_S = 0.25  # after a queue create / alter: how long to follow the map for it before replying anyway


class _ControllerQueues:
    """A move's local queue operations (``fabric.federation.move_local.LocalQueues``) through the
    cluster's controller."""

    def __init__(self, controller: Controller, rf: int) -> None:
        self._controller = controller
        self._rf = rf

    def create(self, queue: str, settings: dict[str, Any]) -> None:
        qs = QueueSettings.from_dict(settings, where=f"federation queue {queue!r}")
        try:
            self._controller.create_queue(
                queue, _settings_json(qs), qs.log_partitions, qs.replication_factor or self._rf
            )
        except QueueExists:
            pass

    def delete(self, queue: str) -> None:
        self._controller.delete_queue(queue)

    def seal(self, queue: str, sealed: bool) -> None:
        self._controller.alter_settings(queue, {"sealed": sealed})


class Federation:
    """A store's part in a federation, stepped by the cluster thread: its load to ``/load/<node>``,
    its candidacy for manager and, while its node is the controller, the cluster's report and
    the queues the manager placed here: each federation queue with partitions on this cluster
    becomes a queue of the cluster with that many partitions (partition i here is the queue's
    i-th partition placed on this cluster), created like any other through the controller."""

    def __init__(
        self, meta: Namespaced, node_id: str, endpoint: str, cluster: ClusterConfig, load: Callable[[], Counters | None]
    ) -> None:
        period = cluster.federation_report_ms
        self._meta = meta
        self._node_id = node_id
        self._load = load
        self._meter = LoadMeter()
        self._period_ms = period
        self._load_due = 0
        self._name = cluster.name
        self._rf = cluster.replication_factor
        self._made: set[str] = set()  # federation queues this cluster is known to hold
        self._made_due = 0
        self.reporter = ClusterReporter(meta.inner, meta, cluster.name, period)
        ttl = max(2, cluster.node_lease_ttl_s)
        self.manager = Manager(meta.inner, f"{cluster.name}/{node_id}", endpoint, lease_ttl_s=ttl)
        # queue moves between clusters, driven while this store is the manager (its own thread)
        self.mover = MoveWorker(list(cluster.etcd), self.manager.name, lambda: self.manager.epoch)
        self.mover.start()

    def step(self, now_ms: int, controller: Controller, agent: NodeAgent) -> None:
        if now_ms >= self._load_due:
            self._load_due = now_ms + self._period_ms
            counters = self._load()
            if counters is not None:
                try:
                    self._meta.put(LOAD_PREFIX + self._node_id, self._meter.sample(now_ms, counters).to_json())
                except MetaUnavailable as e:
                    log.debug("load of %s not published: %s", self._node_id, e)
        self.reporter.step(now_ms, controller.epoch, self._node_id, agent.nodes, agent.partitions)
        self.manager.step(now_ms)
        if controller.is_controller and now_ms >= self._made_due:
            self._made_due = now_ms + self._period_ms
            try:
                self._materialise(controller)
                self._apply_moves(controller)
                self._retire(controller)
            except MetaUnavailable as e:
                log.debug("federation queues of %s not read: %s", self._name, e)

    def _materialise(self, controller: Controller) -> None:
        table = read_table(self._meta.inner)
        todo = [p for q, p in sorted(table.items()) if q not in self._made and p.partitions_on(self._name)]
        if not todo:
            return
        held = {kv.key[len(QUEUES_PREFIX) :] for kv in self._meta.get_prefix(QUEUES_PREFIX)[0]}
        for placement in todo:
            q, count = placement.queue, len(placement.partitions_on(self._name))
            if q not in held:
                try:
                    qs = QueueSettings.from_dict(
                        {**placement.settings, "partitions": count}, where=f"federation queue {q!r}"
                    )
                    controller.create_queue(q, _settings_json(qs), qs.log_partitions, qs.replication_factor or self._rf)
                    log.info("federation queue %s: %d partition(s) created on %s", q, count, self._name)
                except QueueExists:
                    pass
                except NotLeader:
                    return
                except FabricError as e:  # bad settings, not enough stores: said in the log, tried again
                    log.warning("federation queue %s: not created on %s: %s", q, self._name, e)
                    continue
            self._made.add(q)

    def _apply_moves(self, controller: Controller) -> None:
        """This cluster's copy of every moving queue made what its move's phase says."""
        try:
            for what in apply_moves(self._meta.inner, self._name, _ControllerQueues(controller, self._rf)):
                log.info("federation move on %s: %s", self._name, what)
        except NotLeader:
            pass
        except FabricError as e:  # tried again next period
            log.warning("federation moves on %s: %s", self._name, e)

    def _retire(self, controller: Controller) -> None:
        """Delete this cluster's share of each federation queue asked to be deleted (``fabric queue
        delete Q --etcd``) once the manager has dropped it from the table."""
        deletions = [d for d in read_deletions(self._meta.inner) if self._name in d.clusters]
        if not deletions:
            return
        table = read_table(self._meta.inner)
        for d in deletions:
            if d.queue in table or self._meta.get(queue_key(d.queue)) is None:
                continue
            try:
                controller.delete_queue(d.queue)
                log.info("federation queue %s: deleted on %s", d.queue, self._name)
            except UnknownQueue:
                pass
            except NotLeader:
                return
            self._made.discard(d.queue)

    def close(self) -> None:
        self.mover.stop()
        self.manager.resign()


@dataclass(frozen=True)
class Event:
    kind: str  # "role", "nodes", "leader", "isr", "group", "groupstate", "grow", "settings", "policy", "done"
    args: tuple[Any, ...]


class ClusterMember(threading.Thread):
    def __init__(
        self,
        node_id: str,
        endpoint: str,
        cluster: ClusterConfig,
        wake: Callable[[], None],
        *,
        curve: tuple[bytes, bytes, bytes] | None = None,
        load: Callable[[], Counters | None] | None = None,
    ) -> None:
        super().__init__(name=f"fabric-cluster-{node_id}", daemon=True)
        self.curve = curve  # the internal identity's CurveZMQ keys (authentication on), for _forward
        self.node_id = node_id
        self.endpoint = endpoint
        self.cluster = cluster
        self._wake = wake
        self.meta = Namespaced(EtcdClient(list(cluster.etcd)), cluster.name)
        zone = next((n.zone for n in cluster.nodes if n.node_id == node_id), None)
        self.agent = NodeAgent(self.meta, node_id, endpoint, lease_ttl_s=cluster.node_lease_ttl_s, zone=zone)
        self.controller = Controller(self.meta, node_id, endpoint, lease_ttl_s=cluster.node_lease_ttl_s)
        self.events: queue_mod.SimpleQueue[Event] = queue_mod.SimpleQueue()
        self._requests: queue_mod.SimpleQueue[Callable[[], None]] = queue_mod.SimpleQueue()
        self._halt = threading.Event()
        self._queue_settings: dict[str, dict[str, Any]] = {}
        self._snapshot: dict[str, Any] = {"cluster": True, "controller": None, "nodes": {}, "queues": {}}
        self._nodes_seen: dict[str, str] = {}
        self._ids_next = self._ids_end = 0
        self._leaders: dict[tuple[str, int], str | None] = {}
        self._qparts: dict[str, dict[int, dict[str, Any]]] = {}  # the snapshot's queues, per partition
        self._controller_read_at = 0.0
        self._fwd: tuple[str, Any] | None = None  # (controller endpoint, connection) for forwarded requests
        self.group_offsets = GroupOffsets(self.meta)
        self.group_states = GroupStates(self.meta)
        self.policy = Policy(self.meta)  # the cluster's ACLs and quotas (/fabric/acls, /fabric/quotas)
        # in a federation ([cluster] federation_report_ms): this store's load, the cluster's report
        # while it is the controller, and its candidacy for federation manager (docs/federation.md)
        self.federation: Federation | None = None
        if cluster.federation_report_ms and load is not None:
            self.federation = Federation(self.meta, node_id, endpoint, cluster, load)
        # ISR swaps whose outcome etcd left unknown: (queue, partition, old, new), read back each step
        self._unsettled: list[tuple[str, int, PartitionRecord, PartitionRecord]] = []

    # ---------------------------------------------------------------- loop side (any thread)

    def stop(self) -> None:
        self._halt.set()

    def submit(self, work: Callable[[], None]) -> None:
        self._requests.put(work)

    def _request(
        self, done: Callable[[Any], None], compute: Callable[[], Any], *, then: Callable[[], None] | None = None
    ) -> None:
        """Run ``compute`` on the cluster thread, then ``then`` if it returned; ``done`` (on the
        loop) gets what it returned or the error it raised: a FabricError as it is, anything else
        as an InternalError (logged). Every request gets an answer, never a client's timeout."""

        def work() -> None:
            try:
                result = compute()
            except Exception as exc:
                result = _as_error(exc)
            else:
                if then is not None:
                    then()
            self._emit(Event("done", (done, result)))

        self.submit(work)

    def metadata(self, queues: list[str] | None) -> dict[str, Any]:
        snap = self._snapshot
        if queues is None:
            return snap
        held = snap["queues"]
        return {**snap, "queues": {q: held[q] for q in queues if q in held}}

    def create_queue(
        self,
        name: str,
        settings: QueueSettings,
        done: Callable[[Any], None],
        *,
        forwarded: bool,
        leader_hint: str | None = None,
    ) -> None:
        """Create ``name`` through the controller; ``done`` gets the records or a FabricError."""
        rf = settings.replication_factor or self.cluster.replication_factor
        settings_json = _settings_json(settings)

        def compute() -> Any:
            if self.controller.is_controller:
                records = self.controller.create_queue(
                    name, settings_json, settings.log_partitions, rf, leader_hint=leader_hint
                )
                return {
                    "name": name,
                    "partitions": settings.partitions,
                    "settings": settings_json,
                    "placement": [_record_json(p, r) for p, r in enumerate(records)],
                }
            if forwarded:
                raise NotLeader(f"{self.node_id} is not the controller (any more); retry")
            return self._forward("CREATE_QUEUE", {"name": name, "settings": settings_json, "leader_hint": leader_hint})

        self._request(done, compute, then=lambda: self._catch_up(name, settings.log_partitions))

    def alter_queue(self, name: str, partitions: int, done: Callable[[Any], None], *, forwarded: bool) -> None:
        """Add partitions to ``name`` through the controller; ``done`` gets the reply or a FabricError."""

        def compute() -> Any:
            if self.controller.is_controller:
                records = self.controller.alter_queue(name, partitions)
                first = partitions - len(records)
                return {
                    "name": name,
                    "partitions": partitions,
                    "added": len(records),
                    "placement": [_record_json(first + i, r) for i, r in enumerate(records)],
                }
            if forwarded:
                raise NotLeader(f"{self.node_id} is not the controller (any more); retry")
            return self._forward("ALTER_QUEUE", {"name": name, "partitions": partitions})

        self._request(done, compute, then=lambda: self._catch_up(name, partitions))

    def alter_settings(
        self, name: str, changes: dict[str, Any], done: Callable[[Any], None], *, forwarded: bool
    ) -> None:
        """Change live settings of ``name`` through the controller; ``done`` gets ``{"name",
        "settings": every setting after, "changed": {key: [old, new]}}`` or a FabricError."""

        def compute() -> Any:
            if self.controller.is_controller:
                before, after = self.controller.alter_settings(name, changes)
                changed = {k: [before.get(k), after[k]] for k in sorted(changes) if before.get(k) != after[k]}
                return {"name": name, "settings": after, "changed": changed}
            if forwarded:
                raise NotLeader(f"{self.node_id} is not the controller (any more); retry")
            return self._forward("ALTER_QUEUE", {"name": name, "settings": changes})

        self._request(done, compute)

    def delete_queue(self, name: str, done: Callable[[Any], None], *, forwarded: bool) -> None:
        def compute() -> Any:
            if self.controller.is_controller:
                self.controller.delete_queue(name)
                return {"deleted": True}
            if forwarded:
                raise NotLeader(f"{self.node_id} is not the controller (any more); retry")
            return self._forward("DELETE_QUEUE", {"name": name})

        self._request(done, compute)

    def cluster_status(self, done: Callable[[Any], None]) -> None:
        """CLUSTER_STATUS: what ``fabric cluster status`` shows, read from etcd by this node's
        client (the configured nodes and routers that are not registered listed as not live)."""
        from fabric.cluster.status import status_from

        nodes = [n.node_id for n in self.cluster.nodes]
        routers = [r.router_id for r in self.cluster.routers]
        self._request(done, lambda: status_from(self.meta, self.cluster.name, nodes, routers))

    def queue_partitions(self, name: str, done: Callable[[Any], None]) -> None:
        """How many partitions etcd gives queue ``name``? ``done`` gets the count (0: no such
        queue), or None when etcd did not answer. When the queue is there, the map is followed at
        once, so the node learns it without waiting for the next step."""

        def work() -> None:
            partitions: int | None
            try:
                kv = self.meta.get(queue_key(name))
                partitions = 0 if kv is None else int(json.loads(kv.value)["partitions"])
                if partitions:
                    self._publish(self.agent.step(time.time_ns() // 1_000_000))
            except Exception as exc:
                if not isinstance(exc, FabricError):
                    log.exception("looking up queue %r failed", name)
                partitions = None
            self._emit(Event("done", (done, partitions)))

        self.submit(work)

    def group_committed(self, queue: str, group: str, offsets: dict[int, int]) -> None:
        """A commit this node took (loop thread): shared with the other nodes within ~1 s."""
        self.group_offsets.note(queue, group, offsets)

    def group_checkpointed(self, queue: str, group: str, state: dict[str, Any]) -> None:
        """A queue group's checkpoint this node (its coordinator) took, loop thread: shared with
        the other nodes within ~1 s, so a new coordinator keeps receive counts and settled ranges."""
        self.group_states.note(queue, group, state)

    def init_producer(self, name: str | None, done: Callable[[Any], None]) -> None:
        """INIT_PRODUCER in a cluster: producer ids unique across the cluster (blocks of ids taken
        from etcd), a named producer's id and epoch kept in etcd so that a restart bumps the
        epoch (and fences the old instance) whichever node it connects to."""

        self._request(done, lambda: self._allocate_producer(name))

    def _fresh_producer_id(self) -> int:
        if self._ids_next >= self._ids_end:
            # the cluster's own counter (namespaced) and, in a federation, the federation's: a block
            # above both and above every federated cluster's own counter (ids any of them handed
            # out before it joined stay below), the two moved past it in one txn
            keys = [self.meta.prefix + PRODUCER_IDS_KEY]
            others: list[str] = []
            root = self.meta.inner
            if self.federation is not None:
                keys.append(FEDERATION_PRODUCER_IDS_KEY)
                names = [kv.key[len(CLUSTERS_PREFIX) :] for kv in root.get_prefix(CLUSTERS_PREFIX)[0]]
                others = [f"{cluster_prefix(n)}{PRODUCER_IDS_KEY}" for n in names]
            for _ in range(20):
                kvs = [root.get(k) for k in keys]
                seen = [*kvs, *(root.get(k) for k in others)]
                start = max((int(json.loads(kv.value)["next"]) for kv in seen if kv is not None), default=0)
                value = json.dumps({"next": start + PRODUCER_ID_BLOCK}).encode()
                conds = [
                    Compare.modified_at(k, kv.mod_revision) if kv else Compare.absent(k)
                    for k, kv in zip(keys, kvs, strict=True)
                ]
                if root.txn(conds, [Put(k, value) for k in keys]).succeeded:
                    self._ids_next, self._ids_end = start, start + PRODUCER_ID_BLOCK
                    break
            else:
                raise MetaUnavailable("could not reserve producer ids (etcd busy); retry")
        pid = self._ids_next
        self._ids_next += 1
        return pid

    def _allocate_producer(self, name: str | None) -> dict[str, int]:
        if name is None:
            return {"producer_id": self._fresh_producer_id(), "epoch": 0}
        key = PRODUCERS_PREFIX + name
        for _ in range(20):
            kv = self.meta.get(key)
            if kv is None:
                grant = {"producer_id": self._fresh_producer_id(), "epoch": 0}
                cond = Compare.absent(key)
            else:
                old = json.loads(kv.value)
                grant = {"producer_id": old["producer_id"], "epoch": old["epoch"] + 1}
                if grant["epoch"] > 32767:
                    grant = {"producer_id": self._fresh_producer_id(), "epoch": 0}
                cond = Compare.modified_at(key, kv.mod_revision)
            if self.meta.txn([cond], [Put(key, json.dumps(grant).encode())]).succeeded:
                return grant
        raise MetaUnavailable(f"could not register producer {name!r} (etcd busy); retry")

    def change_acl(self, rule: dict[str, str], add: bool, done: Callable[[Any], None]) -> None:
        """ACL_ADD / ACL_REMOVE in a cluster: written to etcd (CAS), then the rules in force on this
        node at once (a "policy" event before ``done``); the other nodes within POLL_MS."""

        def compute() -> Any:
            rules, changed = self.policy.change_acl(rule, add)
            self._emit(Event("policy", (rules, None)))
            return {"changed": changed, "rules": len(rules)}

        self._request(done, compute)

    def set_quota(self, quota: dict[str, Any], done: Callable[[Any], None]) -> None:
        """QUOTA_SET in a cluster: written to etcd (CAS), in force here at once, elsewhere soon."""

        def compute() -> Any:
            self._emit(Event("policy", (None, self.policy.set_quota(quota))))
            return {"quota": quota}

        self._request(done, compute)

    def propose_isr(self, queue: str, p: int, old: PartitionRecord, new: PartitionRecord) -> None:
        def work() -> None:
            try:
                ok = self.agent.cas_partition(queue, p, old, new)
            except Exception as exc:  # MetaUnavailable, or anything else: the leader must hear
                # the swap may or may not have gone in: the leader keeps counting the proposed
                # members (its high watermark waits for them) until a read of the store settles it
                if not isinstance(exc, MetaUnavailable):
                    log.exception("ISR swap of %s/%d failed; reading the record back", queue, p)
                self._unsettled.append((queue, p, old, new))
                return
            current = self.agent.partitions.get((queue, p), old) if not ok else new
            self._emit(Event("isr", (queue, p, current, ok)))

        self.submit(work)

    def settle_isr_swaps(self) -> None:
        """Read back the ISR swaps whose outcome was unknown, and tell the leader. Reporting one as
        failed without reading (as this once did) left the proposal pending in the leader for
        good when etcd had lost it: a follower back from a restart never rejoined the ISR."""
        while self._unsettled:
            queue, p, old, new = self._unsettled[0]
            try:
                stored = self.agent.read_partition(queue, p)
            except MetaUnavailable:
                return  # still out: the next step tries again
            self._unsettled.pop(0)
            self._emit(Event("isr", (queue, p, *settle_isr_swap(old, new, stored))))

    # ---------------------------------------------------------------- the thread

    def run(self) -> None:
        while not self._halt.is_set():
            now = time.time_ns() // 1_000_000
            try:
                changes = self.agent.step(now)
                self.controller.step(now)
                if self.federation is not None:
                    self.federation.step(now, self.controller, self.agent)
                self._publish(changes)
                self.settle_isr_swaps()
                for update in self.group_offsets.step(now):
                    self._emit(Event("group", update))
                for state in self.group_states.step(now):
                    self._emit(Event("groupstate", state))
                rules, quotas = self.policy.poll(now)
                if rules is not None or quotas is not None:
                    self._emit(Event("policy", (rules, quotas)))
            except Exception:  # keep the node's link alive through any bug in one step
                log.exception("cluster step failed")
            deadline = time.monotonic() + STEP_MS / 1000
            while True:
                try:
                    work = self._requests.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue_mod.Empty:
                    break
                try:
                    work()
                except Exception:
                    log.exception("cluster request failed")
        if self.federation is not None:
            self.federation.close()
        if self._fwd is not None:
            self._fwd[1].close()
        self.group_offsets.close()
        self.group_states.close()
        self.agent.close()
        self.meta.close()

    def _emit(self, event: Event) -> None:
        self.events.put(event)
        self._wake()

    def _settings_changed(self) -> None:
        """Settings changed live (`fabric queue alter --set`) in the keys of queues this node has
        seen: an event ``settings`` with the changed keys for each. Partitions are not among them:
        roles and ``grow`` events carry those."""
        for queue, raw in self.agent.take_queues_put().items():
            cached = self._queue_settings.get(queue)
            if cached is None:
                continue  # first sight: the queue's roles read its key
            try:
                settings = json.loads(raw)["settings"]
            except (ValueError, KeyError, TypeError):
                log.warning("queue %r: its key does not hold settings; ignored", queue)
                continue
            old = cached["settings"]
            changed = {k: v for k, v in settings.items() if k != "partitions" and old.get(k) != v}
            if changed:
                cached["settings"] = {**old, **changed}
                self._emit(Event("settings", (queue, changed)))

    def _publish(self, changes: list[RoleChange]) -> None:
        nodes = {n.name: n.endpoint for n in self.agent.nodes.values()}
        if nodes != self._nodes_seen:
            self._nodes_seen = nodes
            self._emit(Event("nodes", (dict(nodes),)))
        self._settings_changed()
        for ch in changes:
            settings = None
            cached = self._queue_settings.get(ch.queue)
            if ch.record is not None and (cached is None or ch.partition >= int(cached.get("partitions", 0))):
                # first sight of the queue, or a partition added since (fabric queue alter)
                kv = self.meta.get(queue_key(ch.queue))
                if kv is None:
                    continue  # the queue key is written with its partitions: a race with a delete
                self._queue_settings[ch.queue] = json.loads(kv.value)
            if ch.record is not None:
                settings = self._queue_settings[ch.queue]["settings"]
            self._emit(Event("role", (ch.queue, ch.partition, ch.record, settings, ch.is_leader)))
        # the map's view for METADATA and routing, rebuilt only when the map moved: with thousands
        # of queues a rebuild every step (100 ms) would take the loop's CPU for nothing
        queues: dict[str, list[dict[str, Any]]] = self._snapshot["queues"]
        touched = self.agent.take_touched()
        if touched:
            # only the queues whose partitions changed are rebuilt: with thousands of queues a
            # whole rebuild per create would make creating them quadratic
            queues = dict(queues)
            for q, p in touched:
                rec = self.agent.record(q, p)
                parts = self._qparts.setdefault(q, {})
                if rec is None:
                    parts.pop(p, None)
                    self._leaders.pop((q, p), None)
                    continue
                parts[p] = _record_json(p, rec)
                if self.node_id not in rec.replicas and self._leaders.get((q, p), rec.leader) != rec.leader:
                    self._emit(Event("leader", (q, p, rec.leader)))  # requests passed on to the old one are lost
                self._leaders[(q, p)] = rec.leader
            for q in {q for q, _ in touched}:
                parts = self._qparts.get(q, {})
                if not parts:
                    self._qparts.pop(q, None)
                    queues.pop(q, None)
                    continue
                queues[q] = [parts[p] for p in sorted(parts)]
                cached = self._queue_settings.get(q)  # partitions added (fabric queue alter) that name no replica here
                if cached is not None and len(parts) > int(cached.get("partitions", 0)):
                    kv = self.meta.get(queue_key(q))
                    if kv is not None:
                        self._queue_settings[q] = json.loads(kv.value)
                        self._emit(Event("grow", (q, int(self._queue_settings[q]["partitions"]))))
        controller = self._snapshot.get("controller")
        now = time.monotonic()
        if self.controller.is_controller:
            controller = self.node_id
        elif now >= self._controller_read_at:  # who is the controller: read at most every second
            self._controller_read_at = now + 1.0
            try:
                kv = self.meta.get(CONTROLLER_KEY)
                controller = json.loads(kv.value)["name"] if kv is not None else None
            except (MetaUnavailable, ValueError, KeyError):
                pass
        self._snapshot = {"cluster": True, "controller": controller, "nodes": nodes, "queues": queues}

    def _catch_up(self, queue: str, partitions: int) -> None:
        """A queue request the controller carried out: follow the map now (briefly, until it
        shows the queue's ``partitions`` partitions) instead of at the next step, so this node
        takes its roles and the client's reply does not wait up to STEP_MS for them."""
        deadline = time.monotonic() + CATCH_UP_S
        while True:
            try:
                self._publish(self.agent.step(time.time_ns() // 1_000_000))
            except FabricError:
                return
            if self.agent.knows(queue, partitions - 1) or time.monotonic() >= deadline:
                return
            time.sleep(0.002)

    def _forward(self, op_name: str, params: dict[str, Any]) -> Any:
        """Send a queue request to the controller's node and return its answer. The connection
        is kept for the next request while the controller stays where it is."""
        from fabric.protocol.ops import Op
        from fabric.transport.connection import connect

        kv = self.meta.get(CONTROLLER_KEY)
        if kv is None:
            raise MetaUnavailable("no controller is elected yet; retry in a moment")
        endpoint = json.loads(kv.value)["endpoint"]
        if self._fwd is not None and self._fwd[0] != endpoint:
            self._fwd[1].close()
            self._fwd = None
        if self._fwd is None:
            self._fwd = (endpoint, connect(endpoint, timeout_ms=5000, curve=self.curve))
        try:
            return self._fwd[1].request(Op[op_name], {**params, "forwarded": True}).params
        except FabricError as exc:
            if not exc.retriable or isinstance(exc, NotLeader):
                raise
            self._fwd[1].close()  # lost link or timeout: a fresh connection next time
            self._fwd = None
            raise


def _settings_json(settings: QueueSettings) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(settings)


def _record_json(p: int, rec: PartitionRecord) -> dict[str, Any]:
    return {
        "partition": p,
        "leader": rec.leader,
        "leader_epoch": rec.leader_epoch,
        "replicas": list(rec.replicas),
        "isr": list(rec.isr),
    }


def _as_error(exc: Exception) -> FabricError:
    """What a request done on the cluster thread answers when it raised: its FabricError, or an
    InternalError for a bug (logged), rather than no answer at all (the client waiting out its
    timeout)."""
    if isinstance(exc, FabricError):
        return exc
    log.error("cluster request failed", exc_info=exc)
    return InternalError(f"{type(exc).__name__}: {exc}")
