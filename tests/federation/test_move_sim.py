"""Queue moves between clusters in a seeded simulation: real Manager candidates (election, epochs),
the real MoveDriver and each cluster's real ``apply_moves`` on the in-memory etcd, with an
in-memory data plane: each cluster's leader applies its queue key's seal (or deletion) some
ticks late, producers write where the directory says (and some, stale, where it said before),
the copy appends the source's log to the destination's only where it ends as expected. Managers
are killed (kill -9: the lease lapses) and paused (a deposed manager's driver keeps stepping with
its old epoch) mid-move, clusters stop reporting for a while, moves are cancelled.

Invariants after every event: never both copies of a queue taking writes; a move's phase only
moves by the transition table. At the end (everything healed, moves finished): every
acknowledged message is in the copy the directory names, once, in the order acknowledged.

Replay one seed:  FABRIC_SIM_SEED=17 .venv/bin/python -m pytest tests/federation/test_move_sim.py -q
More:             FABRIC_SIM_SEEDS=200 FABRIC_SIM_EVENTS=3000
"""

from __future__ import annotations

import functools
import json
import os
import random
from typing import Any

import pytest

from fabric.cluster.keys import queue_key as cluster_queue_key
from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.namespace import cluster_prefix
from fabric.errors import FabricError
from fabric.federation.directory import ClusterReport, Health, QueuePlacement, Utilisation, cluster_key, queue_key
from fabric.federation.manager import Manager
from fabric.federation.move_driver import MoveDriver
from fabric.federation.move_local import apply_moves, local_queue
from fabric.federation.move_requests import cancel_move, read_move, request_move
from fabric.federation.moves import DONE, TRANSITIONS, Move, PartitionProgress

EVENTS = int(os.environ.get("FABRIC_SIM_EVENTS", "300"))
SEEDS = (
    [int(os.environ["FABRIC_SIM_SEED"])]
    if "FABRIC_SIM_SEED" in os.environ
    else list(range(int(os.environ.get("FABRIC_SIM_SEEDS", "4"))))
)
CLUSTERS = ("a", "b", "c")
QUEUES = ("q0", "q1")
PARTS = 2


class Leader:
    """A cluster's copy of one queue as its leaders hold it (the partition logs) and the seal
    they have applied: learnt from the queue key some ticks after it changed."""

    def __init__(self) -> None:
        self.logs: list[list[int]] = [[] for _ in range(PARTS)]
        self.sealed = True  # created sealed or not: set at the first apply


class Plane:
    def __init__(self, world: World) -> None:
        self.w = world

    def copy(self, move: Move) -> list[PartitionProgress] | None:
        w = self.w
        if move.source in w.down or move.destination in w.down:
            return None
        src, dst = w.leaders[move.source].get(move.queue), w.leaders[move.destination].get(move.queue)
        if src is None or dst is None:
            return None
        out = []
        for p in range(PARTS):
            s, d = src.logs[p], dst.logs[p]
            n = w.rng.randint(0, 6)
            d.extend(s[len(d) : len(d) + n])  # appends where the destination ends (move_copy's check)
            out.append(PartitionProgress(len(s), len(s), src.sealed, len(d)))
        return out

    def forget(self, queue: str) -> None:
        pass


class Local:
    """A cluster controller's queue operations: the queue key in the cluster's namespace."""

    def __init__(self, etcd: MemoryEtcd, cluster: str) -> None:
        self.etcd, self.cluster = etcd, cluster

    def _key(self, queue: str) -> str:
        return cluster_prefix(self.cluster) + cluster_queue_key(queue)

    def create(self, queue: str, settings: dict[str, Any]) -> None:
        self.etcd.put(self._key(queue), json.dumps({"settings": settings, "partitions": PARTS}).encode())

    def delete(self, queue: str) -> None:
        self.etcd.delete(self._key(queue))

    def seal(self, queue: str, sealed: bool) -> None:
        held = local_queue(self.etcd, self.cluster, queue)
        assert held is not None
        self.etcd.put(
            self._key(queue), json.dumps({**held, "settings": {**held["settings"], "sealed": sealed}}).encode()
        )


