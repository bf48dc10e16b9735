"""A producer that meets UNKNOWN_PARTITION or UNKNOWN_QUEUE for a batch (a node or router whose map
has not caught up with a queue just created or a partition just added) sends it again after its
backoff instead of failing the send; a queue that stays unknown fails after the retries."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fabric.client import Producer
from fabric.errors import UnknownPartition, UnknownQueue
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from tests.client.fake_router import FakeRouter

SETTINGS = {"max_message_bytes": 1 << 20, "max_batch_bytes": 4 << 20}


class LaggingNode(FakeRouter):
    """Refuses the first ``refusals`` PRODUCE requests with ``error``, then stores everything."""

    def __init__(self, error: type[Any], refusals: int) -> None:
        super().__init__()
        self.error = error
        self.refusals = refusals
        self.produce_at: list[float] = []
        self.start()

    def _serve(self) -> None:
        for ident, h in self.requests(20):
            if h.op == Op.DESCRIBE_QUEUE:
                self.reply(ident, h, {"name": "q", "partitions": 2, "settings": SETTINGS})
            elif h.op == Op.INIT_PRODUCER:
                self.reply(ident, h, {"producer_id": 7, "epoch": 0})
            elif h.op == Op.PRODUCE:
                self.produce_at.append(time.monotonic())
                if len(self.produce_at) <= self.refusals:
                    err = self.error("queue 'q' is not known here yet")
                    self.reply(ident, h, {"error": err.name, "message": err.message}, err.code)
                else:
                    self.reply(ident, h, {"offsets": [len(self.produce_at)], "partitions": 2})
            elif not h.flags & fr.FLAG_NO_REPLY:
                self.reply(ident, h, {"subscriptions": []} if h.op == Op.HEARTBEAT else {})


@pytest.mark.parametrize("error", [UnknownPartition, UnknownQueue])
def test_a_batch_refused_while_the_map_catches_up_is_sent_again(error: type[Any]) -> None:
    node = LaggingNode(error, refusals=2)
    try:
        with Producer(node.endpoint, linger_ms=0, retry_backoff_ms=20) as prod:
            meta = prod.send("q", b"v", partition=1).result(10)
        assert meta.partition == 1 and meta.offset == 3
        assert len(node.produce_at) == 3
        assert node.produce_at[1] - node.produce_at[0] >= 0.015  # after the backoff
    finally:
        node.stop()


def test_a_queue_that_stays_unknown_fails_after_the_retries() -> None:
    node = LaggingNode(UnknownQueue, refusals=100)
    try:
        with Producer(node.endpoint, linger_ms=0, retries=3, retry_backoff_ms=20) as prod:
            started = time.monotonic()
            with pytest.raises(UnknownQueue):
                prod.send("q", b"v").result(10)
            assert time.monotonic() - started < 5
        assert len(node.produce_at) == 4  # the first try and 3 retries
    finally:
        node.stop()
