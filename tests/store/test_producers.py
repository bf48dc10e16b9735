"""Idempotent producer state: duplicates answered, gaps refused, zombies fenced, state rebuilt."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fabric.client.sequencer import IDEMPOTENT_IN_FLIGHT_MAX
from fabric.errors import BadParameter, OutOfOrderSequence, ProducerFenced
from fabric.protocol.batch import BatchHeader, encode_batch, parse_header, stamp
from fabric.store.producers import EPOCH_MAX, SEQUENCE_MOD, ProducerIdAllocator, ProducerStates
from tests.depth import examples

PID = 7
NOW = 1_000


def header(pid: int, epoch: int, seq: int, count: int, offset: int) -> BatchHeader:
    """A real batch header, built with the codec and stamped at ``offset``."""
    batch = bytearray(
        encode_batch([b"v"] * count, producer_id=pid, producer_epoch=epoch, base_sequence=seq, first_timestamp=NOW)
    )
    stamp(batch, offset)
    return parse_header(batch)


class Partition:
    """ProducerStates in front of a log that is just a list of headers."""

    def __init__(self, states: ProducerStates | None = None) -> None:
        self.states = states if states is not None else ProducerStates()
        self.log: list[BatchHeader] = []
        self.next_offset = 0

    def produce(self, pid: int, epoch: int, seq: int, count: int = 1, now_ms: int = NOW) -> int:
        """Append unless a duplicate; return the base offset either way."""
        dup = self.states.check(pid, epoch, seq, count, now_ms)
        if dup is not None:
            return dup
        base = self.next_offset
        self.log.append(header(pid, epoch, seq, count, base))
        self.next_offset += count
        self.states.record(pid, epoch, seq, count, base, now_ms)
        return base

    def truncate(self, offset: int) -> None:
        self.log = [h for h in self.log if h.base_offset < offset]
        self.next_offset = offset
        self.states.truncate(offset)


def without_times(states: ProducerStates) -> dict[str, object]:
    doc = json.loads(states.snapshot())
    for row in doc["producers"]:
        row[3] = None
    return doc


# ------------------------------------------------------------------ the rules


def test_not_idempotent_always_appends() -> None:
    p = Partition()
    for _ in range(3):
        assert p.states.check(-1, -1, -1, 1, NOW) is None
    p.states.record(-1, -1, -1, 2, 0, NOW)
    assert len(p.states) == 0
    assert p.states.end_offset == 2


def test_in_order_batches_append() -> None:
    p = Partition()
    assert [p.produce(PID, 0, seq, 2) for seq in (0, 2, 4)] == [0, 2, 4]
    assert p.states.next_sequence(PID) == 6
    assert len(p.log) == 3


def test_duplicate_returns_the_original_base_offset() -> None:
    p = Partition()
    p.produce(9, 0, 0, 4)  # another producer first, so offsets differ from sequences
    assert p.produce(PID, 0, 0, 3) == 4
    assert p.states.check(PID, 0, 0, 3, NOW) == 4
    assert p.produce(PID, 0, 0, 3) == 4
    assert len(p.log) == 2


@pytest.mark.parametrize("back", range(16))
def test_retry_of_each_of_the_last_sixteen_batches(back: int) -> None:
    p = Partition()
    offsets = [p.produce(PID, 0, seq, 1) for seq in range(20)]
    seq = 19 - back
    assert p.states.check(PID, 0, seq, 1, NOW) == offsets[seq]


def test_retry_older_than_the_recent_batches_is_out_of_order() -> None:
    p = Partition()
    for seq in range(20):
        p.produce(PID, 0, seq, 1)
    with pytest.raises(OutOfOrderSequence, match="older"):
        p.states.check(PID, 0, 3, 1, NOW)


def test_duplicate_with_another_record_count_is_out_of_order() -> None:
    p = Partition()
    p.produce(PID, 0, 0, 3)
    with pytest.raises(OutOfOrderSequence, match="records"):
        p.states.check(PID, 0, 0, 2, NOW)


def test_gap_raises() -> None:
    p = Partition()
    p.produce(PID, 0, 0, 3)
    with pytest.raises(OutOfOrderSequence, match="skips ahead"):
        p.states.check(PID, 0, 4, 1, NOW)
    assert p.states.check(PID, 0, 3, 1, NOW) is None


def test_unknown_producer_must_start_at_zero() -> None:
    states = ProducerStates()
    with pytest.raises(OutOfOrderSequence, match="unknown"):
        states.check(PID, 3, 5, 1, NOW)
    assert states.check(PID, 3, 0, 1, NOW) is None


def test_older_epoch_is_fenced() -> None:
    p = Partition()
    p.produce(PID, 0, 0)
    p.produce(PID, 1, 0)
    for seq in (0, 1, 5):
        with pytest.raises(ProducerFenced):
            p.states.check(PID, 0, seq, 1, NOW)


def test_old_epoch_may_write_until_the_new_one_has() -> None:
    p = Partition()
    p.produce(PID, 0, 0)
    assert p.states.check(PID, 0, 1, 1, NOW) is None  # epoch 1 exists elsewhere, but not here yet
    p.produce(PID, 1, 0)
    with pytest.raises(ProducerFenced):
        p.states.check(PID, 0, 1, 1, NOW)


def test_new_epoch_must_start_at_zero() -> None:
    p = Partition()
    p.produce(PID, 0, 0, 5)
    with pytest.raises(OutOfOrderSequence, match="new epoch"):
        p.states.check(PID, 1, 5, 1, NOW)
    assert p.states.check(PID, 1, 0, 1, NOW) is None


def test_new_epoch_forgets_the_old_batches() -> None:
    p = Partition()
    p.produce(PID, 0, 0, 1)
    p.produce(PID, 1, 0, 1)
    assert p.states.check(PID, 1, 0, 1, NOW) == 1
    assert p.states.check(PID, 1, 1, 1, NOW) is None


def test_sequence_wraps_at_2_to_the_31() -> None:
    states = ProducerStates()
    top = SEQUENCE_MOD - 3
    states.record(PID, 0, top, 2, 100, NOW)  # e.g. replayed from a log that started there
    assert states.next_sequence(PID) == SEQUENCE_MOD - 1
    assert states.check(PID, 0, SEQUENCE_MOD - 1, 4, NOW) is None  # this batch straddles the wrap
    states.record(PID, 0, SEQUENCE_MOD - 1, 4, 102, NOW)
    assert states.next_sequence(PID) == 3
    assert states.check(PID, 0, 3, 1, NOW) is None
    assert states.check(PID, 0, SEQUENCE_MOD - 1, 4, NOW) == 102
    assert states.check(PID, 0, top, 2, NOW) == 100
    with pytest.raises(OutOfOrderSequence, match="skips ahead"):
        states.check(PID, 0, 4, 1, NOW)
    with pytest.raises(OutOfOrderSequence, match="older"):
        states.check(PID, 0, SEQUENCE_MOD - 10, 1, NOW)


@pytest.mark.parametrize(
    ("pid", "epoch", "seq", "count"),
    [(PID, -1, 0, 1), (PID, EPOCH_MAX + 1, 0, 1), (PID, 0, -1, 1), (PID, 0, SEQUENCE_MOD, 1), (PID, 0, 0, 0)],
)
def test_fields_out_of_range_are_bad_parameters(pid: int, epoch: int, seq: int, count: int) -> None:
    with pytest.raises(BadParameter):
        ProducerStates().check(pid, epoch, seq, count, NOW)


def test_check_changes_nothing() -> None:
    p = Partition()
    p.produce(PID, 0, 0)
    before = p.states.snapshot()
    p.states.check(PID, 0, 1, 1, NOW + 5)
    p.states.check(PID, 1, 0, 1, NOW + 5)
    p.states.check(8, 0, 0, 1, NOW + 5)
    assert p.states.snapshot() == before


# ----------------------------------------------------------- limits and expiry


def test_idle_producers_expire() -> None:
    states = ProducerStates(expiry_ms=1_000)
    states.record(1, 0, 0, 1, 0, 0)
    states.record(2, 0, 0, 1, 1, 500)
    assert states.expire(1_000) == 0
    assert states.expire(1_001) == 1
    assert 1 not in states and 2 in states
    with pytest.raises(OutOfOrderSequence, match="unknown"):
        states.check(1, 0, 1, 1, 1_001)  # its state is gone: it must get a new epoch
    assert states.expire(1_501) == 1
    assert len(states) == 0


def test_activity_postpones_expiry() -> None:
    states = ProducerStates(expiry_ms=1_000)
    states.record(1, 0, 0, 1, 0, 0)
    states.record(2, 0, 0, 1, 1, 100)
    states.record(1, 0, 1, 1, 2, 900)
    assert states.expire(1_500) == 1
    assert 1 in states and 2 not in states


def test_max_producers_forgets_the_least_recently_active() -> None:
    states = ProducerStates(max_producers=3)
    for pid in range(3):
        states.record(pid, 0, 0, 1, pid, NOW)
    states.record(0, 0, 1, 1, 3, NOW)  # 0 is now the most recent
    states.record(3, 0, 0, 1, 4, NOW)
    assert sorted(pid for pid in range(4) if pid in states) == [0, 2, 3]
    assert states.evicted == 1


def test_time_running_backwards_is_clamped() -> None:
    states = ProducerStates(expiry_ms=1_000)
    states.record(1, 0, 0, 1, 0, 5_000)
    states.record(2, 0, 0, 1, 1, 3_000)  # counts as 5_000
    assert states.expire(6_000) == 0
    assert states.expire(6_001) == 2


# ---------------------------------------------------------- snapshot, rebuild


def busy_partition() -> Partition:
    p = Partition(ProducerStates(recent=3))
    p.produce(-1, -1, -1, 2)
    for seq in range(6):
        p.produce(1, 0, seq, 1, now_ms=NOW + seq)
    p.produce(2, 4, 0, 3)
    p.produce(2, 5, 0, 2)
    p.produce(3, 0, 0, 1)
    p.produce(1, 0, 6, 2)
    return p


def test_snapshot_round_trip() -> None:
    p = busy_partition()
    data = p.states.snapshot()
    back = ProducerStates.restore(data, recent=3)
    assert back.snapshot() == data
    assert back.end_offset == p.next_offset
    for args in [(1, 0, 6, 2), (1, 0, 8, 1), (2, 5, 0, 2), (3, 0, 1, 1)]:
        assert back.check(*args, NOW) == p.states.check(*args, NOW)
    with pytest.raises(ProducerFenced):
        back.check(2, 4, 3, 1, NOW)


def test_restore_with_smaller_limits_keeps_the_newest() -> None:
    p = busy_partition()
    back = ProducerStates.restore(p.states.snapshot(), max_producers=2, recent=1)
    assert len(back) == 2 and 1 in back and 3 in back
    assert back.check(1, 0, 6, 2, NOW) == p.states.check(1, 0, 6, 2, NOW)
    with pytest.raises(OutOfOrderSequence):
        back.check(1, 0, 5, 1, NOW)
    p.truncate(p.next_offset - 2)  # the batch kept in the restored state goes: the floor says how far
    back.truncate(p.next_offset)
    assert back.next_sequence(1) == 6


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe",
        b"[]",
        b'{"version": 2, "end_offset": 0, "producers": []}',
        b'{"version": 1, "end_offset": -1, "producers": []}',
        b'{"version": 1, "end_offset": 0, "producers": {}}',
        b'{"version": 1, "end_offset": 0, "producers": [[1, 0, 1, 0, null]]}',
        b'{"version": 1, "end_offset": 0, "producers": [[1, 0, 1, 0, null, [[0, 0, 0]]]]}',
        b'{"version": 1, "end_offset": 0, "producers": [[1, 0, 1, 0, null, [[0, 1, 5], [1, 1, 5]]]]}',
        b'{"version": 1, "end_offset": 0, "producers": [[1, 0, 1, 0, 9, [[0, 1, 5]]]]}',
        b'{"version": 1, "end_offset": 0, "producers": [[1, 0, 1, 0, null, []], [1, 0, 1, 0, null, []]]}',
        b'{"version": 1, "end_offset": 0, "producers": [[1, true, 1, 0, null, []]]}',
        b'{"version": 1, "end_offset": 0, "producers": [[1, 0, 2147483648, 0, null, []]]}',
    ],
)
def test_corrupt_snapshot_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        ProducerStates.restore(data)


def test_rebuild_from_headers_equals_live_state() -> None:
    p = busy_partition()
    rebuilt = ProducerStates(recent=3)
    assert rebuilt.rebuild(p.log, NOW) == len(p.log) - 1  # all but the non-idempotent batch
    assert without_times(rebuilt) == without_times(p.states)


def test_rebuild_after_restore_skips_what_the_snapshot_covers() -> None:
    p = busy_partition()
    snap = p.states.snapshot()
    p.produce(1, 0, 8, 1)
    p.produce(4, 0, 0, 1)
    p.produce(2, 6, 0, 1)
    recovered = ProducerStates.restore(snap, recent=3)
    assert recovered.rebuild(p.log, NOW) == 3
    assert without_times(recovered) == without_times(p.states)


def test_rebuild_skips_batches_that_could_not_have_passed() -> None:
    states = ProducerStates()
    hs = [header(PID, 2, 0, 1, 0), header(PID, 1, 0, 1, 1), header(PID, 2, 1, 1, 2)]
    assert states.rebuild(hs, NOW) == 2
    assert states.epoch(PID) == 2 and states.next_sequence(PID) == 2
    assert states.end_offset == 3


# ---------------------------------------------------------------- truncation


def test_truncate_drops_batches_at_or_after_the_offset() -> None:
    p = Partition()
    for seq in range(4):
        p.produce(PID, 0, seq, 1)  # offsets 0..3
    p.truncate(2)
    assert p.states.next_sequence(PID) == 2
    assert p.states.end_offset == 2
    assert p.states.check(PID, 0, 1, 1, NOW) == 1  # still stored
    assert p.states.check(PID, 0, 2, 1, NOW) is None  # gone: appended again
    assert p.produce(PID, 0, 2, 1) == 2


def test_truncate_past_a_new_epoch_keeps_the_fence() -> None:
    p = Partition()
    p.produce(PID, 0, 0)
    p.produce(PID, 1, 0)
    p.truncate(1)
    with pytest.raises(ProducerFenced):
        p.states.check(PID, 0, 1, 1, NOW)
    assert p.states.check(PID, 1, 0, 1, NOW) is None


def test_truncate_past_the_recent_batches_loses_the_sequence() -> None:
    p = Partition(ProducerStates(recent=2))
    for seq in range(5):
        p.produce(PID, 0, seq, 1)
    p.truncate(4)  # within the recent batches: exact
    assert p.states.next_sequence(PID) == 4
    p.truncate(1)  # past them: the sequence is unknown
    assert p.states.next_sequence(PID) is None
    for seq in (0, 1, 2):
        with pytest.raises(OutOfOrderSequence, match="truncated"):
            p.states.check(PID, 0, seq, 1, NOW)
    assert p.states.check(PID, 1, 0, 1, NOW) is None  # a new epoch may write


def test_truncate_then_rebuild_from_an_older_snapshot_is_exact() -> None:
    p = Partition(ProducerStates(recent=2))
    for seq in range(2):
        p.produce(PID, 0, seq, 1)
    snap = p.states.snapshot()
    for seq in range(2, 6):
        p.produce(PID, 0, seq, 1)
    p.truncate(3)
    exact = ProducerStates.restore(snap, recent=2)
    exact.rebuild(p.log, NOW)
    assert exact.next_sequence(PID) == 3
    assert exact.check(PID, 0, 2, 1, NOW) == 2


# --------------------------------------------------------------- allocator


def test_allocator_hands_out_fresh_ids() -> None:
    alloc = ProducerIdAllocator()
    assert [alloc.allocate() for _ in range(3)] == [(0, 0), (1, 0), (2, 0)]


def test_allocator_bumps_the_epoch_of_a_known_name() -> None:
    alloc = ProducerIdAllocator(next_id=10)
    assert alloc.allocate("billing") == (10, 0)
    assert alloc.allocate(None) == (11, 0)
    assert alloc.allocate("billing") == (10, 1)
    assert alloc.allocate("shipping") == (12, 0)
    assert alloc.allocate("billing") == (10, 2)


def test_allocator_epoch_exhaustion_gives_a_fresh_id() -> None:
    alloc = ProducerIdAllocator()
    alloc.allocate("a")
    alloc._names["a"] = (0, EPOCH_MAX)
    assert alloc.allocate("a") == (1, 0)


def test_allocator_names_are_bounded() -> None:
    alloc = ProducerIdAllocator(names_max=2)
    alloc.allocate("a")
    alloc.allocate("b")
    alloc.allocate("a")
    alloc.allocate("c")  # "b" was least recently allocated
    assert len(alloc) == 2
    assert alloc.allocate("b") == (3, 0)


@pytest.mark.parametrize("name", ["", "x" * 256, "é" * 128])
def test_allocator_refuses_bad_names(name: str) -> None:
    with pytest.raises(BadParameter):
        ProducerIdAllocator().allocate(name)


def test_allocator_snapshot_round_trip() -> None:
    alloc = ProducerIdAllocator()
    alloc.allocate("a")
    alloc.allocate(None)
    alloc.allocate("a")
    back = ProducerIdAllocator.restore(alloc.snapshot())
    assert back.snapshot() == alloc.snapshot()
    assert back.allocate("a") == (0, 2)
    assert back.allocate(None) == (2, 0)


@pytest.mark.parametrize(
    "data",
    [
        b"nope",
        b'{"version": 1, "next_id": 1}',
        b'{"version": 1, "next_id": 1, "names": [["a", 1, 0]]}',  # id not below next_id
        b'{"version": 1, "next_id": 1, "names": [["", 0, 0]]}',
        b'{"version": 1, "next_id": 1, "names": [["a", 0, 40000]]}',
    ],
)
def test_allocator_corrupt_snapshot_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        ProducerIdAllocator.restore(data)


# -------------------------------------------------------- the stateful model

IN_FLIGHT_MAX = IDEMPOTENT_IN_FLIGHT_MAX  # the producer never has more in flight; the node remembers as many


@dataclass(frozen=True)
class Sent:
    pid: int
    epoch: int
    seq: int
    count: int


PLAIN = Sent(-1, -1, -1, 1)  # a batch from a producer that is not idempotent


@dataclass
class Producer:
    pid: int
    epoch: int = 0
    next_seq: int = 0
    in_flight: list[Sent] = field(default_factory=list)  # oldest first
    stale: list[Sent] = field(default_factory=list)  # given up on, or of an older epoch: a zombie may send them
    numbered: int = 0  # batches numbered so far
    index: dict[Sent, int] = field(default_factory=dict)  # which one each was

    def window(self) -> int:
        """Batches numbered since the oldest one still unresolved: the client's Lane keeps this
        at most IN_FLIGHT_MAX (fabric/client/inflight.py), acknowledged ones after it included."""
        return self.numbered - self.index[self.in_flight[0]] if self.in_flight else 0


@dataclass
class Track:
    """What the leader can know of one producer: its epoch, how many of that epoch's newest
    batches it remembers (at most ``recent``), and whether a truncation cut past them."""

    epoch: int
    known: int = 0
    uncertain: bool = False


class IdempotentProduce(RuleBasedStateMachine):
    """Producers with up to 5 batches in flight, retries, reordering and losses, against a model log.

    After every step: no batch is in the log twice, each (producer, epoch) run in
    the log is contiguous in sequence (no gap was ever let in), and every
    acknowledged batch is in the log once, at the offset its acknowledgement
    named. Each reply is checked when it is given: an append is the next
    sequence, a duplicate names the stored offset, a fence means a newer epoch
    was stored, and a refusal of an in-order batch or of a retry of a stored
    in-flight batch happens only once a truncation cut past what the leader keeps.
    Truncation (a leader change) drops only batches past the last acknowledged
    one: acknowledged data is committed.
    """

    def __init__(self) -> None:
        super().__init__()
        self.states = ProducerStates(recent=IN_FLIGHT_MAX)
        self.log: list[tuple[Sent, int]] = []  # (batch, base offset)
        self.next_offset = 0
        self.acked: dict[Sent, int] = {}
        self.track: dict[int, Track] = {}
        self.producers: list[Producer] = []
        self.now = NOW
        self.pristine = True  # the live state equals a fresh rebuild from the log
        # (snapshot, log length, tracks, pristine then, truncated since)
        self.checkpoint: tuple[bytes, int, dict[int, Track], bool, bool] | None = None

    @initialize(near_wrap=st.booleans())
    def start(self, near_wrap: bool) -> None:
        self.producers = [Producer(1), Producer(2)]
        if near_wrap:  # producer 2 resumes close to the wrap, as if its state came from an older log
            seed = Sent(2, 0, SEQUENCE_MOD - 6, 3)
            self.store(seed)
            self.acked[seed] = 0
            self.producers[1].next_seq = SEQUENCE_MOD - 3

    # --------------------------------------------------------------- model

    @staticmethod
    def remember(track: dict[int, Track], batch: Sent) -> None:
        t = track.get(batch.pid)
        if t is None or batch.epoch > t.epoch:
            track[batch.pid] = Track(batch.epoch, 1)
        else:
            t.known, t.uncertain = min(IN_FLIGHT_MAX, t.known + 1), False

    def store(self, batch: Sent) -> int:
        base = self.next_offset
        self.log.append((batch, base))
        self.next_offset += batch.count
        self.states.record(batch.pid, batch.epoch, batch.seq, batch.count, base, self.now)
        if batch.pid >= 0:
            self.remember(self.track, batch)
        return base

    def stored_at(self, batch: Sent) -> int | None:
        hits = [offset for b, offset in self.log if b == batch]
        assert len(hits) <= 1
        return hits[0] if hits else None

    def expected_next(self, batch: Sent) -> int | None:
        """The sequence a batch of its (pid, epoch) must have to follow the log; None if fenced."""
        t = self.track.get(batch.pid)
        if t is not None and batch.epoch < t.epoch:
            return None
        run = [b for b, _ in self.log if b.pid == batch.pid and b.epoch == batch.epoch]
        return (run[-1].seq + run[-1].count) % SEQUENCE_MOD if run else 0

    def send(self, batch: Sent) -> int | None:
        """Deliver ``batch`` to the leader; its base offset, or None when refused. Checks each reply."""
        self.now += 1
        stored = self.stored_at(batch)
        expected = self.expected_next(batch)
        t = self.track.get(batch.pid)
        try:
            dup = self.states.check(batch.pid, batch.epoch, batch.seq, batch.count, self.now)
        except ProducerFenced:
            assert t is not None and batch.epoch < t.epoch, f"{batch} fenced with no newer epoch stored"
            return None
        except OutOfOrderSequence:
            if t is None or batch.epoch != t.epoch or not t.uncertain:
                assert batch.seq != expected or stored is not None, f"in-order batch {batch} refused"
                in_flight = any(batch in p.in_flight for p in self.producers)
                assert stored is None or not in_flight, f"retry of stored in-flight batch {batch} refused"
            return None
        if dup is not None:
            assert dup == stored, f"duplicate {batch} answered {dup}, stored at {stored}"
            return dup
        assert stored is None, f"{batch} would be stored twice"
        assert batch.seq == expected, f"{batch} accepted with a gap (expected {expected})"
        return self.store(batch)

    # --------------------------------------------------------------- rules

    @rule(who=st.integers(0, 1), count=st.integers(1, 3))
    def new_batch(self, who: int, count: int) -> None:
        p = self.producers[who]
        if len(p.in_flight) < IN_FLIGHT_MAX and p.window() < IN_FLIGHT_MAX:
            batch = Sent(p.pid, p.epoch, p.next_seq, count)
            p.in_flight.append(batch)
            p.index[batch] = p.numbered
            p.numbered += 1
            p.next_seq = (p.next_seq + count) % SEQUENCE_MOD

    @rule(who=st.integers(0, 1), pick=st.integers(0, IN_FLIGHT_MAX - 1), ack_lost=st.booleans())
    def deliver(self, who: int, pick: int, ack_lost: bool) -> None:
        """Send any in-flight batch (a reorder when not the oldest, a retry when already sent)."""
        p = self.producers[who]
        if not p.in_flight:
            return
        batch = p.in_flight[pick % len(p.in_flight)]
        offset = self.send(batch)
        if offset is not None and not ack_lost:
            self.acked[batch] = offset
            p.in_flight.remove(batch)

    @rule()
    def plain(self) -> None:
        assert self.states.check(-1, -1, -1, 1, self.now) is None
        self.store(PLAIN)

    @rule(who=st.integers(0, 1), pick=st.integers(0, IN_FLIGHT_MAX - 1))
    def lose(self, who: int, pick: int) -> None:
        """The producer gives up on a batch (delivery timeout): what follows it is a gap, unless it was stored."""
        p = self.producers[who]
        if p.in_flight:
            p.stale.append(p.in_flight.pop(pick % len(p.in_flight)))

    @rule(who=st.integers(0, 1), times=st.integers(1, 8))
    def stored_but_timed_out(self, who: int, times: int) -> None:
        """In-flight batches are stored, but their replies come too late: the producer gave up on them."""
        p = self.producers[who]
        for _ in range(times):
            self.new_batch(who, 1)
            if self.send(p.in_flight[0]) is None:
                break
            p.stale.append(p.in_flight.pop(0))

    @rule(who=st.integers(0, 1))
    def bump_epoch(self, who: int) -> None:
        """The producer restarts (or recovers from a gap) with a new epoch; its old batches turn stale."""
        p = self.producers[who]
        p.stale.extend(p.in_flight)
        p.in_flight.clear()
        p.epoch += 1
        p.next_seq = 0

    @precondition(lambda self: any(p.stale for p in self.producers))
    @rule(data=st.data())
    def zombie(self, data: st.DataObject) -> None:
        """A given-up or older-epoch batch arrives after all."""
        stale = [b for p in self.producers for b in p.stale]
        self.send(data.draw(st.sampled_from(stale)))

    @rule(back=st.integers(1, 30))
    def truncate(self, back: int) -> None:
        """A leader change drops part of the uncommitted tail (never an acknowledged batch)."""
        committed = max((offset + b.count for b, offset in self.log if b in self.acked), default=0)
        target = max(committed, self.next_offset - back)
        offset = min((o for _, o in self.log if o >= target), default=self.next_offset)  # a batch boundary
        dropped = [b for b, o in self.log if o >= offset]
        self.log = [(b, o) for b, o in self.log if o < offset]
        self.next_offset = offset
        self.states.truncate(offset)
        assert self.states.end_offset == offset
        for pid, t in self.track.items():
            lost = sum(1 for b in dropped if b.pid == pid and b.epoch == t.epoch)
            if lost > t.known:
                t.known, t.uncertain = 0, True
            else:
                t.known -= lost
        self.pristine = self.pristine and not dropped
        if self.checkpoint is not None:
            snap, length, track, pristine, since = self.checkpoint
            # a snapshot above the truncation point is deleted
            self.checkpoint = (
                (snap, length, track, pristine, since or bool(dropped)) if length <= len(self.log) else None
            )

    @rule()
    def take_checkpoint(self) -> None:
        track = {pid: Track(t.epoch, t.known, t.uncertain) for pid, t in self.track.items()}
        self.checkpoint = (self.states.snapshot(), len(self.log), track, self.pristine, False)

    @rule(from_checkpoint=st.booleans())
    def restart(self, from_checkpoint: bool) -> None:
        """The leader restarts: restore the last snapshot (if any) and replay the log's headers."""
        headers = [header(b.pid, b.epoch, b.seq, b.count, offset) for b, offset in self.log]
        if from_checkpoint and self.checkpoint is not None:
            snap, length, track, pristine, truncated_since = self.checkpoint
            recovered = ProducerStates.restore(snap, recent=IN_FLIGHT_MAX)
            same_as_live = not truncated_since
        else:
            recovered, length, track, pristine = ProducerStates(recent=IN_FLIGHT_MAX), 0, {}, True
            same_as_live = self.pristine
        recovered.rebuild(headers, self.now)
        assert recovered.end_offset == self.next_offset
        if same_as_live:
            assert without_times(recovered) == without_times(self.states)
        for b, _ in self.log[length:]:
            if b.pid >= 0:
                self.remember(track, b)
        self.states, self.track, self.pristine = recovered, track, pristine
        self.checkpoint = None

    @rule()
    def snapshot_round_trip(self) -> None:
        data = self.states.snapshot()
        self.states = ProducerStates.restore(data, recent=IN_FLIGHT_MAX)
        assert self.states.snapshot() == data

    # ----------------------------------------------------------- invariants

    @invariant()
    def log_holds_no_batch_twice(self) -> None:
        batches = [b for b, _ in self.log if b.pid >= 0]
        assert len(batches) == len(set(batches))

    @invariant()
    def every_run_is_contiguous(self) -> None:
        last: dict[tuple[int, int], Sent] = {}
        for b, _ in self.log:
            if b.pid < 0:
                continue
            prev = last.get((b.pid, b.epoch))
            if prev is not None:
                assert b.seq == (prev.seq + prev.count) % SEQUENCE_MOD, f"gap before {b}"
            elif b.seq != 0:
                assert (b.pid, b.epoch, b.seq) == (2, 0, SEQUENCE_MOD - 6), f"{b} starts a run at {b.seq}"
            last[(b.pid, b.epoch)] = b

    @invariant()
    def every_ack_is_in_the_log_once(self) -> None:
        for batch, offset in self.acked.items():
            assert [o for b, o in self.log if b == batch] == [offset]


TestIdempotentProduce = IdempotentProduce.TestCase
TestIdempotentProduce.settings = settings(
    max_examples=examples(100), stateful_step_count=80, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
