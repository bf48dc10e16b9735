"""What an operator sees in the node's log (issue 15 #11): queue create and delete, auto-creation,
dead letters (counted, rate-limited), member expiry."""

from __future__ import annotations

import logging

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.node.notices import Notices
from tests.conftest import drain

pytestmark = pytest.mark.integration


def test_the_node_logs_what_an_operator_needs(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("jobs", partitions=1, max_receive_count=1, visibility_timeout_ms=200)
    with Producer(node.endpoint) as p:
        for i in range(5):
            p.send("jobs", b"%d" % i)
        p.send("fresh", b"first")
    with Consumer("jobs", node.endpoint, group="w", kind="queue") as c:
        assert len(drain(c, 5, seconds=10)) == 5  # leased once, never acked: dead after the lease
        drain(c, 100, seconds=1.5)
    with Admin(node.endpoint) as admin:
        admin.delete_queue("fresh")
    text = node.log_text()
    assert "queue 'jobs' created" in text
    assert "queue 'fresh' created on first send" in text
    assert "queue 'fresh' deleted" in text
    assert "dead-lettered 5 message(s) of 'jobs' to 'jobs.dlq' (reason max_receive_count" in text, text[-2000:]


def test_notices_fold_bursts_into_one_line_per_interval(caplog):
    n = Notices(logging.getLogger("t"), interval_ms=1000)
    with caplog.at_level(logging.INFO, logger="t"):
        n.note(0, ("dl", "q"), 3, "moved {n}")
        for t in range(1, 10):
            n.note(t * 10, ("dl", "q"), 1, "moved {n}")
        n.note(1500, ("dl", "q"), 1, "moved {n}")
        n.note(1600, ("other",), 2, "other {n}")
    assert [r.getMessage() for r in caplog.records] == ["moved 3", "moved 10", "other 2"]
