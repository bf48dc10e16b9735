"""Queue size limits (issue 15 #6): dead_letter_oldest moves out exactly the oldest messages that
make room (not the whole batch or segment they sit in); reject says the limit and the room left."""

from __future__ import annotations

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.errors import QueueFull
from tests.conftest import drain

pytestmark = pytest.mark.integration


def _send(endpoint: str, queue: str, values: list[bytes]) -> None:
    with Producer(endpoint, linger_ms=1000, batch_messages=100_000, batch_bytes=8 << 20) as p:
        futures = [p.send(queue, v, partition=0) for v in values]
        p.flush()
        for f in futures:
            f.result(5)


def test_dead_letter_oldest_moves_only_what_makes_room(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("recent", partitions=1, max_messages=1000, overflow="dead_letter_oldest")
    _send(node.endpoint, "recent", [b"%d" % i for i in range(1000)])  # one batch of 1,000
    _send(node.endpoint, "recent", [b"1000", b"1001"])
    with Admin(node.endpoint) as admin:
        d = admin.describe_queue("recent")
        assert d["messages"] == 1000
        assert admin.list_offsets("recent", 0, "earliest")["offset"] == 2
        assert admin.list_offsets("recent.dlq", 0)["high_watermark"] == 2
    with Consumer("recent.dlq", node.endpoint, start="earliest") as c:
        dead = drain(c, 2, seconds=10)
    assert [m.value for m in dead] == [b"0", b"1"]
    assert {m.headers["x-dlq-reason"] for m in dead} == {b"overflow"}
    with Consumer("recent", node.endpoint, start="earliest") as c:
        kept = drain(c, 1000, seconds=15)
    assert [m.value for m in kept] == [b"%d" % i for i in range(2, 1002)]
    with Consumer("recent", node.endpoint, group="g", kind="queue") as c:  # a shared group starts there too
        got = drain(c, 1000, seconds=15)
    assert sorted(m.offset for m in got) == list(range(2, 1002))


def test_reject_names_the_limit_and_the_room(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("capped", partitions=1, max_messages=1000)
    _send(node.endpoint, "capped", [b"x"] * 998)
    with pytest.raises(QueueFull) as err:
        _send(node.endpoint, "capped", [b"y"] * 5)
    text = err.value.message
    assert "max_messages 1000" in text and "998" in text and "room for 2" in text and "has 5" in text, text
