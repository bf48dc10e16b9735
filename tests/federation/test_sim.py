"""The federation in a seeded simulation: real Manager, Controller and ClusterReporter objects on
the in-memory etcd, with crashes, pauses (a deposed manager that still believes), store losses,
load changes and etcd outages; invariants after every event.

Replay one seed:  FABRIC_SIM_SEED=17 .venv/bin/python -m pytest tests/federation/test_sim.py -q -k test_seed
More:             FABRIC_SIM_SEEDS=200 FABRIC_SIM_EVENTS=5000 (seeds, events per seed)
"""

from __future__ import annotations

import os
import random

import pytest

from fabric.cluster.controller import Controller
from fabric.cluster.keys import CONTROLLER_KEY, NodeInfo
from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.meta import Compare, Put
from fabric.cluster.namespace import Namespaced
from fabric.cluster.partition import PartitionRecord
from fabric.errors import MetaUnavailable, NotLeader, QueueExists
from fabric.federation.directory import (
    CLUSTERS_PREFIX,
    MANAGER_KEY,
    ClusterReport,
    QueuePlacement,
    QueueRequest,
    queue_key,
    request_key,
)
from fabric.federation.manager import Manager, read_reports, read_table
from fabric.federation.planner import NoRoom, load, partitions_placed, problems
from fabric.federation.report import LOAD_PREFIX, ClusterReporter, NodeLoad

EVENTS = int(os.environ.get("FABRIC_SIM_EVENTS", "400"))
SEEDS = (
    [int(os.environ["FABRIC_SIM_SEED"])]
    if "FABRIC_SIM_SEED" in os.environ
    else list(range(int(os.environ.get("FABRIC_SIM_SEEDS", "16"))))
)
STORES = ("s0", "s1", "s2")
GIB = 2**30


