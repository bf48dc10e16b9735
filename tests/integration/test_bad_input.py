"""Every error code a client can provoke, over a raw DEALER socket: an error reply
with the right code each time, and the connection and the node live on."""

from __future__ import annotations

import json
import struct

import pytest
import zmq

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
from fabric.protocol.batch import encode_batch
from fabric.protocol.ops import Op

pytestmark = pytest.mark.integration


class Raw:
    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 5000)
        self.sock.connect(endpoint)
        self.rid = 100

    def send_frames(self, frames: list[bytes]) -> fr.Message:
        self.sock.send_multipart(frames)
        return fr.decode(self.sock.recv_multipart())

    def call(
        self, op: int, params: dict | bytes | None = None, data: list[bytes] = (), version: int = 1, flags: int = 0
    ) -> fr.Message:
        self.rid += 1
        header = fr.HEADER.pack(b"FB", version, op, flags, 0, 0, self.rid)
        body = params if isinstance(params, bytes) else json.dumps(params or {}).encode()
        msg = self.send_frames([header, body, *data])
        assert msg.header.flags & fr.FLAG_REPLY
        return msg

    def alive(self) -> None:
        assert self.call(Op.PING).header.status == 0


@pytest.fixture
def raw(node):
    r = Raw(node.endpoint)
    r.call(Op.CREATE_QUEUE, {"name": "q", "settings": {"partitions": 2, "max_message_bytes": 1000, "max_messages": 5}})
    yield r
    r.sock.close(0)


def _status(msg: fr.Message) -> int:
    return msg.header.status


def test_malformed_frames(raw):
    # too few frames, short header, bad magic: the node cannot even read a request id, yet replies
    assert _status(raw.send_frames([b"\x01\x02"])) == ProtocolError.code
    assert _status(raw.send_frames([b"short", b""])) == ProtocolError.code
    assert _status(raw.send_frames([b"XX" + b"\0" * 14, b""])) == ProtocolError.code
    assert _status(raw.call(Op.PING, version=9)) == UnsupportedVersion.code
    assert _status(raw.call(99)) == UnknownCommand.code
    assert _status(raw.call(Op.PING, b"{not json")) == ProtocolError.code
    assert _status(raw.call(Op.PING, b"[1,2]")) == ProtocolError.code
    assert _status(raw.call(Op.PING, flags=0x80)) == ProtocolError.code
    assert _status(raw.call(Op.PUSH)) == ProtocolError.code
    raw.alive()


def test_bad_parameters(raw):
    m = raw.call(Op.PRODUCE, {"queue": "q"})
    assert _status(m) == BadParameter.code and "partition" in m.params["message"]
    assert _status(raw.call(Op.FETCH, {"queue": "q", "partition": 0, "offset": -1})) == BadParameter.code
    assert _status(raw.call(Op.FETCH, {"queue": "q", "partition": True, "offset": 0})) == BadParameter.code
    assert _status(raw.call(Op.CREATE_QUEUE, {"name": "../etc"})) == BadParameter.code
    m = raw.call(Op.CREATE_QUEUE, {"name": "z", "settings": {"partitons": 2}})
    assert _status(m) == BadParameter.code and "partitons" in m.params["message"]
    assert _status(raw.call(Op.CREATE_QUEUE, {"name": "z", "settings": {"fsync": "sometimes"}})) == BadParameter.code
    assert _status(raw.call(Op.LIST_QUEUES, {"bogus": 1})) == BadParameter.code
    assert _status(raw.call(Op.PRODUCE, {"queue": "q", "partition": 0})) == BadParameter.code  # no batch frame
    raw.alive()


def test_unknown_things(raw):
    assert _status(raw.call(Op.DESCRIBE_QUEUE, {"name": "nope"})) == UnknownQueue.code
    batch = encode_batch([b"x"])
    # queues are created on first send (auto_create_queues); dead-letter queues never are
    m = raw.call(Op.PRODUCE, {"queue": "nope.dlq", "partition": 0}, [batch])
    assert _status(m) == UnknownQueue.code and "nope.dlq" in m.params["message"]
    m = raw.call(Op.PRODUCE, {"queue": "fresh", "partition": 0}, [batch])
    assert _status(m) == 0 and m.params["created"] is True
    assert _status(raw.call(Op.PRODUCE, {"queue": "q", "partition": 7}, [batch])) == UnknownPartition.code
    assert _status(raw.call(Op.UNSUBSCRIBE, {"subscription": 12345})) == UnknownSubscription.code
    assert _status(raw.call(Op.CREATE_QUEUE, {"name": "q"})) == QueueExists.code
    assert _status(raw.call(Op.FETCH, {"queue": "q", "partition": 0, "offset": 50})) == OffsetOutOfRange.code
    raw.alive()


