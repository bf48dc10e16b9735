"""A seeded deterministic simulation of a stream group: consumers that join, leave, crash, come
back under a new id and confirm revocations slowly, and a node that pushes each partition's
messages to its owner. After every event: no two members hold a partition at once, every
consumer holds exactly what it was told, commits come only from the holder, and each
partition is consumed in order with nothing skipped (a crash may cause repeats from the last
commit, never loss). At the end everything produced has been consumed.

A failure names its seed; rerun one with ``pytest -k 'simulation and 7'`` or raise the number
of seeds with FABRIC_GROUP_SIM_SEEDS.
"""

from __future__ import annotations

import os
import random
from collections import deque
from dataclasses import dataclass, field

import pytest

from fabric.errors import UnknownMember
from fabric.push.groups import Assign, Change, Revoke, StreamGroup

SEEDS = int(os.environ.get("FABRIC_GROUP_SIM_SEEDS", "20"))
EVENTS = 2_000
TIMEOUT_MS = 1_000
HEARTBEAT_MS = 300  # a third of the session timeout: a live consumer never expires
TICK_MS_MAX = 300
INBOX_MAX = 8
CONSUMERS_MAX = 6


@dataclass
class Consumer:
    id: str
    last_beat_ms: int
    position: dict[int, int] = field(default_factory=dict)  # held partition -> next offset to consume
    releasing: set[int] = field(default_factory=set)  # told to revoke, not yet confirmed
    inbox: dict[int, deque[int]] = field(default_factory=dict)  # pushed, not yet consumed


