"""PRODUCE and FETCH on the broker driven in memory: offsets, long polls that a produce completes or
the clock ends, what fsync "always" shows consumers, idempotent producers and dedup ids (the same
over sockets: tests/integration/test_end_to_end.py, test_idempotence.py, test_message_properties.py)."""

from __future__ import annotations

from fabric.errors import OffsetOutOfRange, OutOfOrderSequence, ProducerFenced, QueueMoved
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from tests.node.harness import BOB, BrokerHarness, records, values


def fetch(h: BrokerHarness, offset: int, **params) -> dict:
    return {"queue": "q", "partition": 0, "offset": offset, **params}


def test_produce_then_fetch(harness):
    h = harness
    h.create_queue("q", partitions=2)
    assert h.produce("q", b"a", b"b") == {"offsets": [0], "partitions": 2}
    assert h.produce("q", b"c")["offsets"] == [2]
    assert h.produce("q", b"other", partition=1)["offsets"] == [0]
    m = h.request(Op.FETCH, fetch(h, 1))
    assert m.params == {"high_watermark": 3, "log_start_offset": 0}
    # the whole batch holding offset 1 comes back: the consumer skips what it did not ask for
    assert records(m) == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert h.request(Op.FETCH, fetch(h, 3)).data == ()  # at the end: nothing, at once
    assert h.request(Op.FETCH, fetch(h, 4)).header.status == OffsetOutOfRange.code
    offsets = h.call(Op.LIST_OFFSETS, {"queue": "q", "partition": 0})
    assert offsets == {"offset": 3, "log_start_offset": 0, "high_watermark": 3, "log_end_offset": 3, "sealed": False}


def test_a_sealed_queue_takes_only_a_moves_copy_and_only_where_its_log_ends(harness):
    """A federation move's seal (fabric queue move): QUEUE_MOVED for clients, nothing written; the
    move's own copy (``move_copy``) is stored, and only at the offset it names."""
    h = harness
    h.create_queue("q", sealed=True)
    refused = h.request(Op.PRODUCE, {"queue": "q", "partition": 0}, [h.batch(b"a")])
    assert refused.header.status == QueueMoved.code and "moving" in refused.params["message"]
    assert h.produce("q", b"a", b"b", move_copy=0)["offsets"] == [0]
    stale = h.request(Op.PRODUCE, {"queue": "q", "partition": 0, "move_copy": 0}, [h.batch(b"again")])
    assert stale.header.status == OffsetOutOfRange.code  # a second copier's append: refused
    assert h.produce("q", b"c", move_copy=2)["offsets"] == [2]
    assert h.call(Op.LIST_OFFSETS, {"queue": "q", "partition": 0})["sealed"] is True
    h.broker.store.alter_settings("q", {"sealed": False})
    assert h.produce("q", b"d")["offsets"] == [3]
    assert h.call(Op.LIST_OFFSETS, {"queue": "q", "partition": 0})["sealed"] is False


def test_a_long_poll_is_answered_by_the_next_produce(harness):
    h = harness
    h.create_queue("q")
    rid = h.send(Op.FETCH, fetch(h, 0, wait_ms=5000), client=BOB)
    h.advance(1000)
    assert h.reply(rid, client=BOB) is None  # parked
    h.produce("q", b"late")
    m = h.reply(rid, client=BOB)
    assert m is not None and values(m) == [b"late"] and m.params["high_watermark"] == 1


def test_a_long_poll_ends_empty_when_its_wait_is_over(harness):
    h = harness
    h.create_queue("q")
    rid = h.send(Op.FETCH, fetch(h, 0, wait_ms=300))
    h.advance(299)
    assert h.reply(rid) is None
    h.advance(1)
    m = h.reply(rid)
    assert m is not None and m.header.status == 0 and m.data == () and m.params["high_watermark"] == 0


def test_a_long_poll_is_answered_when_its_queue_is_deleted(harness):
    h = harness
    h.create_queue("q")
    rid = h.send(Op.FETCH, fetch(h, 0, wait_ms=5000))
    h.call(Op.DELETE_QUEUE, {"name": "q"})
    m = h.reply(rid)
    assert m is not None and m.header.status != 0  # the queue is gone: said at once, not after 5 s


def test_fsync_always_replies_and_shows_consumers_only_after_the_fdatasync(harness):
    h = harness
    h.create_queue("q", fsync="always")
    rid = h.send(Op.PRODUCE, {"queue": "q", "partition": 0}, [h.batch(b"durable")])
    m = h.reply(rid)  # the harness's loop turn ran the group commit: the reply is out
    assert m is not None and m.params["offsets"] == [0]
    assert h.flusher.fsyncs >= 1 and h.flusher.completed >= 1
    assert values(h.request(Op.FETCH, fetch(h, 0))) == [b"durable"]


def test_acks_none_gets_no_reply_but_is_stored(harness):
    h = harness
    h.create_queue("q")
    rid = h.send(Op.PRODUCE, {"queue": "q", "partition": 0, "acks": "none"}, [h.batch(b"x")], flags=fr.FLAG_NO_REPLY)
    assert h.reply(rid) is None
    assert h.describe("q")["messages"] == 1


def test_an_idempotent_producers_duplicate_is_dropped(harness):
    h = harness
    h.create_queue("q")
    ident = h.call(Op.INIT_PRODUCER, {"name": "billing"})
    pid, epoch = ident["producer_id"], ident["epoch"]

    def send(seq: int, ep: int = epoch):
        batch = h.batch(b"m%d" % seq, b"m%d" % (seq + 1), producer_id=pid, producer_epoch=ep, base_sequence=seq)
        return h.request(Op.PRODUCE, {"queue": "q", "partition": 0}, [batch])

    assert send(0).params["offsets"] == [0]
    assert send(2).params["offsets"] == [2]
    assert send(0).params["offsets"] == [0]  # a retry: the first offsets again, nothing stored
    assert send(8).header.status == OutOfOrderSequence.code  # 4..7 are missing
    assert h.describe("q")["messages"] == 4
    newer = h.call(Op.INIT_PRODUCER, {"name": "billing"})
    assert newer == {"producer_id": pid, "epoch": epoch + 1}
    assert send(0, newer["epoch"]).params["offsets"] == [4]
    assert send(2).header.status == ProducerFenced.code  # the zombie with the old epoch
    assert h.describe("q")["messages"] == 6


def test_dedup_ids_drop_a_message_seen_within_the_window(harness):
    h = harness
    h.create_queue("q", dedup_window_ms=10_000)
    produce = {"queue": "q", "partition": 0}
    assert h.call(Op.PRODUCE, {**produce, "dedup_ids": ["a"]}, [h.batch(b"1")])["offsets"] == [0]
    assert h.call(Op.PRODUCE, {**produce, "dedup_ids": ["a"]}, [h.batch(b"1 again")])["duplicates"] == [0]
    h.advance(10_001)
    assert h.call(Op.PRODUCE, {**produce, "dedup_ids": ["a"]}, [h.batch(b"1 later")])["offsets"] == [1]
    assert values(h.request(Op.FETCH, fetch(h, 0))) == [b"1", b"1 later"]
