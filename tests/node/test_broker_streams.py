"""Stream subscriptions on the broker driven in memory: pushes within the credit window, CREDIT
bringing more, commits, and stream groups that assign, revoke and hand partitions over
(over sockets: tests/integration/test_end_to_end.py, test_delivery_recovery.py, test_groups.py)."""

from __future__ import annotations

from fabric.errors import NotLeaseHolder
from fabric.protocol.ops import Op
from tests.node.harness import ALICE, BOB, BrokerHarness, records


def subscribe(h: BrokerHarness, client: bytes = ALICE, **params) -> dict:
    return h.call(Op.SUBSCRIBE, {"queue": "q", **params}, client=client)


def test_pushes_stop_at_the_credit_window_and_credit_brings_the_rest(harness):
    h = harness
    h.create_queue("q")
    for i in range(5):
        h.produce("q", b"m%d" % i)  # one batch each
    sub = subscribe(h, start="earliest", credit_messages=2)
    assert sub["partitions"] == {"0": 0}
    pushes = h.pushes()
    assert [m.header.request_id for m in pushes] == [sub["subscription"]] * len(pushes)
    assert [v for m in pushes for _, v in records(m)] == [b"m0", b"m1"]
    assert pushes[-1].params == {"partition": 0, "high_watermark": 5}
    h.advance(1000)
    assert h.pushes() == []  # no credit, nothing more
    h.call(Op.CREDIT, {"subscription": sub["subscription"], "messages": 2, "bytes": 1024})
    assert h.pushed_values() == [b"m2", b"m3"]
    h.call(Op.CREDIT, {"subscription": sub["subscription"], "messages": 2, "bytes": 1024})
    assert h.pushed_values() == [b"m4"]
    h.produce("q", b"m5")  # new data goes out at once to a subscriber with credit
    assert h.pushed_values() == [b"m5"]


def test_start_latest_pushes_only_what_comes_after(harness):
    h = harness
    h.create_queue("q")
    h.produce("q", b"old")
    assert subscribe(h, start="latest")["partitions"] == {"0": 1}
    h.produce("q", b"new")
    assert h.pushed_values() == [b"new"]


def test_a_group_commits_and_a_new_subscription_resumes_there(harness):
    h = harness
    h.create_queue("q")
    h.produce("q", *[b"m%d" % i for i in range(10)])
    h.call(Op.COMMIT, {"queue": "q", "group": "g", "offsets": {"0": 4}})
    assert h.call(Op.COMMITTED, {"queue": "q", "group": "g"}) == {"offsets": {"0": 4}}
    assert subscribe(h, group="g", partitions=[0])["partitions"] == {"0": 4}
    assert h.request(Op.COMMIT, {"queue": "q", "group": "g", "offsets": {"0": 11}}).header.status != 0


def test_a_stream_group_splits_the_partitions_and_hands_them_over_on_revoke(harness):
    h = harness
    h.create_queue("q", partitions=4)
    first = subscribe(h, group="g")
    assert sorted(first["partitions"]) == ["0", "1", "2", "3"]
    second = subscribe(h, BOB, group="g")
    assert second["partitions"] == {}  # nothing yet: the first member must give partitions back
    [revoke] = h.pushes(ALICE)
    assert revoke.header.op == Op.ASSIGNMENT and revoke.header.request_id == first["subscription"]
    revoked = revoke.params["revoked"]
    assert len(revoked) == 2
    h.call(Op.REVOKED, {"subscription": first["subscription"], "partitions": revoked})
    [assign] = h.pushes(BOB)
    assert assign.header.op == Op.ASSIGNMENT and sorted(map(int, assign.params["assigned"])) == sorted(revoked)
    # only the holder may commit a partition of the group
    p = revoked[0]
    member = {"queue": "q", "group": "g", "offsets": {str(p): 0}}
    m = h.request(Op.COMMIT, {**member, "subscription": first["subscription"]})
    assert m.header.status == NotLeaseHolder.code
    h.call(Op.COMMIT, {**member, "subscription": second["subscription"]}, client=BOB)


def test_a_consumer_back_over_a_new_link_replaces_its_old_subscription(harness):
    h = harness
    h.create_queue("q", partitions=3)
    old = subscribe(h, group="g", session_timeout_ms=60_000)
    params = {"group": "g", "session_timeout_ms": 60_000}
    assert subscribe(h, BOB, **params, replaces=old["subscription"])["partitions"] == {"0": 0, "1": 0, "2": 0}
    assert len(h.call(Op.DESCRIBE_QUEUE, {"name": "q"})["groups"]["g"]["members"]) == 1
