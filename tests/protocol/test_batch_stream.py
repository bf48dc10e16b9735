"""Parsing a stream whole, byte by byte, or in random pieces gives the same batches."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.errors import CorruptBatch, ProtocolError
from fabric.protocol import batch as B

from .helpers import MEDIUM, batch_streams


def feed_in_pieces(stream: bytes, cuts: list[int]) -> tuple[list[bytes], int]:
    decoder = B.BatchStreamDecoder()
    out: list[bytes] = []
    start = 0
    for cut in [*sorted(cuts), len(stream)]:
        out += decoder.feed(stream[start:cut])
        start = cut
    return out, decoder.pending


@MEDIUM
@given(batch_streams(), st.data())
def test_whole_bytewise_and_random_pieces_agree(sample: tuple[bytes, list[bytes]], data: st.DataObject) -> None:
    stream, batches = sample
    whole = B.BatchStreamDecoder()
    assert whole.feed(stream) == batches
    assert whole.pending == 0

    bytewise = B.BatchStreamDecoder()
    out: list[bytes] = []
    for i in range(len(stream)):
        out += bytewise.feed(stream[i : i + 1])
    assert out == batches
    assert bytewise.pending == 0

    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts")
    assert feed_in_pieces(stream, cuts) == (batches, 0)

    # feeding memoryview / bytearray pieces gives the same as bytes
    mixed = B.BatchStreamDecoder()
    half = len(stream) // 2
    assert mixed.feed(memoryview(stream)[:half]) + mixed.feed(bytearray(stream[half:])) == batches


@MEDIUM
@given(batch_streams())
def test_iter_batches_agrees_with_the_stream_decoder(sample: tuple[bytes, list[bytes]]) -> None:
    stream, batches = sample
    walked = list(B.iter_batches(stream))
    assert walked == list(B.iter_batches(stream, verify=False))
    assert [h for _, h in walked] == [B.parse_header(b) for b in batches]
    positions = [0]
    for b in batches[:-1]:
        positions.append(positions[-1] + len(b))
    assert [pos for pos, _ in walked] == positions
    # offsets are consecutive, as the store assigns them
    for (_, first), (_, second) in itertools.pairwise(walked):
        assert second.base_offset == first.next_offset
    for pos, h in walked:
        assert B.decode_records(stream, pos).values == B.decode_records(stream[pos : pos + h.size]).values
        assert B.decode_values(stream, pos)[1] == B.decode_records(stream, pos).values


@MEDIUM
@given(batch_streams(), st.data())
def test_partial_tail_waits_and_the_good_prefix_comes_out(
    sample: tuple[bytes, list[bytes]], data: st.DataObject
) -> None:
    stream, batches = sample
    cut = data.draw(st.integers(0, len(stream) - 1))
    decoder = B.BatchStreamDecoder()
    got = decoder.feed(stream[:cut])
    assert got == batches[: len(got)]
    assert decoder.pending == cut - sum(map(len, got))
    assert got + decoder.feed(stream[cut:]) == batches
    # iter_batches over a cut stream yields the whole batches, then raises if a batch is cut short
    seen = []
    try:
        for _, h in B.iter_batches(stream[:cut]):
            seen.append(h)
    except ProtocolError:
        assert cut != sum(map(len, batches[: len(seen)]))
    else:
        assert cut == sum(map(len, batches[: len(seen)]))
    assert seen == [B.parse_header(b) for b in batches[: len(seen)]]


def test_decoder_limit_rejects_a_batch_larger_than_allowed() -> None:
    big = B.encode_batch([b"x" * 2000])
    decoder = B.BatchStreamDecoder(batch_bytes_max=1024)
    with pytest.raises(CorruptBatch, match="exceeds 1024"):
        decoder.feed(big[: B.HEADER_SIZE])  # the header alone is enough to refuse
    assert B.BatchStreamDecoder(batch_bytes_max=len(big)).feed(big) == [big]


def test_iter_batches_stops_at_the_first_bad_batch_after_yielding_the_good_ones() -> None:
    a, b = B.encode_batch([b"a"]), bytearray(B.encode_batch([b"b"]))
    b[-1] ^= 1
    seen = []
    with pytest.raises(CorruptBatch):
        for pos, _ in B.iter_batches(a + bytes(b)):
            seen.append(pos)
    assert seen == [0]


def test_decoder_pieces_see_the_good_prefix_before_the_error() -> None:
    good = B.encode_batch([b"ok"])
    decoder = B.BatchStreamDecoder()
    assert decoder.feed(good) == [good]
    with pytest.raises(ProtocolError):
        decoder.feed(b"\x00" * B.HEADER_SIZE)


def test_decoder_whole_returns_the_good_prefix_then_raises() -> None:
    good = B.encode_batch([b"ok"])
    decoder = B.BatchStreamDecoder()
    assert decoder.feed(good + b"\x00" * B.HEADER_SIZE) == [good]
    with pytest.raises(ProtocolError):
        decoder.feed(b"")
