"""The record batch: one format from producer to disk to replica to consumer.

Theory of operation
-------------------
A producer packs many messages into one batch. Routers and stores read only the
fixed 57-byte header and check the CRC; they never re-encode the records. The
store assigns the offsets by writing ``base_offset`` (and ``leader_epoch``), the
two header fields the CRC does not cover. Consumers receive the very same bytes.

Header (all integers little-endian)::

    off  size  field
     0    8    base_offset      i64  first record's offset; set by the store
     8    4    batch_length     i32  bytes that follow this field (= total - 12)
    12    4    leader_epoch     i32  set by the store
    16    1    magic            u8   format version, = 1
    17    4    crc              u32  CRC32C of bytes [21, end of batch)
    21    2    attributes       u16  codec (bits 0-2) and column flags
    23    4    record_count     i32  >= 1
    27    8    first_timestamp  i64  ms since the epoch
    35    8    max_timestamp    i64  ms since the epoch
    43    8    producer_id      i64  -1 when not idempotent; <= -2 on a cluster's delayed
                                      batch: its delay id is -2 - producer_id (stamp_delay_id)
    51    2    producer_epoch   i16
    53    4    base_sequence    i32
    57    4    ttl_ms           u32  only when attributes has HAS_TTL (0x40): the records
                                      expire ttl_ms after their timestamps
    57/61 ...  records region (lz4 block with a stored size when codec = 1)

On disk, a queue with ``encrypt = true`` holds its batches with attribute ENCRYPTED (0x80):
the header (and ttl_ms) stay as they are, the records region is AES-GCM ciphertext behind a
key id and a nonce, and the CRC covers those stored bytes (docs/protocol.md, "Encrypted at
rest"). Nodes decrypt before any batch leaves them for a client.

The records region is columnar, so that packing and unpacking are a few C-level
calls per batch rather than Python work per message::

    [u32 ts_delta  * n]   if HAS_TIMESTAMPS  (ms after first_timestamp)
    [i32 key_len   * n]   if HAS_KEYS        (-1: no key)
    [u32 hdr_len   * n]   if HAS_HEADERS
    [u32 value_len * n]   always
    keys, headers, values: each column's bytes concatenated

Each record's headers are ``u16 count`` then ``count`` times
``u16 name_len, name (UTF-8), u32 value_len, value``.

Everything here is pure: no sockets, files or clocks.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import NamedTuple

import crc32c as _crc32c
import lz4.block

from fabric.errors import CorruptBatch, MessageTooLarge, ProtocolError

MAGIC = 1
HEADER_SIZE = 57
LENGTH_PREFIX = 12  # base_offset + batch_length: what precedes the counted bytes
CRC_START = 21

CODEC_NONE = 0
CODEC_LZ4 = 1
CODEC_MASK = 0x0007
HAS_KEYS = 0x0008
HAS_HEADERS = 0x0010
HAS_TIMESTAMPS = 0x0020
HAS_TTL = 0x0040  # a u32 time to live (ms after each record's timestamp) follows the header
# Set by a node only, on disk and between replicas: the records region is AES-GCM ciphertext
# (fabric/security/at_rest.py). Producers may not set it; consumers never see it.
ENCRYPTED = 0x0080
KNOWN_ATTRIBUTES = CODEC_MASK | HAS_KEYS | HAS_HEADERS | HAS_TIMESTAMPS | HAS_TTL | ENCRYPTED
TTL_MS_MAX = 0xFFFFFFFF
CODECS = {"none": CODEC_NONE, "lz4": CODEC_LZ4}

RECORD_COUNT_MAX = 1_000_000
# A cluster's delayed batch carries its delay id in producer_id as -2 - id (ids 0..DELAY_ID_MAX;
# -1 stays "not idempotent"): every reader of producer ids already skips values below 0.
DELAY_ID_MAX = 2**63 - 2
_PRODUCER_ID_AT = 43
BATCH_BYTES_MAX = 64 * 1024 * 1024  # absolute ceiling; queues set lower limits

_HEADER = struct.Struct("<qiiBIHiqqqhi")
_OFFSET_EPOCH = struct.Struct("<q")
_EPOCH = struct.Struct("<i")
_LEN = struct.Struct("<i")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_LITTLE = sys.byteorder == "little"
assert _HEADER.size == HEADER_SIZE


def crc32c(data: bytes | bytearray | memoryview) -> int:
    return int(_crc32c.crc32c(data))


class BatchHeader(NamedTuple):
    """A batch's fixed header, as read (an immutable tuple: one is made per batch on every
    produce and every push received, where a frozen dataclass's field-by-field construction
    cost four times as much)."""

    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    record_count: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int

    @property
    def size(self) -> int:
        """Whole batch size in bytes, header included."""
        return self.batch_length + LENGTH_PREFIX

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    @property
    def codec(self) -> int:
        return self.attributes & CODEC_MASK


@dataclass(frozen=True, slots=True)
class Records:
    """The decoded records of one batch, column by column."""

    base_offset: int
    values: list[bytes]
    keys: list[bytes | None] | None
    headers: list[dict[str, bytes]] | None
    timestamps: list[int]

    def __len__(self) -> int:
        return len(self.values)


_PREFIX = struct.Struct("<qiiBI")  # base_offset, batch_length, leader_epoch, magic, crc
_NO_PREFIX = bytes(_PREFIX.size)


def _u32_array(values: Sequence[int], code: str = "I") -> bytes:
    arr = array(code, values)
    if not _LITTLE:
        arr.byteswap()
    return arr.tobytes()


def _read_array(region: bytes | memoryview, pos: int, n: int, code: str) -> array:
    arr = array(code)
    arr.frombytes(region[pos : pos + 4 * n])
    if not _LITTLE:
        arr.byteswap()
    return arr


def encode_headers(headers: dict[str, bytes]) -> bytes:
    parts = [_U16.pack(len(headers))]
    for name, value in headers.items():
        raw = name.encode()
        if len(raw) > 0xFFFF:
            raise ProtocolError(f"header name longer than 65535 bytes: {name[:40]!r}")
        parts += (_U16.pack(len(raw)), raw, _U32.pack(len(value)), bytes(value))
    return b"".join(parts)


def decode_headers(raw: bytes) -> dict[str, bytes]:
    try:
        (count,) = _U16.unpack_from(raw, 0)
        pos, out = 2, {}
        for _ in range(count):
            (n,) = _U16.unpack_from(raw, pos)
            name = raw[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            (m,) = _U32.unpack_from(raw, pos)
            if pos + 4 + m > len(raw):
                raise CorruptBatch("record header value runs past its record")
            out[name] = bytes(raw[pos + 4 : pos + 4 + m])
            pos += 4 + m
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptBatch(f"malformed record headers: {exc}") from None
    if pos != len(raw):
        raise CorruptBatch("trailing bytes after record headers")
    return out


def encode_batch(
    values: Sequence[bytes],
    *,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[dict[str, bytes] | None] | None = None,
    timestamps: Sequence[int] | None = None,
    first_timestamp: int = 0,
    max_timestamp: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    codec: int = CODEC_NONE,
    value_lengths: Sequence[int] | None = None,
    ttl_ms: int = 0,
) -> bytes | bytearray:
    """Pack ``values`` (and optional columns) into one batch with base offset 0: a bytearray when
    uncompressed (built in one copy, its CRC filled in after; treat it as read-only), bytes with LZ4.

    ``timestamps`` are absolute ms; when given, ``first_timestamp`` and
    ``max_timestamp`` are derived from them. ``value_lengths`` lets a caller that
    already tracked the lengths skip one pass. ``ttl_ms`` > 0 gives every record a
    time to live, counted from its timestamp.
    """
    n = len(values)
    if n < 1 or n > RECORD_COUNT_MAX:
        raise ProtocolError(f"a batch holds 1 to {RECORD_COUNT_MAX} records, not {n}")
    attributes = codec & CODEC_MASK
    if codec not in (CODEC_NONE, CODEC_LZ4):
        raise ProtocolError(f"unknown codec {codec}")
    columns: list[bytes] = []
    blobs: list[bytes] = []
    if timestamps is not None:
        if len(timestamps) != n:
            raise ProtocolError("timestamps and values differ in length")
        first_timestamp = min(timestamps)
        max_timestamp = max(timestamps)
        deltas = [t - first_timestamp for t in timestamps]
        if max(deltas) > 0xFFFFFFFF:
            raise ProtocolError("timestamps in one batch span more than 49 days")
        attributes |= HAS_TIMESTAMPS
        columns.append(_u32_array(deltas))
    if keys is not None and any(k is not None for k in keys):
        if len(keys) != n:
            raise ProtocolError("keys and values differ in length")
        attributes |= HAS_KEYS
        columns.append(_u32_array([-1 if k is None else len(k) for k in keys], "i"))
        blobs.append(b"".join(k for k in keys if k is not None))
    if headers is not None and any(headers):
        if len(headers) != n:
            raise ProtocolError("headers and values differ in length")
        attributes |= HAS_HEADERS
        encoded = [encode_headers(h or {}) for h in headers]
        columns.append(_u32_array([len(h) for h in encoded]))
        blobs.append(b"".join(encoded))
    columns.append(_u32_array(value_lengths if value_lengths is not None else list(map(len, values))))
    # The batch's parts after the header. Compressed: the records region joined and compressed,
    # the CRC taken part by part, one join at the end. Uncompressed: the values themselves are
    # parts, joined once into a bytearray whose prefix (length, CRC) is filled in after (a 256 KiB
    # batch was copied three times on its way, then twice; now once: a third of a bulk
    # producer's encoding time).
    if codec == CODEC_LZ4:
        blobs.append(b"".join(values))
        parts = [lz4.block.compress(b"".join(columns + blobs), store_size=True)]
    else:
        parts = columns + blobs
    if max_timestamp is None:
        max_timestamp = first_timestamp
    if ttl_ms:
        if not 0 < ttl_ms <= TTL_MS_MAX:
            raise ProtocolError(f"ttl_ms must be 1..{TTL_MS_MAX}, got {ttl_ms}")
        attributes |= HAS_TTL
        parts.insert(0, _U32.pack(ttl_ms))
    body = _HEADER.pack(
        0,
        0,
        0,
        MAGIC,
        0,
        attributes,
        n,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
    )[CRC_START:]
    total = CRC_START + len(body) + sum(map(len, parts))
    if codec == CODEC_LZ4:
        if total > BATCH_BYTES_MAX:
            raise MessageTooLarge(f"batch of {total} bytes exceeds {BATCH_BYTES_MAX}")
        crc = _crc32c.crc32c(body)
        for part in parts:
            crc = _crc32c.crc32c(part, crc)
        return b"".join([_PREFIX.pack(0, total - LENGTH_PREFIX, 0, MAGIC, crc), body, *parts])
    total += sum(map(len, values))
    if total > BATCH_BYTES_MAX:
        raise MessageTooLarge(f"batch of {total} bytes exceeds {BATCH_BYTES_MAX}")
    out = bytearray().join([_NO_PREFIX, body, *parts, *values])
    _PREFIX.pack_into(out, 0, 0, total - LENGTH_PREFIX, 0, MAGIC, _crc32c.crc32c(memoryview(out)[CRC_START:]))
    return out


_ONE_BODY = struct.Struct("<HiqqqhiI")  # attributes .. base_sequence, then the one value length


def encode_one(
    value: bytes,
    first_timestamp: int,
    max_timestamp: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """``encode_batch([value], ...)`` for one uncompressed value with no key, headers or TTL: the
    same bytes, a third of the work (a producer with ``linger_ms=0`` encodes every message)."""
    covered = (
        _ONE_BODY.pack(0, 1, first_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, len(value))
        + value
    )
    total = CRC_START + len(covered)
    if total > BATCH_BYTES_MAX:
        raise MessageTooLarge(f"batch of {total} bytes exceeds {BATCH_BYTES_MAX}")
    return _PREFIX.pack(0, total - LENGTH_PREFIX, 0, MAGIC, crc32c(covered)) + covered


_SPAN = struct.Struct("<qi11xi")  # base_offset, batch_length, (11 bytes), record_count of _HEADER


def batch_span(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int, int]:
    """``(base_offset, size, record_count)`` of a batch this side has stored (checked when it was
    appended): three fields and no header object, for the push path's one read per batch sent."""
    base_offset, batch_length, record_count = _SPAN.unpack_from(buf, pos)
    if batch_length < HEADER_SIZE - LENGTH_PREFIX or record_count < 1:
        raise CorruptBatch(f"batch at byte {pos}: batch_length {batch_length}, record_count {record_count}")
    return base_offset, batch_length + LENGTH_PREFIX, record_count


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Read and sanity-check the fixed header at ``pos`` (the CRC is not checked)."""
    if len(buf) - pos < HEADER_SIZE:
        raise ProtocolError(f"need {HEADER_SIZE} bytes for a batch header, have {len(buf) - pos}")
    h = BatchHeader(*_HEADER.unpack_from(buf, pos))
    if h.magic != MAGIC:
        raise ProtocolError(f"unknown batch format version {h.magic} (this side reads {MAGIC})")
    if h.batch_length < HEADER_SIZE - LENGTH_PREFIX or h.batch_length > BATCH_BYTES_MAX:
        raise CorruptBatch(f"batch_length {h.batch_length} out of range")
    if h.record_count < 1 or h.record_count > RECORD_COUNT_MAX:
        raise CorruptBatch(f"record_count {h.record_count} out of range")
    if h.attributes & ~KNOWN_ATTRIBUTES or h.codec > CODEC_LZ4:
        raise CorruptBatch(f"unknown attribute bits 0x{h.attributes:04x}")
    if h.attributes & HAS_TTL and h.batch_length < HEADER_SIZE + 4 - LENGTH_PREFIX:
        raise CorruptBatch("batch too short for its ttl_ms field")
    return h


def delay_id_of(h: BatchHeader) -> int | None:
    """The delay id of a cluster's delayed batch (stamped by its leader), None for any other batch."""
    return -2 - h.producer_id if h.producer_id < -1 else None


