"""encode_batch -> check_batch / decode_records / decode_values gives back the input."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.errors import MessageTooLarge, ProtocolError
from fabric.protocol import batch as B

from .helpers import MEDIUM, batch_inputs, build_batch, encode, lz4_region


def expected_columns(kw: dict[str, Any]) -> dict[str, Any]:
    """What decode_records must return: absent or all-empty optional columns decode as None."""
    n = len(kw["values"])
    keys = kw.get("keys")
    headers = kw.get("headers")
    timestamps = kw.get("timestamps")
    return {
        "values": list(kw["values"]),
        "keys": list(keys) if keys is not None and any(k is not None for k in keys) else None,
        "headers": [h or {} for h in headers] if headers is not None and any(headers) else None,
        "timestamps": list(timestamps) if timestamps is not None else [kw["first_timestamp"]] * n,
    }


@MEDIUM
@given(batch_inputs())
def test_round_trip(kw: dict[str, Any]) -> None:
    raw = encode(kw)
    want = expected_columns(kw)
    n = len(kw["values"])

    h = B.check_batch(raw)
    assert h == B.parse_header(raw)
    assert h.size == len(raw)
    assert (h.base_offset, h.leader_epoch, h.magic) == (0, 0, B.MAGIC)
    assert h.record_count == n and h.last_offset == n - 1 and h.next_offset == n
    assert h.codec == kw["codec"]
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (
        kw["producer_id"],
        kw["producer_epoch"],
        kw["base_sequence"],
    )
    assert h.first_timestamp == min(want["timestamps"])
    if "timestamps" in kw:
        assert h.max_timestamp == max(kw["timestamps"])
    else:
        assert h.max_timestamp == kw.get("max_timestamp", kw["first_timestamp"])
    assert bool(h.attributes & B.HAS_KEYS) == (want["keys"] is not None)
    assert bool(h.attributes & B.HAS_HEADERS) == (want["headers"] is not None)
    assert bool(h.attributes & B.HAS_TIMESTAMPS) == ("timestamps" in kw)
    assert B.batch_ttl_ms(raw, h) == kw.get("ttl_ms", 0)
    if kw.get("ttl_ms"):
        assert B.expires_at_ms(raw, h, 5) == h.max_timestamp + kw["ttl_ms"]
    else:
        assert B.expires_at_ms(raw, h, 5) == h.max_timestamp + 5
        assert B.expires_at_ms(raw, h, 0) == 0

    for buf in (raw, bytearray(raw), memoryview(raw)):
        rec = B.decode_records(buf)
        assert len(rec) == n
        assert rec.base_offset == 0
        assert rec.values == want["values"]
        assert rec.keys == want["keys"]
        assert rec.headers == want["headers"]
        assert rec.timestamps == want["timestamps"]
        # decode_values is hinted bytes | memoryview but takes a bytearray as well
        vh, values = B.decode_values(buf)  # type: ignore[arg-type]
        assert vh == h
        assert values == want["values"]
        assert all(type(v) is bytes for v in values)

    # max_record_bytes bounds every record's key + headers + value, exactly when only values exist
    biggest = B.max_record_bytes(raw, h)
    rec = B.decode_records(raw)
    sizes = [
        len(v)
        + (len(rec.keys[i] or b"") if rec.keys else 0)
        + (len(B.encode_headers(rec.headers[i])) if rec.headers else 0)
        for i, v in enumerate(rec.values)
    ]
    assert biggest >= max(sizes)
    if rec.keys is None and rec.headers is None:
        assert biggest == max(sizes)


@MEDIUM
@given(batch_inputs(), st.integers(0, 2**63 - 2**21), st.integers(-(2**31), 2**31 - 1))
def test_stamp_sets_offset_and_epoch_without_touching_the_crc(kw: dict[str, Any], base: int, epoch: int) -> None:
    raw = encode(kw)
    buf = bytearray(raw)
    B.stamp(buf, base, epoch)
    h = B.check_batch(buf)  # CRC still good
    assert (h.base_offset, h.leader_epoch) == (base, epoch)
    assert h.crc == B.parse_header(raw).crc
    assert buf[8:12] == raw[8:12] and buf[16:] == raw[16:]
    assert B.decode_records(buf).base_offset == base
    assert B.decode_records(buf).values == B.decode_records(raw).values
    assert h.last_offset == base + h.record_count - 1


def test_stamp_at_a_position_inside_a_buffer() -> None:
    a, b = B.encode_batch([b"a"]), B.encode_batch([b"b", b"c"])
    buf = bytearray(a + b)
    B.stamp(buf, 7, 2, pos=len(a))
    assert [(pos, h.base_offset, h.leader_epoch) for pos, h in B.iter_batches(buf)] == [(0, 0, 0), (len(a), 7, 2)]


def test_the_crc_covers_exactly_bytes_21_to_the_end() -> None:
    raw = B.encode_batch([b"x", b"yz"], keys=[b"k", None])
    (crc,) = struct.unpack_from("<I", raw, 17)
    assert crc == B.crc32c(raw[21:])
    assert B.HEADER_SIZE == 57 and B.CRC_START == 21 and B.LENGTH_PREFIX == 12


@pytest.mark.parametrize("codec", [B.CODEC_NONE, B.CODEC_LZ4])
def test_encoder_matches_the_documented_layout(codec: int) -> None:
    """Rebuild a batch from the docstring's offsets alone and compare byte for byte."""
    values, keys, ts = [b"hi", b""], [None, b"key"], [1_000, 1_250]
    headers = [{"h": b"v"}, None]
    raw = B.encode_batch(values, keys=keys, headers=headers, timestamps=ts, codec=codec, producer_id=9)
    hdr_a = struct.pack("<H", 1) + struct.pack("<H", 1) + b"h" + struct.pack("<I", 1) + b"v"
    hdr_b = struct.pack("<H", 0)
    region = (
        struct.pack("<2I", 0, 250)  # ts deltas
        + struct.pack("<2i", -1, 3)  # key lengths
        + struct.pack("<2I", len(hdr_a), len(hdr_b))
        + struct.pack("<2I", 2, 0)  # value lengths
        + b"key"
        + hdr_a
        + hdr_b
        + b"hi"
    )
    if codec == B.CODEC_LZ4:
        region = lz4_region(region)
    attributes = codec | B.HAS_TIMESTAMPS | B.HAS_KEYS | B.HAS_HEADERS
    want = build_batch(
        region, attributes=attributes, record_count=2, first_timestamp=1_000, max_timestamp=1_250, producer_id=9
    )
    assert raw == want


