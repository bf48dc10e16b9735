"""A seeded deterministic simulation of a key_shared group: consumers that work through what is
pushed to them, nack now and then, extend leases, hang (stop acking, so their leases expire and
the node removes them after a session timeout), crash (leave without acking) and come back, over
a partition of messages with ~50 keys that the node offers as it goes.

After every delivery: no other member holds a lease on the key, everything older of the key is
done or held by the same member, and the receive count is the number of deliveries so far. Every
few events the table's view (holders, counts, ``verify``) must agree with the simulation's. At the
end every message was acked or dead-lettered (none lost, none both), and for each key none of whose
messages was ever given back (nack, expiry, crash), the first acks came in offset order.

A failure names its seed; rerun one with ``pytest -k 'simulation and 7'`` or raise the number of
seeds with FABRIC_KEYSHARED_SIM_SEEDS.
"""

from __future__ import annotations

import os
import random
from collections import defaultdict, deque
from dataclasses import dataclass, field

import pytest

from fabric.errors import NotLeaseHolder
from fabric.push.keyshared import KeySharedLeases

SEEDS = int(os.environ.get("FABRIC_KEYSHARED_SIM_SEEDS", "20"))
EVENTS = 2_000
VISIBILITY_MS = 1_000
SESSION_MS = 2_500  # a hung member is removed by the node after this long
TICK_MS_MAX = 300
KEYS = [b"key-%d" % i for i in range(50)]
PENDING_MAX = 300  # how far ahead the node offers
INBOX_MAX = 24
CHECK_EVERY = 25


@dataclass
class Consumer:
    name: str
    inbox: deque[tuple[int, int]] = field(default_factory=deque)  # (offset, receive count) pushed, not handled
    hung_since: int | None = None  # stopped working; still a member until the node removes it


