"""The idempotent producer's sequence state machine (fabric.client.inflight), driven against the
node's own sequence checks (fabric.store.producers.ProducerStates) over a simulated connection
that loses requests and replies, refuses with a full disk, times out and forgets.

Properties: nothing is stored twice; every acknowledged batch is stored, where its reply said;
without a failure batches are stored in the order they were sealed; only a batch that met a
terminal condition fails; and once faults stop, every batch resolves (nothing stuck)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.client.inflight import FAIL, FAIL_GAP, RENUMBER, RETRY, WAIT, WIDE_BATCH_BYTES, Lane
from fabric.errors import DiskFull, FabricError, OutOfOrderSequence, ProducerFenced
from fabric.store.producers import ProducerStates

RETRIES = 3


@dataclass(eq=False)
class B:
    """A batch as the Lane sees it (fabric.client.inflight.Entry) plus what the test tracks."""

    serial: int
    count: int
    ident: tuple[int, int] | None = None
    sequence: int = -1
    inflight: bool = False
    unknown: bool = False
    settled: bool = False
    sent_no: int = 0
    refused_at: int = -1
    retry_at: float = 0.0
    encoded: bytes | bytearray | None = None
    nbytes: int = 100
    tries: int = 0
    outcome: str | None = None  # "ok" or the error class name
    offset: int | None = None


@dataclass
class Sim:
    """One partition: a producer's lane, its queues, a connection and a node."""

    lane: Lane[B] = field(default_factory=lambda: Lane((0, 0)))
    node: ProducerStates = field(default_factory=ProducerStates)
    log: list[int] = field(default_factory=list)  # serials, in offset order
    batches: list[B] = field(default_factory=list)
    ready: list[B] = field(default_factory=list)
    inflight: dict[int, B] = field(default_factory=dict)
    to_node: list[tuple[int, B, tuple[int, int], int]] = field(default_factory=list)
    to_client: list[tuple[int, int | None, FabricError | None]] = field(default_factory=list)
    disk_full: int = 0  # appends still to refuse
    next_rid: int = 1
    next_pid: int = 1
    gaps: int = 0
    now: float = 0.0

    # -------------------------------------------------------------- producer side

    def new_batch(self, count: int, nbytes: int = 100) -> None:
        b = B(len(self.batches), count, nbytes=nbytes)
        self.batches.append(b)
        self.ready.append(b)

    def send(self) -> bool:
        for b in sorted(self.ready, key=lambda x: x.serial):
            if self.lane.may_send(b, self.now):
                if b.ident is None:
                    self.lane.number(b, b.count)
                self.ready.remove(b)
                self.lane.sent(b)
                rid, self.next_rid = self.next_rid, self.next_rid + 1
                self.inflight[rid] = b
                assert b.ident is not None
                self.to_node.append((rid, b, b.ident, b.sequence))
                return True
        return False

    def receive(self) -> None:
        rid, offset, err = self.to_client.pop(0)
        b = self.inflight.pop(rid, None)
        if b is None:
            return  # a reply to a request given up on (request timeout): ignored
        if err is None:
            self.lane.acked(b)
            b.outcome, b.offset = "ok", offset
            return
        may_retry = err.retriable and b.tries < RETRIES
        action = self.lane.refused(b, isinstance(err, OutOfOrderSequence), may_retry, self.now, 0.5)
        if action == RETRY:
            b.tries += 1
            self.ready.append(b)
        elif action in (WAIT, RENUMBER):
            self.ready.append(b)
        else:
            assert action in (FAIL, FAIL_GAP)
            self.gaps += action == FAIL_GAP
            self.fail(b, err)

    def fail(self, b: B, err: FabricError) -> None:
        if b in self.ready:
            self.ready.remove(b)
        self.lane.failed(b)
        b.outcome = type(err).__name__

    def lose_link(self) -> None:
        """The connection broke: what was on the wire is gone; what was in flight goes again."""
        self.to_node.clear()
        self.to_client.clear()
        for b in self.inflight.values():
            self.lane.lost(b)
            self.ready.append(b)
        self.inflight.clear()

    def request_timeout(self) -> None:
        """The oldest request in flight has waited too long: sent again (its reply, if it ever
        comes, is ignored)."""
        rid = min(self.inflight)
        b = self.inflight.pop(rid)
        self.lane.lost(b)
        self.ready.append(b)

    def delivery_timeout(self) -> None:
        """The oldest unresolved batch not in flight gives up (its caller gets Timeout)."""
        waiting = [b for b in self.ready if b.outcome is None]
        if waiting:
            self.fail(min(waiting, key=lambda x: x.serial), FabricError("delivery timeout"))

    def identity(self) -> None:
        if self.lane.needs_identity():
            self.lane.adopt((self.next_pid, 0))
            self.next_pid += 1

    # ------------------------------------------------------------------ node side

    def node_step(self) -> None:
        rid, b, (pid, epoch), seq = self.to_node.pop(0)
        try:
            dup = self.node.check(pid, epoch, seq, b.count, 0)
            if dup is not None:
                self.to_client.append((rid, dup, None))
                return
            if self.disk_full:
                self.disk_full -= 1
                raise DiskFull("disk full")
        except (OutOfOrderSequence, ProducerFenced, DiskFull) as exc:
            self.to_client.append((rid, None, exc))
            return
        base = len(self.log)
        self.log.append(b.serial)
        self.node.record(pid, epoch, seq, b.count, base, 0)
        self.to_client.append((rid, base, None))

    # ------------------------------------------------------------------ driving

    def step(self, event: str) -> None:
        self.now += 0.1
        if event == "new":  # small and big batches: the window is 5 deep or 16
            self.new_batch(1 + len(self.batches) % 3, WIDE_BATCH_BYTES if len(self.batches) % 4 else 100)
        elif event == "send":
            self.send()
        elif event == "node" and self.to_node:
            self.node_step()
        elif event == "reply" and self.to_client:
            self.receive()
        elif event == "link":
            self.lose_link()
        elif event == "unnoticed" and self.to_node:
            self.to_node.pop(0)  # a request lost on the wire; the client learns later (link)
        elif event == "timeout" and self.inflight:
            self.request_timeout()
        elif event == "disk":
            self.disk_full = 2
        elif event == "expire":
            self.delivery_timeout()
        self.identity()
        self.check()

    def settle(self) -> None:
        """No more faults: run until nothing moves; everything must have resolved."""
        for _ in range(10_000):
            self.now += 1.0
            self.identity()
            if self.to_client:
                self.receive()
            elif self.to_node:
                self.node_step()
            elif not self.send():
                if self.inflight:  # requests whose replies were lost without a link break
                    self.request_timeout()
                else:
                    break
            self.check()
        stuck = [b for b in self.batches if b.outcome is None]
        assert not stuck, f"stuck: {stuck[:3]} lane {self.lane}"

    def check(self) -> None:
        assert len(self.log) == len(set(self.log)), "a batch was stored twice"
        for b in self.batches:
            if b.outcome == "ok":
                assert b.offset is not None and self.log[b.offset] == b.serial