class Cluster:
    def __init__(self, etcd: MemoryEtcd, name: str) -> None:
        self.name, self.etcd = name, etcd
        self.meta = Namespaced(etcd, name)
        self.live = set(STORES)
        self.bps = 0.0
        self.used = 10 * GIB
        self.candidates: dict[str, tuple[Controller, ClusterReporter] | None] = {}
        # stalled: its controller is not stepped (no keepalive, no step-down) but its reporter
        # is, with the epoch it last knew: a process paused between the two, writing late
        self.stalled: set[str] = set()
        for i in range(2):
            self.restart(f"{name}-n{i}")

    def restart(self, who: str) -> None:
        ctl = Controller(self.meta, who, f"tcp://{who}", lease_ttl_s=2)
        self.candidates[who] = (ctl, ClusterReporter(self.etcd, self.meta, self.name, 1000))

    def step(self, now: int) -> None:
        nodes = {s: NodeInfo(s, f"tcp://{s}", None, 1) for s in sorted(self.live)}
        isr = tuple(s for s in STORES if s in self.live)
        records = {("bg", p): PartitionRecord(STORES, isr[0] if isr else None, 0, isr or STORES, 0) for p in range(4)}
        share = self.bps / max(1, len(self.live))
        for s in sorted(self.live):
            try:
                self.meta.put(
                    LOAD_PREFIX + s, NodeLoad(share, share / 100, share, 0.0, self.used // 3, GIB * 30).to_json()
                )
            except MetaUnavailable:
                pass
        for who, pair in self.candidates.items():
            if pair is not None:
                ctl, reporter = pair
                if who not in self.stalled:
                    ctl.step(now)
                reporter.step(now, ctl.epoch, ctl.name, nodes, records)


class World:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.now = 1_000_000
        self.etcd = MemoryEtcd(self.now)
        self.clusters = [Cluster(self.etcd, f"c{i}") for i in range(2 + seed % 3)]
        self.managers: dict[str, Manager] = {}
        self.paused: set[str] = set()  # not stepped: a paused process that still believes it is manager
        for i in range(3):
            self.managers[f"m{i}"] = Manager(self.etcd, f"m{i}", f"tcp://m{i}", lease_ttl_s=3)
        self.placed: dict[str, bytes] = {}  # queue -> its placement as first written
        self.report_epochs: dict[str, tuple[int, int]] = {}  # cluster -> (mod_revision, epoch) last seen
        self.trace: list[str] = []
        self.created = self.refused = self.fenced = 0
        self.asked: dict[str, QueueRequest] = {}  # queue -> the last request written for it

    def run(self, events: int) -> None:
        for _ in range(events):
            r = self.rng.random()
            if r < 0.45:
                self.tick()
            elif r < 0.58:
                self.create()
            elif r < 0.70:
                self.ask()
            elif r < 0.78:
                c = self.rng.choice(self.clusters)
                down = sorted(set(STORES) - c.live)
                if down and self.rng.random() < 0.7:
                    c.live.add(self.rng.choice(down))
                else:
                    c.live.discard(self.rng.choice(STORES))
                self.trace.append(f"{c.name} stores {sorted(c.live)}")
            elif r < 0.85:
                c = self.rng.choice(self.clusters)
                c.bps = self.rng.choice([0.0, 20e6, 80e6, 290e6])
                c.used = self.rng.choice([5, 40, 88]) * GIB
                self.trace.append(f"{c.name} load {c.bps:.0f} B/s disk {c.used // GIB}")
            elif r < 0.91:
                name = self.rng.choice(sorted(self.managers))
                if name in self.paused or self.rng.random() < 0.5:
                    self.paused.discard(name)
                    self.managers[name] = Manager(self.etcd, name, f"tcp://{name}", lease_ttl_s=3)
                    self.trace.append(f"restart manager {name}")
                else:
                    self.paused.add(name)
                    self.trace.append(f"pause manager {name}")
            elif r < 0.96:
                c = self.rng.choice(self.clusters)
                who = self.rng.choice(sorted(c.candidates))
                if c.candidates[who] is None:
                    c.restart(who)
                    self.trace.append(f"restart controller {who}")
                elif who in c.stalled or self.rng.random() < 0.5:
                    (c.stalled.discard if who in c.stalled else c.stalled.add)(who)
                    self.trace.append(f"{'stall' if who in c.stalled else 'resume'} controller {who}")
                else:
                    c.candidates[who] = None
                    self.trace.append(f"crash controller {who}")
            elif self.etcd.available == (self.rng.random() < 0.2):
                self.etcd.set_available(not self.etcd.available)
                self.trace.append(f"etcd {'back' if self.etcd.available else 'outage'}")
            self.check()

    def tick(self) -> None:
        self.now += self.rng.randint(100, 1500)
        self.etcd.advance(self.now)
        for c in self.clusters:
            c.step(self.now)
        for name, m in self.managers.items():
            if name not in self.paused:
                m.step(self.now)
        self.trace.append(f"tick {self.now}")

    def create(self) -> None:
        believers = [m for _, m in sorted(self.managers.items()) if m.is_manager]
        if believers and self.rng.random() < 0.8:
            m = self.rng.choice(believers)  # possibly a paused one, deposed meanwhile
        else:
            m = self.managers[self.rng.choice(sorted(self.managers))]
        queue = f"q{self.rng.randint(0, 60)}"
        partitions, clusters, rf = self.rng.randint(1, 12), self.rng.randint(1, 3), self.rng.randint(1, 3)
        before = self.read()
        try:
            p = m.create_queue(queue, partitions, self.now, clusters=clusters, rf=rf)
        except NotLeader:
            self.fenced += 1
            assert self.read() == before, f"{m.name} was refused but the table changed"
            return
        except QueueExists:
            assert queue in self.placed or before is None
            return
        except NoRoom:
            self.refused += 1
            assert before is not None
            reports, table = before
            placed = partitions_placed(table.values(), reports)
            ok = [n for n, r in reports.items() if not problems(r, self.now, rf, placed.get(n, 0))]
            assert len(ok) < min(clusters, partitions), f"NoRoom with eligible clusters {ok}"
            return
        except MetaUnavailable:
            return
        self.trace.append(f"create {queue} by {m.name}: {p.partitions}")
        self.created += 1
        holder = self.etcd.get(MANAGER_KEY)
        assert holder is not None and holder.create_revision == m.epoch, f"{m.name} placed {queue} while not manager"
        assert before is not None and queue not in before[1], f"{queue} placed twice"
        reports, table = before
        placed = partitions_placed(table.values(), reports)
        ok = {n for n, r in reports.items() if not problems(r, self.now, rf, placed.get(n, 0))}
        assert set(p.clusters) <= ok, f"{queue} placed on {p.clusters}, eligible {ok}"
        assert len(p.clusters) == min(clusters, partitions) and len(p.partitions) == partitions
        worst = max(load(reports[c], placed.get(c, 0)) for c in p.clusters)
        for other in ok - set(p.clusters):
            assert load(reports[other], placed.get(other, 0)) >= worst, f"{other} had more room than {p.clusters}"
        kv = self.etcd.get(queue_key(queue))
        assert kv is not None
        self.placed[queue] = kv.value

    def ask(self) -> None:
        """A queue asked for through a request key (``fabric queue create --clusters``), which
        the manager takes on a later step."""
        queue = f"r{self.rng.randint(0, 40)}"
        req = QueueRequest(queue, self.rng.randint(1, 12), self.rng.randint(1, 3), 1, {"partitions": 1})
        try:
            self.etcd.txn(
                [Compare.absent(request_key(queue)), Compare.absent(queue_key(queue))],
                [Put(request_key(queue), req.to_json())],
            )
        except MetaUnavailable:
            return
        self.asked[queue] = req
        self.trace.append(f"ask {queue}: {req.partitions} partitions on {req.clusters}")

    def read(self) -> tuple[dict[str, ClusterReport], dict] | None:
        if not self.etcd.available:
            return None
        return read_reports(self.etcd), read_table(self.etcd)

    def check(self) -> None:
        if not self.etcd.available:
            return
        holder = self.etcd.get(MANAGER_KEY)
        rightful = [m for m in self.managers.values() if m.is_manager and holder and m.epoch == holder.create_revision]
        assert len(rightful) <= 1, "two managers hold the current epoch"
        for queue, value in self.placed.items():  # a placement, once written, never changes
            kv = self.etcd.get(queue_key(queue))
            assert kv is not None and kv.value == value, f"placement of {queue} changed"
        for queue, req in self.asked.items():  # a request is pending, answered, or placed as asked
            rkv, pkv = self.etcd.get(request_key(queue)), self.etcd.get(queue_key(queue))
            if rkv is not None and QueueRequest.from_json(rkv.value).error is None:
                assert pkv is None, f"{queue} placed and still requested"
            if pkv is not None and queue not in self.placed:
                got = QueuePlacement.from_json(pkv.value)
                assert len(got.partitions) == req.partitions and len(got.clusters) == min(req.partitions, req.clusters)
                self.placed[queue] = pkv.value
        for kv in self.etcd.get_prefix(CLUSTERS_PREFIX)[0]:
            report = ClusterReport.from_json(kv.value)
            seen = self.report_epochs.get(report.name)
            if seen is not None and seen[0] != kv.mod_revision:  # written since: never by an older controller
                assert report.health.controller_epoch >= seen[1], f"{report.name}: a deposed controller's report"
            ctl = self.etcd.get(f"/clusters/{report.name}{CONTROLLER_KEY}")
            if seen is None or seen[0] != kv.mod_revision:
                assert ctl is None or report.health.controller_epoch <= ctl.create_revision
            self.report_epochs[report.name] = (kv.mod_revision, report.health.controller_epoch)


def run_seed(seed: int, events: int = EVENTS) -> World:
    world = World(seed)
    try:
        world.run(events)
    except AssertionError as e:
        trace = "\n  ".join(world.trace[-30:])
        raise AssertionError(f"seed {seed}: {e}\n  last events:\n  {trace}\nreplay: FABRIC_SIM_SEED={seed}") from e
    return world


@pytest.mark.parametrize("seed", SEEDS)
def test_seed(seed: int) -> None:
    run_seed(seed)


def test_the_runs_exercise_placement_refusal_and_fencing() -> None:
    worlds = [run_seed(s) for s in range(4)]
    assert sum(w.created for w in worlds) > 20
    assert sum(w.refused for w in worlds) > 0
    assert sum(w.fenced for w in worlds) > 0
    for w in worlds:
        w.etcd.set_available(True)  # to read what the runs left
    asked = [q for w in worlds for q in w.asked if q in w.placed]
    answered = [
        q
        for w in worlds
        for q in w.asked
        if (kv := w.etcd.get(request_key(q))) is not None and QueueRequest.from_json(kv.value).error
    ]
    assert asked and answered, "no request was placed, or none refused"
    split = [
        v
        for w in worlds
        for v in w.placed.values()
        if b'"clusters": ["c' in v and b'", "c' in v.split(b"clusters")[1][:40]
    ]
    assert split, "no queue was split across clusters"


def test_a_run_replays_exactly() -> None:
    a, b = run_seed(5, 300), run_seed(5, 300)
    assert a.trace == b.trace and a.etcd.revision == b.etcd.revision
