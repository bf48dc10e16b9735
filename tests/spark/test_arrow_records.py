"""Record batches -> Arrow (fabric.spark.arrow_records) against the client's decoder, in memory."""

from __future__ import annotations

import pyarrow as pa
import pytest

from fabric.client.messages import decode_chunk
from fabric.errors import CorruptBatch
from fabric.protocol.batch import CODEC_LZ4, encode_batch, stamp
from fabric.spark.arrow_records import ARROW_SCHEMA, decode_fetched


def _batch(base: int, n: int, *, keys: bool = False, headers: bool = False, stamps: bool = False, lz4: bool = False):
    buf = bytearray(
        encode_batch(
            [b"v%d" % (base + i) * (1 + i % 3) for i in range(n)],
            keys=[None if i % 4 == 0 else b"k%d" % i for i in range(n)] if keys else None,
            headers=[{"h": b"%d" % i, "x": b""} if i % 3 == 1 else None for i in range(n)] if headers else None,
            timestamps=[1_700_000_000_000 + 7 * i for i in range(n)] if stamps else None,
            first_timestamp=1_700_000_000_000,
            codec=CODEC_LZ4 if lz4 else 0,
        )
    )
    stamp(buf, base)
    return bytes(buf)


def _expected(chunks: list[bytes], start: int, end: int) -> list[tuple]:
    rows = []
    for chunk in chunks:
        for b in decode_chunk("q", 3, chunk, start):
            for m in b.messages():
                if start <= m.offset < end:
                    rows.append(
                        (m.offset, m.key, m.value, sorted(m.headers.items()) if m.headers else None, m.timestamp_ms)
                    )
    return rows


@pytest.mark.parametrize("start,end", [(0, 10**9), (5, 10**9), (3, 47), (20, 21)])
def test_the_same_records_as_the_client_decodes(start, end):
    chunks = [
        _batch(0, 10) + _batch(10, 15, keys=True, stamps=True),
        _batch(25, 12, headers=True, lz4=True) + _batch(37, 13, keys=True, headers=True, stamps=True),
    ]
    batch, nxt = decode_fetched("q", 3, chunks, start, end)
    assert batch is not None and batch.schema == ARROW_SCHEMA
    d = batch.to_pydict()
    got = [
        (o, k, v, sorted(h) if h else None, int(t.timestamp() * 1000))
        for o, k, v, h, t in zip(d["offset"], d["key"], d["value"], d["headers"], d["timestamp"])
    ]
    assert got == _expected(chunks, start, end)
    assert set(d["queue"]) == {"q"} and set(d["partition"]) == {3}
    assert nxt == min(end, 50)


def test_nothing_in_range_and_a_flipped_byte():
    chunk = _batch(100, 5)
    assert decode_fetched("q", 0, [chunk], 200, 300) == (None, 200)
    assert decode_fetched("q", 0, [chunk], 0, 100) == (None, 0)
    bad = bytearray(chunk)
    bad[-1] ^= 1
    with pytest.raises(CorruptBatch):
        decode_fetched("q", 0, [bytes(bad)], 100, 105)


def test_values_only_columns_are_views_of_the_region():
    batch, _ = decode_fetched("q", 0, [_batch(0, 1000)], 0, 1000)
    assert batch.column("key").null_count == 1000 and batch.column("headers").null_count == 1000
    assert isinstance(batch.column("value"), pa.BinaryArray) and batch.column("value")[999].as_py() == b"v999"
