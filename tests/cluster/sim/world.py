"""A deterministic cluster simulation: the real Controller and NodeAgent over MemoryEtcd.

Theory of operation
-------------------
One ``World`` per seed. Time is virtual (``now``), every random choice comes from one
``random.Random(seed)``, and nothing reads a clock, so a seed replays exactly. The world holds
N simulated nodes; each is a process running a ``NodeAgent`` and a ``Controller`` candidate,
each talking to the shared MemoryEtcd through its own ``MetaProxy`` (which fails while the node
is cut off from etcd, and can pause the process in the middle of a write: a *stall*, during
which the rest of the world moves on past the node's leases).

Each event is one of: step an agent, step a controller, let time pass (leases lapse), crash or
restart a node, crash or restart a controller alone, an etcd outage or its end, cut a node off
from etcd or reconnect it, arm a stall, lose the reply of a node's next txn (applied, but the
caller sees MetaUnavailable: the outcome-unknown paths), compact etcd's history, create or delete a queue (through
whoever believes it is the controller), or have an acting leader propose an ISR change (what the
LeaderReplica will do). After every event ``Checker`` (checker.py) verifies the invariants;
every ``heal_every`` events all faults are healed but crashed nodes stay down, and within
``heal_bound_ms`` of virtual time every partition with a live ISR member must have a live leader
that knows it leads.

Hook for data replication: ``SimNode.replicas`` holds one ``SimReplica`` per partition the node
hosts, updated from the agent's RoleChanges in ``SimNode.on_role``; ``SimNode.tick`` is called
whenever the node's agent steps. The LeaderReplica / FollowerReplica state machines, an
in-memory log and network plug in there (and ``World._propose_isr_change`` becomes the leader's
``isr_change``), without touching the controller side of the world.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fabric.cluster.agent import NodeAgent, RoleChange
from fabric.cluster.controller import Controller
from fabric.cluster.keys import CONTROLLER_KEY, PARTITIONS_PREFIX, QUEUES_PREFIX
from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.meta import (
    Compare,
    Delete,
    KeyValue,
    MetaUnavailable,
    Put,
    TxnOp,
    TxnResult,
    Watch,
)
from fabric.cluster.partition import PartitionRecord
from fabric.errors import FabricError
from tests.cluster.sim.checker import Checker, Violation

TTL_S = 2
TTL_MS = TTL_S * 1000


# --- the network between a process and etcd ---------------------------------------------------


class MetaProxy:
    """One process's etcd client: the MetaStore protocol over the world's MemoryEtcd."""

    def __init__(self, world: World, node: SimNode) -> None:
        self._world = world
        self._node = node
        self._etcd = world.etcd
        self.controller: Controller | None = None  # set when this proxy is a controller's

    def _gate(self) -> None:
        if self._node.cut or not self._node.up:
            raise MetaUnavailable(f"{self._node.name} cannot reach etcd")

    def get(self, key: str) -> KeyValue | None:
        self._gate()
        return self._etcd.get(key)

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        self._gate()
        return self._etcd.get_prefix(prefix)

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        self._gate()
        return self._etcd.put(key, value, lease)

    def delete(self, key: str, prefix: bool = False) -> int:
        self._gate()
        return self._etcd.delete(key, prefix)

    def txn(self, compare: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp] = ()) -> TxnResult:
        self._gate()
        if self._node.stall_armed:
            self._node.stall_armed = False
            self._world.stall(self._node)  # paused between deciding and writing
            self._gate()
        result = self._etcd.txn(compare, success, failure)
        if self.controller is not None and result.succeeded:
            meta_keys = [op.key for op in success if isinstance(op, Put | Delete)]
            if any(k.startswith((PARTITIONS_PREFIX, QUEUES_PREFIX)) for k in meta_keys):
                self._world.checker.controller_wrote(self.controller)
        if self._node.lose_reply:
            self._node.lose_reply = False
            raise MetaUnavailable(f"{self._node.name}: the txn was applied but its reply was lost")
        return result

    def lease_grant(self, ttl_s: int) -> int:
        self._gate()
        return self._etcd.lease_grant(ttl_s)

    def lease_keepalive(self, lease: int) -> int:
        self._gate()
        return self._etcd.lease_keepalive(lease)

    def lease_revoke(self, lease: int) -> None:
        self._gate()
        self._etcd.lease_revoke(lease)

    def watch(self, prefix: str, start_revision: int) -> Watch:
        self._gate()
        return _ProxyWatch(self, self._etcd.watch(prefix, start_revision))

    def close(self) -> None:
        pass


class _ProxyWatch:
    def __init__(self, proxy: MetaProxy, inner: Watch) -> None:
        self._proxy = proxy
        self._inner = inner

    def poll(self, timeout_s: float) -> list:  # type: ignore[type-arg]
        try:
            self._proxy._gate()
        except MetaUnavailable:
            self._inner.cancel()  # a cut connection loses the watch stream
            raise
        return self._inner.poll(timeout_s)

    def cancel(self) -> None:
        self._inner.cancel()


# --- nodes ------------------------------------------------------------------------------------


@dataclass
class SimReplica:
    """One node's replica of one partition, as its agent last reported it. Data replication
    (LeaderReplica / FollowerReplica, the in-memory log) will live here."""

    queue: str
    partition: int
    record: PartitionRecord
    is_leader: bool
    mod_revision: int


@dataclass
class SimNode:
    name: str
    zone: str | None
    up: bool = False
    cut: bool = False
    stall_armed: bool = False
    lose_reply: bool = False  # the next txn is applied but its caller gets MetaUnavailable
    paused: bool = False
    agent: NodeAgent | None = None
    controller: Controller | None = None
    replicas: dict[tuple[str, int], SimReplica] = field(default_factory=dict)

    def on_role(self, change: RoleChange) -> None:
        where = (change.queue, change.partition)
        old = self.replicas.get(where)
        if change.record is None or self.name not in change.record.replicas:
            self.replicas.pop(where, None)
            return
        rec = change.record
        if old is not None and (
            rec.leader_epoch < old.record.leader_epoch or rec.partition_epoch < old.record.partition_epoch
        ):
            raise Violation(f"{self.name} saw {where} go back from {old.record} to {rec}")
        self.replicas[where] = SimReplica(where[0], where[1], rec, change.is_leader, change.mod_revision)

    def tick(self, now_ms: int) -> None:
        """Data-plane hook: drive the node's replica state machines (nothing yet)."""


