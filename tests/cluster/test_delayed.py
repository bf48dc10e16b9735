"""Delayed batches on replicated partitions, the pure pieces: delay ids in the batch header, the
ids a leader gives out, a follower's drop-on-replicate bookkeeping under truncation, and the
leader's delay cursor (acks=all, ISR joins)."""

from __future__ import annotations

import random

import pytest

from fabric.cluster.delayed import COUNTER_MAX, AppendedDelays, DelayIds, make_delay_id, split_delay_id
from fabric.cluster.epochs import LeaderEpochCache
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.replica import FetchRequest, LeaderReplica
from fabric.protocol.batch import check_batch, decode_values, delay_id_of, encode_batch, stamp_delay_id

# ---------------------------------------------------------------- the batch header


def test_a_stamped_batch_carries_its_delay_id_under_a_good_crc() -> None:
    buf = bytearray(encode_batch([b"a", b"b"], headers=[{"k": b"v"}, {}]))
    assert delay_id_of(check_batch(buf)) is None
    big = make_delay_id(2**31 - 1, COUNTER_MAX)
    h = stamp_delay_id(buf, big)
    assert check_batch(buf) == h and delay_id_of(h) == big and h.producer_id < -1
    assert decode_values(bytes(buf))[1] == [b"a", b"b"]  # consumers read it as before
    with pytest.raises(ValueError, match="producer id"):
        stamp_delay_id(buf, 1)  # already stamped
    idempotent = bytearray(encode_batch([b"a"], producer_id=7, producer_epoch=0, base_sequence=0))
    with pytest.raises(ValueError, match="producer id"):
        stamp_delay_id(idempotent, 1)


# ---------------------------------------------------------------- delay ids


def test_delay_ids_are_unique_across_epochs_and_go_on_after_the_store_s_highest() -> None:
    a = DelayIds(3).take(3)
    assert [split_delay_id(d) for d in a] == [(3, 0), (3, 1), (3, 2)]
    assert DelayIds(3, highest=a[-1]).take(1) == [make_delay_id(3, 3)]
    assert DelayIds(4, highest=a[-1]).take(1) == [make_delay_id(4, 0)]  # a new epoch counts again
    assert not set(a) & set(DelayIds(4).take(3))
    ids = DelayIds(1, highest=make_delay_id(1, COUNTER_MAX - 1))
    assert ids.take(1) == [make_delay_id(1, COUNTER_MAX)]
    with pytest.raises(ValueError, match="no room"):
        ids.take(1)


# ---------------------------------------------------------------- a follower's marks


def test_a_row_is_dropped_only_once_the_high_watermark_passes_its_append() -> None:
    marks = AppendedDelays()
    marks.add(10, 1)
    marks.add(12, 2)
    assert marks.committed(10) == []  # the append at 10 is not on every in-sync replica yet
    assert marks.committed(11) == [1] and marks.lowest == 12
    assert marks.truncated(12) == [2] and not marks  # cut at 12: row 2 waits again
    assert marks.committed(100) == []


def test_a_new_leader_drops_what_its_log_holds_and_keeps_the_rest() -> None:
    marks = AppendedDelays([(5, 50), (9, 90), (7, 70)])  # as loaded from the store, any order
    log_end = 8
    assert marks.committed(log_end) == [50, 70] and marks.truncated(log_end) == [90] and not marks


def test_drop_on_replicate_never_loses_or_doubles_a_row_under_random_truncations() -> None:
    """A model: one follower's log takes appends of delayed rows and is cut back (never below its
    high watermark, which only rises). A row is delivered once iff its append survives; after any
    history, (rows still held) + (appends in the log) = every row, each once."""
    rng = random.Random(9)
    for _ in range(200):
        marks = AppendedDelays()
        held = set(range(30))
        log: list[int | None] = []  # offset -> delay id (None: an ordinary batch)
        hw = 0
        for _ in range(60):
            move = rng.random()
            waiting = sorted(held - {d for d in log if d is not None})
            if move < 0.4 and waiting:
                d = rng.choice(waiting)
                marks.add(len(log), d)
                log.append(d)
            elif move < 0.55:
                log.append(None)
            elif move < 0.8:
                hw = rng.randint(hw, len(log))
                held -= set(marks.committed(hw))
            else:
                cut = rng.randint(hw, len(log))
                del log[cut:]
                marks.truncated(cut)
            appended = [d for d in log if d is not None]
            assert len(appended) == len(set(appended))
            assert held | set(appended) == set(range(30)) and not (held - set(range(30)))
            assert all(d in held for off, d in enumerate(log) if d is not None and off >= hw)


# ---------------------------------------------------------------- the leader's delay cursor


def _leader(isr: tuple[str, ...] = ("a", "b", "c"), min_insync: int = 2) -> LeaderReplica:
    rec = PartitionRecord(replicas=("a", "b", "c"), leader="a", leader_epoch=1, isr=isr, partition_epoch=1)
    return LeaderReplica(
        "a",
        rec,
        log_end=0,
        high_watermark=0,
        epochs=LeaderEpochCache(),
        min_insync=min_insync,
        lag_time_ms=1000,
        now_ms=0,
    )


def test_acks_all_for_a_delayed_row_waits_for_every_in_sync_cursor() -> None:
    leader = _leader()
    leader.on_delay_stored(5)
    assert not leader.delays_acked(5)
    leader.on_fetch(FetchRequest("b", 1, 0, -1, 5), now_ms=1)
    assert not leader.delays_acked(5)  # c has not fetched in this term
    leader.on_fetch(FetchRequest("c", 1, 0, -1, 4), now_ms=1)
    assert leader.delay_high_watermark == 4 and leader.delays_acked(4) and not leader.delays_acked(5)
    leader.on_fetch(FetchRequest("c", 1, 0, -1, 5), now_ms=2)
    assert leader.delays_acked(5)
    leader.on_delay_stored(3)  # an older id is no news
    assert leader.delays_end == 5


def test_a_replica_joins_the_isr_only_with_the_delayed_rows_the_isr_holds() -> None:
    leader = _leader(isr=("a", "b"))
    leader.on_delay_stored(7)
    leader.on_fetch(FetchRequest("b", 1, 0, -1, 7), now_ms=1)
    assert leader.delay_high_watermark == 7
    leader.on_fetch(FetchRequest("c", 1, 0, -1, 0), now_ms=1)  # caught up on the log, not the rows
    assert leader.isr_change(now_ms=2) is None
    leader.on_fetch(FetchRequest("c", 1, 0, -1, 7), now_ms=3)
    change = leader.isr_change(now_ms=3)
    assert change is not None and set(change.isr) == {"a", "b", "c"}


def test_too_few_in_sync_replicas_refuse_a_delayed_acks_all() -> None:
    leader = _leader(isr=("a",), min_insync=2)
    leader.on_delay_stored(1)
    assert leader.not_enough_replicas() is not None and not leader.delays_acked(1)
