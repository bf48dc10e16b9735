"""Issue 33's gaps next to the tools users know (kafka-*, nats, aws sqs), driven from the shell
against a real node: group delete, recv --follow, queue alter --set, queue purge, settling by
receipt handle."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.testing import Node

from ..conftest import drain
from .test_cli import fabric

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gaps_node(tmp_path_factory) -> Iterator[Node]:
    """One node for the module; every test uses queue names of its own."""
    n = Node(str(tmp_path_factory.mktemp("gaps") / "data"))
    try:
        yield n
    finally:
        n.stop()


def _send(endpoint: str, queue: str, values: list[bytes]) -> None:
    with Producer(endpoint) as p:
        for v in values:
            p.send(queue, v)
        p.flush()


def test_group_delete_removes_an_idle_group_and_refuses_a_live_one(gaps_node):
    e = ["-e", gaps_node.endpoint]
    _send(gaps_node.endpoint, "gd", [b"a", b"b"])
    assert fabric("recv", "gd", "--group", "billing", "--count", "2", *e).returncode == 0
    with Consumer("gd", gaps_node.endpoint, group="live", kind="queue") as member:
        assert drain(member, 1, 15)
        r = fabric("group", "delete", "gd", "live", "--yes", *e)
        assert r.returncode == 1 and "live member" in r.stderr, r.stderr
    r = fabric("group", "delete", "gd", "billing", *e)  # no terminal, no --yes: refused, nothing deleted
    assert r.returncode == 2 and "--yes" in r.stderr
    r = fabric("group", "delete", "gd", "billing", "--yes", "--json", *e)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"queue": "gd", "group": "billing", "deleted": True}
    groups = json.loads(fabric("group", "list", "gd", "--json", *e).stdout)
    assert [g["group"] for g in groups] == ["live"]
    r = fabric("group", "delete", "gd", "billing", "--yes", *e)
    assert r.returncode == 1 and "no group" in r.stderr


def test_recv_follow_prints_until_ctrl_c_commits_and_exits_130(gaps_node):
    e = ["-e", gaps_node.endpoint]
    _send(gaps_node.endpoint, "follow", [b"one", b"two"])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabric.cli",
            "recv",
            "follow",
            "--group",
            "tailers",
            "--follow",
            "--timeout-ms",
            "200",
            *e,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)  # past --timeout-ms many times over: --follow does not stop when idle
        assert proc.poll() is None
        _send(gaps_node.endpoint, "follow", [b"three"])
        deadline = time.monotonic() + 15
        with Admin(gaps_node.endpoint) as admin:
            while time.monotonic() < deadline and admin.committed("follow", "tailers").get(0) != 3:
                time.sleep(0.1)
            assert admin.committed("follow", "tailers") == {0: 3}  # committed as it went
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 130, err
    assert out.splitlines() == ["one", "two", "three"]
    assert "3 message(s) printed and committed" in err


def test_recv_follow_needs_a_group(gaps_node):
    r = fabric("recv", "follow-x", "--follow", "-e", gaps_node.endpoint)
    assert r.returncode == 2 and "--group" in r.stderr and "tail -f" in r.stderr


def test_queue_alter_set_changes_live_settings_at_once_and_keeps_them(tmp_path):
    n = Node(str(tmp_path / "data"))
    try:
        e = ["-e", n.endpoint]
        assert fabric("queue", "create", "alt", *e).returncode == 0
        _send(n.endpoint, "alt", [b"1", b"2"])
        r = fabric("queue", "alter", "alt", "--set", "max_messages=2", "--set", "retention_ms=60000", "--json", *e)
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["changed"] == {"max_messages": [0, 2], "retention_ms": [7 * 24 * 3600 * 1000, 60000]}
        r = fabric("send", "alt", "3", *e)  # the queue is full now: the limit applies to the next produce
        assert r.returncode == 1 and "QUEUE_FULL" in r.stderr, r.stderr
        r = fabric("queue", "alter", "alt", "--set", "max_messages=0", *e)
        assert r.returncode == 0 and "max_messages 2 -> 0" in r.stdout, r.stderr
        assert fabric("send", "alt", "3", *e).returncode == 0
        n.stop()
        n = Node(str(tmp_path / "data"))  # the change is in the queue's record: it survives a restart
        settings = json.loads(fabric("queue", "describe", "alt", "--json", "-e", n.endpoint).stdout)["settings"]
        assert settings["retention_ms"] == 60000 and settings["max_messages"] == 0
    finally:
        n.stop()


def test_queue_alter_refuses_what_cannot_change_live_and_says_why(gaps_node):
    e = ["-e", gaps_node.endpoint]
    assert fabric("queue", "create", "fixed", "--priority-levels", "2", *e).returncode == 0
    for item, reason in [
        ("priority_levels=3", "level * partitions"),
        ("encrypt=true", "chosen at create"),
        ("partitions=4", "--partitions"),
        ("mode=direct", "create a new queue"),
    ]:
        r = fabric("queue", "alter", "fixed", "--set", item, *e)
        assert r.returncode == 1 and "BAD_PARAMETER" in r.stderr and reason in r.stderr, (item, r.stderr)
    r = fabric("queue", "alter", "fixed", "--set", "retention_ms=-1", *e)
    assert r.returncode == 1 and "'retention_ms' must be >= 0" in r.stderr
    r = fabric("queue", "alter", "fixed", "--set", "no_such_key=1", *e)
    assert r.returncode == 1 and "unknown key 'no_such_key'" in r.stderr
    r = fabric("queue", "alter", "fixed", "--set", "oops", *e)
    assert r.returncode == 2 and "KEY=VALUE" in r.stderr
    r = fabric("queue", "alter", "fixed", *e)
    assert r.returncode == 2 and "--set" in r.stderr
    settings = json.loads(fabric("queue", "describe", "fixed", "--json", *e).stdout)["settings"]
    assert settings["priority_levels"] == 2 and settings["encrypt"] is False and settings["retention_ms"] > 0


def test_queue_purge_removes_every_message_and_keeps_queue_settings_and_groups(gaps_node):
    e = ["-e", gaps_node.endpoint]
    assert fabric("queue", "create", "pq", "--partitions", "2", "--max-receive-count", "5", *e).returncode == 0
    _send(gaps_node.endpoint, "pq", [b"old%d" % i for i in range(10)])
    assert fabric("recv", "pq", "--group", "readers", "--count", "3", *e).returncode == 0
    with Consumer("pq", gaps_node.endpoint, group="workers", kind="queue") as w:
        assert drain(w, 1, 15)  # a queue group with messages leased and a backlog
    r = fabric("queue", "purge", "pq", *e)  # no terminal, no --yes: refused, nothing removed
    assert r.returncode == 2 and "--yes" in r.stderr
    with Admin(gaps_node.endpoint) as admin:
        assert admin.describe_queue("pq")["messages"] == 10
    r = fabric("queue", "purge", "pq", "--yes", "--json", *e)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["queue"] == "pq" and d["purged"] == 10 and len(d["partitions"]) == 2
    with Admin(gaps_node.endpoint) as admin:
        q = admin.describe_queue("pq")
        assert q["messages"] == 0 and q["settings"]["max_receive_count"] == 5 and q["partitions"] == 2
        assert q["groups"]["readers"]["total_lag"] == 0
        assert q["groups"]["workers"]["backlog"] == 0 and q["groups"]["workers"]["in_flight"] == 0
    _send(gaps_node.endpoint, "pq", [b"new1", b"new2"])
    r = fabric("recv", "pq", "--group", "readers", "--timeout-ms", "1500", *e)
    assert r.returncode == 0 and sorted(r.stdout.split()) == ["new1", "new2"], r.stderr
    r = fabric("recv", "pq", "--group", "workers", "--kind", "queue", "--timeout-ms", "1500", *e)
    assert r.returncode == 0 and sorted(r.stdout.split()) == ["new1", "new2"], r.stderr
    r = fabric("queue", "purge", "nope-pq", "--yes", *e)
    assert r.returncode == 1 and "UNKNOWN_QUEUE" in r.stderr


def test_settle_from_the_shell_by_receipt_handle(gaps_node):
    e = ["-e", gaps_node.endpoint]
    assert fabric("queue", "create", "sqs", "--visibility-timeout", "60s", *e).returncode == 0
    _send(gaps_node.endpoint, "sqs", [b"a", b"b", b"c", b"d"])
    r = fabric("recv", "sqs", "--group", "w", "--kind", "queue", "--no-ack", "-n", "4", *e)
    assert r.returncode == 0, r.stderr
    lines = [line.split("\t") for line in r.stdout.splitlines()]
    handles = {value: handle for handle, value in lines}
    assert sorted(handles) == ["a", "b", "c", "d"] and "fabric ack sqs w" in r.stderr
    with Admin(gaps_node.endpoint) as admin:  # the receiver left; what it printed stays leased
        assert admin.describe_group("sqs", "w")["in_flight"] == 4
    r = fabric("ack", "sqs", "w", handles["a"], handles["b"], "--json", *e)
    assert r.returncode == 0 and json.loads(r.stdout)["acked"] == 2, r.stderr
    r = fabric("ack", "sqs", "w", handles["a"], *e)  # acks are idempotent
    assert r.returncode == 0 and "acked 0" in r.stdout, r.stderr
    r = fabric("change-visibility", "sqs", "w", handles["c"], "--visibility-timeout", "0", *e)
    assert r.returncode == 0, r.stderr  # c is delivered again at once
    r = fabric("nack", "sqs", "w", "--json", *e, stdin=f"{handles['d']}\td\n")  # a handle from stdin
    assert r.returncode == 0 and json.loads(r.stdout)["nacked"] == 1, r.stderr
    r = fabric("recv", "sqs", "--group", "w", "--kind", "queue", "--no-ack", "-n", "2", "--json", *e)
    again = [json.loads(x) for x in r.stdout.splitlines()]
    assert sorted(x["value"] for x in again) == ["c", "d"], r.stderr
    r = fabric("ack", "sqs", "w", *[x["receipt_handle"] for x in again], *e)
    assert r.returncode == 0 and "acked 2" in r.stdout, r.stderr
    with Admin(gaps_node.endpoint) as admin:
        g = admin.describe_group("sqs", "w")
        assert g["in_flight"] == 0 and g["backlog"] == 0
    r = fabric("ack", "sqs", "w", handles["c"], *e)  # settled already: nothing to do, no error
    assert r.returncode == 0
    for bad, where in [("nope", "not a receipt handle"), ("1.2", "not a receipt handle")]:
        r = fabric("ack", "sqs", "w", bad, *e)
        assert r.returncode == 1 and where in r.stderr, r.stderr
    r = fabric("recv", "sqs", "--group", "s", "--no-ack", *e)
    assert r.returncode == 2 and "--kind queue" in r.stderr


def test_a_receipt_handle_whose_lease_ended_is_refused(gaps_node):
    e = ["-e", gaps_node.endpoint]
    assert fabric("queue", "create", "sqs-short", "--visibility-timeout", "500ms", *e).returncode == 0
    _send(gaps_node.endpoint, "sqs-short", [b"x"])
    r = fabric("recv", "sqs-short", "--group", "w", "--kind", "queue", "--no-ack", "-n", "1", *e)
    handle = r.stdout.split("\t")[0]
    with Consumer("sqs-short", gaps_node.endpoint, group="w", kind="queue") as other:
        assert [m.value for m in drain(other, 1, 15)] == [b"x"]  # redelivered once the lease ended
        r = fabric("ack", "sqs-short", "w", handle, *e)
        assert r.returncode == 1 and "NOT_LEASE_HOLDER" in r.stderr, r.stderr


def test_group_list_and_lag_across_all_queues(tmp_path):
    n = Node(str(tmp_path / "data"))
    try:
        e = ["-e", n.endpoint]
        _send(n.endpoint, "lag-a", [b"1", b"2", b"3"])
        _send(n.endpoint, "lag-b", [b"1", b"2"])
        assert fabric("recv", "lag-a", "--group", "ga", "--count", "1", *e).returncode == 0
        assert fabric("recv", "lag-b", "--group", "gb", "--kind", "queue", "--count", "2", *e).returncode == 0
        r = fabric("group", "list", "--all-queues", "--json", *e)
        assert r.returncode == 0, r.stderr
        rows = {(x["queue"], x["group"]): x for x in json.loads(r.stdout)}
        assert set(rows) == {("lag-a", "ga"), ("lag-b", "gb")}
        assert rows[("lag-a", "ga")]["lag"] == 2 and rows[("lag-b", "gb")]["backlog"] == 0
        r = fabric("group", "list", "--all-queues", *e)
        assert r.returncode == 0 and r.stdout.splitlines()[0].split()[:2] == ["QUEUE", "GROUP"]
        r = fabric("lag", "--all-queues", "--json", *e)
        assert r.returncode == 0, r.stderr
        lags = [
            (x["queue"], x["group"], x["partition"], x["committed"], x["high_watermark"], x["lag"])
            for x in json.loads(r.stdout)
        ]
        assert lags == [("lag-a", "ga", 0, 1, 3, 2), ("lag-b", "gb", 0, 2, 2, 0)]
        r = fabric("lag", "lag-a", "--json", *e)
        assert [x["group"] for x in json.loads(r.stdout)] == ["ga"]
        assert (
            fabric("lag", *e).returncode == 2 and fabric("group", "list", "lag-a", "--all-queues", *e).returncode == 2
        )
        r = fabric("lag", "nope", *e)
        assert r.returncode == 1 and "UNKNOWN_QUEUE" in r.stderr
    finally:
        n.stop()
