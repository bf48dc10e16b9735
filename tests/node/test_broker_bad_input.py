"""Every error a client can provoke gets an error reply with its code, and the client and the node
live on: the broker driven in memory (the same cases over a real socket are in
tests/integration/test_bad_input.py)."""

from __future__ import annotations

import pytest

from fabric.errors import (
    BadParameter,
    CorruptBatch,
    MessageTooLarge,
    OffsetOutOfRange,
    ProtocolError,
    QueueExists,
    QueueFull,
    RequestTooLarge,
    UnknownCommand,
    UnknownPartition,
    UnknownQueue,
    UnknownSubscription,
    UnsupportedVersion,
)
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from fabric.settings import Limits, NodeConfig
from tests.node.harness import BrokerHarness, values


@pytest.fixture
def h(harness: BrokerHarness) -> BrokerHarness:
    harness.create_queue("q", partitions=2, max_message_bytes=1000, max_messages=5)
    return harness


def alive(h: BrokerHarness) -> None:
    assert h.request(Op.PING).header.status == 0


def raw(h: BrokerHarness, frames: list[bytes]) -> int:
    """Feed frames as they came off the socket; the status of the one reply."""
    h.send_frames(frames)
    return h.last_reply().header.status


def header(op: int, *, version: int = 1, flags: int = 0) -> bytes:
    return fr.HEADER.pack(b"FB", version, op, flags, 0, 0, 7)


def test_malformed_frames_get_an_error_reply(h):
    # too few frames, short header, bad magic: no request id can be read, yet there is a reply
    assert raw(h, [b"\x01\x02"]) == ProtocolError.code
    assert raw(h, [b"short", b""]) == ProtocolError.code
    assert raw(h, [b"XX" + b"\0" * 14, b""]) == ProtocolError.code
    assert raw(h, [header(Op.PING, version=9), b""]) == UnsupportedVersion.code
    assert raw(h, [header(99), b""]) == UnknownCommand.code
    assert raw(h, [header(Op.PING), b"{not json"]) == ProtocolError.code
    assert raw(h, [header(Op.PING), b"[1,2]"]) == ProtocolError.code
    assert raw(h, [header(Op.PING, flags=0x80), b""]) == ProtocolError.code
    assert raw(h, [header(Op.PUSH), b""]) == ProtocolError.code  # an event, not a request
    assert raw(h, [header(Op.PING, flags=fr.FLAG_REPLY), b""]) == ProtocolError.code
    alive(h)


def test_bad_parameters_name_the_parameter(h):
    m = h.request(Op.PRODUCE, {"queue": "q"})
    assert m.header.status == BadParameter.code and "partition" in m.params["message"]
    assert h.request(Op.FETCH, {"queue": "q", "partition": 0, "offset": -1}).header.status == BadParameter.code
    assert h.request(Op.FETCH, {"queue": "q", "partition": True, "offset": 0}).header.status == BadParameter.code
    assert h.request(Op.CREATE_QUEUE, {"name": "../etc"}).header.status == BadParameter.code
    m = h.request(Op.CREATE_QUEUE, {"name": "z", "settings": {"partitons": 2}})
    assert m.header.status == BadParameter.code and "partitons" in m.params["message"]
    m = h.request(Op.CREATE_QUEUE, {"name": "z", "settings": {"fsync": "sometimes"}})
    assert m.header.status == BadParameter.code
    assert h.request(Op.LIST_QUEUES, {"bogus": 1}).header.status == BadParameter.code
    assert h.request(Op.PRODUCE, {"queue": "q", "partition": 0}).header.status == BadParameter.code  # no batch
    alive(h)


def test_unknown_things(h):
    assert h.request(Op.DESCRIBE_QUEUE, {"name": "nope"}).header.status == UnknownQueue.code
    batch = h.batch(b"x")
    # queues are created on first send (auto_create_queues); dead-letter queues never are
    m = h.request(Op.PRODUCE, {"queue": "nope.dlq", "partition": 0}, [batch])
    assert m.header.status == UnknownQueue.code and "nope.dlq" in m.params["message"]
    assert h.call(Op.PRODUCE, {"queue": "fresh", "partition": 0}, [batch])["created"] is True
    assert h.request(Op.PRODUCE, {"queue": "q", "partition": 7}, [batch]).header.status == UnknownPartition.code
    assert h.request(Op.UNSUBSCRIBE, {"subscription": 12345}).header.status == UnknownSubscription.code
    assert h.request(Op.CREATE_QUEUE, {"name": "q"}).header.status == QueueExists.code
    assert h.request(Op.FETCH, {"queue": "q", "partition": 0, "offset": 50}).header.status == OffsetOutOfRange.code
    alive(h)


