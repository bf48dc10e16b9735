"""A follower's copy of the log: the leader's batches appended with their offsets and epochs,
producer states recorded from them, a batch out of place stops the append, and a diverging
answer cuts the log and the producer states back. On a real store in a temp directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric.cluster.epochs import LeaderEpochCache
from fabric.node.replica_log import append_copy, truncate_copy
from fabric.protocol.batch import encode_batch, stamp
from fabric.settings import QueueSettings
from fabric.store.flusher import Flusher
from fabric.store.log import PartitionLog
from fabric.store.store import Store


@pytest.fixture
def store(tmp_path: Path):
    s = Store(tmp_path / "b", defaults=QueueSettings(), now_ms=0)
    s.create_queue("q", QueueSettings(), now_ms=0)
    yield s
    s.close()


def _leaders_batch(base: int, epoch: int, n: int, **kw: int) -> bytes:
    buf = bytearray(encode_batch([b"x"] * n, **kw))
    stamp(buf, base, epoch)  # as the leader stored it
    return bytes(buf)


def test_the_leaders_batches_keep_their_offsets_and_epochs(store: Store) -> None:
    plog = store.partition("q", 0)
    saved: list[list[tuple[int, int]]] = []
    epochs = LeaderEpochCache()
    data = _leaders_batch(0, 1, 3) + _leaders_batch(3, 2, 2, producer_id=7, producer_epoch=0, base_sequence=0)

    def save(log: PartitionLog, cache: LeaderEpochCache) -> None:
        saved.append(list(cache.entries))

    got, marks = append_copy(store, Flusher(lambda gen: None), plog, "q", 0, data, epochs, 0, save)
    assert got == [(1, 0), (2, 3)] and marks == []
    assert plog.next_offset == 5 and epochs.latest_epoch() == 2
    assert saved == [[(1, 0)], [(1, 0), (2, 3)]]  # the cache changed twice: saved each time
    states = store.producer_states("q", 0, 0)
    assert states.epoch(7) == 0 and states.next_sequence(7) == 2  # the producer carries on here after a failover


def test_a_batch_out_of_place_stops_the_append(store: Store) -> None:
    plog = store.partition("q", 0)
    data = _leaders_batch(0, 1, 2) + _leaders_batch(5, 1, 2)  # a gap: 2..4 missing
    got, _ = append_copy(store, Flusher(lambda gen: None), plog, "q", 0, data, LeaderEpochCache(), 0, lambda *a: None)
    assert got == [(1, 0)] and plog.next_offset == 2  # the next fetch asks from 2


def test_a_diverging_answer_cuts_the_log_back(store: Store) -> None:
    plog = store.partition("q", 0)
    data = _leaders_batch(0, 1, 2) + _leaders_batch(2, 1, 3, producer_id=7, producer_epoch=0, base_sequence=0)
    append_copy(store, Flusher(lambda gen: None), plog, "q", 0, data, LeaderEpochCache(), 0, lambda *a: None)
    assert store.producer_states("q", 0, 0).next_sequence(7) == 3
    truncate_copy(store, plog, "q", 0, 2, 0)
    assert plog.next_offset == 2
    assert store.producer_states("q", 0, 0).next_sequence(7) == 0  # the cut batch's sequences may come again