EVENTS = st.sampled_from(
    ["new", "new", "send", "send", "node", "node", "reply", "reply", "link", "unnoticed", "timeout", "disk", "expire"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, max_size=120))
def test_stored_once_acknowledged_stored_and_never_stuck(events):
    sim = Sim()
    for e in events:
        sim.step(e)
    sim.settle()
    assert sim.gaps == 0, "the node lost nothing: no gap may be unrecoverable"
    failed = [b for b in sim.batches if b.outcome != "ok"]
    assert all(b.outcome in ("DiskFull", "FabricError") for b in failed)
    if not failed:
        assert sim.log == sorted(sim.log), "stored out of order without any failure"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(["new", "send", "send", "node", "reply", "link", "unnoticed", "timeout"]), max_size=120)
)
def test_without_terminal_failures_everything_is_stored_once_in_order(events):
    sim = Sim()
    for e in events:
        sim.step(e)
    sim.settle()
    assert all(b.outcome == "ok" for b in sim.batches)
    assert sim.log == list(range(len(sim.batches)))  # every batch, once, in order
    assert sim.lane.ident == (0, 0)  # no reset was needed


# ---------------------------------------------------------------------- the three rules, by example


def _sim_with(n: int) -> Sim:
    sim = Sim()
    for _ in range(n):
        sim.new_batch(2)
    while sim.send():
        pass
    return sim