def test_bad_batches_lose_nothing(raw):
    good = encode_batch([b"ok"])
    assert _status(raw.call(Op.PRODUCE, {"queue": "q", "partition": 0}, [good])) == 0
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF
    assert _status(raw.call(Op.PRODUCE, {"queue": "q", "partition": 0}, [bytes(flipped)])) == CorruptBatch.code
    assert _status(raw.call(Op.PRODUCE, {"queue": "q", "partition": 0}, [good + b"junk"])) == ProtocolError.code
    assert _status(raw.call(Op.PRODUCE, {"queue": "q", "partition": 0}, [good[:30]])) == ProtocolError.code
    big = encode_batch([b"x" * 1001])
    assert _status(raw.call(Op.PRODUCE, {"queue": "q", "partition": 0}, [big])) == MessageTooLarge.code
    # a request mixing a good and a bad batch stores neither
    assert _status(raw.call(Op.PRODUCE, {"queue": "q", "partition": 0}, [good, bytes(flipped)])) == CorruptBatch.code
    m = raw.call(Op.DESCRIBE_QUEUE, {"name": "q"})
    assert m.params["messages"] == 1
    fetched = raw.call(Op.FETCH, {"queue": "q", "partition": 0, "offset": 0})
    assert fetched.data and bytes(fetched.data[0])[57:] == good[57:]


def test_queue_full_rejects_with_clear_error(raw):
    five = encode_batch([b"a"] * 5)
    assert _status(raw.call(Op.PRODUCE, {"queue": "q", "partition": 1}, [five])) == 0
    m = raw.call(Op.PRODUCE, {"queue": "q", "partition": 0}, [encode_batch([b"b"])])
    assert _status(m) == QueueFull.code and "max_messages" in m.params["message"]
    raw.alive()


def test_oversize_request(node):
    r = Raw(node.endpoint)
    r.call(
        Op.CREATE_QUEUE,
        {"name": "big", "settings": {"max_batch_bytes": 64 * 1024 * 1024, "max_message_bytes": 64 * 1024 * 1024}},
    )
    # 70 MiB > max_request_bytes (64 MiB) but < the socket's hard ceiling
    data = [b"\0" * (10 * 1024 * 1024)] * 7
    assert _status(r.call(Op.PRODUCE, {"queue": "big", "partition": 0}, data)) == RequestTooLarge.code
    r.alive()
    r.sock.close(0)


def test_no_reply_flag_and_garbage_does_not_kill_the_node(raw):
    raw.sock.send_multipart([fr.HEADER.pack(b"FB", 1, Op.PRODUCE, fr.FLAG_NO_REPLY, 0, 0, 1), b"{}", b"garbage"])
    for junk in ([b""], [b"\xff" * 16, b"\xff"], [struct.pack("<q", 5)] * 5):
        raw.sock.send_multipart(junk)
        raw.sock.recv_multipart()
    raw.alive()


def test_bad_message_properties_lose_nothing(raw):
    batch = encode_batch([b"a", b"b"])
    produce = {"queue": "q", "partition": 0}

    def status(extra: dict, data: list[bytes] = [batch]) -> fr.Message:  # noqa: B006
        return raw.call(Op.PRODUCE, {**produce, **extra}, data)

    m = status({"priority": 1})
    assert _status(m) == BadParameter.code and "priority levels 0..0" in m.params["message"]
    assert _status(status({"priority": 10})) == BadParameter.code
    m = status({"delay_ms": 5, "deliver_at_ms": 5})
    assert _status(m) == BadParameter.code and "not both" in m.params["message"]
    assert _status(status({"delay_ms": -1})) == BadParameter.code
    m = status({"dedup_ids": ["x", "y"]})
    assert _status(m) == BadParameter.code and "no dedup window" in m.params["message"]
    raw.call(Op.CREATE_QUEUE, {"name": "d", "settings": {"dedup_window_ms": 60_000}})
    dedup = {"queue": "d", "partition": 0}
    m = raw.call(Op.PRODUCE, {**dedup, "dedup_ids": ["x"]}, [batch])
    assert _status(m) == BadParameter.code and "1 ids for a batch of 2" in m.params["message"]
    m = raw.call(Op.PRODUCE, {**dedup, "dedup_ids": ["x", 5]}, [batch])
    assert _status(m) == BadParameter.code and "entry 1" in m.params["message"]
    m = raw.call(Op.PRODUCE, {**dedup, "dedup_ids": ["x", "y"]}, [batch, batch])
    assert _status(m) == BadParameter.code and "one batch" in m.params["message"]
    idempotent = encode_batch([b"a"], producer_id=1, producer_epoch=0, base_sequence=0)
    m = raw.call(Op.PRODUCE, {**dedup, "dedup_ids": ["x"]}, [idempotent])
    assert _status(m) == BadParameter.code and "producer id" in m.params["message"]
    m = raw.call(Op.PRODUCE, {**dedup, "delay_ms": 1000}, [idempotent])
    assert _status(m) == BadParameter.code and "producer id" in m.params["message"]
    m = raw.call(Op.PRODUCE, {**dedup, "delay_ms": 1000, "dedup_ids": ["x", "y"]}, [batch])
    assert _status(m) == BadParameter.code and "delayed" in m.params["message"]
    # nothing of the refused requests was stored, and a good one still goes through
    ok = raw.call(Op.PRODUCE, {**dedup, "dedup_ids": ["x", "x"]}, [batch])
    assert _status(ok) == 0 and ok.params == {"offsets": [0], "duplicates": [1], "partitions": 1}
    assert raw.call(Op.DESCRIBE_QUEUE, {"name": "d"}).params["messages"] == 1
    assert raw.call(Op.DESCRIBE_QUEUE, {"name": "q"}).params["messages"] == 0
    raw.alive()
