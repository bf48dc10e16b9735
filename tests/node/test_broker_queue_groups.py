"""Queue groups on the broker driven in memory: leases, ack, nack, the visibility timeout run out by
the clock, max_receive_count to the dead-letter queue, redrive (over sockets:
tests/integration/test_groups.py, test_delivery_recovery.py)."""

from __future__ import annotations

from fabric.errors import NotLeaseHolder
from fabric.protocol.batch import decode_records, iter_batches
from fabric.protocol.ops import Op
from tests.node.harness import ALICE, BOB, BrokerHarness


def join(h: BrokerHarness, client: bytes = ALICE, **params) -> int:
    reply = h.call(Op.SUBSCRIBE, {"queue": "jobs", "group": "workers", "kind": "queue", **params}, client=client)
    return reply["subscription"]


def deliveries(h: BrokerHarness, client: bytes = ALICE) -> list[tuple[int, bytes, int]]:
    """(offset, value, receive_count) of every record leased to ``client`` since the last look."""
    out = []
    for m in h.pushes(client):
        for frame in m.data:
            for pos, batch in iter_batches(frame):
                rec = decode_records(frame, pos)
                for i, value in enumerate(rec.values):
                    offset = batch.base_offset + i
                    out.extend((offset, value, c) for s, e, c in m.params["leases"] if s <= offset < e)
    return out


def settle(h: BrokerHarness, op: Op, sub: int, *offsets: int, client: bytes = ALICE, **params) -> dict:
    ranges = {"0": [[o, o + 1] for o in offsets]}
    return h.call(op, {"subscription": sub, "ranges": ranges, **params}, client=client)


def group(h: BrokerHarness) -> dict:
    return h.describe("jobs")["groups"]["workers"]


def test_leases_go_to_one_member_and_an_ack_settles_them(harness):
    h = harness
    h.create_queue("jobs")
    h.produce("jobs", b"a", b"b", b"c")
    a = join(h)
    b = join(h, BOB)
    assert deliveries(h) == [(0, b"a", 1), (1, b"b", 1), (2, b"c", 1)]
    assert deliveries(h, BOB) == []  # all three are leased to the first member
    assert h.request(Op.ACK, {"subscription": b, "ranges": {"0": [[0, 1]]}}, client=BOB).header.status == (
        NotLeaseHolder.code
    )
    assert settle(h, Op.ACK, a, 0, 1) == {"acked": 2}
    assert group(h)["in_flight"] == 1
    assert settle(h, Op.ACK, a, 2, durable=True) == {"acked": 1}
    assert group(h)["backlog"] == 0 and group(h)["in_flight"] == 0


def test_a_nack_redelivers_with_the_receive_count_raised(harness):
    h = harness
    h.create_queue("jobs")
    h.produce("jobs", b"a")
    a = join(h)
    assert deliveries(h) == [(0, b"a", 1)]
    assert settle(h, Op.NACK, a, 0) == {"nacked": 1}
    assert deliveries(h) == [(0, b"a", 2)]
    assert settle(h, Op.NACK, a, 0, delay_ms=5000) == {"nacked": 1}
    h.advance(4999)
    assert deliveries(h) == []
    h.advance(1)
    assert deliveries(h) == [(0, b"a", 3)]


def test_a_member_that_left_keeping_leases_is_settled_by_receipt_uncounted_only_by_nack(harness):
    """SETTLE on behalf of a member gone with keep_leases: ``uncount`` gives a nack back without
    raising the receive count (pushes it never handed out); with any other action it is refused."""
    h = harness
    h.create_queue("jobs")
    h.produce("jobs", b"a", b"b")
    a = join(h)
    assert deliveries(h) == [(0, b"a", 1), (1, b"b", 1)]
    assert h.call(Op.UNSUBSCRIBE, {"subscription": a, "keep_leases": True}) == {"released": 0}
    assert group(h)["in_flight"] == 2
    left = {"queue": "jobs", "group": "workers", "member": a, "ranges": {"0": [[1, 2]]}}
    refused = h.request(Op.SETTLE, {**left, "action": "ack", "uncount": True})
    assert refused.header.status != 0 and "uncount" in refused.params["message"]
    assert h.call(Op.SETTLE, {**left, "action": "nack", "uncount": True}) == {"settled": 1}
    assert group(h)["in_flight"] == 1
    join(h, BOB)
    assert deliveries(h, BOB) == [(1, b"b", 1)]  # given back uncounted: still its first delivery


