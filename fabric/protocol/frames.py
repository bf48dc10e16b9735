"""Framing over ZeroMQ multipart messages: header frame, params frame, data frames.

Every fabric message (after the ROUTER routing envelope, which the transport
strips) is::

    frame 0   header, 16 bytes:  magic b"FB" | version u8 | op u8 | flags u8 |
              reserved u8 (0) | status u16 | request_id u64   (little-endian)
    frame 1   params: a JSON object, UTF-8 (may be empty, meaning {})
    frame 2+  data: PRODUCE carries one record batch per frame; FETCH replies and PUSH
              events carry one frame of whole batches laid end to end

A reply copies the op and request id of its request, sets ``FLAG_REPLY`` and a
status (0 = ok, else an error code from :mod:`fabric.errors`, with
``{"error": NAME, "message": text}`` as params). Everything here is pure.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from fabric.errors import ProtocolError, RequestTooLarge, UnknownCommand, UnsupportedVersion

MAGIC = b"FB"
VERSION = 1
HEADER = struct.Struct("<2sBBBBHQ")
HEADER_SIZE = HEADER.size
PARAMS_BYTES_MAX = 1024 * 1024

FLAG_REPLY = 0x01
FLAG_NO_REPLY = 0x02  # the sender wants no reply (acks=none)
FLAG_EVENT = 0x04  # unsolicited server -> client message (PUSH)
FLAG_FORWARDED = 0x08  # cluster: a node passed this request on to the partition's leader; never again
KNOWN_FLAGS = FLAG_REPLY | FLAG_NO_REPLY | FLAG_EVENT | FLAG_FORWARDED
# Envelope flag between a router and a storage node, never seen by the broker or a client: the
# frame after the header is the client's routing id at the router (docs/protocol.md, "Routers").
FLAG_ROUTED = 0x10
ROUTED_CLIENT = b"\x00R"  # a storage node's name for a client behind a router: prefix | len | router id | client id


def routed_client(router: bytes, client: bytes) -> bytes:
    """The identity a storage node gives ``client`` reached through the router connection ``router``."""
    return ROUTED_CLIENT + bytes((len(router),)) + router + client


PRINCIPAL_BYTES_MAX = 255


def routed(header: Frame, client: bytes, principal: str, rest: Sequence[Any]) -> list[Any]:
    """A client's request as a router sends it on to a storage node: ``[header | FLAG_ROUTED,
    client id, principal, params, data...]``; ``principal`` is the name the router authenticated
    the client as ("" when the router has no authentication)."""
    h = bytearray(header)
    h[4] |= FLAG_ROUTED
    return [bytes(h), client, principal.encode(), *rest]


def unrouted(frames: Sequence[Any]) -> tuple[bytes, bytes, str, list[Any]] | None:
    """The parts of a message made by :func:`routed`: ``(header without FLAG_ROUTED, client id,
    principal, [params, data...])``; None when the envelope is broken (fewer than four frames, an
    empty client id, a principal over 255 bytes or not UTF-8)."""
    if len(frames) < 4 or len(frames[0]) != HEADER_SIZE or not frames[1] or len(frames[2]) > PRINCIPAL_BYTES_MAX:
        return None
    try:
        principal = bytes(frames[2]).decode()
    except UnicodeDecodeError:
        return None
    h = bytearray(frames[0])
    h[4] &= ~FLAG_ROUTED & 0xFF
    return bytes(h), bytes(frames[1]), principal, list(frames[3:])


def split_routed(identity: bytes) -> tuple[bytes, bytes] | None:
    """``(router, client)`` of an identity made by :func:`routed_client`; None for any other."""
    if len(identity) < 4 or identity[:2] != ROUTED_CLIENT:
        return None
    n = identity[2]
    if n == 0 or len(identity) < 4 + n:
        return None
    return identity[3 : 3 + n], identity[3 + n :]


Frame = bytes | bytearray | memoryview


class Header(NamedTuple):
    """The 16-byte header frame, decoded (an immutable tuple: cheap on the per-request path)."""

    op: int
    request_id: int
    flags: int = 0
    status: int = 0
    version: int = VERSION

    def encode(self) -> bytes:
        return HEADER.pack(MAGIC, self.version, self.op, self.flags, 0, self.status, self.request_id)


def decode_header(raw: Frame) -> Header:
    if len(raw) != HEADER_SIZE:
        raise ProtocolError(f"header frame must be {HEADER_SIZE} bytes, got {len(raw)}")
    magic, version, op, flags, reserved, status, request_id = HEADER.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise UnsupportedVersion(f"protocol version {version} not supported (this side speaks {VERSION})")
    if flags & ~KNOWN_FLAGS or reserved:
        raise ProtocolError(f"unknown flag bits 0x{flags:02x}")
    return Header(op, request_id, flags, status, version)


class Message(NamedTuple):
    """One decoded fabric message: header, params and data frames."""

    header: Header
    params: dict[str, Any]
    data: Sequence[Frame] = ()


def encode_params(params: Mapping[str, Any] | bytes | None) -> bytes:
    """Params as JSON; bytes are params a caller formatted as JSON already (a hot request's)."""
    if not params:
        return b""
    if type(params) is bytes:
        return params
    return _ENCODE(params).encode()


def decode_params(raw: Frame) -> dict[str, Any]:
    if len(raw) == 0:
        return {}
    if type(raw) is bytes and raw[:12] == b'{"offsets":[':
        # a PRODUCE reply of one batch, the most common params, as the node preformats it
        one = _PRODUCE_REPLY.fullmatch(raw)
        if one is not None:
            if one[2] is None:
                return {"offsets": [int(one[1])]}
            return {"offsets": [int(one[1])], "partitions": int(one[2])}
    elif type(raw) is bytes and raw[:13] == b'{"partition":':
        push = _PUSH_PARAMS.fullmatch(raw)  # a stream push, as the node preformats it
        if push is not None:
            return {"partition": int(push[1]), "high_watermark": int(push[2])}
    if len(raw) > PARAMS_BYTES_MAX:
        raise RequestTooLarge(f"params frame of {len(raw)} bytes exceeds {PARAMS_BYTES_MAX}")
    try:
        value = _DECODE(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"params frame is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ProtocolError("params frame must be a JSON object")
    return value


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed in params")


# One encoder and one decoder for the process: json.dumps/json.loads with options build a new
# one on every call, a cost every request, reply and push paid twice.
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
_DECODE = json.JSONDecoder(parse_constant=_no_constant).decode
# the params the node preformats most (a stream push; a PRODUCE reply, {"offsets":[N]} or
# {"offsets":[N],"partitions":P}), each read by one regex match instead of a JSON parse
_PUSH_PARAMS = re.compile(rb'\{"partition":(0|[1-9][0-9]{0,9}),"high_watermark":(0|[1-9][0-9]{0,18})\}')
_PRODUCE_REPLY = re.compile(rb'\{"offsets":\[(0|[1-9][0-9]{0,18})\](?:,"partitions":(0|[1-9][0-9]{0,9}))?\}')


def encode(header: Header, params: Mapping[str, Any] | bytes | None = None, data: Sequence[Frame] = ()) -> list[Frame]:
    return [header.encode(), encode_params(params), *data]


def decode(frames: Sequence[Frame], *, known_ops: frozenset[int] | None = None) -> Message:
    """Decode a multipart message; any malformation raises a ``ProtocolError``."""
    if len(frames) < 2:
        raise ProtocolError(f"a message has at least 2 frames (header, params), got {len(frames)}")
    header = decode_header(frames[0])
    if known_ops is not None and header.op not in known_ops:
        raise UnknownCommand(f"unknown op {header.op}")
    return Message(header, decode_params(frames[1]), tuple(frames[2:]))


def peek_request_id(frames: Sequence[Frame]) -> tuple[int, int]:
    """Best-effort (op, request_id) of a message that failed to decode, for the error reply."""
    if frames and len(frames[0]) == HEADER_SIZE:
        _, _, op, _, _, _, request_id = HEADER.unpack(frames[0])
        return op, request_id
    return 0, 0