class Sim:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.max_rc = self.rng.choice([0, 3, 5])
        self.t = KeySharedLeases(
            0,
            visibility_ms=VISIBILITY_MS,
            max_receive_count=self.max_rc,
            virtual_points=self.rng.choice([16, 64]),
        )
        self.now = 0
        self.log: list[bytes | None] = []  # the partition: the key of each offset
        self.consumers: dict[str, Consumer] = {}
        self.offline: list[str] = []  # crashed or removed; they come back under the same name
        self.leases: dict[int, tuple[str, int]] = {}  # offset -> (member, deadline) as the consumers were told
        self.deliveries: dict[int, int] = defaultdict(int)
        self.open: dict[bytes | None, set[int]] = defaultdict(set)  # per key: offered, not acked or dead-lettered
        self.acked: dict[int, str] = {}
        self.dead_lettered: set[int] = set()
        self.first_acks: dict[bytes | None, list[int]] = defaultdict(list)
        self.given_back: set[int] = set()  # offsets released at least once (nack, expiry, crash)
        self.disturbed: set[bytes | None] = set()  # keys with a message given back at least once
        self.last_holder: dict[bytes, str] = {}
        self.handovers = 0
        for i in range(self.rng.randint(4, 8)):
            self.join(f"m{i}")

    # ------------------------------------------------------------ the node

    def feed(self) -> None:
        """Offer what the log has, as far as the pending bound allows."""
        room = PENDING_MAX - self.t.pending
        pos = self.t.offered_upto
        if room > 0 and pos < len(self.log):
            records = [(o, self.log[o]) for o in range(pos, min(len(self.log), pos + room))]
            self.t.offer(records)
            for o, key in records:
                self.open[key].add(o)

    def produce(self) -> None:
        for _ in range(self.rng.randint(1, 6)):
            self.log.append(None if self.rng.random() < 0.1 else self.rng.choice(KEYS))
        self.feed()

    def join(self, name: str) -> None:
        self.t.join(name)
        self.consumers[name] = Consumer(name)

    def remove(self, name: str) -> None:
        """The member leaves (crash or session expiry): every lease it still has is given back at once."""
        mine = [o for o, (m, d) in self.leases.items() if m == name and d > self.now]
        assert self.t.leave(name, self.now) == len(mine)
        self.prune()
        for o in mine:
            del self.leases[o]
            self.give_back(o)
        del self.consumers[name]
        self.offline.append(name)

    def prune(self) -> None:
        """Leases past their deadline are gone (the table released them): their keys were disturbed."""
        for o in [o for o, (_, d) in self.leases.items() if d <= self.now]:
            del self.leases[o]
            self.give_back(o)

    def give_back(self, o: int) -> None:
        self.given_back.add(o)
        self.disturbed.add(self.log[o])

    # ------------------------------------------------------------ consumers

    def poll(self, c: Consumer, max_records: int) -> None:
        for d in self.t.deliver(c.name, self.now, max_records):
            for o in range(d.start, d.end):
                self.delivered(c, o, d.receive_count, d.deadline_ms)

    def delivered(self, c: Consumer, o: int, rc: int, deadline: int) -> None:
        self.prune()
        key = self.log[o]
        self.deliveries[o] += 1
        assert rc == self.deliveries[o], f"offset {o} delivered with rc {rc}, {self.deliveries[o]} deliveries"
        assert o not in self.leases and o not in self.acked and o not in self.dead_lettered
        if key is not None:
            for other in self.open[key]:
                holder = self.leases.get(other)
                assert holder is None or holder[0] == c.name, f"key {key!r}: {o} to {c.name}, {other} held by {holder}"
                if other < o:
                    assert holder is not None or self.t.state(other) == "dead", f"key {key!r}: {o} before {other}"
            if self.last_holder.get(key, c.name) != c.name:
                self.handovers += 1
            self.last_holder[key] = c.name
        assert rc == 1 or o in self.given_back
        self.leases[o] = (c.name, deadline)
        c.inbox.append((o, rc))

    def work(self, c: Consumer) -> None:
        """Handle the oldest pushed messages: mostly ack, sometimes nack or extend the lease."""
        for _ in range(self.rng.randint(1, 4)):
            if not c.inbox:
                return
            o, _ = c.inbox.popleft()
            r = self.rng.random()
            if r < 0.88:
                self.move(c, o, "ack")
            elif r < 0.94:
                self.move(c, o, "nack", self.rng.choice([0, 0, 50, 500]))
            else:
                self.move(c, o, "extend")
                c.inbox.appendleft((o, 0))
                return

    def move(self, c: Consumer, o: int, verb: str, delay_ms: int = 0) -> None:
        self.prune()
        mine = self.leases.get(o, ("", 0))[0] == c.name
        settled = o in self.acked or o in self.dead_lettered

        def call() -> int:
            if verb == "ack":
                return self.t.ack(c.name, o, o + 1, self.now)
            if verb == "nack":
                return self.t.nack(c.name, o, o + 1, self.now, delay_ms)
            return self.t.change_visibility(c.name, o, o + 1, self.now, 2 * VISIBILITY_MS)

        if not mine and not settled:
            with pytest.raises(NotLeaseHolder):
                call()
            return
        assert call() == (1 if mine else 0)
        if not mine:
            return
        key = self.log[o]
        if verb == "ack":
            del self.leases[o]
            self.acked[o] = c.name
            self.open[key].discard(o)
            self.first_acks[key].append(o)
        elif verb == "nack":
            del self.leases[o]
            self.give_back(o)
        else:
            self.leases[o] = (c.name, self.now + 2 * VISIBILITY_MS)

    def dead_letters(self) -> None:
        self.prune()
        for s, e, rc in self.t.take_dead(self.now):
            assert 0 < self.max_rc <= rc
            for o in range(s, e):
                assert o not in self.acked and o not in self.leases
                self.dead_lettered.add(o)
                self.open[self.log[o]].discard(o)
                assert o in self.given_back
            assert self.t.settle(s, e) == e - s

    # ------------------------------------------------------------ events

    def tick(self) -> None:
        self.now += self.rng.randint(1, TICK_MS_MAX)
        for c in list(self.consumers.values()):
            if c.hung_since is not None and self.now - c.hung_since > SESSION_MS:
                self.remove(c.name)

    def step(self) -> None:
        r = self.rng.random()
        working = [c for c in self.consumers.values() if c.hung_since is None]
        if r < 0.15:
            self.produce()
        elif r < 0.40 and working:
            c = self.rng.choice(working)
            if len(c.inbox) < INBOX_MAX:
                self.feed()
                self.poll(c, self.rng.randint(1, 8))
        elif r < 0.75 and working:
            self.work(self.rng.choice(working))
        elif r < 0.90:
            self.tick()
        elif r < 0.93:
            self.dead_letters()
        elif r < 0.945 and working:
            self.remove(self.rng.choice(working).name)  # a crash: gone without acking
        elif r < 0.96 and working:
            self.rng.choice(working).hung_since = self.now  # a hang: still a member, acks nothing
        elif r < 0.98 and self.offline:
            self.join(self.offline.pop(self.rng.randrange(len(self.offline))))

    def check(self) -> None:
        """The table agrees with what the consumers were told, and each key has at most one holder."""
        self.t.expire(self.now)
        self.prune()
        self.t.verify()
        assert self.t.in_flight == len(self.leases)
        for key, offsets in self.open.items():
            holders = {self.t.holder(o) for o in offsets} - {None}
            assert len(holders) <= (1 if key is not None else len(self.consumers))
            for o in offsets:
                held = self.leases.get(o)
                assert self.t.holder(o) == (held[0] if held else None)
        assert self.t.floor <= self.t.offered_upto <= len(self.log)

    def drain(self) -> None:
        """Hung members are removed, everyone comes back and works everything off."""
        for c in [c for c in self.consumers.values() if c.hung_since is not None]:
            self.remove(c.name)
        while self.offline:
            self.join(self.offline.pop())
        for _ in range(10_000):
            if self.t.floor == len(self.log):
                return
            self.feed()
            for c in list(self.consumers.values()):
                self.poll(c, 64)
                while c.inbox:
                    self.move(c, c.inbox.popleft()[0], "ack")
            self.dead_letters()
            self.now += 100
        raise AssertionError(f"not drained: floor {self.t.floor} of {len(self.log)}")


@pytest.mark.parametrize("seed", range(SEEDS))
def test_keyshared_simulation(seed: int) -> None:
    sim = Sim(seed)
    for i in range(EVENTS):
        sim.step()
        if i % CHECK_EVERY == 0:
            sim.check()
    sim.drain()
    sim.check()
    produced = set(range(len(sim.log)))
    assert set(sim.acked) | sim.dead_lettered == produced, "a message was lost"
    assert not set(sim.acked) & sim.dead_lettered, "a message was both acked and dead-lettered"
    assert sim.t.pending == 0 and sim.t.floor == sim.t.offered_upto == len(sim.log)
    for key, acks in sim.first_acks.items():
        if key is None:
            continue
        if key not in sim.disturbed:  # nothing of the key ever given back: every message in order
            assert acks == [o for o, k in enumerate(sim.log) if k == key], f"key {key!r} acked out of order"
        latest = -1
        for o in acks:  # a message first acked after a newer one of its key must have been given back
            assert o > latest or o in sim.given_back, f"key {key!r}: {o} acked after {latest}"
            latest = max(latest, o)
    assert len(sim.log) > 500 and sim.handovers > 0, "the simulation did too little"
    assert len(sim.given_back) < 0.7 * len(sim.log), "the order check saw too few calm messages"