def test_a_lease_not_settled_within_the_visibility_timeout_goes_to_another_member(harness):
    h = harness
    h.create_queue("jobs", visibility_timeout_ms=1000)
    h.produce("jobs", b"a")
    join(h, credit_messages=1)  # its credit spent on "a": the redelivery goes to the other member
    assert deliveries(h) == [(0, b"a", 1)]
    join(h, BOB)
    h.advance(999)
    assert deliveries(h, BOB) == []
    h.advance(1)
    assert deliveries(h, BOB) == [(0, b"a", 2)]
    assert deliveries(h) == []


def test_change_visibility_extends_a_lease(harness):
    h = harness
    h.create_queue("jobs", visibility_timeout_ms=1000)
    h.produce("jobs", b"a")
    a = join(h)
    assert deliveries(h) == [(0, b"a", 1)]
    assert settle(h, Op.CHANGE_VISIBILITY, a, 0, visibility_ms=10_000) == {"changed": 1}
    h.advance(9_000)
    assert deliveries(h) == []
    h.call(Op.HEARTBEAT, {})
    h.advance(1_000)
    assert deliveries(h) == [(0, b"a", 2)]


def test_past_max_receive_count_a_message_is_dead_lettered_and_redrive_brings_it_back(harness):
    h = harness
    h.create_queue("jobs", partitions=1, max_receive_count=3, visibility_timeout_ms=60_000)
    for i in range(3):
        h.produce("jobs", b"job-%d" % i)
    a = join(h)
    assert [c for _, _, c in deliveries(h)] == [1, 1, 1]
    settle(h, Op.ACK, a, 0, 2)
    for attempt in (2, 3):
        settle(h, Op.NACK, a, 1)
        assert deliveries(h) == [(1, b"job-1", attempt)]
    settle(h, Op.NACK, a, 1)  # a 4th delivery would pass max_receive_count: dead-lettered instead
    assert deliveries(h) == []
    assert group(h)["backlog"] == 0 and group(h)["in_flight"] == 0
    fetched = h.request(Op.FETCH, {"queue": "jobs.dlq", "partition": 0, "offset": 0})
    [(pos, _)] = list(iter_batches(fetched.data[0]))
    dead = decode_records(fetched.data[0], pos)
    assert dead.values == [b"job-1"]
    assert dead.headers is not None
    headers = dead.headers[0]
    assert headers["x-dlq-source"] == b"jobs" and headers["x-dlq-reason"] == b"max_receive_count"
    assert headers["x-dlq-receive-count"] == b"3" and headers["x-dlq-offset"] == b"1"
    assert h.describe("jobs")["dead_letters"]["reasons"] == {"max_receive_count": 1}
    assert h.call(Op.REDRIVE, {"queue": "jobs.dlq", "dry_run": True})["matching"] == 1
    assert h.describe("jobs.dlq")["groups"] == {}  # a dry run leaves no fabric.redrive group behind
    assert h.call(Op.REDRIVE, {"queue": "jobs.dlq"})["redriven"] == 1
    assert h.call(Op.REDRIVE, {"queue": "jobs.dlq", "dry_run": True})["matching"] == 0  # redriven already
    assert h.call(Op.REDRIVE, {"queue": "jobs.dlq"})["redriven"] == 0  # never twice
    assert deliveries(h) == [(3, b"job-1", 1)]
    # deleting the redrive group (a queue group without members) removes it from the DLQ's groups
    assert "fabric.redrive" in h.describe("jobs.dlq")["groups"]
    h.call(Op.COMMIT, {"queue": "jobs.dlq", "group": "fabric.redrive", "offsets": {}, "forget": True})
    assert h.describe("jobs.dlq")["groups"] == {}


def test_unsubscribe_gives_back_what_was_never_handed_out_uncounted(harness):
    h = harness
    h.create_queue("jobs")
    h.produce("jobs", b"a", b"b")
    a = join(h)
    assert len(deliveries(h)) == 2
    released = h.call(Op.UNSUBSCRIBE, {"subscription": a, "release": {"0": [[0, 2]]}})
    assert released == {"released": 2}
    join(h, BOB)
    assert deliveries(h, BOB) == [(0, b"a", 1), (1, b"b", 1)]


def test_a_key_shared_nack_with_a_delay_is_redelivered_when_the_delay_ends(harness):
    h = harness
    h.create_queue("jobs")
    h.call(Op.PRODUCE, {"queue": "jobs", "partition": 0}, [h.batch(b"a", keys=[b"k"])])
    a = join(h, kind="key_shared")
    assert deliveries(h) == [(0, b"a", 1)]
    settle(h, Op.NACK, a, 0, delay_ms=2000)
    h.advance(1999)
    assert deliveries(h) == []
    h.advance(1)
    assert deliveries(h) == [(0, b"a", 2)]
