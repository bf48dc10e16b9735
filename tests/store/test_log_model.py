"""Property test: a PartitionLog behaves like a list of batches, across rolls, truncations and reopens."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabric.protocol.batch import iter_batches, parse_header
from fabric.store.log import PartitionLog
from tests.store.helpers import SMALL, make_batch, read_all

MODEL_SETTINGS = dataclasses.replace(SMALL, segment_ms=1_000)
TAIL_CACHE_BYTES = 16 * 1024


@dataclass
class Batch:
    base: int
    count: int
    data: bytes
    max_ts: int


value_bytes = st.one_of(st.integers(0, 150), st.integers(0, 4_000))  # many batches below the index interval
appends = st.tuples(st.just("append"), st.integers(1, 5), value_bytes, st.integers(0, 10_000))
reads = st.tuples(st.just("read"), st.integers(0, 10**6), st.one_of(st.integers(1, 2_000), st.integers(1, 40_000)))
operations = st.lists(
    st.one_of(
        appends,
        appends,
        appends,
        reads,
        st.tuples(st.just("roll")),
        st.tuples(st.just("reopen"), st.booleans()),
        st.tuples(st.just("truncate"), st.integers(0, 10**6)),
        st.tuples(st.just("timestamp"), st.integers(0, 11_000)),
    ),
    max_size=50,
)


def check_read(log: PartitionLog, model: list[Batch], offset: int, max_bytes: int) -> None:
    data = log.read(offset, max_bytes)
    if offset == log.next_offset:
        assert data == b""
        return
    first = next(i for i, b in enumerate(model) if b.base <= offset < b.base + b.count)
    got = [data[p : p + h.size] for p, h in iter_batches(data)]
    assert got, "a read before the end returns at least one batch"
    assert got == [b.data for b in model[first : first + len(got)]]
    assert len(data) <= max(max_bytes, len(got[0]))


def check_all(log: PartitionLog, model: list[Batch]) -> None:
    end = model[-1].base + model[-1].count if model else log.log_start_offset
    assert log.next_offset == end
    assert log.size_bytes == sum(len(b.data) for b in model)
    assert list(read_all(log)) == [b.data for b in model]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_log_matches_a_list_model(tmp_path_factory: pytest.TempPathFactory, ops: list[tuple]) -> None:
    directory = tmp_path_factory.mktemp("model") / "0"
    log = PartitionLog.open(directory, MODEL_SETTINGS, now_ms=0, tail_cache_bytes=TAIL_CACHE_BYTES)
    model: list[Batch] = []
    now = 0
    try:
        for op in ops:
            now += 150
            kind = op[0]
            if kind == "append":
                _, records, value_bytes, ts = op
                batch = make_batch(records, value_bytes, ts, tag=len(model))
                base = log.append(batch, parse_header(batch), now_ms=now)
                assert base == log.next_offset - records
                model.append(Batch(base, records, bytes(batch), ts))
            elif kind == "read":
                _, choice, max_bytes = op
                span = log.next_offset - log.log_start_offset + 1
                check_read(log, model, log.log_start_offset + choice % span, max_bytes)
            elif kind == "roll":
                log.roll(now)
            elif kind == "reopen":
                log.close(clean=op[1])
                log = PartitionLog.open(directory, MODEL_SETTINGS, now_ms=now, tail_cache_bytes=TAIL_CACHE_BYTES)
                assert log.recovery.lossless
                assert log.recovery.clean_shutdown == op[1]
                check_all(log, model)
            elif kind == "truncate":
                span = log.next_offset - log.log_start_offset + 1
                target = log.log_start_offset + op[1] % span
                new_end = log.truncate_to(target)
                model = [b for b in model if b.base + b.count <= target]
                assert new_end == (model[-1].base + model[-1].count if model else log.log_start_offset)
            else:
                ts = op[1]
                expected = next((b.base for b in model if b.max_ts >= ts), log.next_offset)
                assert log.offset_for_timestamp(ts) == expected
        check_all(log, model)
    finally:
        log.close(clean=False)
