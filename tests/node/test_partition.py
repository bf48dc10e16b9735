"""NodePartition's rules for the visible offset, its ordering state, and the broker's partitions
as queues come and go, driven in memory (tests/node/harness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric.client.hlc import header_value
from fabric.node.partition import NodePartition
from fabric.protocol import frames as fr
from fabric.protocol.batch import encode_batch
from fabric.protocol.ops import Op
from tests.node.harness import BOB, BrokerHarness


def test_every_partition_log_of_a_queue_has_one_node_partition(harness: BrokerHarness) -> None:
    h = harness
    h.create_queue("q", partitions=2, priority_levels=2)
    assert sorted(k for k in h.broker.partitions if k[0] == "q") == [("q", 0), ("q", 1), ("q", 2), ("q", 3)]
    part = h.broker.partitions[("q", 1)]
    assert part.log is h.store.partition("q", 1) and part.visible == 0


def test_a_produce_advances_the_visible_offset_to_the_log_end(harness: BrokerHarness) -> None:
    h = harness
    h.create_queue("q")
    h.produce("q", b"a", b"b")
    part = h.broker.partitions[("q", 0)]
    assert part.visible == part.log.next_offset == 2


def test_fsync_always_keeps_the_visible_offset_until_the_fdatasync(harness: BrokerHarness) -> None:
    h = harness
    h.create_queue("q", fsync="always")
    part = h.broker.partitions[("q", 0)]
    frames = fr.encode(fr.Header(Op.PRODUCE, 1, 0), {"queue": "q", "partition": 0}, [h.batch(b"x")])
    h.broker.handle(BOB, frames, h.now_ms)  # no loop turn yet
    assert (part.visible, part.log.next_offset) == (0, 1)  # appended, not yet durable
    h.advance(1)  # the loop's turn: the group commit, then on_synced
    assert part.visible == 1


def test_advance_refuses_to_move_back_or_past_the_log_end(harness: BrokerHarness) -> None:
    h = harness
    h.create_queue("q")
    h.produce("q", b"a", b"b", b"c")
    part = h.broker.partitions[("q", 0)]
    with pytest.raises(AssertionError, match="cannot advance to 4"):
        part.advance(4)
    part.truncate(1)
    with pytest.raises(AssertionError, match="cannot advance to 0"):
        part.advance(0)
    assert part.advance_to(0) is False and part.visible == 1  # not past it: nothing moves
    assert part.advance_to(3) is True and part.visible == 3


def test_truncate_may_go_back_but_not_past_the_log_end(harness: BrokerHarness) -> None:
    h = harness
    h.create_queue("q")
    h.produce("q", b"a", b"b")
    part = h.broker.partitions[("q", 0)]
    part.truncate(0)
    assert part.visible == 0
    with pytest.raises(AssertionError, match="past the log end 2"):
        part.truncate(3)
    with pytest.raises(AssertionError):
        NodePartition("q", 0, part.log, 3)


def test_fetch_reads_up_to_the_visible_offset_only(harness: BrokerHarness) -> None:
    h = harness
    h.create_queue("q")
    h.produce("q", b"a")
    h.produce("q", b"b")
    h.broker.partitions[("q", 0)].truncate(1)  # as a replica's checkpointed high watermark would
    m = h.request(Op.FETCH, {"queue": "q", "partition": 0, "offset": 1})
    assert m.params["high_watermark"] == 1 and m.data == ()


def test_deleting_a_queue_closes_its_partitions_and_answers_their_long_polls(harness: BrokerHarness) -> None:
    h = harness
    h.create_queue("q", partitions=2)
    h.create_queue("other")
    rids = [h.send(Op.FETCH, {"queue": "q", "partition": p, "offset": 0, "wait_ms": 60_000}) for p in (0, 1)]
    kept = h.send(Op.FETCH, {"queue": "other", "partition": 0, "offset": 0, "wait_ms": 60_000})
    assert len(h.broker.fetches) == 3
    h.call(Op.DELETE_QUEUE, {"name": "q"})
    assert [k for k in h.broker.partitions if k[0] == "q"] == []
    answers = [h.reply(r) for r in rids]
    assert [m.params["error"] if m is not None else None for m in answers] == ["UNKNOWN_QUEUE"] * 2
    assert h.reply(kept) is None and len(h.broker.fetches) == 1


def test_growing_a_queue_opens_the_new_partitions(harness: BrokerHarness) -> None:
    h = harness
    h.create_queue("q", partitions=1)
    h.call(Op.ALTER_QUEUE, {"name": "q", "partitions": 3})
    assert [h.broker.partitions[("q", p)].visible for p in range(3)] == [0, 0, 0]
    h.produce("q", b"x", partition=2)
    assert h.broker.partitions[("q", 2)].visible == 1


def test_a_restarted_broker_sees_every_stored_record(tmp_path: Path) -> None:
    h = BrokerHarness(tmp_path)
    h.create_queue("q")
    h.produce("q", b"a", b"b")
    h.close()
    again = BrokerHarness(tmp_path)
    try:
        assert again.broker.partitions[("q", 0)].visible == 2
    finally:
        again.close()


def _hlc_batch(h: BrokerHarness, value: bytes, clock_ms: int) -> bytes:
    return bytes(encode_batch([value], headers=[{"x-hlc": header_value(clock_ms << 16)}], timestamps=[clock_ms]))


def test_a_strict_partition_holds_its_records_in_its_ordering_state_until_the_window_passes(
    harness: BrokerHarness,
) -> None:
    h = harness
    h.create_queue("q", ordering="strict", ordering_window_ms=400)
    part = h.broker.partitions[("q", 0)]
    late = h.send(Op.PRODUCE, {"queue": "q", "partition": 0}, [_hlc_batch(h, b"second", h.now_ms + 50)])
    early = h.send(Op.PRODUCE, {"queue": "q", "partition": 0}, [_hlc_batch(h, b"first", h.now_ms + 10)])
    assert part.ordering is not None and len(part.ordering.held) == 2
    assert part.log.next_offset == 0 and h.reply(late) is None  # held, not appended
    h.advance(500)
    assert part.ordering.held == [] and part.visible == 2
    assert [m.params["record_offsets"] for m in (h.reply(early), h.reply(late)) if m is not None] == [[[0]], [[1]]]


def test_deleting_a_strict_queue_drops_its_held_records_with_its_partitions(harness: BrokerHarness) -> None:
    h = harness
    h.create_queue("q", ordering="strict", ordering_window_ms=400)
    h.send(Op.PRODUCE, {"queue": "q", "partition": 0}, [_hlc_batch(h, b"held", h.now_ms)])
    assert h.broker.ordering.held == {("q", 0)}
    h.call(Op.DELETE_QUEUE, {"name": "q"})
    h.create_queue("q", ordering="strict", ordering_window_ms=400)  # the same name again: nothing held
    h.advance(500)
    assert h.broker.ordering.held == set() and h.broker.partitions[("q", 0)].log.next_offset == 0


def test_a_queue_deleted_and_made_again_before_the_fdatasync_shows_nothing_of_the_old_write(
    harness: BrokerHarness,
) -> None:
    h = harness
    h.create_queue("q", fsync="always")
    frames = fr.encode(fr.Header(Op.PRODUCE, 1, 0), {"queue": "q", "partition": 0}, [h.batch(b"a", b"b")])
    h.broker.handle(BOB, frames, h.now_ms)  # appended; its fdatasync has not run yet
    h.broker.handle(BOB, fr.encode(fr.Header(Op.DELETE_QUEUE, 2, 0), {"name": "q"}), h.now_ms)
    h.broker.handle(BOB, fr.encode(fr.Header(Op.CREATE_QUEUE, 3, 0), {"name": "q"}), h.now_ms)
    h.advance(1)  # the group commit covers the old write: the new queue's partition stays at 0
    assert h.broker.partitions[("q", 0)].visible == 0
    produced = h.reply(1, client=BOB)
    assert produced is not None and produced.params["offsets"] == [0]  # its producer still hears
