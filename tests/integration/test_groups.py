"""Consumer groups through real processes: stream groups fail over, queue groups
redeliver, dead-letter and redrive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.protocol.ops import Op
from fabric.transport.connection import Connection
from tests.conftest import drain

pytestmark = pytest.mark.integration

HEARTBEAT_MS = 300
SESSION_MS = 1200

STREAM_MEMBER = (
    textwrap.dedent(
        """
    import json, os, sys, time
    from fabric.client import Consumer
    endpoint, queue, out_path, seconds, stop = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
    out = open(out_path, "w", buffering=1)
    c = Consumer(queue, endpoint, group="g", heartbeat_ms=HEARTBEAT_MS, session_timeout_ms=SESSION_MS, auto_commit_interval_ms=200)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not os.path.exists(stop):
        b = c.poll_batch(100)
        if b is not None:
            out.write(json.dumps([b.partition, b.base_offset, len(b)]) + "\\n")
        out.write(json.dumps({"t": time.time(), "owns": c.assignment()}) + "\\n")
    c.close()
    """
    )
    .replace("HEARTBEAT_MS", str(HEARTBEAT_MS))
    .replace("SESSION_MS", str(SESSION_MS))
)


def _lines(path: Path) -> list:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line cut by kill -9
    return out


def test_stream_group_of_four_survives_a_kill9(node, tmp_path):
    with Admin(node.endpoint) as admin:
        admin.create_queue("events", partitions=8)
    n = 40_000
    procs, paths = [], []
    stop = tmp_path / "stop"  # the members run until it exists (at most 30 s)
    for i in range(4):
        path = tmp_path / f"member{i}.jsonl"
        paths.append(path)
        args = [node.endpoint, "events", str(path), "30", str(stop)]
        procs.append(subprocess.Popen([sys.executable, "-c", STREAM_MEMBER, *args]))
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # wait until the group has settled on 4 members
            with Admin(node.endpoint) as admin:
                info = admin.describe_queue("events")["groups"].get("g", {})
            members = info.get("members", {})
            if len(members) == 4 and all(m["owned"] and not m["revoking"] for m in members.values()):
                break
            time.sleep(0.1)
        assert len(members) == 4, members
        with Producer(node.endpoint, linger_ms=2) as p:
            for i in range(n // 2):
                p.send("events", b"%d" % i, key=b"%d" % (i % 97))
        time.sleep(0.5)
        victim = procs[0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(5)
        killed_at = time.monotonic()
        taken_over = None
        while time.monotonic() - killed_at < 10:
            with Admin(node.endpoint) as admin:
                members = admin.describe_queue("events")["groups"]["g"]["members"]
            owned = [p for m in members.values() for p in m["owned"]]
            if len(members) == 3 and sorted(owned) == list(range(8)):
                taken_over = time.monotonic() - killed_at
                break
            time.sleep(0.05)
        assert taken_over is not None, members
        # within the session timeout plus two heartbeat intervals (and a little scheduling slack)
        assert taken_over < (SESSION_MS + 2 * HEARTBEAT_MS) / 1000 + 1.0, taken_over
        with Producer(node.endpoint, linger_ms=2) as p:
            for i in range(n // 2, n):
                p.send("events", b"%d" % i, key=b"%d" % (i % 97))
        with Admin(node.endpoint) as admin:
            ends = {x["partition"]: x["high_watermark"] for x in admin.describe_queue("events")["partition_detail"]}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _uncovered(paths, ends):
            time.sleep(0.2)
        stop.touch()
        for proc in procs[1:]:
            proc.wait(30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert sum(ends.values()) == n
    missing = _uncovered(paths, ends)
    assert not missing, f"messages never consumed, per partition: {missing}"


def _uncovered(paths: list[Path], ends: dict[int, int]) -> dict[int, int]:
    """Per partition, how many offsets below its end no member has written it received."""
    seen: dict[int, set[int]] = {}
    for path in paths:
        for rec in _lines(path) if path.exists() else []:
            if isinstance(rec, list):
                seen.setdefault(rec[0], set()).update(range(rec[1], rec[1] + rec[2]))
    gaps = {p: end - len(seen.get(p, set()) & set(range(end))) for p, end in ends.items()}
    return {p: k for p, k in gaps.items() if k}


def test_queue_group_dead_letters_with_history_and_redrive(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("jobs", partitions=2, max_receive_count=3, visibility_timeout_ms=60_000)
    with Producer(node.endpoint) as p:
        for i in range(20):
            p.send("jobs", b"job-%d" % i)
    with Consumer("jobs", node.endpoint, group="workers", kind="queue") as c:
        first = drain(c, 20, 10)
        assert len(first) == 20 and all(m.receive_count == 1 for m in first)
        poison = next(m for m in first if m.value == b"job-7")
        c.ack([m for m in first if m is not poison])
        c.flush_acks()
        for attempt in (2, 3):
            c.nack(poison)
            again = drain(c, 1, 10)
            assert [(m.value, m.receive_count) for m in again] == [(b"job-7", attempt)]
        c.nack(poison)  # a 4th delivery would pass max_receive_count: dead-lettered instead
        assert c.poll(1500) == []
        with Admin(node.endpoint) as admin:
            d = admin.describe_queue("jobs")["groups"]["workers"]
            assert d["backlog"] == 0 and d["in_flight"] == 0
        with Consumer("jobs.dlq", node.endpoint, start="earliest") as peek:  # browsing consumes nothing
            dead = drain(peek, 1, 10)
        assert [m.value for m in dead] == [b"job-7"]
        h = dead[0].headers
        assert h["x-dlq-source"] == b"jobs" and h["x-dlq-reason"] == b"max_receive_count"
        assert h["x-dlq-receive-count"] == b"3" and h["x-dlq-offset"] == b"%d" % poison.offset
        conn = Connection(node.endpoint)
        assert conn.request(Op.REDRIVE, {"queue": "jobs.dlq", "dry_run": True}).params["matching"] == 1
        assert conn.request(Op.REDRIVE, {"queue": "jobs.dlq"}).params["redriven"] == 1
        assert conn.request(Op.REDRIVE, {"queue": "jobs.dlq"}).params["redriven"] == 0  # never twice
        conn.close()
        back = drain(c, 1, 10)
        assert [(m.value, m.receive_count, m.headers) for m in back] == [
            (b"job-7", 1, {"x-redriven-from": b"jobs.dlq"})
        ]
        c.ack(back)


QUEUE_MEMBER = textwrap.dedent(
    """
    import sys, time
    from fabric.client import Consumer
    c = Consumer(sys.argv[2], sys.argv[1], group="workers", kind="queue")
    got = 0
    while got < int(sys.argv[3]):
        got += len(c.poll(200))   # takes leases and never acks
    print("HOLDING", flush=True)
    time.sleep(60)
    """
)


def test_queue_leases_of_a_killed_consumer_are_redelivered(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("tasks", visibility_timeout_ms=1000)
    with Producer(node.endpoint) as p:
        for i in range(50):
            p.send("tasks", b"t%d" % i)
    proc = subprocess.Popen(
        [sys.executable, "-c", QUEUE_MEMBER, node.endpoint, "tasks", "50"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "HOLDING"
        with Consumer("tasks", node.endpoint, group="workers", kind="queue") as c:
            assert c.poll(300) == []  # all 50 are leased to the other member
            proc.send_signal(signal.SIGKILL)
            proc.wait(5)
            t0 = time.monotonic()
            got = drain(c, 50, 10)
            assert len(got) == 50 and time.monotonic() - t0 < 3.5
            # 2, or 3 when the node pushed them once more to the dead member before it saw the
            # connection close (a push into a dead TCP connection counts as a delivery)
            assert {m.receive_count for m in got} <= {2, 3}
            c.ack(got)
            c.flush_acks()
        with Admin(node.endpoint) as admin:
            assert admin.describe_queue("tasks")["groups"]["workers"]["backlog"] == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_describe_reports_lag_in_seconds_and_oldest_unsettled_age(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("aging")
        with Producer(node.endpoint) as p:
            for i in range(10):
                p.send("aging", b"m%d" % i)
        with Consumer("aging", node.endpoint, group="slow", auto_commit=False) as c:
            drain(c, 10, 10)
            c.commit({0: 3})
        with Consumer("aging", node.endpoint, group="jobs", kind="queue") as q:
            got = drain(q, 10, 10)
            q.ack(got[:4])
            q.flush_acks()
            time.sleep(1.0)
            groups = admin.describe_queue("aging")["groups"]
            assert groups["slow"]["total_lag"] == 7 and groups["slow"]["lag_seconds"] >= 1.0
            assert groups["jobs"]["total_lag"] == 6 and groups["jobs"]["oldest_unsettled_age_seconds"] >= 1.0
            q.ack(got[4:])
            q.flush_acks()
        with Consumer("aging", node.endpoint, group="slow") as c:
            drain(c, 7, 10)
            c.commit()
        groups = admin.describe_queue("aging")["groups"]
        assert groups["slow"]["lag_seconds"] == 0 and groups["jobs"]["lag_seconds"] == 0


def test_deliveries_a_closing_consumer_never_handed_out_do_not_count(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("chores", max_receive_count=2, visibility_timeout_ms=60_000)
    with Producer(node.endpoint, linger_ms=0) as p:
        for i in range(10):
            p.send("chores", b"c%d" % i).result(10)  # one batch each
    seen = []
    for _ in range(3):
        with Consumer("chores", node.endpoint, group="w", kind="queue", credit_messages=100) as c:
            b = c.poll_batch(10_000)  # one batch: one message handed out (poll() takes all received)
            assert b is not None
            got = b.messages()
            time.sleep(0.3)  # the rest of the pushes arrive and wait, unseen, in the consumer
            seen.append((got[0].value, got[0].receive_count))
    # c0 was handed out twice (counted), then dead-lettered; the others were only buffered
    assert seen == [(b"c0", 1), (b"c0", 2), (b"c1", 1)]
    with Admin(node.endpoint) as admin:
        assert admin.describe_queue("chores")["dead_letters"]["reasons"] == {"max_receive_count": 1}


def test_delete_group_removes_stream_and_queue_groups_and_refuses_live_ones(node):
    """Admin.delete_group removes a group of either kind from `group list` (the redrive group
    included); while the group has a member, or for a group that is not there, it raises."""
    from fabric.errors import BadParameter

    from .test_cli import fabric

    def listed(queue: str) -> list[str]:
        r = fabric("group", "list", queue, "--json", "-e", node.endpoint)
        assert r.returncode == 0, r.stderr
        return sorted(row["group"] for row in json.loads(r.stdout))

    with Admin(node.endpoint) as admin, Producer(node.endpoint) as producer:
        admin.create_queue("dg", partitions=1)
        producer.send("dg", b"m")
        producer.flush()
        with (
            Consumer("dg", node.endpoint, group="readers") as stream,
            Consumer("dg", node.endpoint, group="workers", kind="queue") as shared,
        ):
            assert drain(stream, 1) and drain(shared, 1)
            stream.commit()
            with pytest.raises(BadParameter, match="live member"):
                admin.delete_group("dg", "workers")
        assert listed("dg") == ["readers", "workers"]
        admin.delete_group("dg", "readers")
        admin.delete_group("dg", "workers")
        assert listed("dg") == [] and admin.groups("dg") == {}
        with pytest.raises(BadParameter, match="no group"):
            admin.delete_group("dg", "readers")