class World:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.now = 1_000_000
        self.etcd = MemoryEtcd(self.now)
        self.down: set[str] = set()  # clusters cut off: no report, no controller, no copy, no clients
        self.leaders: dict[str, dict[str, Leader]] = {c: {} for c in CLUSTERS}
        self.managers: dict[str, tuple[Manager, MoveDriver]] = {}
        self.paused: set[str] = set()
        for i in range(3):
            self.restart(f"m{i}")
        self.plane = Plane(self)
        self.acked: dict[str, list[list[int]]] = {q: [[] for _ in range(PARTS)] for q in QUEUES}
        self.next_msg = 0
        self.phases: dict[str, tuple[int, str]] = {}  # queue -> (started_ms, phase) last seen
        self.trace: list[str] = []
        self.done = self.cancelled = self.kills = 0
        for q in QUEUES:  # each queue starts on a, placed by a manager long ago
            self.etcd.put(queue_key(q), QueuePlacement(q, ("a",) * PARTS, 1).to_json())
            Local(self.etcd, "a").create(q, {"partitions": PARTS})
            self.leaders["a"][q] = Leader()
            self.leaders["a"][q].sealed = False

    def restart(self, name: str) -> None:
        self.managers[name] = (Manager(self.etcd, name, f"tcp://{name}", lease_ttl_s=3), MoveDriver(self.etcd, name))
        self.paused.discard(name)

    def run(self, events: int) -> None:
        for _ in range(events):
            r = self.rng.random()
            if r < 0.45:
                self.tick()
            elif r < 0.75:
                self.produce()
            elif r < 0.83:
                self.ask()
            elif r < 0.85:
                q = self.rng.choice(QUEUES)
                try:
                    cancel_move(self.etcd, q)
                    self.trace.append(f"cancel {q}")
                except FabricError:
                    pass
            elif r < 0.96:
                name = self.rng.choice(sorted(self.managers))
                if self.managers[name][0].is_manager and self.rng.random() < 0.6:
                    self.kills += 1
                if name in self.paused or self.rng.random() < 0.6:
                    self.restart(name)  # kill -9 and start again: the old lease lapses by itself
                    self.trace.append(f"kill manager {name}")
                else:
                    self.paused.add(name)
                    self.trace.append(f"pause manager {name}")
            else:
                c = self.rng.choice(CLUSTERS)
                (self.down.discard if c in self.down else self.down.add)(c)
                self.trace.append(f"{c} {'down' if c in self.down else 'up'}")
            self.check()

    def tick(self, heal: bool = False) -> None:
        self.now += self.rng.randint(100, 3000)
        self.etcd.advance(self.now)
        for c in CLUSTERS:
            if c in self.down:
                continue
            report = ClusterReport(c, (), Health(3, 0, 0, "n1", 1), Utilisation(0, 0, 0, 0, 0, 1, 0), self.now)
            self.etcd.put(cluster_key(c), report.to_json())
            apply_moves(self.etcd, c, Local(self.etcd, c))
            for q in QUEUES:  # the leaders learn their queue key, some ticks late
                if heal or self.rng.random() < 0.5:
                    held = local_queue(self.etcd, c, q)
                    if held is None:
                        self.leaders[c].pop(q, None)
                    else:
                        self.leaders[c].setdefault(q, Leader()).sealed = bool(held["settings"].get("sealed"))
        for name, (m, driver) in sorted(self.managers.items()):
            if name in self.paused:
                if self.rng.random() < 0.3:  # paused between its keepalive and its driver: old epoch
                    driver.step(self.now, m.epoch, self.plane)
                continue
            m.step(self.now)
            driver.step(self.now, m.epoch, self.plane)
        self.trace.append(f"tick {self.now}")

    def produce(self) -> None:
        q = self.rng.choice(QUEUES)
        kv = self.etcd.get(queue_key(q))
        assert kv is not None
        where = QueuePlacement.from_json(kv.value).clusters[0]
        if self.rng.random() < 0.25:
            where = self.rng.choice(CLUSTERS)  # a client with an old map
        leader = self.leaders[where].get(q)
        if where in self.down or leader is None or leader.sealed:
            return  # refused (QUEUE_MOVED, UNKNOWN_QUEUE, unreachable): nothing written, retried later
        p = self.rng.randrange(PARTS)
        leader.logs[p].append(self.next_msg)
        self.acked[q][p].append(self.next_msg)
        self.trace.append(f"produce {self.next_msg} to {where}/{q}/{p}")
        self.next_msg += 1

    def ask(self) -> None:
        q, to = self.rng.choice(QUEUES), self.rng.choice(CLUSTERS)
        try:
            move = request_move(self.etcd, q, to, self.now)
        except FabricError:
            return
        self.trace.append(f"move {q} {move.source} -> {to}")

    def check(self) -> None:
        for q in QUEUES:
            writable = [c for c in CLUSTERS if (x := self.leaders[c].get(q)) is not None and not x.sealed]
            assert len(writable) <= 1, f"{q} writable on {writable}"
            move = read_move(self.etcd, q)
            if move is None:
                continue
            seen = self.phases.get(q)
            if seen is not None and seen[0] == move.started_ms and seen[1] != move.phase:
                assert any(k[0] == seen[1] and v == move.phase for k, v in TRANSITIONS.items()), (
                    f"{q}: {seen[1]} -> {move.phase}"
                )
                self.done += move.phase == DONE
                self.cancelled += move.phase == "cancelled"
            self.phases[q] = (move.started_ms, move.phase)

    def settle(self) -> None:
        """Heal everything and let the moves finish; then every acknowledged message is in the
        copy the directory names, once and in order."""
        self.down.clear()
        for name in list(self.paused):
            self.restart(name)
        for _ in range(400):
            self.tick(heal=True)
            self.check()
            moves = [read_move(self.etcd, q) for q in QUEUES]
            if all(m is None or m.finished for m in moves):
                break
        else:
            raise AssertionError(f"moves did not finish: {[read_move(self.etcd, q) for q in QUEUES]}")
        for q in QUEUES:
            kv = self.etcd.get(queue_key(q))
            assert kv is not None
            home = QueuePlacement.from_json(kv.value).clusters[0]
            leader = self.leaders[home][q]
            assert not leader.sealed, f"{q} is sealed on {home}, where the directory points"
            assert leader.logs == self.acked[q], f"{q} on {home}: {leader.logs} != acked {self.acked[q]}"
            for c in CLUSTERS:
                if c != home:
                    assert q not in self.leaders[c], f"{q} left behind on {c}"


def run_seed(seed: int, events: int = EVENTS) -> World:
    world = World(seed)
    try:
        world.run(events)
        world.settle()
    except AssertionError as e:
        trace = "\n  ".join(world.trace[-30:])
        raise AssertionError(f"seed {seed}: {e}\n  last events:\n  {trace}\nreplay: FABRIC_SIM_SEED={seed}") from e
    return world


@functools.cache
def _world(seed: int) -> World:
    return run_seed(seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_seed(seed: int) -> None:
    _world(seed)


def test_the_runs_move_cancel_and_kill_managers_mid_move() -> None:
    worlds = [_world(s) for s in range(4)]
    assert sum(w.done for w in worlds) > 3, "too few moves finished"
    assert sum(w.cancelled for w in worlds) > 0, "no move was rolled back"
    assert sum(w.kills for w in worlds) > 3
    assert sum(len(x) for w in worlds for q in QUEUES for x in w.acked[q]) > 100


def test_a_run_replays_exactly() -> None:
    a, b = run_seed(3, 150), run_seed(3, 150)
    assert a.trace == b.trace and a.etcd.revision == b.etcd.revision