def test_bad_batches_store_nothing(h):
    good = h.batch(b"ok")
    produce = {"queue": "q", "partition": 0}
    assert h.request(Op.PRODUCE, produce, [good]).header.status == 0
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF
    assert h.request(Op.PRODUCE, produce, [bytes(flipped)]).header.status == CorruptBatch.code
    assert h.request(Op.PRODUCE, produce, [good + b"junk"]).header.status == ProtocolError.code
    assert h.request(Op.PRODUCE, produce, [good[:30]]).header.status == ProtocolError.code
    assert h.request(Op.PRODUCE, produce, [h.batch(b"x" * 1001)]).header.status == MessageTooLarge.code
    # a request mixing a good and a bad batch stores neither
    assert h.request(Op.PRODUCE, produce, [good, bytes(flipped)]).header.status == CorruptBatch.code
    assert h.describe("q")["messages"] == 1
    assert values(h.request(Op.FETCH, {**produce, "offset": 0})) == [b"ok"]


def test_a_full_queue_refuses_with_a_clear_error(h):
    assert h.request(Op.PRODUCE, {"queue": "q", "partition": 1}, [h.batch(*[b"a"] * 5)]).header.status == 0
    m = h.request(Op.PRODUCE, {"queue": "q", "partition": 0}, [h.batch(b"b")])
    assert m.header.status == QueueFull.code and "max_messages" in m.params["message"]
    alive(h)


def test_an_oversize_request_is_refused(tmp_path):
    config = NodeConfig(node_id="n1", data_dir=str(tmp_path), limits=Limits(max_request_bytes=64 * 1024))
    h = BrokerHarness(tmp_path, config)
    try:
        h.create_queue("big")
        m = h.request(Op.PRODUCE, {"queue": "big", "partition": 0}, [b"\0" * 40_000] * 2)
        assert m.header.status == RequestTooLarge.code and "65536" in m.params["message"]
        alive(h)
    finally:
        h.close()


def test_no_reply_wanted_and_garbage_do_not_stop_the_node(h):
    h.send_frames([header(Op.PRODUCE, flags=fr.FLAG_NO_REPLY), b"{}", b"garbage"])
    assert not h.replies[b"alice"]  # the error is logged, not sent
    for junk in ([b""], [b"\xff" * 16, b"\xff"], [(5).to_bytes(8, "little")] * 5):
        h.send_frames(junk)
        assert h.last_reply().header.status != 0
    alive(h)


def test_bad_message_properties_store_nothing(h):
    def status(queue: str, extra: dict, batch: bytes) -> fr.Message:
        return h.request(Op.PRODUCE, {"queue": queue, "partition": 0, **extra}, [batch])

    two = h.batch(b"a", b"b")
    m = status("q", {"priority": 1}, two)
    assert m.header.status == BadParameter.code and "priority levels 0..0" in m.params["message"]
    m = status("q", {"delay_ms": 5, "deliver_at_ms": 5}, two)
    assert m.header.status == BadParameter.code and "not both" in m.params["message"]
    m = status("q", {"dedup_ids": ["x", "y"]}, two)
    assert m.header.status == BadParameter.code and "no dedup window" in m.params["message"]
    h.create_queue("d", dedup_window_ms=60_000)
    m = status("d", {"dedup_ids": ["x"]}, two)
    assert m.header.status == BadParameter.code and "1 ids for a batch of 2" in m.params["message"]
    idempotent = h.batch(b"a", producer_id=1, producer_epoch=0, base_sequence=0)
    m = status("d", {"delay_ms": 1000}, idempotent)
    assert m.header.status == BadParameter.code and "producer id" in m.params["message"]
    m = status("d", {"delay_ms": 1000, "dedup_ids": ["x", "y"]}, two)
    assert m.header.status == BadParameter.code and "delayed" in m.params["message"]
    assert h.describe("d")["messages"] == 0 and h.describe("q")["messages"] == 0
    assert h.call(Op.PRODUCE, {"queue": "d", "partition": 0, "dedup_ids": ["x", "x"]}, [two]) == {
        "offsets": [0],
        "duplicates": [1],
        "partitions": 1,
    }
