"""Credit flow control: the server never sends past the consumer's credit, except
one whole batch while any credit is left (KIP-74), and every consumer that grants
as the client does reaches the high watermark, whatever the batch sizes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.client.credit import CreditDebt, chunk_records
from fabric.protocol.batch import encode_batch, iter_batches, stamp
from fabric.push.credit import Credit, take
from fabric.push.subscriptions import READ_SLACK_BYTES, Pusher, Subscription, Subscriptions


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


def test_a_batch_beyond_the_credit_left_goes_alone_while_any_credit_is_left():
    data = _log([50, 5])
    idle = Credit(10, 1 << 20)
    chunk = take(data, idle, upto_offset=55)
    assert chunk is not None and chunk.records == 50  # alone, not with the next batch
    busy = Credit(10, 1 << 20)
    busy.spend(1, 100)  # KIP-74: room for anything means the next whole batch
    chunk = take(data, busy, upto_offset=55)
    assert chunk is not None and chunk.records == 50
    spent = Credit(10, 1 << 20)
    spent.spend(10, 100)  # no room at all: wait for a grant
    assert take(data, spent, upto_offset=55) is None
    short_of_bytes = Credit(100, 1000)
    short_of_bytes.spend(1, 1000)
    assert take(data, short_of_bytes, upto_offset=55) is None


def test_a_consumer_owing_less_than_its_grant_step_still_gets_the_next_large_batch():
    """Issue 15 #1: a 3-record batch, then one larger than the credit left; the consumer takes the
    first and owes 3 (below its quarter-window step): before the fix neither side moved again."""
    data = _log([3, 18])
    credit = Credit(20, 1 << 20)
    first = take(data, credit, upto_offset=21)
    assert first is not None and first.records == 21 - 18
    credit.spend(first.records, first.nbytes)
    assert CreditDebt(20, 1 << 20, messages=3).due() is None  # the consumer waits to grant
    second = take(data[first.nbytes :], credit, upto_offset=21)
    assert second is not None and second.next_offset == 21


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
        for _, h in iter_batches(bytes(chunk)):
            n += h.record_count
            received.append((h.base_offset, h.record_count))
        # the rule: within credit, or a single batch sent while any credit was left
        assert inflight[0] + n <= window or (inflight[0] < window and len(list(iter_batches(bytes(chunk)))) == 1)
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


def _reader(sizes: list[int]):
    data = _log(sizes)
    end = sum(sizes)
    starts, positions = [0], [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    for _, h in iter_batches(data):
        positions.append(positions[-1] + h.size)

    def read(queue, p, offset, max_bytes):
        """Whole batches from the one holding ``offset``, at most ``max_bytes`` but the first always."""
        if offset >= end:
            return b"", end
        i = max(j for j, s in enumerate(starts[:-1]) if s <= offset)
        stop = i + 1
        while stop < len(sizes) and positions[stop + 1] - positions[i] <= max_bytes:
            stop += 1
        return data[positions[i] : positions[stop]], end

    return read, end


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 400), min_size=1, max_size=30),
    window_messages=st.integers(1, 300),
    window_bytes=st.integers(200, 8000),
    takes=st.lists(st.integers(0, 3), min_size=1, max_size=20),
)
def test_every_consumer_reaches_the_high_watermark(sizes, window_messages, window_bytes, takes):
    """Issue 15 #1, as a property: a consumer that grants exactly as the client does (quarter-window
    steps of what it received, see fabric.client.credit) and takes batches at any pace is never
    left waiting while the log holds more for it."""
    read, end = _reader(sizes)
    wire: list[bytes] = []  # pushed, not yet received
    held: list[int] = []  # records of received batches the application has not taken yet
    debt = CreditDebt(window_messages, window_bytes)

    def send(client, sub_id, p, upto, chunk, leases=None):
        wire.append(bytes(chunk))
        return True

    subs = Subscriptions()
    sub = Subscription(subs.new_id(), b"c", "q", None, {0: 0}, Credit(window_messages, window_bytes), 0)
    subs.add(sub)
    pusher = Pusher(subs, read, send)
    consumed = 0
    for step in range(10_000):
        pusher.deliver()
        while wire:  # the consumer receives what is on the wire
            chunk = wire.pop(0)
            debt.received(chunk_records(chunk), len(chunk))
            held.extend(h.record_count for _, h in iter_batches(chunk))
        n = takes[step % len(takes)] or (1 if not subs.ready else 0)  # an idle app still polls
        for _ in range(min(n, len(held))):
            consumed += held.pop(0)
            grant = debt.due()
            if grant is not None:
                subs.grant(sub.id, *grant)
        if consumed == end:
            break
        if not held and not wire and not subs.ready:
            raise AssertionError(f"stalled at {consumed} of {end}: credit {sub.credit}, owed {debt}")
    assert consumed == end


def test_a_push_reads_no_more_than_its_message_credit_can_take() -> None:
    """A push read is a copy: with credit for a few messages of the sizes sent so far, the pusher
    asks for about that many bytes (plus a batch boundary's slack), not its 4 MiB pass maximum."""
    sizes = [100] * 400  # batches of 100 records
    read, end = _reader(sizes)
    asked: list[int] = []

    def counting_read(queue, p, offset, max_bytes):
        asked.append(max_bytes)
        return read(queue, p, offset, max_bytes)

    subs = Subscriptions()
    sub = Subscription(subs.new_id(), b"c", "q", None, {0: 0}, Credit(250, 1 << 30), 0)
    subs.add(sub)
    pusher = Pusher(subs, counting_read, lambda *a, **k: True)
    pusher.deliver()
    per_record = sub.sent_bytes // sub.sent_messages
    assert sub.sent_messages == 300  # 2 batches within credit, then the one that crosses goes alone
    for _ in range(5):
        asked.clear()
        subs.grant(sub.id, 300, sub.sent_bytes)
        pusher.deliver()
        assert asked and max(asked) <= 300 * per_record + READ_SLACK_BYTES
    assert sub.cursors[0] == 1_800 < end


def test_a_pass_that_sends_all_it_can_see_reads_once_and_is_done() -> None:
    """A subscription that was sent every visible record leaves the ready set after one read per
    partition (new data makes it ready again); one with records left past its pass stays ready."""
    sizes = [10] * 30
    read, end = _reader(sizes)
    reads: list[int] = []

    def counting_read(queue, p, offset, max_bytes):
        reads.append(offset)
        return read(queue, p, offset, max_bytes)

    subs = Subscriptions()
    sub = Subscription(subs.new_id(), b"c", "q", None, {0: 0}, Credit(1_000, 1 << 30), 0)
    subs.add(sub)
    Pusher(subs, counting_read, lambda *a, **k: True).deliver()
    assert sub.cursors[0] == end and reads == [0] and not subs.ready

    small = Subscriptions()
    sub2 = Subscription(small.new_id(), b"c", "q", None, {0: 0}, Credit(1_000, 1 << 30), 0)
    small.add(sub2)
    Pusher(small, read, lambda *a, **k: True, pass_bytes_max=200).deliver()
    assert 0 < sub2.cursors[0] < end and sub2.id in small.ready  # the rest goes on the next turn
