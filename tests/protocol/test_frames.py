"""Multipart framing: header frame, JSON params frame, data frames."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.errors import (
    BadParameter,
    ProtocolError,
    RequestTooLarge,
    UnknownCommand,
    UnsupportedVersion,
    error_for_code,
)
from fabric.protocol import batch as B
from fabric.protocol import frames as F
from fabric.protocol.ops import KNOWN_OPS, Op

from .helpers import FAST, MEDIUM, THOROUGH, decodes_or_protocol_error, json_objects

headers = st.builds(
    F.Header,
    op=st.integers(0, 255),
    request_id=st.integers(0, 2**64 - 1),
    flags=st.sampled_from([0, F.FLAG_REPLY, F.FLAG_NO_REPLY, F.FLAG_EVENT, F.FLAG_REPLY | F.FLAG_EVENT]),
    status=st.integers(0, 0xFFFF),
    version=st.just(F.VERSION),
)
data_frames = st.lists(st.binary(max_size=64), max_size=4)


def raw_header(
    magic: bytes = b"FB",
    version: int = 1,
    op: int = 1,
    flags: int = 0,
    reserved: int = 0,
    status: int = 0,
    rid: int = 7,
) -> bytes:
    return struct.pack("<2sBBBBHQ", magic, version, op, flags, reserved, status, rid)


def test_header_layout() -> None:
    h = F.Header(op=3, request_id=0x0102030405060708, flags=F.FLAG_REPLY, status=0x0B0A)
    raw = h.encode()
    assert F.HEADER_SIZE == 16 and len(raw) == 16
    assert raw == b"FB" + bytes([1, 3, 1, 0, 0x0A, 0x0B]) + bytes([8, 7, 6, 5, 4, 3, 2, 1])
    assert raw == raw_header(op=3, flags=1, status=0x0B0A, rid=0x0102030405060708)


@MEDIUM
@given(headers, json_objects, data_frames)
def test_round_trip(header: F.Header, params: dict[str, Any], data: list[bytes]) -> None:
    frames = F.encode(header, params, data)
    assert len(frames) == 2 + len(data)
    msg = F.decode(frames)
    assert msg.header == header
    assert msg.params == params
    assert list(msg.data) == data
    assert F.decode_header(frames[0]) == header
    assert F.peek_request_id(frames) == (header.op, header.request_id)
    # memoryview / bytearray frames decode the same
    assert F.decode([memoryview(f) for f in frames]) == F.decode([bytearray(f) for f in frames]) == msg


def test_empty_params_frame_means_empty_object() -> None:
    assert F.encode_params(None) == F.encode_params({}) == b""
    assert F.decode_params(b"") == {}
    assert F.decode_params(b"{}") == {}
    assert F.encode_params({"a": 1, "b": [1, 2]}) == b'{"a":1,"b":[1,2]}'


def test_batches_travel_as_data_frames() -> None:
    batches = [B.encode_batch([b"a"]), B.encode_batch([b"b", b"c"], codec=B.CODEC_LZ4)]
    frames = F.encode(F.Header(Op.PRODUCE, 42), {"queue": "q", "partition": 0}, batches)
    msg = F.decode(frames, known_ops=KNOWN_OPS)
    assert [B.decode_values(bytes(f))[1] for f in msg.data] == [[b"a"], [b"b", b"c"]]


def test_known_ops_accepts_every_op() -> None:
    for op in Op:
        assert F.decode(F.encode(F.Header(op, 1)), known_ops=KNOWN_OPS).header.op == op


@pytest.mark.parametrize(
    ("frames", "error"),
    [
        ([], ProtocolError),
        ([raw_header()], ProtocolError),  # no params frame
        ([raw_header()[:15], b""], ProtocolError),  # short header
        ([raw_header() + b"\x00", b""], ProtocolError),  # long header
        ([b"", b""], ProtocolError),
        ([raw_header(magic=b"FC"), b""], ProtocolError),
        ([raw_header(magic=b"\x00\x00"), b""], ProtocolError),
        ([raw_header(version=2), b""], UnsupportedVersion),
        ([raw_header(version=0), b""], UnsupportedVersion),
        ([raw_header(flags=0x10), b""], ProtocolError),  # unknown flag bit
        ([raw_header(flags=0x80), b""], ProtocolError),
        ([raw_header(reserved=1), b""], ProtocolError),
        ([raw_header(), b"[]"], ProtocolError),  # JSON, but not an object
        ([raw_header(), b"1"], ProtocolError),
        ([raw_header(), b'"s"'], ProtocolError),
        ([raw_header(), b"null"], ProtocolError),
        ([raw_header(), b"{"], ProtocolError),  # not JSON
        ([raw_header(), b"\xff\xfe"], ProtocolError),  # not UTF-8
        ([raw_header(), b" " * (F.PARAMS_BYTES_MAX + 1)], RequestTooLarge),
    ],
)
def test_decode_rejects(frames: list[bytes], error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        F.decode(frames)
    assert type(info.value) is error  # exactly this class, not just some ProtocolError


def test_magic_is_checked_before_version() -> None:
    with pytest.raises(ProtocolError) as info:
        F.decode_header(raw_header(magic=b"XX", version=9))
    assert type(info.value) is ProtocolError


@pytest.mark.parametrize("op", [0, 99, 255])
def test_unknown_op_with_known_ops(op: int) -> None:
    frames = [raw_header(op=op), b""]
    with pytest.raises(UnknownCommand, match=str(op)):
        F.decode(frames, known_ops=KNOWN_OPS)
    assert F.decode(frames).header.op == op  # without known_ops any op byte passes


def test_params_size_limit_is_inclusive() -> None:
    body = b'{"k":"' + b"x" * (F.PARAMS_BYTES_MAX - 8) + b'"}'
    assert len(body) == F.PARAMS_BYTES_MAX
    assert len(F.decode_params(body)["k"]) == F.PARAMS_BYTES_MAX - 8
    with pytest.raises(RequestTooLarge):
        F.decode_params(body + b" ")


def test_peek_request_id() -> None:
    assert F.peek_request_id([raw_header(op=9, rid=12345), b"{"]) == (9, 12345)
    # a header that fails to decode still yields its op and id for the error reply
    assert F.peek_request_id([raw_header(magic=b"??", version=7, op=5, rid=99)]) == (5, 99)
    assert F.peek_request_id([raw_header()[:10], b""]) == (0, 0)
    assert F.peek_request_id([]) == (0, 0)


@pytest.mark.parametrize("exc", [UnknownCommand("unknown op 77"), BadParameter("PRODUCE needs param 'queue'")])
def test_error_reply_shape_round_trips(exc: Exception) -> None:
    """A reply copies op and request id, sets FLAG_REPLY and the status; the client rebuilds the error."""
    request = [raw_header(op=77, rid=5), b""]
    op, rid = F.peek_request_id(request)
    assert isinstance(exc, BadParameter | UnknownCommand)
    reply = F.encode(
        F.Header(op, rid, flags=F.FLAG_REPLY, status=exc.code), {"error": exc.name, "message": exc.message}
    )
    msg = F.decode(reply)
    assert msg.header.flags & F.FLAG_REPLY and msg.header.request_id == 5 and msg.header.op == 77
    again = error_for_code(msg.header.status, msg.params["message"])
    assert type(again) is type(exc) and again.message == exc.message and again.name == msg.params["error"]


@THOROUGH
@given(st.lists(st.binary(max_size=40), max_size=4))
def test_any_frames_decode_or_raise_protocol_error(frames: list[bytes]) -> None:
    decodes_or_protocol_error(F.decode, frames)
    decodes_or_protocol_error(F.decode, frames, known_ops=KNOWN_OPS)
    assert len(F.peek_request_id(frames)) == 2


@MEDIUM
@given(
    st.builds(
        raw_header,
        magic=st.sampled_from([b"FB", b"FB", b"fb"]),
        version=st.sampled_from([1, 1, 0, 2, 255]),
        op=st.integers(0, 255),
        flags=st.integers(0, 255),
        reserved=st.sampled_from([0, 0, 1]),
        status=st.integers(0, 0xFFFF),
        rid=st.integers(0, 2**64 - 1),
    )
)
def test_plausible_headers_decode_or_raise_protocol_error(raw: bytes) -> None:
    h = decodes_or_protocol_error(F.decode_header, raw)
    if isinstance(h, F.Header):
        assert h.encode() == raw


@MEDIUM
@given(
    st.binary(max_size=64) | st.text(max_size=30).map(str.encode) | json_objects.map(lambda o: json.dumps(o).encode())
)
def test_any_params_frame_decodes_to_a_dict_or_raises_protocol_error(raw: bytes) -> None:
    out = decodes_or_protocol_error(F.decode_params, raw)
    assert isinstance(out, dict | ProtocolError)


@FAST
@given(st.from_regex(r"\A[\[\]{}\"a:,0-9 ]{0,40}\Z"))
def test_json_shaped_noise(text: str) -> None:
    decodes_or_protocol_error(F.decode_params, text.encode())


def test_deeply_nested_params_are_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        F.decode_params(b"[" * 200_000)


def test_params_must_be_utf8() -> None:
    with pytest.raises(ProtocolError):
        F.decode_params('{"queue":"q"}'.encode("utf-16"))


@pytest.mark.parametrize(
    "raw",
    [
        b'{"offsets":[0]}',
        b'{"offsets":[1234567890123]}',
        b'{"offsets":[7],"partitions":3}',
        b'{"offsets":[7],"partitions":0}',
        b'{"offsets":[07]}',
        b'{"offsets":[-1]}',
        b'{"offsets":[1,2],"partitions":3}',
        b'{"offsets":[5],"partitions":3,"duplicates":[]}',
        b'{"offsets":[5],"partitions":"3"}',
        b'{"offsets":[5]} ',
        b'{"partition":0,"high_watermark":12}',
        b'{"partition":3,"high_watermark":0}',
        b'{"partition":03,"high_watermark":12}',
        b'{"partition":1,"high_watermark":12,"leases":[[0,1,1]]}',
        b'{"partition":-1,"high_watermark":12}',
    ],
)
def test_reply_and_push_shortcuts_decode_as_json_does(raw: bytes) -> None:
    """The PRODUCE reply and stream push shortcuts give what the JSON decoder gives, and leaves every other shape
    (and every malformed one) to it."""
    try:
        want = json.loads(raw)
    except ValueError:
        with pytest.raises(ProtocolError):
            F.decode_params(raw)
        return
    assert F.decode_params(raw) == want