class Sim:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.n = self.rng.randint(1, 8)
        self.group = StreamGroup(self.n, session_timeout_ms=TIMEOUT_MS)
        self.now = 0
        self.produced = [0] * self.n  # offsets 0..produced-1 exist
        self.committed = [0] * self.n  # the group's committed offset
        self.cursor = [0] * self.n  # the node's next offset to push to the current owner
        self.high = [0] * self.n  # one past the highest offset ever consumed
        self.repeat_below = [0] * self.n  # offsets below this may be consumed twice (a holder crashed)
        self.live: dict[str, Consumer] = {}
        self.crashed: set[str] = set()  # processes dead, maybe still members until expiry
        self.restarts = 0  # crashed processes waiting to come back under a new id
        self.next_id = 0
        self.trace: list[str] = []
        self.steps = 0

    # ------------------------------------------------------------ the node telling members

    def deliver(self, changes: list[Change]) -> None:
        for c in changes:
            consumer = self.live.get(c.member)
            if isinstance(c, Revoke):
                if consumer is not None:
                    assert set(c.partitions) <= set(consumer.position) - consumer.releasing
                    consumer.releasing.update(c.partitions)
                continue
            assert isinstance(c, Assign)
            for p in c.partitions:
                assert all(p not in k.position for k in self.live.values()), f"{p} given while held"
                assert self.committed[p] <= self.high[p], "a new owner would skip messages"
                self.cursor[p] = self.committed[p]
                if consumer is not None:
                    consumer.position[p] = self.committed[p]
                    consumer.inbox[p] = deque()

    def commit(self, consumer: Consumer, p: int) -> None:
        assert self.group.owner(p) == consumer.id, f"commit of {p} from {consumer.id}, not its holder"
        assert consumer.position[p] >= self.committed[p], "commits never go back"
        self.committed[p] = consumer.position[p]

    def release(self, consumer: Consumer, p: int) -> None:
        self.commit(consumer, p)
        del consumer.position[p]
        del consumer.inbox[p]
        consumer.releasing.discard(p)

    # ------------------------------------------------------------ events

    def join(self) -> None:
        cid = f"c{self.next_id}"
        self.next_id += 1
        self.live[cid] = Consumer(cid, self.now)
        self.trace.append(f"{self.now} join {cid}")
        self.deliver(self.group.join(cid, self.now))

    def leave(self, consumer: Consumer) -> None:
        self.trace.append(f"{self.now} leave {consumer.id}")
        for p in sorted(consumer.position):
            self.release(consumer, p)
        del self.live[consumer.id]
        self.deliver(self.group.leave(consumer.id, self.now))

    def crash(self, consumer: Consumer) -> None:
        self.trace.append(f"{self.now} crash {consumer.id} holding {sorted(consumer.position)}")
        del self.live[consumer.id]
        self.crashed.add(consumer.id)
        self.restarts += 1

    def confirm(self, consumer: Consumer) -> None:
        """A slow confirmation of some of what was asked back: commit, stop, confirm."""
        parts = self.rng.sample(sorted(consumer.releasing), self.rng.randint(1, len(consumer.releasing)))
        self.trace.append(f"{self.now} revoked {consumer.id} {sorted(parts)}")
        for p in parts:
            self.release(consumer, p)
        self.deliver(self.group.revoked(consumer.id, parts, self.now))

    def produce(self) -> None:
        self.produced[self.rng.randrange(self.n)] += self.rng.randint(1, 5)

    def push(self) -> None:
        """The node sends each owned partition's next messages to its owner (lost if it is dead)."""
        for m in self.group.members:
            consumer = self.live.get(m)
            for p in sorted(self.group.owned(m)):
                room = INBOX_MAX - (len(consumer.inbox[p]) if consumer else 0)
                upto = min(self.produced[p], self.cursor[p] + max(0, room))
                if consumer is not None:
                    consumer.inbox[p].extend(range(self.cursor[p], upto))
                self.cursor[p] = upto

    def consume(self, consumer: Consumer) -> None:
        for p in sorted(consumer.position):
            for _ in range(self.rng.randint(0, 4)):
                if not consumer.inbox[p]:
                    break
                o = consumer.inbox[p].popleft()
                assert self.group.owner(p) == consumer.id, f"{consumer.id} consumed {p} it does not hold"
                assert o == consumer.position[p], (
                    f"partition {p}: {consumer.id} got {o}, expected {consumer.position[p]}"
                )
                assert o <= self.high[p], f"partition {p}: offset {o} skips {self.high[p]}..{o - 1}"
                assert o >= self.high[p] or o < self.repeat_below[p], f"partition {p}: {o} repeated without a crash"
                consumer.position[p] = o + 1
                self.high[p] = max(self.high[p], o + 1)

    def tick(self) -> None:
        self.now += self.rng.randint(1, TICK_MS_MAX)
        for consumer in self.live.values():
            if self.now - consumer.last_beat_ms >= HEARTBEAT_MS:
                self.group.heartbeat(consumer.id, self.now)
                consumer.last_beat_ms = self.now
        before = {m: self.group.owned(m) | self.group.revoking(m) for m in self.group.members}
        changes = self.group.expire(self.now)
        gone = set(before) - set(self.group.members)
        assert gone <= self.crashed, f"live consumers expired: {sorted(gone - self.crashed)}"
        for m in sorted(gone):
            self.trace.append(f"{self.now} expired {m} holding {sorted(before[m])}")
            self.crashed.discard(m)
            for p in before[m]:
                self.repeat_below[p] = max(self.repeat_below[p], self.high[p])
        self.deliver(changes)

    def step(self) -> None:
        self.steps += 1
        live = sorted(self.live)
        pick = self.live[self.rng.choice(live)] if live else None
        roll = self.rng.random()
        if roll < 0.20:
            self.produce()
        elif roll < 0.40:
            self.push()
        elif roll < 0.62:
            if pick:
                self.consume(pick)
        elif roll < 0.80:
            self.tick()
        elif roll < 0.88:
            if pick and pick.releasing:
                self.confirm(pick)
        elif roll < 0.92:
            if pick:
                for p in sorted(set(pick.position) - pick.releasing):
                    self.commit(pick, p)
        elif roll < 0.95:
            if len(self.live) < CONSUMERS_MAX:
                self.join()
        elif roll < 0.97:
            if pick:
                self.leave(pick)
        elif roll < 0.99:
            if pick:
                self.crash(pick)
        elif self.restarts:
            self.restarts -= 1
            self.join()  # the crashed process comes back as a new member

    # ------------------------------------------------------------ checks

    def check(self) -> None:
        self.group.check_invariants()
        holders: dict[int, str] = {}
        for m in self.group.members:
            assert m in self.live or m in self.crashed, f"member {m} is neither live nor crashed"
            for p in self.group.owned(m) | self.group.revoking(m):
                assert p not in holders, f"partition {p} held by {holders[p]} and {m}"
                holders[p] = m
        for consumer in self.live.values():
            assert consumer.id in self.group, f"live {consumer.id} is not a member"
            told = set(consumer.position)
            assert told == self.group.owned(consumer.id) | self.group.revoking(consumer.id), consumer.id
            assert consumer.releasing == self.group.revoking(consumer.id), consumer.id
            for p, q in consumer.inbox.items():
                assert list(q) == list(range(consumer.position[p], consumer.position[p] + len(q)))
        if self.group.members:
            assert len(holders) == self.n, "a free partition while the group has members"
        for p in range(self.n):
            assert self.committed[p] <= self.high[p] <= self.produced[p]

    def drain(self) -> None:
        """Stop the faults; let crashed members expire and everyone confirm: everything gets consumed."""
        if not self.live:
            self.join()
        for _ in range(10_000):
            if all(self.high[p] == self.produced[p] for p in range(self.n)) and not self.crashed:
                return
            for consumer in list(self.live.values()):
                if consumer.releasing:
                    self.confirm(consumer)
            self.tick()
            self.push()
            for consumer in list(self.live.values()):
                self.consume(consumer)
            self.check()
        raise AssertionError(f"not drained: consumed {self.high} of {self.produced}, crashed {sorted(self.crashed)}")


@pytest.mark.parametrize("seed", range(SEEDS))
def test_group_simulation(seed: int) -> None:
    sim = Sim(seed)
    try:
        for _ in range(3):
            sim.join()
        for _ in range(EVENTS):
            sim.step()
            sim.check()
        sim.drain()
    except (AssertionError, UnknownMember) as e:
        tail = "\n  ".join(sim.trace[-15:])
        raise AssertionError(f"seed={seed} event #{sim.steps} (n={sim.n}): {e}\n  last events:\n  {tail}") from e
    assert sum(sim.high) == sum(sim.produced)
