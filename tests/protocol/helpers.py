"""Shared strategies and checks for the protocol tests (pure, in memory)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import lz4.block
from hypothesis import settings
from hypothesis import strategies as st

from fabric.errors import ProtocolError
from fabric.protocol import batch as B
from tests.depth import examples

# deadline=None: lz4 and first-call warm-up make single examples jittery.
FAST = settings(max_examples=examples(60), deadline=None)
MEDIUM = settings(max_examples=examples(100), deadline=None)
THOROUGH = settings(max_examples=examples(150), deadline=None)

I64 = st.integers(-(2**63), 2**63 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
I16 = st.integers(-(2**15), 2**15 - 1)

# Known bugs in fabric/protocol that the fuzz tests would otherwise trip over.
# Each one is pinned by a strict xfail test; when it is fixed, that test XPASSes
# (which fails the run) and the entry here must be deleted with the xfail marker.
KNOWN_BUGS: list[tuple[type[BaseException], str]] = []


def is_known_bug(exc: BaseException) -> bool:
    return any(type(exc) is kind and text in str(exc) for kind, text in KNOWN_BUGS)


def decodes_or_protocol_error(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``; a ProtocolError (or subclass) is fine, any other exception fails the test."""
    try:
        return fn(*args, **kwargs)
    except ProtocolError as exc:
        return exc
    except Exception as exc:
        if is_known_bug(exc):
            return exc
        raise AssertionError(f"{fn.__name__} raised {type(exc).__name__}, not a ProtocolError: {exc}") from exc


# --- building batches by hand (independently of encode_batch) -----------------------------


def build_batch(
    region: bytes,
    *,
    attributes: int,
    record_count: int,
    first_timestamp: int = 0,
    max_timestamp: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_offset: int = 0,
    leader_epoch: int = 0,
    good_crc: bool = True,
) -> bytes:
    """Lay out a batch from the documented offsets, with a correct (or deliberately wrong) CRC."""
    covered = (
        struct.pack(
            "<Hiqqqhi",
            attributes,
            record_count,
            first_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
        )
        + region
    )
    crc = B.crc32c(covered) ^ (0 if good_crc else 0xFFFFFFFF)
    batch_length = B.CRC_START + len(covered) - B.LENGTH_PREFIX
    return struct.pack("<qiiBI", base_offset, batch_length, leader_epoch, B.MAGIC, crc) + covered


def recrc(buf: bytes | bytearray) -> bytes:
    """Fix batch_length and the CRC after a mutation, so only the content is wrong."""
    out = bytearray(buf)
    struct.pack_into("<i", out, 8, len(out) - B.LENGTH_PREFIX)
    struct.pack_into("<I", out, 17, B.crc32c(out[B.CRC_START :]))
    return bytes(out)


def lz4_region(raw: bytes) -> bytes:
    return bytes(lz4.block.compress(raw, store_size=True))


# --- strategies ---------------------------------------------------------------------------

values_st = st.lists(st.binary(max_size=40), min_size=1, max_size=12)
header_names = st.text(max_size=8)  # Hypothesis text() never produces surrogates
header_dicts = st.dictionaries(header_names, st.binary(max_size=12), max_size=3)


@st.composite
def batch_inputs(draw: st.DrawFn) -> dict[str, Any]:
    """Keyword arguments for encode_batch covering every optional column and codec."""
    values = draw(values_st)
    n = len(values)
    kwargs: dict[str, Any] = {"values": values}
    if draw(st.booleans()):
        kwargs["keys"] = draw(st.lists(st.none() | st.binary(max_size=12), min_size=n, max_size=n))
    if draw(st.booleans()):
        kwargs["headers"] = draw(st.lists(st.none() | header_dicts, min_size=n, max_size=n))
    if draw(st.booleans()):
        base = draw(st.integers(-(2**62), 2**62))
        deltas = draw(st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n))
        kwargs["timestamps"] = [base + d for d in deltas]
    else:
        kwargs["first_timestamp"] = draw(st.integers(-(2**62), 2**62))
        if draw(st.booleans()):
            kwargs["max_timestamp"] = draw(I64)
    kwargs["producer_id"] = draw(st.just(-1) | I64)
    kwargs["producer_epoch"] = draw(st.just(-1) | I16)
    kwargs["base_sequence"] = draw(st.just(-1) | I32)
    kwargs["codec"] = draw(st.sampled_from([B.CODEC_NONE, B.CODEC_LZ4]))
    if draw(st.booleans()):
        kwargs["ttl_ms"] = draw(st.integers(1, B.TTL_MS_MAX))
    return kwargs


def encode(kwargs: dict[str, Any]) -> bytes:
    kw = dict(kwargs)
    return B.encode_batch(kw.pop("values"), **kw)


encoded_batches = batch_inputs().map(encode)


@st.composite
def batch_streams(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    """Several encoded batches, stamped with consecutive offsets, laid end to end."""
    batches = draw(st.lists(encoded_batches, min_size=1, max_size=5))
    offset = draw(st.integers(0, 2**40))
    epoch = draw(st.integers(0, 2**31 - 1))
    stamped = []
    for raw in batches:
        buf = bytearray(raw)
        B.stamp(buf, offset, epoch)
        offset += B.parse_header(buf).record_count
        stamped.append(bytes(buf))
    return b"".join(stamped), stamped


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=12), json_values, max_size=6)