def test_the_window_is_16_deep_for_big_batches_and_5_while_any_is_small():
    sim = Sim()
    for _ in range(20):
        sim.new_batch(2, WIDE_BATCH_BYTES)
    while sim.send():
        pass
    assert len(sim.inflight) == 16 and sim.node.recent == 16  # no deeper than the node remembers
    sim = Sim()
    for i in range(20):
        sim.new_batch(2, 100 if i == 3 else WIDE_BATCH_BYTES)
    while sim.send():
        pass
    assert len(sim.inflight) == 5  # the small fourth keeps it narrow, for big ones behind it too
    for _ in range(4):  # the first four stored and acknowledged: the small one has left
        sim.node_step()
        sim.receive()
    while sim.send():
        pass
    assert len(sim.inflight) == 16 and [b.serial for b in sim.inflight.values()] == list(range(4, 20))


def test_after_a_reconnect_the_window_goes_again_in_order_before_anything_newer():
    sim = _sim_with(5)
    sim.node_step()  # the first reaches the node; its reply and the rest are lost with the link
    sim.lose_link()
    sim.new_batch(2)  # newer: must wait behind the whole window
    order = []
    while sim.send():
        order.append(sim.to_node[-1][1].serial)
    assert order == [0, 1, 2, 3, 4]  # the sixth is numbered only once the window is back in flight
    assert sim.send() is False
    sim.settle()
    assert sim.log == [0, 1, 2, 3, 4, 5]
    assert [b.outcome for b in sim.batches] == ["ok"] * 6


def test_out_of_order_while_predecessors_are_in_flight_waits_and_goes_again():
    sim = _sim_with(3)
    sim.to_node.pop(0)  # batch 0 is lost on the wire, unnoticed
    sim.node_step()  # batch 1: OutOfOrderSequence (0 is missing)
    sim.receive()
    b1 = sim.batches[1]
    assert b1.outcome is None and b1 in sim.ready and b1.tries == 0  # retriable, no retry counted
    assert not sim.lane.may_send(b1, sim.now)  # not before batch 0 has gone again
    sim.lose_link()  # the client learns batch 0 is lost
    sent = []
    while sim.send():
        sent.append(sim.to_node[-1][1].serial)
    assert sent == [0, 1, 2]
    sim.settle()
    assert sim.log == [0, 1, 2]


def test_an_unrecoverable_gap_fails_only_its_batch_and_the_partition_carries_on():
    sim = _sim_with(1)
    sim.settle()
    sim.node = ProducerStates()  # the node forgot this producer (its state expired)
    sim.new_batch(2)
    sim.new_batch(2)
    while sim.send():
        pass
    sim.node_step()
    sim.node_step()
    sim.receive()  # batch 1 (sequence 2): nothing before it can still arrive: a gap for good
    assert sim.batches[1].outcome == "OutOfOrderSequence" and sim.gaps == 1
    assert sim.lane.ident is None
    sim.receive()  # batch 2: refused too under the old identity; it goes again under a new one
    assert sim.batches[2].outcome is None and sim.batches[2].ident is None
    sim.identity()
    assert sim.lane.ident == (1, 0)
    sim.new_batch(2)
    sim.settle()
    assert [b.outcome for b in sim.batches] == ["ok", "OutOfOrderSequence", "ok", "ok"]
    assert sim.batches[2].ident == (1, 0) and sim.batches[2].sequence == 0
    assert sim.log == [0, 2, 3]


def test_a_terminal_failure_renumbers_what_the_node_refused_and_resends_what_it_may_have():
    sim = _sim_with(3)
    sim.disk_full = 1
    sim.node_step()  # batch 0: DiskFull
    sim.node_step()  # batch 1: out of order
    sim.receive()  # batch 0: retry after a backoff
    sim.receive()  # batch 1: early, waits for batch 0
    assert sim.batches[1].refused_at >= 0 and not sim.batches[1].inflight
    sim.fail(sim.batches[0], DiskFull("retries exhausted"))
    # batch 1 was refused (not stored): numbered again later, under the new identity; batch 2 is
    # in flight, perhaps stored: it stays under the old identity until the node says
    assert sim.batches[1].ident is None and sim.lane.old == [sim.batches[2]]
    assert not sim.lane.needs_identity()
    sim.settle()
    assert [b.outcome for b in sim.batches] == ["DiskFull", "ok", "ok"]
    assert sim.log == [1, 2]
