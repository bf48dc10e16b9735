"""A producer given several endpoints leaves one whose node says it can neither serve nor pass on
a request (NOT_LEADER with ``try_elsewhere``: cut off from its peers, or fenced) for the next,
and what it had in flight there is sent again on the new one. Without the hint it stays: a
NOT_LEADER during an election is retried where it is."""

from __future__ import annotations

import time
from typing import Any

from fabric.client import Producer
from fabric.errors import NotLeader, Timeout
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from tests.client.fake_router import FakeRouter

SETTINGS = {"max_message_bytes": 1 << 20, "max_batch_bytes": 4 << 20}


class Node(FakeRouter):
    """Refuses every PRODUCE with NOT_LEADER (``details`` added) when ``cut_off``, else stores it."""

    def __init__(self, cut_off: bool, details: dict[str, Any]) -> None:
        super().__init__()
        self.cut_off = cut_off
        self.details = details
        self.produced = 0
        self.refused = 0
        self.start()

    def _serve(self) -> None:
        for ident, h in self.requests(20):
            if h.op == Op.DESCRIBE_QUEUE:
                self.reply(ident, h, {"name": "q", "partitions": 1, "settings": SETTINGS})
            elif h.op == Op.INIT_PRODUCER:
                self.reply(ident, h, {"producer_id": 7, "epoch": 0})
            elif h.op == Op.PRODUCE and self.cut_off:
                self.refused += 1
                err = NotLeader("n1 does not lead q/0 and cannot reach n2")
                self.reply(ident, h, {"error": err.name, "message": err.message, **self.details}, err.code)
            elif h.op == Op.PRODUCE:
                self.produced += 1
                self.reply(ident, h, {"offsets": [self.produced - 1], "partitions": 1})
            elif not h.flags & fr.FLAG_NO_REPLY:
                self.reply(ident, h, {"subscriptions": []} if h.op == Op.HEARTBEAT else {})


def _run(details: dict[str, Any], wait_s: float) -> tuple[Node, Node, bool]:
    cut, healthy = Node(True, details), Node(False, {})
    prod = Producer(f"{cut.endpoint},{healthy.endpoint}", spread=False, linger_ms=0, retry_backoff_ms=20)
    try:
        fut = prod.send("q", b"v", partition=0)
        deadline = time.monotonic() + wait_s
        while not fut.done() and time.monotonic() < deadline:
            time.sleep(0.02)
        done = fut.done()
        if done:
            assert fut.result(0).offset == 0
    finally:
        try:
            prod.close(timeout=0.1)
        except Timeout:
            pass  # the batch refused for ever: failed at close, as documented
        cut.stop()
        healthy.stop()
    return cut, healthy, done


def test_a_node_that_says_try_elsewhere_is_left_for_the_next_endpoint() -> None:
    cut, healthy, done = _run({"try_elsewhere": True}, 5.0)
    assert done and healthy.produced == 1
    assert cut.refused >= 1


def test_a_plain_not_leader_is_retried_where_it_is() -> None:
    cut, healthy, done = _run({}, 1.0)
    assert not done and healthy.produced == 0
    assert cut.refused >= 3
