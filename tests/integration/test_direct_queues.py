"""Direct (brokerless) queues on a real node: consumers register their PULL sockets, producers
send straight to them; at most once, nothing stored, refusals for what needs a log."""

from __future__ import annotations

import collections
import time

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.errors import BadParameter, NotDelivered
from fabric.protocol.ops import Op
from fabric.transport.connection import connect

pytestmark = pytest.mark.integration


def _wait_consumers(endpoint: str, queue: str, n: int) -> None:
    deadline = time.monotonic() + 10
    with Admin(endpoint) as admin:
        while len(admin.describe_queue(queue)["direct_consumers"]) != n:
            assert time.monotonic() < deadline, admin.describe_queue(queue)
            time.sleep(0.05)


def _drain(consumers: list[Consumer], want: int, seconds: float = 20) -> dict[int, list]:
    got: dict[int, list] = collections.defaultdict(list)
    deadline = time.monotonic() + seconds
    while sum(len(v) for v in got.values()) < want and time.monotonic() < deadline:
        for i, c in enumerate(consumers):
            b = c.poll_batch(20)
            if b is not None:
                got[i].extend(b.messages())
    return got


def test_producers_send_straight_to_the_consumers(node) -> None:
    with Admin(node.endpoint) as admin:
        admin.create_queue("ticks", mode="direct")
        assert admin.describe_queue("ticks")["settings"]["mode"] == "direct"
    consumers = [Consumer("ticks", node.endpoint, heartbeat_ms=500) for _ in range(2)]
    try:
        _wait_consumers(node.endpoint, "ticks", 2)
        with Producer(node.endpoint, linger_ms=0) as prod:
            futs = [prod.send("ticks", b"t%d" % i) for i in range(1000)]
            assert all(f.result().offset is None for f in futs)  # nothing stored: no offsets
            got = _drain(consumers, 1000)
            values = sorted(m.value for ms in got.values() for m in ms)
            assert values == sorted(b"t%d" % i for i in range(1000))
            assert len(got[0]) > 100 and len(got[1]) > 100  # round robin without a key
            # by key: every key stays with one consumer, with its key and headers intact
            for i in range(300):
                prod.send("ticks", b"k%d" % i, key=b"key-%d" % (i % 7), headers={"n": str(i)})
            got = _drain(consumers, 300)
            owner: dict[bytes, set[int]] = collections.defaultdict(set)
            for c, ms in got.items():
                for m in ms:
                    owner[m.key].add(c)
                    assert m.headers == {"n": m.value[1:]}
            assert len(owner) == 7 and all(len(o) == 1 for o in owner.values())
        # the node stored none of it
        with Admin(node.endpoint) as admin:
            assert admin.describe_queue("ticks")["messages"] == 0
    finally:
        for c in consumers:
            c.close()
    _wait_consumers(node.endpoint, "ticks", 0)  # a closed consumer leaves the registry at once


def test_no_consumer_means_not_delivered_and_what_needs_a_log_is_refused(node) -> None:
    with Admin(node.endpoint) as admin:
        admin.create_queue("lonely", mode="direct")
        with pytest.raises(BadParameter, match="max_receive_count"):
            admin.create_queue("bad", mode="direct", max_receive_count=3)
        with pytest.raises(BadParameter, match="mode"):
            admin.create_queue("bad2", mode="teleport")
    with Producer(node.endpoint) as prod:
        fut = prod.send("lonely", b"x")
        with pytest.raises(NotDelivered):
            fut.result()
        errors = []
        prod.send("lonely", b"y", callback=lambda md, exc: errors.append(exc))
        assert isinstance(errors[0], NotDelivered)
        with pytest.raises(BadParameter, match="stores nothing"):
            prod.send("lonely", b"z", delay_ms=100)
    with Producer(node.endpoint, acks="all") as prod, pytest.raises(BadParameter, match="at most once"):
        prod.send("lonely", b"z")
    # a raw PRODUCE to a direct queue, and a log subscription to it, are refused by the node
    conn = connect(node.endpoint, timeout_ms=5000)
    try:
        with pytest.raises(BadParameter, match="direct"):
            conn.request(Op.PRODUCE, {"queue": "lonely", "partition": 0}, [b"\x00" * 8])
        with pytest.raises(BadParameter, match="direct"):
            conn.request(Op.SUBSCRIBE, {"queue": "lonely", "group": "g", "kind": "queue"})
        with pytest.raises(BadParameter, match="endpoint"):
            conn.request(Op.SUBSCRIBE, {"queue": "lonely", "kind": "direct"})
    finally:
        conn.close()
    with Admin(node.endpoint) as admin:
        admin.create_queue("logged")
    with pytest.raises(BadParameter, match="log queue"):
        Consumer("logged", node.endpoint, kind="direct")


def test_a_consumer_that_goes_away_is_dropped_and_sends_go_to_the_others(node) -> None:
    with Admin(node.endpoint) as admin:
        admin.create_queue("pair", mode="direct")
    stay = Consumer("pair", node.endpoint, heartbeat_ms=300)
    leave = Consumer("pair", node.endpoint, heartbeat_ms=300)
    try:
        _wait_consumers(node.endpoint, "pair", 2)
        leave.close()
        _wait_consumers(node.endpoint, "pair", 1)
        time.sleep(1.1)  # the producer's view of the consumers is at most REFRESH_S old
        with Producer(node.endpoint) as prod:
            futs = [prod.send("pair", b"p%d" % i) for i in range(200)]
            delivered = sum(1 for f in futs if f.done() and _ok(f))
        got = _drain([stay], delivered)
        assert delivered == 200 and len(got[0]) == 200
    finally:
        stay.close()


def _ok(fut) -> bool:  # type: ignore[no-untyped-def]
    try:
        fut.result()
        return True
    except NotDelivered:
        return False