def stamp_delay_id(buf: bytearray, delay_id: int) -> BatchHeader:
    """Mark a checked, non-idempotent batch (at position 0 of ``buf``) with ``delay_id`` and
    recompute its CRC; returns the new header. Replicas read the id from the header alone."""
    if not 0 <= delay_id <= DELAY_ID_MAX:
        raise ValueError(f"delay id {delay_id} out of range 0..{DELAY_ID_MAX}")
    h = parse_header(buf)
    if h.producer_id != -1:
        raise ValueError(f"only a batch without a producer id takes a delay id (producer_id {h.producer_id})")
    _OFFSET_EPOCH.pack_into(buf, _PRODUCER_ID_AT, -2 - delay_id)
    _U32.pack_into(buf, 17, crc32c(memoryview(buf)[CRC_START : h.size]))
    return parse_header(buf)


def batch_ttl_ms(buf: bytes | bytearray | memoryview, h: BatchHeader, pos: int = 0) -> int:
    """The batch's time to live in ms (0: none). Per-batch: one field read, no decoding."""
    if not h.attributes & HAS_TTL:
        return 0
    return int(_U32.unpack_from(buf, pos + HEADER_SIZE)[0])


def expires_at_ms(buf: bytes | bytearray | memoryview, h: BatchHeader, default_ttl_ms: int, pos: int = 0) -> int:
    """When every record of the batch has expired (ms since the epoch); 0 when it never does.

    A batch's own ``ttl_ms`` wins over the queue's ``default_ttl_ms``; records
    expire that long after their timestamp, so the whole batch after its
    ``max_timestamp``."""
    ttl = batch_ttl_ms(buf, h, pos) or default_ttl_ms
    return h.max_timestamp + ttl if ttl else 0


