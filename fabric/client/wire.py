"""A producer batch on the wire: its record batch bytes and its PRODUCE params."""

from __future__ import annotations

import time

from fabric.client import properties
from fabric.client.batches import Batch
from fabric.protocol import frames as fr
from fabric.protocol.batch import CODEC_NONE, encode_batch, encode_one


def encode(b: Batch, codec: int) -> bytes | bytearray:
    """Encode a batch once. A numbered batch (``b.ident``: the idempotent producer) carries its
    producer id, epoch and base sequence; it and a dedup-id batch keep the bytes for retries."""
    if b.strict:
        properties.stamp_clocks(b)
    pid, epoch = b.ident if b.ident is not None else (-1, -1)
    seq = b.sequence if b.ident is not None else -1
    ttl = b.props[2] or 0 if b.props is not None else 0
    now = time.time()
    first = int((now - (time.monotonic() - b.created)) * 1000)
    one = len(b.values) == 1 and b.keys is None and b.headers is None and b.timestamps is None
    batch: bytes | bytearray
    if one and not ttl and codec == CODEC_NONE:  # linger_ms=0 sends every message so
        batch = encode_one(b.values[0], first, int(now * 1000), pid, epoch, seq)
    else:
        batch = encode_batch(
            b.values,
            keys=b.keys,
            headers=b.headers,
            timestamps=b.timestamps,
            first_timestamp=first,
            max_timestamp=int(now * 1000),
            codec=codec,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            ttl_ms=ttl,
        )
    if pid >= 0 or b.dedup_ids is not None:
        b.encoded = batch  # resent as is: the node stores it once (sequence or dedup ids)
    return batch


def params(b: Batch, acks: str, cache: dict[tuple[str, int], bytes]) -> bytes:
    """PRODUCE params, encoded once per partition (the node caches them by these bytes)."""
    if b.props is not None or b.dedup_ids is not None:
        return properties.params(b, acks)
    key = (b.queue, b.partition)
    raw = cache.get(key)
    if raw is None:
        raw = cache[key] = fr.encode_params({"queue": b.queue, "partition": b.partition, "acks": acks})
    return raw
