"""Credit flow control: the server never sends past the consumer's credit, except
one whole batch when nothing is in flight (so an oversize batch cannot wedge)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.protocol.batch import encode_batch, stamp
from fabric.push.credit import Credit, take
from fabric.push.subscriptions import Pusher, Subscription, Subscriptions


def _log(sizes: list[int]) -> bytes:
    out, off = [], 0
    for n in sizes:
        b = bytearray(encode_batch([b"v" * 10] * n))
        stamp(b, off)
        off += n
        out.append(bytes(b))
    return b"".join(out)


def test_take_respects_message_and_byte_credit():
    data = _log([10, 10, 10])
    c = Credit(25, 1 << 20)
    chunk = take(data, c, upto_offset=30)
    assert chunk is not None and chunk.records == 20 and chunk.next_offset == 20


def test_take_stops_at_the_visible_offset():
    data = _log([5, 5, 5])
    chunk = take(data, Credit(100, 1 << 20), upto_offset=10)
    assert chunk is not None and chunk.next_offset == 10
    assert take(data, Credit(100, 1 << 20), upto_offset=0) is None


def test_oversize_batch_goes_alone_only_when_idle():
    data = _log([50, 5])
    idle = Credit(10, 1 << 20)
    chunk = take(data, idle, upto_offset=55)
    assert chunk is not None and chunk.records == 50  # alone, not with the next batch
    busy = Credit(10, 1 << 20)
    busy.spend(1, 100)
    assert take(data, busy, upto_offset=55) is None


def test_grant_never_exceeds_window():
    c = Credit(10, 1000)
    c.spend(10, 1000)
    c.grant(50, 50_000)
    assert (c.messages, c.bytes) == (10, 1000) and c.idle


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=40),
    window=st.integers(1, 60),
    grants=st.lists(st.integers(0, 40), max_size=30),
)
def test_pusher_never_overruns_credit(sizes, window, grants):
    data = _log(sizes)
    end = sum(sizes)
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)

    def read(queue, p, offset, max_bytes):
        # whole batches from the one containing offset, like PartitionLog.read
        if offset >= end:
            return b"", end
        i = max(j for j, s in enumerate(starts[:-1]) if s <= offset)
        pos = len(_log(sizes[:i]))
        return data[pos:], end

    inflight = [0]
    received = []

    def send(client, sub_id, p, upto, chunk, leases=None):
        n = 0
        from fabric.protocol.batch import iter_batches

        for _, h in iter_batches(bytes(chunk)):
            n += h.record_count
            received.append((h.base_offset, h.record_count))
        # the rule: within credit, or a single batch sent when nothing was in flight
        assert inflight[0] + n <= window or (inflight[0] == 0 and len(list(iter_batches(bytes(chunk)))) == 1)
        inflight[0] += n
        return True

    subs = Subscriptions()
    sub = Subscription(subs.new_id(), b"c", "q", None, {0: 0}, Credit(window, 1 << 30), 0)
    subs.add(sub)
    pusher = Pusher(subs, read, send)
    pusher.deliver()
    for g in grants:
        g = min(g, inflight[0])
        inflight[0] -= g
        subs.grant(sub.id, g, 0)
        pusher.deliver()
    # drain completely
    for _ in range(len(sizes) + 2):
        subs.grant(sub.id, inflight[0], 1 << 30)
        inflight[0] = 0
        pusher.deliver()
    assert [b for b, _ in received] == starts[:-1]  # in order, every batch once
