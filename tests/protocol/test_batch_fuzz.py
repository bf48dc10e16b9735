"""Any bytes either decode or raise a ProtocolError (or a subclass); never another exception."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.errors import CorruptBatch, ProtocolError
from fabric.protocol import batch as B

from .helpers import (
    FAST,
    MEDIUM,
    THOROUGH,
    build_batch,
    decodes_or_protocol_error,
    encoded_batches,
    lz4_region,
    recrc,
)


def exercise_every_decoder(buf: bytes) -> None:
    """Run every batch decoder on ``buf``; check what each returns is self-consistent."""
    h = decodes_or_protocol_error(B.parse_header, buf)
    if isinstance(h, B.BatchHeader):
        assert 1 <= h.record_count <= B.RECORD_COUNT_MAX
        assert B.HEADER_SIZE <= h.size <= B.BATCH_BYTES_MAX + B.LENGTH_PREFIX
        if h.size <= len(buf):
            biggest = decodes_or_protocol_error(B.max_record_bytes, buf, h)
            assert not isinstance(biggest, int) or biggest >= 0
    decodes_or_protocol_error(B.check_batch, buf)
    rec = decodes_or_protocol_error(B.decode_records, buf)
    if isinstance(rec, B.Records):
        n = B.parse_header(buf).record_count
        assert len(rec.values) == len(rec.timestamps) == n
        assert rec.keys is None or len(rec.keys) == n
        assert rec.headers is None or len(rec.headers) == n
    vals = decodes_or_protocol_error(B.decode_values, buf)
    if isinstance(vals, tuple) and isinstance(rec, B.Records):
        assert vals[1] == rec.values
    decodes_or_protocol_error(lambda b: list(B.iter_batches(b)), buf)
    decodes_or_protocol_error(lambda b: list(B.iter_batches(b, verify=False)), buf)
    decodes_or_protocol_error(B.BatchStreamDecoder().feed, buf)


@THOROUGH
@given(st.binary(max_size=200))
def test_random_bytes(buf: bytes) -> None:
    exercise_every_decoder(buf)


@st.composite
def plausible_batches(draw: st.DrawFn) -> bytes:
    """A well-formed header (magic, lengths, maybe CRC) over a random records region."""
    attributes = draw(st.integers(0, 0xFFFF) | st.sampled_from([0, 8, 16, 32, 56, 1, 9, 17, 33, 57]))
    record_count = draw(st.integers(-2, 6) | st.sampled_from([B.RECORD_COUNT_MAX, B.RECORD_COUNT_MAX + 1]))
    region = draw(st.binary(max_size=120))
    if attributes & B.CODEC_MASK == B.CODEC_LZ4 and draw(st.booleans()):
        region = lz4_region(region)  # valid lz4, garbage columns inside
    return build_batch(region, attributes=attributes, record_count=record_count, good_crc=draw(st.booleans()))


@THOROUGH
@given(plausible_batches())
def test_plausible_headers_over_random_regions(buf: bytes) -> None:
    exercise_every_decoder(buf)


@MEDIUM
@given(encoded_batches, st.data())
def test_flipping_a_crc_covered_byte_is_corrupt_batch(raw: bytes, data: st.DataObject) -> None:
    i = data.draw(st.integers(B.CRC_START, len(raw) - 1), label="index")
    flip = data.draw(st.integers(1, 255), label="xor")
    bad = bytearray(raw)
    bad[i] ^= flip
    with pytest.raises(CorruptBatch):
        B.check_batch(bad)
    with pytest.raises(CorruptBatch):
        list(B.iter_batches(bytes(bad)))
    with pytest.raises(CorruptBatch):
        B.BatchStreamDecoder().feed(bad)
    exercise_every_decoder(bytes(bad))


@FAST
@given(encoded_batches, st.data())
def test_flipping_the_crc_field_is_corrupt_batch(raw: bytes, data: st.DataObject) -> None:
    i = data.draw(st.integers(17, 20))
    bad = bytearray(raw)
    bad[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptBatch):
        B.check_batch(bad)


@FAST
@given(encoded_batches, st.data())
def test_flipping_a_byte_outside_the_crc_never_escapes(raw: bytes, data: st.DataObject) -> None:
    bad = bytearray(raw)
    bad[data.draw(st.integers(0, B.CRC_START - 1))] ^= data.draw(st.integers(1, 255))
    exercise_every_decoder(bytes(bad))


@MEDIUM
@given(encoded_batches, st.data())
def test_truncation_is_a_protocol_error(raw: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(raw) - 1))
    short = raw[:cut]
    with pytest.raises(ProtocolError):
        B.check_batch(short)
    if cut:
        with pytest.raises(ProtocolError):
            list(B.iter_batches(short))
        with pytest.raises(ProtocolError):
            list(B.iter_batches(short, verify=False))
    decoder = B.BatchStreamDecoder()
    assert decoder.feed(short) == []  # a partial batch waits for more
    assert decoder.pending == cut
    assert decoder.feed(raw[cut:]) == [raw]
    assert decoder.pending == 0
    exercise_every_decoder(short)


@st.composite
def recrc_mutants(draw: st.DrawFn) -> bytes:
    """A valid batch damaged after the CRC area starts, then given a fresh CRC and batch_length.

    The header checks and the CRC pass, so only decode_records' own validation of the
    length columns stands between the damage and the caller.
    """
    raw = bytearray(draw(encoded_batches))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set", "insert", "delete", "set_u32"]))
        i = draw(st.integers(B.CRC_START, len(raw)))
        if kind == "set" and i < len(raw):
            raw[i] = draw(st.integers(0, 255))
        elif kind == "insert":
            raw[i:i] = draw(st.binary(min_size=1, max_size=6))
        elif kind == "delete" and i < len(raw):
            del raw[i : i + draw(st.integers(1, 6))]
        elif kind == "set_u32" and i + 4 <= len(raw):
            value = draw(st.sampled_from([0, 1, 2, 3, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF]))
            struct.pack_into("<I", raw, i, value)
    return recrc(raw)


@st.composite
def region_mutants(draw: st.DrawFn) -> bytes:
    """Damage the *uncompressed* records region, then re-encode (lz4 too) with a good CRC."""
    raw = draw(encoded_batches)
    h = B.parse_header(raw)
    region = bytearray(B.records_region(raw, h))
    if region:
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, max(len(region) - 4, 0)))
            width = draw(st.sampled_from([1, 4]))
            value = draw(st.integers(0, 2 ** (8 * width) - 1))
            region[i : i + width] = value.to_bytes(width, "little")
    if draw(st.booleans()):
        region = region[: draw(st.integers(0, len(region)))]
    attributes = h.attributes
    if draw(st.booleans()):
        attributes ^= draw(st.sampled_from([B.HAS_KEYS, B.HAS_HEADERS, B.HAS_TIMESTAMPS]))
    record_count = draw(st.sampled_from([h.record_count, h.record_count + 1, max(h.record_count - 1, 1)]))
    body = lz4_region(bytes(region)) if h.codec == B.CODEC_LZ4 else bytes(region)
    return build_batch(body, attributes=attributes, record_count=record_count)


@THOROUGH
@given(recrc_mutants())
def test_recrc_mutants_decode_or_raise_protocol_errors(buf: bytes) -> None:
    exercise_every_decoder(buf)


@THOROUGH
@given(region_mutants())
def test_region_mutants_decode_or_raise_protocol_errors(buf: bytes) -> None:
    assert isinstance(decodes_or_protocol_error(B.check_batch, buf), B.BatchHeader | ProtocolError)
    exercise_every_decoder(buf)


@pytest.mark.parametrize(
    ("region", "attributes", "record_count"),
    [
        (b"", 0, 1),  # no value_len column at all
        (struct.pack("<I", 5) + b"abc", 0, 1),  # value runs past the region
        (struct.pack("<I", 1) + b"ab", 0, 1),  # trailing bytes
        (struct.pack("<2I", 0xFFFFFFFF, 1) + b"a", 0, 2),  # lengths overflow u32 sums
        (struct.pack("<iI", -2, 0), B.HAS_KEYS, 1),  # key length below -1
        (struct.pack("<II", 0, 0), B.HAS_HEADERS, 1),  # empty header blob (no count)
        (struct.pack("<II", 3, 0) + b"\x01\x00\x05", B.HAS_HEADERS, 1),  # header cut short
        (struct.pack("<II", 5, 0) + b"\x01\x00\x01\x00\xff", B.HAS_HEADERS, 1),  # name not UTF-8 / cut
        (struct.pack("<II", 9, 0) + b"\x00\x00" + b"\x00" * 7, B.HAS_HEADERS, 1),  # trailing header bytes
        (b"\x00\x00\x00\x00", B.CODEC_LZ4, 1),  # lz4 claims 0 bytes
        (b"\x01\x00", B.CODEC_LZ4, 1),  # lz4 size field cut short
        (struct.pack("<i", -1) + b"\x00", B.CODEC_LZ4, 1),  # lz4 negative size
        (struct.pack("<i", B.BATCH_BYTES_MAX + 1) + b"\x00", B.CODEC_LZ4, 1),  # lz4 over the limit
        (struct.pack("<I", 100) + b"\x10abc", B.CODEC_LZ4, 1),  # lz4 garbage
    ],
)
def test_handmade_corrupt_regions_are_corrupt_batch(region: bytes, attributes: int, record_count: int) -> None:
    buf = build_batch(region, attributes=attributes, record_count=record_count)
    B.check_batch(buf)  # the CRC is fine: the damage is in the layout
    with pytest.raises(CorruptBatch):
        B.decode_records(buf)
    with pytest.raises(CorruptBatch):
        B.decode_values(buf)


def test_lz4_uncompressed_max_is_enforced() -> None:
    raw = B.encode_batch([b"a" * 10_000], codec=B.CODEC_LZ4)
    assert B.decode_records(raw, uncompressed_max=10_004).values == [b"a" * 10_000]
    with pytest.raises(CorruptBatch):
        B.decode_records(raw, uncompressed_max=10_003)


@pytest.mark.parametrize(
    ("field", "fmt", "value", "error"),
    [
        (16, "<B", 2, ProtocolError),  # magic
        (8, "<i", 44, CorruptBatch),  # batch_length below the header
        (8, "<i", B.BATCH_BYTES_MAX + 1, CorruptBatch),
        (23, "<i", 0, CorruptBatch),  # record_count
        (23, "<i", B.RECORD_COUNT_MAX + 1, CorruptBatch),
        (21, "<H", 0x0100, CorruptBatch),  # unknown attribute bit (0x0080 is ENCRYPTED, set by nodes)
        (21, "<H", 0x0002, CorruptBatch),  # unknown codec
    ],
)
def test_parse_header_rejects(field: int, fmt: str, value: int, error: type[Exception]) -> None:
    buf = bytearray(B.encode_batch([b"a"]))
    struct.pack_into(fmt, buf, field, value)
    with pytest.raises(error):
        B.parse_header(buf)


def test_parse_header_needs_57_bytes() -> None:
    raw = B.encode_batch([b"a"])
    with pytest.raises(ProtocolError, match="57"):
        B.parse_header(raw[:56])
    assert B.parse_header(raw[: B.HEADER_SIZE]).record_count == 1  # header alone: CRC not checked


def test_decode_values_short_region_is_corrupt_batch() -> None:
    buf = build_batch(b"\x01\x00\x00\x00\x00", attributes=0, record_count=2)
    with pytest.raises(CorruptBatch):
        B.decode_values(buf)


@pytest.mark.parametrize(
    ("region", "attributes", "record_count"),
    [(b"", B.HAS_KEYS, 1), (b"\x00" * 5, B.HAS_KEYS, 2), (b"\x00" * 4, B.HAS_KEYS | B.HAS_HEADERS, 1)],
)
def test_max_record_bytes_short_region_is_corrupt_batch(region: bytes, attributes: int, record_count: int) -> None:
    buf = build_batch(region, attributes=attributes, record_count=record_count)
    with pytest.raises(CorruptBatch):
        B.max_record_bytes(buf, B.check_batch(buf))
