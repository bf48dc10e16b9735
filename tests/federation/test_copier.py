"""The move's copy (fabric/federation/copier.py) against two logs in memory standing in for the
source's and destination's leaders: batches copied byte for byte at their offsets, in requests
under a node's batch limit, a source log that does not start at 0 refused, a destination that
stores elsewhere refused."""

from __future__ import annotations

from typing import Any

import pytest

from fabric.errors import OffsetOutOfRange
from fabric.federation import copier
from fabric.federation.copier import ClientPlane
from fabric.federation.move_driver import MoveFailed
from fabric.protocol import frames as fr
from fabric.protocol.batch import encode_batch, iter_batches, stamp
from fabric.protocol.ops import Op


class Leader:
    """One partition's leader: its batches (stamped with their offsets), its seal."""

    def __init__(self, start: int = 0) -> None:
        self.batches: list[bytes] = []
        self.start = self.end = start
        self.sealed = False
        self.shift = 0  # a misbehaving destination: stores this much further on
        self.produces: list[int] = []  # batches per PRODUCE

    def append(self, raw: bytes) -> int:
        buf = bytearray(raw)
        base = self.end + self.shift
        stamp(buf, base)
        self.batches.append(bytes(buf))
        self.end = base + next(iter(iter_batches(buf)))[1].record_count
        return base

    def request(self, op: Op, params: dict[str, Any], data: Any = (), **_: Any) -> fr.Message:
        if op == Op.LIST_OFFSETS:
            out = {"high_watermark": self.end, "log_end_offset": self.end, "sealed": self.sealed}
            return fr.Message(fr.Header(op, 1, fr.FLAG_REPLY), {**out, "log_start_offset": self.start}, ())
        if op == Op.FETCH:
            got, size = [], 0
            for b in self.batches:
                h = next(iter(iter_batches(b)))[1]
                if h.next_offset > params["offset"] and size + len(b) <= params["max_bytes"]:
                    got.append(b)
                    size += len(b)
            return fr.Message(fr.Header(op, 1, fr.FLAG_REPLY), {}, (b"".join(got),) if got else ())
        assert op == Op.PRODUCE
        if params["move_copy"] != self.end:
            raise OffsetOutOfRange("not where the log ends")
        self.produces.append(len(data))
        return fr.Message(fr.Header(op, 1, fr.FLAG_REPLY), {"offsets": [self.append(b) for b in data]}, ())


def _plane(src: Leader, dst: Leader) -> ClientPlane:
    plane = ClientPlane(None)  # type: ignore[arg-type]  # no etcd: connections handed in below
    plane._conn = lambda queue, cluster: src if cluster == "a" else dst  # type: ignore[assignment,method-assign,return-value]
    return plane


def _move() -> Any:
    from fabric.federation.moves import Move

    return Move("q", "a", "b", phase="copying", partitions=1)


def test_the_copy_is_byte_for_byte_at_the_source_offsets_in_bounded_requests(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(copier, "BATCHES_PER_PRODUCE", 7)
    monkeypatch.setattr(copier, "COPY_BYTES_PER_STEP", 2000)
    monkeypatch.setattr(copier, "FETCH_BYTES", 700)
    src, dst = Leader(), Leader()
    for i in range(40):
        src.append(bytes(encode_batch([f"m{i}-{k}".encode() for k in range(1 + i % 3)], producer_id=i % 4)))
    plane = _plane(src, dst)
    steps = 0
    while dst.end < src.end:
        (progress,) = plane.copy(_move())  # type: ignore[misc]
        steps += 1
        assert progress.dest_end == dst.end and progress.source_hw == src.end and not progress.cut
    assert steps > 1  # the budget spreads the copy over steps
    assert dst.batches == src.batches  # byte for byte, headers (offsets) included
    assert max(dst.produces) == 7  # fetched more than 7 at a time: split
    src.sealed = True
    (done,) = plane.copy(_move())  # type: ignore[misc]
    assert done.cut


def test_a_source_log_not_starting_at_0_or_a_destination_storing_elsewhere_stops_the_move() -> None:
    src = Leader(start=10)
    src.append(bytes(encode_batch([b"x"])))
    with pytest.raises(MoveFailed, match="starts at offset 10"):
        _plane(src, Leader()).copy(_move())
    src, dst = Leader(), Leader()
    src.append(bytes(encode_batch([b"x"])))
    dst.shift = 3
    with pytest.raises(MoveFailed, match="stored batches at"):
        _plane(src, dst).copy(_move())
