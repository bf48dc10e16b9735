"""Delayed delivery on the broker driven in memory: a delayed batch waits in the delay store and is
appended when the clock reaches its time (over sockets, across kill -9:
tests/integration/test_message_properties.py)."""

from __future__ import annotations

from fabric.protocol.ops import Op
from tests.node.harness import BOB, BrokerHarness, values


def fetch_all(h: BrokerHarness) -> list[bytes]:
    return values(h.request(Op.FETCH, {"queue": "later", "partition": 0, "offset": 0}))


def test_a_delayed_message_is_appended_when_it_is_due(harness):
    h = harness
    h.create_queue("later")
    h.call(Op.SUBSCRIBE, {"queue": "later", "start": "earliest"}, client=BOB)
    reply = h.produce("later", b"in three seconds", delay_ms=3000)
    assert reply["offsets"] == [-1] and reply["delayed_until"] == h.now_ms + 3000
    assert h.produce("later", b"now")["offsets"] == [0]
    assert h.describe("later")["delayed"]["batches"] == 1
    assert h.pushed_values(BOB) == [b"now"]
    h.advance(2999)
    assert fetch_all(h) == [b"now"] and h.pushed_values(BOB) == []
    h.advance(1)
    assert fetch_all(h) == [b"now", b"in three seconds"]
    assert h.pushed_values(BOB) == [b"in three seconds"]
    assert h.describe("later")["delayed"]["batches"] == 0


def test_deliver_at_names_the_time_and_one_in_the_past_appends_at_once(harness):
    h = harness
    h.create_queue("later")
    assert h.produce("later", b"past", deliver_at_ms=h.now_ms - 5000)["offsets"] == [0]
    reply = h.produce("later", b"at noon", deliver_at_ms=h.now_ms + 60_000)
    assert reply["delayed_until"] == h.now_ms + 60_000
    h.advance(59_999)
    assert fetch_all(h) == [b"past"]
    h.advance(1)
    assert fetch_all(h) == [b"past", b"at noon"]


def test_delayed_batches_keep_their_order_by_due_time(harness):
    h = harness
    h.create_queue("later")
    for value, delay in ((b"third", 300), (b"first", 100), (b"second", 200)):
        h.produce("later", value, delay_ms=delay)
    h.advance(1000)
    assert fetch_all(h) == [b"first", b"second", b"third"]
