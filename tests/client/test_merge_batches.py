"""A poll joins contiguous received batches of a partition: every record once, in order, each
with its own key, headers and timestamp."""

from __future__ import annotations

from fabric.client.messages import ReceivedBatch, merge_batches


def _b(base: int, n: int, *, keys: bool = False, stamps: bool = False, first_ts: int = 1000) -> ReceivedBatch:
    return ReceivedBatch(
        "q",
        3,
        base,
        [b"v%d" % (base + i) for i in range(n)],
        [b"k%d" % (base + i) for i in range(n)] if keys else None,
        None,
        [first_ts + i for i in range(n)] if stamps else None,
        first_ts,
    )


def test_plain_batches_join_in_order() -> None:
    m = merge_batches([_b(10, 2), _b(12, 3)])
    assert (m.partition, m.base_offset, len(m)) == (3, 10, 5)
    assert m.values == [b"v10", b"v11", b"v12", b"v13", b"v14"]
    assert m.keys is None and m.timestamps is None
    assert [msg.offset for msg in m.messages()] == [10, 11, 12, 13, 14]


def test_columns_present_in_some_parts_are_filled_for_the_rest() -> None:
    m = merge_batches([_b(0, 2, keys=True), _b(2, 2, first_ts=5000), _b(4, 1, stamps=True, first_ts=7000)])
    assert m.keys == [b"k0", b"k1", None, None, None]
    assert m.timestamps == [1000, 1000, 5000, 5000, 7000]  # each record keeps its own batch's time
    msgs = m.messages()
    assert [(x.key, x.timestamp_ms) for x in msgs][2] == (None, 5000)