def check_batch(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header at ``pos`` and verify that a whole batch with a good CRC follows."""
    h = parse_header(buf, pos)
    end = pos + h.size
    if end > len(buf):
        raise ProtocolError(f"batch of {h.size} bytes is cut short at {len(buf) - pos}")
    if crc32c(memoryview(buf)[pos + CRC_START : end]) != h.crc:
        raise CorruptBatch(f"CRC32C mismatch in batch at byte {pos}")
    return h


def stamp(buf: bytearray | memoryview, base_offset: int, leader_epoch: int = 0, pos: int = 0) -> None:
    """Assign offsets: write the two fields the CRC does not cover."""
    _OFFSET_EPOCH.pack_into(buf, pos, base_offset)
    _EPOCH.pack_into(buf, pos + 12, leader_epoch)


def iter_batches(buf: bytes | bytearray | memoryview, *, verify: bool = True) -> Iterator[tuple[int, BatchHeader]]:
    """Walk batches laid end to end; yield ``(position, header)``.

    Raises ``ProtocolError`` at the first batch that is cut short or damaged, so
    a caller sees the good prefix before the error.
    """
    pos, end = 0, len(buf)
    while pos < end:
        h = check_batch(buf, pos) if verify else parse_header(buf, pos)
        if not verify and pos + h.size > end:
            raise ProtocolError(f"batch of {h.size} bytes is cut short at {end - pos}")
        yield pos, h
        pos += h.size


def whole_prefix(buf: bytes | bytearray | memoryview, end_offset: int) -> tuple[int, int]:
    """(bytes, next offset) of the whole batches at the front of ``buf`` that start below
    ``end_offset``; (0, 0) when there is none. Headers only: nothing is checked or decoded."""
    pos = nxt = 0
    while len(buf) - pos >= HEADER_SIZE:
        h = parse_header(buf, pos)
        if h.base_offset >= end_offset or pos + h.size > len(buf):
            break
        pos += h.size
        nxt = h.next_offset
    return pos, nxt


def records_region(
    buf: bytes | bytearray | memoryview, h: BatchHeader, pos: int = 0, uncompressed_max: int = BATCH_BYTES_MAX
) -> bytes | memoryview:
    if h.attributes & ENCRYPTED:
        raise CorruptBatch("batch is encrypted at rest (attribute 0x0080): only the node that stores it decrypts it")
    start = pos + HEADER_SIZE + (4 if h.attributes & HAS_TTL else 0)
    region = memoryview(buf)[start : pos + h.size]
    if h.codec == CODEC_LZ4:
        if len(region) < 4:
            raise CorruptBatch("lz4 records region shorter than its size field")
        (size,) = _LEN.unpack_from(region, 0)
        if size < 0 or size > uncompressed_max:
            raise CorruptBatch(f"lz4 region claims {size} bytes uncompressed (limit {uncompressed_max})")
        try:
            return bytes(lz4.block.decompress(region))
        except lz4.block.LZ4BlockError as exc:
            raise CorruptBatch(f"lz4 records region does not decompress: {exc}") from None
    return region


_SAME_LENGTHS: dict[tuple[int, int], struct.Struct] = {}  # (length, count) -> "<length>s" * count
_SAME_LENGTHS_MAX = 64


def _lengths_to_slices(region: bytes | memoryview, start: int, lengths: Sequence[int]) -> list[bytes]:
    """``region[start:]`` cut into one bytes object per length, in order (the caller has checked
    that the lengths add up). A consumer's hot path: records of one length (the common case for a
    producer of fixed-size messages) are cut by one compiled ``struct`` in C, ~10x faster than a
    slice per record; other batches are copied out of the view once and sliced as bytes (one
    object per record, not a view and then a copy)."""
    n = len(lengths)
    if n > 1:
        size = lengths[0]
        if size > 0 and lengths.count(size) == n:
            cut = _SAME_LENGTHS.get((size, n))
            if cut is None:
                if len(_SAME_LENGTHS) >= _SAME_LENGTHS_MAX:
                    _SAME_LENGTHS.clear()
                cut = _SAME_LENGTHS[size, n] = struct.Struct(f"{size}s" * n)
            return list(cut.unpack_from(region, start))
    ends = list(accumulate(lengths, initial=0))
    raw = bytes(region[start : start + ends[-1]])
    return [raw[a:b] for a, b in pairwise(ends)]


def decode_records(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, uncompressed_max: int = BATCH_BYTES_MAX
) -> Records:
    """Decode the batch at ``pos`` (already checked) into its columns."""
    h = parse_header(buf, pos)
    region = records_region(bytes(buf) if isinstance(buf, bytearray) else buf, h, pos, uncompressed_max)
    n = h.record_count
    a = h.attributes
    ncols = 1 + bool(a & HAS_TIMESTAMPS) + bool(a & HAS_KEYS) + bool(a & HAS_HEADERS)
    if len(region) < 4 * n * ncols:
        raise CorruptBatch("records region shorter than its length columns")
    cur = 0
    timestamps: list[int]
    if a & HAS_TIMESTAMPS:
        first = h.first_timestamp
        timestamps = [first + d for d in _read_array(region, cur, n, "I")]
        cur += 4 * n
    else:
        timestamps = [h.first_timestamp] * n
    key_lens = hdr_lens = None
    if a & HAS_KEYS:
        key_lens = _read_array(region, cur, n, "i")
        cur += 4 * n
    if a & HAS_HEADERS:
        hdr_lens = _read_array(region, cur, n, "I")
        cur += 4 * n
    value_lens = _read_array(region, cur, n, "I")
    cur += 4 * n
    key_total = sum(k for k in key_lens if k > 0) if key_lens is not None else 0
    if key_lens is not None and min(key_lens) < -1:
        raise CorruptBatch("negative key length")
    hdr_total = sum(hdr_lens) if hdr_lens is not None else 0
    if cur + key_total + hdr_total + sum(value_lens) != len(region):
        raise CorruptBatch("record lengths do not add up to the records region")
    keys: list[bytes | None] | None = None
    if key_lens is not None:
        raw_keys = _lengths_to_slices(region, cur, [max(k, 0) for k in key_lens])
        keys = [None if k < 0 else raw for k, raw in zip(key_lens, raw_keys)]
        cur += key_total
    headers = None
    if hdr_lens is not None:
        headers = [decode_headers(raw) for raw in _lengths_to_slices(region, cur, hdr_lens)]
        cur += hdr_total
    values = _lengths_to_slices(region, cur, value_lens)
    return Records(h.base_offset, values, keys, headers, timestamps)


def decode_values(
    buf: bytes | memoryview, pos: int = 0, h: BatchHeader | None = None
) -> tuple[BatchHeader, list[bytes]]:
    """Fast path for consumers that want only the values of one batch (``h``: its header, when
    the caller has already parsed it)."""
    if h is None:
        h = parse_header(buf, pos)
    if h.attributes & (HAS_KEYS | HAS_HEADERS | HAS_TIMESTAMPS):
        return h, decode_records(buf, pos).values
    region = records_region(buf, h, pos)
    n = h.record_count
    if len(region) < 4 * n:
        raise CorruptBatch("records region shorter than its length columns")
    if n == 1:  # one record per batch: what a producer with linger_ms=0 sends
        if _U32.unpack_from(region)[0] != len(region) - 4:
            raise CorruptBatch("record lengths do not add up to the records region")
        return h, [bytes(region[4:])]
    value_lens = _read_array(region, 0, n, "I")
    if 4 * n + sum(value_lens) != len(region):
        raise CorruptBatch("record lengths do not add up to the records region")
    return h, _lengths_to_slices(region, 4 * n, value_lens)


_PLAIN_HEAD = struct.Struct(
    "<qi4xBIHiq"
)  # base_offset, batch_length, magic, crc, attributes, record_count, first_timestamp


def plain_values(buf: bytes | memoryview, pos: int = 0) -> tuple[int, int, int, list[bytes]] | None:
    """A consumer's fast path for a *plain* batch at ``pos`` (attributes 0: no keys, headers,
    timestamps, TTL, compression or encryption; what most producers send): its CRC checked and
    ``(base_offset, size, first_timestamp, values)`` read with one header unpack, no
    :class:`BatchHeader`. ``None`` for any other batch, and for one whose header is out of range or
    cut short: :func:`check_batch` and :func:`decode_records` take those (and name what is wrong).
    Raises CorruptBatch for a bad CRC or record lengths that do not add up."""
    if len(buf) - pos < HEADER_SIZE:
        return None
    base_offset, batch_length, magic, crc, attributes, n, first_timestamp = _PLAIN_HEAD.unpack_from(buf, pos)
    end = pos + batch_length + LENGTH_PREFIX
    if (
        attributes
        or magic != MAGIC
        or batch_length < HEADER_SIZE - LENGTH_PREFIX
        or batch_length > BATCH_BYTES_MAX
        or n < 1
        or n > RECORD_COUNT_MAX
        or end > len(buf)
    ):
        return None
    view = memoryview(buf)
    if _crc32c.crc32c(view[pos + CRC_START : end]) != crc:
        raise CorruptBatch(f"CRC32C mismatch in batch at byte {pos}")
    start = pos + HEADER_SIZE
    if n == 1:  # one record per batch: what a producer with linger_ms=0 sends
        if end - start < 4 or _U32.unpack_from(buf, start)[0] != end - start - 4:
            raise CorruptBatch("record lengths do not add up to the records region")
        return base_offset, end - pos, first_timestamp, [bytes(view[start + 4 : end])]
    region = view[start:end]
    if len(region) < 4 * n:
        raise CorruptBatch("records region shorter than its length columns")
    value_lens = _read_array(region, 0, n, "I")
    if 4 * n + sum(value_lens) != len(region):
        raise CorruptBatch("record lengths do not add up to the records region")
    return base_offset, end - pos, first_timestamp, _lengths_to_slices(region, 4 * n, value_lens)


class BatchStreamDecoder:
    """Incremental decoder for batches laid end to end (a segment file, a fetch reply).

    ``feed(data)`` returns the complete, CRC-checked batches now available, as
    ``bytes``; a partial batch waits for more input. Feeding a stream whole or a
    byte at a time gives the same batches.
    """

    def __init__(self, batch_bytes_max: int = BATCH_BYTES_MAX) -> None:
        self._buf = bytearray()
        self._batch_bytes_max = batch_bytes_max

    @property
    def pending(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        pos = 0
        buf = self._buf
        try:
            while len(buf) - pos >= HEADER_SIZE:
                h = parse_header(buf, pos)
                if h.size > self._batch_bytes_max:
                    raise CorruptBatch(f"batch of {h.size} bytes exceeds {self._batch_bytes_max}")
                if len(buf) - pos < h.size:
                    break
                check_batch(buf, pos)
                out.append(bytes(buf[pos : pos + h.size]))
                pos += h.size
        except ProtocolError:
            if not out:
                raise
            # hand out the good batches now; the bad bytes stay and the next feed() raises
        finally:
            del buf[:pos]
        return out


def max_record_bytes(buf: bytes | bytearray | memoryview, h: BatchHeader, pos: int = 0) -> int:
    """An upper bound on the largest record (key + headers + value) in a checked batch.

    Exact when the batch has only a value column. Per-batch work: the length
    columns are read as arrays and reduced in C. A batch whose whole records
    region is smaller than a limit cannot hold a record over it, so callers test
    that first and only come here for large batches.
    """
    region = records_region(buf, h, pos)
    n, a, cur, total = h.record_count, h.attributes, 0, 0
    ncols = 1 + bool(a & HAS_TIMESTAMPS) + bool(a & HAS_KEYS) + bool(a & HAS_HEADERS)
    if len(region) < 4 * n * ncols:
        raise CorruptBatch("records region shorter than its length columns")
    if a & HAS_TIMESTAMPS:
        cur += 4 * n
    for flag, code in ((HAS_KEYS, "i"), (HAS_HEADERS, "I")):
        if a & flag:
            total += max(0, max(_read_array(region, cur, n, code)))
            cur += 4 * n
    return total + max(_read_array(region, cur, n, "I"))


_RECORD_COUNT = struct.Struct("<i")
_RECORD_COUNT_AT = 23  # offset of record_count in the header (see the table at the top)


def batch_record_count(buf: bytes | bytearray | memoryview) -> int:
    """The record count a batch's header claims (0 for a frame too short to hold a header):
    for accounting before the full check (quotas), never for trusting the batch."""
    if len(buf) < _RECORD_COUNT_AT + 4:
        return 0
    return int(_RECORD_COUNT.unpack_from(buf, _RECORD_COUNT_AT)[0])
