"""The producer's Sequencer on its own (no sockets, no clock): sealing moves a queue's sticky
partition on, requeued batches go back in the order they were sealed, an idempotent partition
with a full window keeps its batch filling, and a batch to a priority level is numbered in the
lane of its log partition."""

from __future__ import annotations

from fabric.client.batches import Batch
from fabric.client.sequencer import IDEMPOTENT_IN_FLIGHT_NARROW, Sequencer


class Owner:
    def __init__(self, partitions: int) -> None:
        self.partitions = partitions

    def await_batch(self, b: Batch, timeout: float | None) -> bool:
        return b.finished

    def partition_count(self, queue: str) -> int:
        return self.partitions


def open_batch(seq: Sequencer, queue: str, partition: int, owner: Owner, *, plain: bool = True) -> Batch:
    b = Batch(owner, queue, partition, 0.0, 1 << 20, 1 << 20)
    b.values.append(b"v")
    b.nbytes += 5
    seq.open[(queue, partition)] = b
    if plain:
        seq.plain[queue] = b
    return b


def test_sealing_moves_the_sticky_partition_round_robin_and_keeps_the_order() -> None:
    seq, owner = Sequencer(idempotent=False), Owner(3)
    sealed = []
    for expected in (0, 1, 2, 0):
        partition = seq.sticky.setdefault("q", 0)
        assert partition == expected
        b = open_batch(seq, "q", partition, owner)
        seq.take(b, 3)
        sealed.append(b)
        assert "q" not in seq.plain and ("q", partition) not in seq.open
    assert list(seq.ready) == sealed and [b.serial for b in sealed] == [1, 2, 3, 4]


def test_requeued_batches_go_back_in_the_order_they_were_sealed() -> None:
    seq, owner = Sequencer(idempotent=False), Owner(4)
    batches = []
    for p in range(4):
        b = open_batch(seq, "q", p, owner, plain=False)
        seq.take(b, 4)
        batches.append(b)
    first, second = seq.ready.popleft(), seq.ready.popleft()  # both sent
    seq.requeue([second, first])  # both lost with the link: resent before the newer ones
    assert list(seq.ready) == batches
    seq.requeue([first])  # already waiting: not twice
    assert list(seq.ready) == batches


def test_a_full_window_keeps_the_next_batch_open_and_filling() -> None:
    seq, owner = Sequencer(idempotent=True), Owner(1)
    seq.ident = (7, 0)
    for _ in range(IDEMPOTENT_IN_FLIGHT_NARROW):
        b = open_batch(seq, "q", 0, owner)
        assert not seq.keeps_filling(b)
        seq.take(b, 1)
        lane = seq.numbered_lane(seq.ready.popleft())
        assert lane is not None and lane.ident == (7, 0)
    small = open_batch(seq, "q", 0, owner)
    assert seq.keeps_filling(small)  # five small batches in flight: this one gathers more
    assert seq.eager_with_room() == []
    small.eager = True
    window = seq.lanes[("q", 0)].window
    seq.lanes[("q", 0)].acked(window[0])
    assert seq.eager_with_room() == [small]  # a reply opened the window


def test_a_priority_level_is_numbered_in_the_lane_of_its_log_partition() -> None:
    seq, owner = Sequencer(idempotent=True), Owner(2)
    seq.ident = (3, 1)
    b = open_batch(seq, "q", 1, owner, plain=False)
    b.props = (None, None, None, 2)  # level 2 of a queue of 2 partitions: log partition 5
    seq.take(b, 2)
    assert seq.next_sendable(0.0, (0,)) is b
    lane = seq.numbered_lane(seq.ready.popleft())
    assert lane is seq.lanes[("q", 5)] and b.ident == (3, 1) and b.sequence == 0
