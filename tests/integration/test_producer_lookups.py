"""A producer meeting many queues looks them up with one METADATA ``settings`` request instead of
one DESCRIBE_QUEUE round trip each (issue 10's scale bar: one message to each of 10,000 queues)."""

from __future__ import annotations

import pytest

from fabric.client import Admin, Producer, catalog
from fabric.client.catalog import QueueCatalog
from fabric.errors import MessageTooLarge
from fabric.protocol.ops import Op

pytestmark = pytest.mark.integration


def test_a_producer_meeting_many_queues_looks_them_up_at_once(node, monkeypatch) -> None:
    with Admin(node.endpoint) as admin:
        for i in range(20):
            admin.create_queue(f"m{i:02d}", partitions=3 if i == 7 else 1, max_message_bytes=1000)
    ops: list[Op] = []
    real = QueueCatalog.request

    def spy(self: QueueCatalog, op: Op, params: dict) -> dict:
        ops.append(op)
        return real(self, op, params)

    monkeypatch.setattr(QueueCatalog, "request", spy)  # the producer's metadata requests
    monkeypatch.setattr(catalog, "PREFETCH_PAGE", 8)  # pages of 8: the 20 queues take three
    with Producer(node.endpoint, acks="all") as p:
        futs = [p.send(f"m{i:02d}", b"v") for i in range(20)]
        p.flush(30)
        assert all(f.result(10).offset == 0 for f in futs)
        # the first queue is described on its own, the second miss asks for all of them at once
        assert ops.count(Op.DESCRIBE_QUEUE) == 1 and ops.count(Op.METADATA) == 3, ops
        assert p._queues["m07"][:2] == (3, 1000)  # what DESCRIBE_QUEUE would have said
        with pytest.raises(MessageTooLarge):
            p.send("m11", b"x" * 1001)
        assert p.send("m07", b"k", key=b"k").result(10).partition in (0, 1, 2)
        # a queue the answer does not name (it did not exist then): described, and auto-created
        assert p.send("fresh", b"x").result(10).offset == 0
        assert ops.count(Op.DESCRIBE_QUEUE) == 2 and ops.count(Op.METADATA) == 3, ops
    with Admin(node.endpoint) as admin:
        assert admin.describe_queue("fresh")["messages"] == 1
        assert sum(admin.describe_queue(f"m{i:02d}")["messages"] for i in range(20)) == 21