# --- the world --------------------------------------------------------------------------------

EVENTS: list[tuple[str, float]] = [
    ("step_agent", 30),
    ("step_controller", 25),
    ("tick", 20),
    ("isr_change", 4),
    ("crash", 2),
    ("restart", 3),
    ("controller_crash", 1),
    ("controller_restart", 1),
    ("outage", 1),
    ("outage_end", 3),
    ("cut", 1.5),
    ("uncut", 2),
    ("stall", 1),
    ("lose_reply", 1),
    ("compact", 0.5),
    ("create_queue", 1),
    ("delete_queue", 0.4),
]


class World:
    def __init__(self, seed: int, *, nodes: int = 3, heal_every: int = 250, heal_bound_ms: int = 2 * TTL_MS) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self.etcd = MemoryEtcd(history_max=300)
        self.checker = Checker(self.etcd)
        zones = ["z1", "z2", None]
        self.nodes = [SimNode(f"n{i}", zones[i % 3]) for i in range(nodes)]
        self.heal_every = heal_every
        self.heal_bound_ms = heal_bound_ms
        self.trace: list[str] = []
        self.queues = 0
        self.in_stall = False
        self.heal_ms_max = 0  # the longest a heal took: what heal_bound_ms must cover
        self._names = [name for name, _ in EVENTS]
        self._weights = [w for _, w in EVENTS]
        self._handlers: dict[str, Callable[[], str | None]] = {
            name: getattr(self, "_ev_" + name) for name in self._names
        }

    # --- running --------------------------------------------------------------------------

    def run(self, events: int) -> None:
        for node in self.nodes:
            self._start(node)
        self._heal()
        for _ in range(2):
            self._ev_create_queue()
        for i in range(events):
            name = self.rng.choices(self._names, self._weights)[0]
            self._event(name)
            if (i + 1) % self.heal_every == 0:
                self._heal()
        self._heal()

    def _event(self, name: str) -> None:
        what = self._handlers[name]()
        if what is not None:
            self.trace.append(f"t={self.now} {what}")
            del self.trace[:-60]
        self.check()

    def check(self) -> None:
        self.checker.poll()
        self.checker.check_nodes(self.nodes)
        self.checker.check_controllers(self.nodes)

    def _heal(self) -> None:
        """End every fault but crashes, then wait: every partition with a live ISR member must get
        a live leader that knows it leads within heal_bound_ms. The bound: one lease TTL for the
        leases of dead processes (a dead controller, a restarted node's old registration) to
        lapse, a retry interval (TTL/4) to campaign or register again, and a few 100 ms steps
        for the controller to elect and the agents to see it (about 2.2 s at most is seen)."""
        self.trace.append(f"t={self.now} heal")
        self.etcd.set_available(True)
        for node in self.nodes:
            node.cut = node.stall_armed = node.lose_reply = False
            if node.up and node.controller is None:
                self._new_controller(node)
        if not any(n.up for n in self.nodes):
            self._start(self.rng.choice(self.nodes))
        start = self.now
        while True:
            self.now += 100
            self.etcd.advance(self.now)
            for node in self._live_order():
                self._step_agent(node)
            for node in self._live_order():
                self._step_controller(node)
            self.check()
            problem = self._unhealed()
            if problem is None:
                self.heal_ms_max = max(self.heal_ms_max, self.now - start)
                return
            if self.now - start > self.heal_bound_ms:
                raise Violation(f"not healed after {self.now - start} ms: {problem}")

    def _unhealed(self) -> str | None:
        held = self.etcd.get(CONTROLLER_KEY)
        acting = [
            n for n in self.nodes if n.up and n.controller and held and n.controller.epoch == held.create_revision
        ]
        if not acting:
            return "no acting controller"
        live = {n.name: n for n in self.nodes if n.up and n.agent and n.agent.registered}
        for kv in self.etcd.get_prefix(PARTITIONS_PREFIX)[0]:
            rec = PartitionRecord.from_json(kv.value)
            if not any(r in live for r in rec.isr):
                continue
            leader = live.get(rec.leader) if rec.leader else None
            q, _, p = kv.key[len(PARTITIONS_PREFIX) :].rpartition("/")
            rep = leader.replicas.get((q, int(p))) if leader else None
            if rep is None or not rep.is_leader or rep.record.leader_epoch != rec.leader_epoch:
                return f"{kv.key} {rec}: no live leader that knows it (live {sorted(live)})"
        return None

    def _live_order(self) -> list[SimNode]:
        live = [n for n in self.nodes if n.up and not n.paused]
        self.rng.shuffle(live)
        return live

    def stall(self, node: SimNode) -> None:
        """``node``'s process pauses mid-write for longer than a lease; the others go on."""
        if self.in_stall:
            return
        self.in_stall = node.paused = True
        self.trace.append(f"t={self.now} stall {node.name} begins")
        until = self.now + TTL_MS + self.rng.randrange(0, 1500)
        while self.now < until:
            self.now = min(until, self.now + self.rng.randrange(100, 600))
            self.etcd.advance(self.now)
            for other in self._live_order():
                self._step_agent(other)
                self._step_controller(other)
            self.check()
        self.trace.append(f"t={self.now} stall {node.name} ends")
        self.in_stall = node.paused = False

    # --- helpers --------------------------------------------------------------------------

    def _start(self, node: SimNode) -> None:
        node.up, node.cut, node.stall_armed, node.paused, node.lose_reply = True, False, False, False, False
        node.replicas.clear()  # in-memory state is lost (the log on disk would not be)
        node.agent = NodeAgent(
            MetaProxy(self, node), node.name, f"sim://{node.name}", lease_ttl_s=TTL_S, zone=node.zone
        )
        self._new_controller(node)

    def _new_controller(self, node: SimNode) -> None:
        proxy = MetaProxy(self, node)
        node.controller = Controller(proxy, node.name, f"sim://{node.name}", lease_ttl_s=TTL_S)
        proxy.controller = node.controller

    def _step_agent(self, node: SimNode) -> None:
        if node.agent is None:
            return
        for change in node.agent.step(self.now):
            node.on_role(change)
        node.tick(self.now)

    def _step_controller(self, node: SimNode) -> None:
        if node.controller is not None:
            node.controller.step(self.now)

    def _pick(self, pred: Callable[[SimNode], bool]) -> SimNode | None:
        candidates = [n for n in self.nodes if pred(n) and not n.paused]
        return self.rng.choice(candidates) if candidates else None

    # --- events (each returns a line for the trace, or None when it did nothing) ----------

    def _ev_step_agent(self) -> str | None:
        node = self._pick(lambda n: n.up)
        if node is None:
            return None
        self._step_agent(node)
        return None  # too frequent to trace

    def _ev_step_controller(self) -> str | None:
        node = self._pick(lambda n: n.up and n.controller is not None)
        if node is None:
            return None
        written = node.controller.step(self.now)  # type: ignore[union-attr]
        return f"controller {node.name} wrote {written}" if written else None

    def _ev_tick(self) -> str | None:
        self.now += self.rng.randrange(1, 700)
        expired = self.etcd.advance(self.now)
        return f"leases {[hex(x) for x in expired]} expired" if expired else None

    def _ev_isr_change(self) -> str | None:
        node = self._pick(lambda n: n.up and any(r.is_leader for r in n.replicas.values()))
        if node is None:
            return None
        rep = self.rng.choice(
            sorted((r for r in node.replicas.values() if r.is_leader), key=lambda r: (r.queue, r.partition))
        )
        return self._propose_isr_change(node, rep)

    def _propose_isr_change(self, node: SimNode, rep: SimReplica) -> str | None:
        """What the LeaderReplica does: shrink by a follower, or expand by a registered replica."""
        old = rep.record
        known = node.agent.nodes if node.agent else {}
        outside = [r for r in old.replicas if r not in old.isr and r in known]
        followers = [r for r in old.isr if r != node.name]
        if outside and (not followers or self.rng.random() < 0.5):
            isr = tuple(r for r in old.replicas if r in old.isr or r == outside[0])
        elif followers:
            isr = tuple(r for r in old.isr if r != self.rng.choice(followers))
        else:
            return None
        new = PartitionRecord(old.replicas, old.leader, old.leader_epoch, isr, old.partition_epoch + 1)
        try:
            ok = node.agent.cas_partition(rep.queue, rep.partition, old, new)  # type: ignore[union-attr]
        except MetaUnavailable:
            return None
        return f"{node.name} isr {rep.queue}/{rep.partition} {old.isr} -> {isr}: {ok}"

    def _ev_crash(self) -> str | None:
        node = self._pick(lambda n: n.up)
        if node is None:
            return None
        node.up, node.agent, node.controller = False, None, None
        node.replicas.clear()
        return f"crash {node.name}"

    def _ev_restart(self) -> str | None:
        node = self._pick(lambda n: not n.up)
        if node is None:
            return None
        self._start(node)
        return f"restart {node.name}"

    def _ev_controller_crash(self) -> str | None:
        node = self._pick(lambda n: n.up and n.controller is not None)
        if node is None:
            return None
        node.controller = None
        return f"controller {node.name} crashed"

    def _ev_controller_restart(self) -> str | None:
        node = self._pick(lambda n: n.up and n.controller is None)
        if node is None:
            return None
        self._new_controller(node)
        return f"controller {node.name} restarted"

    def _ev_outage(self) -> str | None:
        if not self.etcd.available:
            return None
        self.etcd.set_available(False)
        return "etcd outage"

    def _ev_outage_end(self) -> str | None:
        if self.etcd.available:
            return None
        self.etcd.set_available(True)
        return "etcd back"

    def _ev_cut(self) -> str | None:
        node = self._pick(lambda n: n.up and not n.cut)
        if node is None:
            return None
        node.cut = True
        return f"cut {node.name} off etcd"

    def _ev_uncut(self) -> str | None:
        node = self._pick(lambda n: n.cut)
        if node is None:
            return None
        node.cut = False
        return f"reconnect {node.name}"

    def _ev_stall(self) -> str | None:
        node = self._pick(lambda n: n.up and not n.stall_armed)
        if node is None or self.in_stall:
            return None
        node.stall_armed = True
        return f"stall armed on {node.name}"

    def _ev_lose_reply(self) -> str | None:
        node = self._pick(lambda n: n.up and not n.lose_reply)
        if node is None:
            return None
        node.lose_reply = True
        return f"next txn reply to {node.name} will be lost"

    def _ev_compact(self) -> str | None:
        if not self.etcd.available or self.etcd.revision < 10:
            return None
        self.etcd.compact(self.etcd.revision - 3)
        return f"compact to {self.etcd.revision - 3}"

    def _ev_create_queue(self) -> str | None:
        node = self._pick(lambda n: n.up and n.controller is not None and n.controller.is_controller)
        if node is None:
            return None
        name = f"q{self.queues}"
        self.queues += 1
        partitions, rf = self.rng.randint(1, 3), self.rng.randint(1, 3)
        try:
            node.controller.create_queue(name, {}, partitions, rf)  # type: ignore[union-attr]
        except FabricError as e:
            return f"create {name} by {node.name}: {type(e).__name__}"
        return f"create {name} ({partitions}x rf {rf}) by {node.name}"

    def _ev_delete_queue(self) -> str | None:
        node = self._pick(lambda n: n.up and n.controller is not None and n.controller.is_controller)
        if node is None or not self.etcd.available:
            return None
        queues = [kv.key[len(QUEUES_PREFIX) :] for kv in self.etcd.get_prefix(QUEUES_PREFIX)[0]]
        if not queues:
            return None
        name = self.rng.choice(queues)
        try:
            node.controller.delete_queue(name)  # type: ignore[union-attr]
        except FabricError as e:
            return f"delete {name} by {node.name}: {type(e).__name__}"
        return f"delete {name} by {node.name}"
