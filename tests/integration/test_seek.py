"""A stream consumer seeks to earliest, an offset, a timestamp and latest, and replays from there."""

from __future__ import annotations

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.errors import BadParameter

from ..conftest import drain

pytestmark = pytest.mark.integration


def test_seek_and_replay(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("history")
    with Producer(node.endpoint, linger_ms=0) as p:
        for i in range(100):
            p.send("history", b"%d" % i, timestamp_ms=1_000_000 + i * 1000).result(10)
    with Consumer("history", node.endpoint, start="latest") as c:
        assert c.poll(300) == []
        assert c.seek(0, "earliest") == 0
        assert [int(m.value) for m in drain(c, 100, 10)] == list(range(100))
        assert c.seek(0, 60) == 60
        assert [int(m.value) for m in drain(c, 40, 10)] == list(range(60, 100))
        assert c.seek(0, "timestamp", timestamp_ms=1_000_000 + 90_500) == 91
        assert [m.offset for m in drain(c, 9, 10)] == list(range(91, 100))
        assert c.seek(0, "latest") == 100
        assert c.poll(300) == []
        with Producer(node.endpoint) as p:
            p.send("history", b"new").result(10)
        assert [m.value for m in drain(c, 1, 10)] == [b"new"]
        with pytest.raises(BadParameter):
            c.seek(3, 0)
    with Consumer("history", node.endpoint, group="g", kind="queue") as q, pytest.raises(BadParameter):
        q.seek(0, 0)
