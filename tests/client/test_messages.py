"""What a consumer hands out: ``Message`` and ``ReceivedBatch`` keep the surface they had as
frozen dataclasses (fields, keyword and positional construction, equality, repr, immutability),
and a pushed chunk is decoded in one walk that also counts every record the node spent."""

from __future__ import annotations

import pickle

import pytest

from fabric.client.messages import Message, ReceivedBatch, decode_chunk, decode_pushed
from fabric.errors import CorruptBatch
from fabric.protocol.batch import encode_batch, stamp


def test_message_compares_prints_and_stays_frozen() -> None:
    m = Message("q", 1, 7, b"v", key=b"k", headers={"h": b"x"}, timestamp_ms=5, receive_count=2)
    assert m == Message("q", 1, 7, b"v", b"k", {"h": b"x"}, 5, 2)
    assert m != Message("q", 1, 8, b"v", b"k", {"h": b"x"}, 5, 2)
    assert (m.queue, m.partition, m.offset, m.value, m.key, m.headers, m.timestamp_ms, m.receive_count) == (
        "q",
        1,
        7,
        b"v",
        b"k",
        {"h": b"x"},
        5,
        2,
    )
    assert repr(Message("q", 0, 1, b"v")) == (
        "Message(queue='q', partition=0, offset=1, value=b'v', key=None, headers=None, timestamp_ms=0, receive_count=1)"
    )
    with pytest.raises(AttributeError):
        m.offset = 9  # type: ignore[misc]
    assert hash(Message("q", 0, 1, b"v")) == hash(Message("q", 0, 1, b"v"))
    assert pickle.loads(pickle.dumps(m)) == m


def test_a_batch_makes_its_messages_from_its_columns() -> None:
    b = ReceivedBatch("q", 2, 10, [b"a", b"b", b"c"], [b"k", None, b"m"], None, [7, 8, 9], 7, 3)
    assert len(b) == 3
    assert b.messages() == [
        Message("q", 2, 10, b"a", b"k", None, 7, 3),
        Message("q", 2, 11, b"b", None, None, 8, 3),
        Message("q", 2, 12, b"c", b"m", None, 9, 3),
    ]
    plain = ReceivedBatch("q", 0, 0, [b"x", b"y"], None, [{"h": b"1"}, {}], None, 42)
    assert [(m.offset, m.key, m.headers, m.timestamp_ms, m.receive_count) for m in plain.messages()] == [
        (0, None, {"h": b"1"}, 42, 1),
        (1, None, {}, 42, 1),
    ]
    with pytest.raises(AttributeError):
        plain.base_offset = 3  # type: ignore[misc]


def _chunk(*batches: tuple[int, list[bytes]]) -> bytes:
    out = bytearray()
    for base, values in batches:
        raw = bytearray(encode_batch(values, first_timestamp=1000))
        stamp(raw, base)
        out += raw
    return bytes(out)


def test_a_pushed_chunk_is_decoded_once_and_every_record_counted() -> None:
    chunk = _chunk((0, [b"a", b"b", b"c"]), (3, [b"d"]), (4, [b"e", b"f"]))
    batches, records = decode_pushed("q", 0, chunk, 4)  # the first two batches are behind the position
    assert records == 6  # what the node spent of the credit: skipped batches too
    assert [(b.base_offset, b.values) for b in batches] == [(4, [b"e", b"f"])]
    batches, records = decode_pushed("q", 0, chunk, 1)  # a batch that straddles the position
    assert records == 6
    assert [(b.base_offset, b.values) for b in batches] == [(1, [b"b", b"c"]), (3, [b"d"]), (4, [b"e", b"f"])]
    assert decode_chunk("q", 0, chunk, 1) == batches


def test_a_damaged_batch_in_a_push_is_refused() -> None:
    chunk = bytearray(_chunk((0, [b"a", b"b"])))
    chunk[-1] ^= 0xFF
    with pytest.raises(CorruptBatch):
        decode_pushed("q", 0, bytes(chunk), 0)
