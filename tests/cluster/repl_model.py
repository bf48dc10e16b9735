"""A seeded in-memory model of one partition on three replicas, driving the real LeaderReplica and
FollowerReplica through random interleavings, with invariants checked after every step.

Logs are lists of ``(epoch, payload)`` (offset = index). The "store" is one PartitionRecord with
compare-and-swap; nodes learn it late (stale leaders and followers are part of the model).
Events: appends on whoever believes it leads, fetches whose responses are lost, delayed and
reordered, paused nodes, ISR proposals committed, rejected or with lost results, controller
shrinks and elections from the committed ISR, time passing.

Invariants (``Violation`` when broken):
- a leader's HW never goes back within its term;
- every offset below any leader's HW ("committed") has one (epoch, payload) forever, every
  replica holds exactly that below its own HW, and every member of the committed ISR (whom the
  controller may elect) holds all of it;
- a new leader holds every committed (and every acks=all-acknowledged) offset;
- after a fetch, the follower's log is a prefix of its leader's;
- ``heal()``: once faults stop, every replica catches up, joins the ISR and the HW reaches the end.

Replay a failing seed: ``python -c "from tests.cluster.repl_model import run; run(SEED)"``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from fabric.cluster.epochs import LeaderEpochCache
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.replica import FetchDecision, FetchRequest, FollowerReplica, LeaderReplica

NAMES = ("a", "b", "c")
LAG_MS = 100
MIN_INSYNC = 2

Entry = tuple[int, str]


# Event kinds and their base weights; each seed scales every weight by a random factor in
# [0.2, 1] ("swarm testing"), so some runs are append-heavy, some election-heavy, and so on.
EVENTS = ("append", "fetch", "deliver", "pause", "propose", "resolve", "elect", "learn", "tick")
BASE_WEIGHTS = (18, 24, 20, 2, 8, 7, 2.5, 8.5, 7)


class Violation(AssertionError):
    pass


@dataclass
class Node:
    name: str
    log: list[Entry] = field(default_factory=list)
    epochs: LeaderEpochCache = field(default_factory=LeaderEpochCache)
    role: LeaderReplica | FollowerReplica | None = None
    paused_until: int = -1  # virtual ms; SIGSTOP until then

    def paused(self, now: int) -> bool:
        return now < self.paused_until

    @property
    def hw(self) -> int:
        return 0 if self.role is None else self.role.high_watermark

    def truncate(self, to: int) -> None:
        del self.log[to:]
        self.epochs.truncate_from_end(to)


@dataclass
class Response:
    node: Node
    role: FollowerReplica
    req: FetchRequest
    decision: FetchDecision
    sender: LeaderReplica | None
    data: list[Entry]


@dataclass
class Swap:
    role: LeaderReplica
    old: PartitionRecord
    new: PartitionRecord


class Model:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.weights = [w * self.rng.uniform(0.2, 1.0) for w in BASE_WEIGHTS]
        self.now = 0
        self.nodes = {n: Node(n) for n in NAMES}
        self.store = PartitionRecord(NAMES, "a", 0, NAMES, 0)
        self.inflight: list[Response] = []
        self.swaps: list[Swap] = []
        self.committed: list[Entry] = []
        self.acked_end = 0
        self.pending_acks: list[tuple[LeaderReplica, int]] = []
        self.last_hw: dict[LeaderReplica, int] = {}  # per leader term: HW last seen
        self.trace: list[str] = []
        self.payloads = 0
        for node in self.nodes.values():
            self.learn(node)

    # ---- helpers

    def fail(self, what: str) -> None:
        tail = "\n  ".join(self.trace[-25:])
        raise Violation(
            f"seed {self.seed}, step {len(self.trace)}: {what}\n  last events:\n  {tail}\n"
            f'  replay: python -c "from tests.cluster.repl_model import run; run({self.seed})"'
        )

    def leaders(self) -> list[tuple[Node, LeaderReplica]]:
        return [(n, n.role) for n in self.nodes.values() if isinstance(n.role, LeaderReplica) and n.role.active]

    def followers(self) -> list[tuple[Node, FollowerReplica]]:
        return [(n, n.role) for n in self.nodes.values() if isinstance(n.role, FollowerReplica)]

    # ---- events

    def learn(self, node: Node) -> None:
        """``node`` reads the store (watch event) and takes the role it names."""
        rec, role = self.store, node.role
        if isinstance(role, LeaderReplica):
            self.absorb(node, role)  # its HW may have moved in this very step
        if rec.leader == node.name:
            if isinstance(role, LeaderReplica) and role.active and role.leader_epoch == rec.leader_epoch:
                role.on_isr_result(rec, True)
                return
            if isinstance(role, LeaderReplica):
                role.on_isr_result(rec, True)  # an older term of ours ends
            self.check_new_leader(node)
            node.role = LeaderReplica(
                node.name,
                rec,
                log_end=len(node.log),
                high_watermark=node.hw,
                epochs=node.epochs,
                min_insync=MIN_INSYNC,
                lag_time_ms=LAG_MS,
                now_ms=self.now,
            )
            self.trace.append(f"{node.name} leads epoch {rec.leader_epoch} at {len(node.log)}, hw {node.hw}")
        elif rec.leader is not None:
            if isinstance(role, FollowerReplica) and (role.leader, role.leader_epoch) == (rec.leader, rec.leader_epoch):
                return
            if isinstance(role, LeaderReplica) and role.active and role.on_isr_result(rec, True):
                self.fail(f"{node.name} kept leading after a record naming {rec.leader}")
            node.role = FollowerReplica(
                node.name,
                rec.leader,
                rec.leader_epoch,
                log_end=len(node.log),
                high_watermark=node.hw,
                epochs=node.epochs,
            )
            self.trace.append(f"{node.name} follows {rec.leader} epoch {rec.leader_epoch}")

    def append(self, node: Node, role: LeaderReplica) -> None:
        for _ in range(self.rng.randint(1, 3)):
            self.payloads += 1
            node.log.append((role.leader_epoch, f"p{self.payloads}"))
        role.on_append(len(node.log), self.now)
        self.pending_acks.append((role, len(node.log)))
        self.trace.append(f"{node.name} appends to {len(node.log)}")

    def fetch(self, node: Node, role: FollowerReplica) -> None:
        req = role.next_fetch()
        target = self.nodes[role.leader]
        if target.paused(self.now) or not isinstance(target.role, LeaderReplica):
            self.trace.append(f"{node.name} fetch {req.fetch_offset} to {role.leader}: no leader there")
            if self.rng.random() < 0.5:
                self.learn(node)
            return
        sender = target.role
        decision = sender.on_fetch(req, self.now)
        if decision.error is not None and req.leader_epoch > sender.leader_epoch and self.rng.random() < 0.7:
            self.learn(target)  # a newer epoch in a request: the node refreshes its metadata
        data: list[Entry] = []
        if decision.read_from is not None:
            data = target.log[decision.read_from : decision.read_from + self.rng.randint(0, 16)]
        self.trace.append(f"{node.name} fetch {req} -> {decision}, {len(data)} entries")
        if self.rng.random() < 0.15:
            self.trace.append("  (response lost)")
            return
        self.inflight.append(Response(node, role, req, decision, sender, data))

    def deliver(self, resp: Response) -> None:
        node, role, d = resp.node, resp.role, resp.decision
        if node.role is not role or node.paused(self.now) or not role.is_current(resp.req):
            self.trace.append(f"{node.name} drops a stale response to {resp.req}")
            return
        if d.error is not None:
            self.trace.append(f"{node.name} got {d.error.__name__}")
            self.learn(node)
        elif d.diverging is not None:
            to = role.on_diverging(*d.diverging)
            node.truncate(to)
            self.trace.append(f"{node.name} diverged at {d.diverging}: truncated to {to}")
        else:
            base = len(node.log)
            node.log.extend(resp.data)
            try:
                role.on_appended(len(node.log), [(e, base + i) for i, (e, _) in enumerate(resp.data)], d.high_watermark)
            except ValueError as exc:
                self.fail(f"{node.name} refused the batches its leader sent: {exc}")
            self.trace.append(f"{node.name} appended {len(resp.data)} to {len(node.log)}, hw {role.high_watermark}")
            leader = self.nodes[role.leader]
            if leader.role is resp.sender and leader.log[: len(node.log)] != node.log:
                self.fail(f"{node.name} holds batches its leader {leader.name} does not have")

    def propose(self, node: Node, role: LeaderReplica) -> None:
        old = role.record
        new = role.isr_change(self.now)
        if new is not None:
            self.swaps.append(Swap(role, old, new))
            self.trace.append(f"{node.name} proposes isr {new.isr} pe {new.partition_epoch}")

    def resolve(self, swap: Swap) -> None:
        if self.rng.random() < 0.1:
            self.trace.append(f"swap to {swap.new.isr}: store unreachable")
            swap.role.on_isr_result(swap.new, False)
            return
        ok = self.store == swap.old
        if ok:
            self.store = swap.new
        self.trace.append(f"swap to isr {swap.new.isr}: {'committed' if ok else 'rejected'}")
        if self.rng.random() < 0.15:
            self.trace.append("  (result lost)")
            return
        swap.role.on_isr_result(swap.new, ok)
        node = self.nodes[swap.role.me]
        if not ok and node.role is swap.role and self.rng.random() < 0.5:
            self.learn(node)  # a failed swap: read the record again

    def elect(self) -> None:
        rec = self.store
        lapsed = [r for r in rec.isr if r != rec.leader and self.nodes[r].paused(self.now)]
        if lapsed and self.rng.random() < 0.5:
            gone = self.rng.choice(lapsed)  # its lease lapsed while it was paused
            self.store = rec.with_isr(r for r in rec.isr if r != gone)
            self.trace.append(f"controller drops {gone} from the isr: {self.store.isr}")
            return
        leader = self.rng.choice(rec.isr)
        self.store = rec.with_leader(leader)
        self.trace.append(f"controller elects {leader} epoch {self.store.leader_epoch}, isr {self.store.isr}")

    def step(self) -> None:
        kind = self.rng.choices(EVENTS, self.weights)[0]
        getattr(self, "ev_" + kind)()
        self.check()

    def ev_append(self) -> None:
        choices = [(n, ro) for n, ro in self.leaders() if not n.paused(self.now)]
        if choices:
            self.append(*self.rng.choice(choices))

    def ev_fetch(self) -> None:
        # one fetch in flight per follower, as a fetcher thread does; sometimes a retry (timeout)
        busy = {r.node.name for r in self.inflight} if self.rng.random() < 0.8 else set()
        choices = [(n, ro) for n, ro in self.followers() if not n.paused(self.now) and n.name not in busy]
        if choices:
            self.fetch(*self.rng.choice(choices))

    def ev_deliver(self) -> None:
        if self.inflight:
            self.deliver(self.inflight.pop(self.rng.randrange(len(self.inflight))))

    def ev_pause(self) -> None:
        node = self.rng.choice(list(self.nodes.values()))
        if sum(n.paused(self.now) for n in self.nodes.values()) < 2:
            node.paused_until = self.now + self.rng.randint(1, 2 * LAG_MS)
            self.trace.append(f"{node.name} paused until {node.paused_until}")

    def ev_propose(self) -> None:
        choices = [(n, ro) for n, ro in self.leaders() if not n.paused(self.now)]
        if choices:
            self.propose(*self.rng.choice(choices))

    def ev_resolve(self) -> None:
        if self.swaps:
            self.resolve(self.swaps.pop(self.rng.randrange(len(self.swaps))))

    def ev_elect(self) -> None:
        self.elect()

    def ev_learn(self) -> None:
        live = [n for n in self.nodes.values() if not n.paused(self.now)]
        if live:
            self.learn(self.rng.choice(live))

    def ev_tick(self) -> None:
        self.now += self.rng.randint(1, 60)

    # ---- invariants

    def check_new_leader(self, node: Node) -> None:
        if node.log[: len(self.committed)] != self.committed:
            self.fail(f"new leader {node.name} lacks committed entries: has {node.log}, committed {self.committed}")
        if len(node.log) < self.acked_end:
            self.fail(f"new leader {node.name} lacks acks=all records below {self.acked_end}")

    def absorb(self, node: Node, role: LeaderReplica) -> None:
        """Everything below a leader's HW is committed: check it against, or add it to, the
        committed prefix."""
        hw = role.high_watermark
        if hw < self.last_hw.get(role, 0):
            self.fail(f"leader {node.name} HW went back from {self.last_hw[role]} to {hw}")
        self.last_hw[role] = hw
        for o in range(hw):
            if o < len(self.committed):
                if node.log[o] != self.committed[o]:
                    self.fail(f"leader {node.name} HW {hw} covers {node.log[o]} at {o}, committed {self.committed[o]}")
            else:
                self.committed.append(node.log[o])

    def check(self) -> None:
        for node, role in self.leaders():
            self.absorb(node, role)
        keep = []
        for role, end in self.pending_acks:
            if role.acked(end):
                self.acked_end = max(self.acked_end, end)
            elif role.active:
                keep.append((role, end))
        self.pending_acks = keep
        if self.acked_end > len(self.committed):
            self.fail(f"acked up to {self.acked_end} but committed only {len(self.committed)}")
        for node in self.nodes.values():
            if node.hw > len(self.committed) or node.log[: node.hw] != self.committed[: node.hw]:
                self.fail(f"{node.name}: log below its HW {node.hw} is not the committed prefix")
            if node.name in self.store.isr and node.log[: len(self.committed)] != self.committed:
                self.fail(f"isr member {node.name} lacks committed entries: has {node.log}, committed {self.committed}")

    # ---- liveness

    def heal(self, rounds: int = 60) -> None:
        """Faults stop; within ``rounds`` every replica catches up and is in the ISR."""
        for node in self.nodes.values():
            node.paused_until = -1
        self.inflight.clear()
        for swap in self.swaps:
            swap.role.on_isr_result(swap.new, False)  # never sent
        self.swaps.clear()
        for _ in range(rounds):
            for node in self.nodes.values():
                self.learn(node)
            for node, role in self.followers():
                req = role.next_fetch()
                target = self.nodes[role.leader]
                if isinstance(target.role, LeaderReplica):
                    d = target.role.on_fetch(req, self.now)
                    data = target.log[d.read_from :] if d.read_from is not None else []
                    self.deliver(Response(node, role, req, d, target.role, data))
            for _node, role in self.leaders():
                old, new = role.record, role.isr_change(self.now)
                if new is not None:
                    self.resolve_now(Swap(role, old, new))
            self.now += 10
            self.check()
            if self.converged():
                return
        self.fail("no progress after faults healed: " + repr({n.name: (len(n.log), n.hw) for n in self.nodes.values()}))

    def converged(self) -> bool:
        """One leader, every replica in its ISR, same log everywhere, HW at the end everywhere."""
        leaders = self.leaders()
        if len(leaders) != 1:
            return False
        node, role = leaders[0]
        end = len(node.log)
        return (
            role.record.isr == NAMES
            and role.high_watermark == end
            and all(n.log == node.log and n.hw == end for n in self.nodes.values())
        )

    def resolve_now(self, swap: Swap) -> None:
        ok = self.store == swap.old
        if ok:
            self.store = swap.new
        swap.role.on_isr_result(swap.new, ok)


def run(seed: int, steps: int = 400, heal: bool = True) -> Model:
    m = Model(seed)
    for _ in range(steps):
        m.step()
    if heal:
        m.heal()
    return m