def test_values_only_batch_has_no_column_flags() -> None:
    raw = B.encode_batch([b"a"], keys=[None], headers=[{}])
    assert B.parse_header(raw).attributes == 0
    assert len(raw) == B.HEADER_SIZE + 4 + 1


def test_value_lengths_shortcut_gives_the_same_bytes() -> None:
    values = [b"a", b"bcd", b""]
    assert B.encode_batch(values, value_lengths=[1, 3, 0]) == B.encode_batch(values)


def test_headers_round_trip_alone() -> None:
    h = {"": b"", "name": b"\x00\xff", "ünï": b"x" * 300}
    assert B.decode_headers(B.encode_headers(h)) == h


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"values": []}, ProtocolError),
        ({"values": [b"a"], "codec": 2}, ProtocolError),
        ({"values": [b"a"], "timestamps": [1, 2]}, ProtocolError),
        ({"values": [b"a", b"b"], "timestamps": [0, 2**32]}, ProtocolError),
        ({"values": [b"a"], "keys": [b"k", b"k"]}, ProtocolError),
        ({"values": [b"a"], "headers": [{"a": b""}, {}]}, ProtocolError),
        ({"values": [b"a"], "headers": [{"n" * 65536: b""}]}, ProtocolError),
        ({"values": [b"x" * B.BATCH_BYTES_MAX]}, MessageTooLarge),
    ],
)
def test_encode_rejects(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        encode(kwargs)


def test_encode_rejects_too_many_records() -> None:
    with pytest.raises(ProtocolError):
        B.encode_batch([b""] * (B.RECORD_COUNT_MAX + 1))


def test_record_count_max_is_accepted() -> None:
    raw = B.encode_batch([b""] * B.RECORD_COUNT_MAX, codec=B.CODEC_LZ4)
    h = B.check_batch(raw)
    assert h.record_count == B.RECORD_COUNT_MAX
    assert len(B.decode_values(raw)[1]) == B.RECORD_COUNT_MAX


@given(
    value=st.binary(max_size=300),
    first=st.integers(0, 2**40),
    span=st.integers(0, 2**31),
    producer=st.tuples(st.integers(-1, 2**62), st.integers(-1, 2**15 - 1), st.integers(-1, 2**31 - 1)),
)
@MEDIUM
def test_encode_one_is_encode_batch_of_one_value(value: bytes, first: int, span: int, producer: tuple) -> None:
    pid, epoch, seq = producer
    expected = B.encode_batch(
        [value],
        first_timestamp=first,
        max_timestamp=first + span,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )
    assert B.encode_one(value, first, first + span, pid, epoch, seq) == expected


@pytest.mark.parametrize("size", [1, 7, 100, 4096])
@pytest.mark.parametrize("n", [2, 3, 1000])
def test_records_of_one_length_decode_as_any_other(size: int, n: int) -> None:
    """Records of one length take the compiled-struct cut; what comes out is the same as the
    general path's, from a batch at an offset inside a larger buffer too."""
    values = [bytes([i % 251]) * size for i in range(n)]
    keys = [b"k%03d" % (i % 1000) for i in range(n)]
    raw = B.encode_batch(values, keys=keys, first_timestamp=1)
    buf = b"\x00" * 13 + raw + b"\xff" * 5
    assert B.decode_values(raw)[1] == values
    assert B.decode_values(memoryview(buf), 13)[1] == values
    rec = B.decode_records(buf, 13)
    assert (rec.values, rec.keys) == (values, keys)
    mixed = [*values[:-1], values[-1] + b"!"]
    assert B.decode_values(B.encode_batch(mixed, first_timestamp=1))[1] == mixed


def test_many_shapes_of_one_length_batches_keep_decoding() -> None:
    """The cache of compiled cuts is bounded: past its size it starts again, and every batch
    still decodes."""
    for n in range(2, 2 + 3 * B._SAME_LENGTHS_MAX):
        values = [b"v%d" % n] * n
        assert B.decode_values(B.encode_batch(values, first_timestamp=1))[1] == values
    assert len(B._SAME_LENGTHS) <= B._SAME_LENGTHS_MAX


def test_batch_span_reads_what_parse_header_does() -> None:
    buf = bytearray(B.encode_batch([b"a", b"bc", b"def"]) + B.encode_batch([b"x"]))
    B.stamp(buf, 40)
    first = B.parse_header(buf)
    B.stamp(buf, 43, pos=first.size)
    for pos in (0, first.size):
        h = B.parse_header(buf, pos)
        assert B.batch_span(buf, pos) == (h.base_offset, h.size, h.record_count)
    bad = bytearray(buf)
    struct.pack_into("<i", bad, 8, 3)  # a batch_length shorter than a header: damage, not a batch
    with pytest.raises(B.CorruptBatch):
        B.batch_span(bad)


def test_a_plain_batch_reads_the_same_on_the_consumers_fast_path() -> None:
    from fabric.errors import CorruptBatch
    from fabric.protocol.batch import decode_values, encode_batch, plain_values, stamp

    for values in ([b"x" * 100], [b"a", b"bb", b""], [b"v%03d" % i for i in range(300)]):
        raw = bytearray(encode_batch(values, first_timestamp=1234))
        stamp(raw, 40)
        buf = b"junk" + bytes(raw)
        assert plain_values(buf, 4) == (40, len(raw), 1234, values)
        h, decoded = decode_values(buf, 4)
        assert decoded == values and h.size == len(raw)
    keyed = encode_batch([b"v"], keys=[b"k"])
    assert plain_values(keyed) is None  # keys, headers, timestamps, TTL, lz4: the general path
    assert plain_values(bytes(encode_batch([b"v"]))[:-1]) is None  # cut short: check_batch names it
    bad = bytearray(encode_batch([b"value"]))
    bad[-1] ^= 1
    with pytest.raises(CorruptBatch):
        plain_values(bytes(bad))
