"""The first hour's traps (issue 15 #5, #7, #8, #11), as a user meets them from the shell."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fabric.client import Admin, Producer
from tests.integration.test_cli import fabric

pytestmark = pytest.mark.integration


def _fill(endpoint: str, queue: str, n: int, partitions: int = 1) -> None:
    with Admin(endpoint) as admin:
        admin.create_queue(queue, partitions=partitions)
    with Producer(endpoint, linger_ms=50) as p:  # a few large batches
        for i in range(n):
            p.send(queue, b"%d" % i, partition=i % partitions)


def test_recv_in_a_group_commits_exactly_what_it_printed(node):
    e = ["-e", node.endpoint]
    _fill(node.endpoint, "orders", 1000)
    first = fabric("recv", "orders", "-g", "billing", "--count", "10", "--json", *e)
    second = fabric("recv", "orders", "-g", "billing", "--count", "10", "--json", *e)
    assert [json.loads(x)["offset"] for x in first.stdout.splitlines()] == list(range(10))
    assert [json.loads(x)["offset"] for x in second.stdout.splitlines()] == list(range(10, 20))
    with Admin(node.endpoint) as admin:
        assert admin.committed("orders", "billing") == {0: 20}


def test_recv_in_a_group_leaves_no_gap_over_partitions(node):
    e = ["-e", node.endpoint]
    _fill(node.endpoint, "multi", 300, partitions=3)
    seen: list[tuple[int, int]] = []
    for _ in range(12):
        r = fabric("recv", "multi", "-g", "g", "-n", "25", "--timeout-ms", "1500", "--json", *e)
        seen += [(x["partition"], x["offset"]) for x in map(json.loads, r.stdout.splitlines())]
    assert sorted(seen) == sorted({(i % 3, i // 3) for i in range(300)})  # none skipped, none twice


def test_destructive_commands_refuse_without_a_terminal_or_yes(node):
    e = ["-e", node.endpoint]
    _fill(node.endpoint, "q", 3)
    r = fabric("queue", "delete", "q", *e, stdin="n\n")
    assert r.returncode == 2 and "--yes" in r.stderr
    assert fabric("recv", "q", "--from", "earliest", "-n", "3", *e).stdout.split() == ["0", "1", "2"]
    fabric("recv", "q", "-g", "g", "-n", "3", *e)
    r = fabric("group", "reset-offsets", "q", "g", "--to", "earliest", "--execute", *e, stdin="")
    assert r.returncode == 2 and "--yes" in r.stderr
    with Admin(node.endpoint) as admin:
        assert admin.committed("q", "g") == {0: 3}
    r = fabric("dlq", "redrive", "q.dlq", *e, stdin="y\n")
    assert r.returncode == 2 and "--yes" in r.stderr
    assert fabric("queue", "delete", "q", "--yes", *e).returncode == 0


def test_recv_timeout_is_an_idle_timeout(node):
    """8 messages 0.5 s apart and --timeout-ms 1500: all 8 arrive (it used to stop after ~4)."""
    with Admin(node.endpoint) as admin:
        admin.create_queue("slow", partitions=1)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabric.cli",
            "recv",
            "slow",
            "--from",
            "latest",
            "--timeout-ms",
            "1500",
            "-e",
            node.endpoint,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20  # subscribed (from latest) before the first send, however slow its start
    with Admin(node.endpoint) as admin:
        while not admin.describe_queue("slow")["subscriptions"] and time.monotonic() < deadline:
            time.sleep(0.05)
    with Producer(node.endpoint, linger_ms=0) as p:
        for i in range(8):
            p.send("slow", b"%d" % i).result(5)
            time.sleep(0.5)
    out, _ = proc.communicate(timeout=30)
    assert out.split() == [str(i) for i in range(8)]


def test_recv_max_wait_bounds_the_total(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("quiet", partitions=1)
    t0 = time.monotonic()
    r = fabric("recv", "quiet", "--timeout-ms", "60000", "--max-wait", "1s", "-e", node.endpoint)
    assert r.returncode == 0 and time.monotonic() - t0 < 15


def test_usage_errors_are_clear(node):
    e = ["-e", node.endpoint]
    for bad in ("localhost:7420", "tcp://", "foo://x", "tcp://127.0.0.1:notaport"):
        r = fabric("queue", "list", "-e", bad)
        assert r.returncode == 2 and "tcp://HOST:PORT" in r.stderr and "INTERNAL" not in r.stderr, (bad, r.stderr)
    assert fabric("recv", "q", "--count", "-1", *e).returncode == 2
    assert fabric("tail", "q", "-n", "-5", *e).returncode == 2
    assert fabric("queue", "create", "z", "--partitions", "0", *e).returncode == 2
    r = fabric("dlq", "redrive", "q.dlq", "--reason", "bogus", "--dry-run", *e)
    assert r.returncode == 2 and "max_receive_count" in r.stderr


def test_dlq_peek_returns_once_it_has_shown_what_is_there(node):
    e = ["-e", node.endpoint]
    _fill(node.endpoint, "few", 2)
    with Admin(node.endpoint) as admin:
        admin.create_queue("empty.dlq", partitions=1)
    with Producer(node.endpoint) as p:
        p.send("empty.dlq", b"dead").result(5)
    t0 = time.monotonic()
    r = fabric("dlq", "peek", "empty.dlq", *e)
    took = time.monotonic() - t0
    assert r.returncode == 0 and "dead" in r.stdout
    base = time.monotonic()
    fabric("ping", *e)
    startup = time.monotonic() - base  # what any CLI call costs on this machine now
    assert took < startup + 1.5, f"peek took {took:.2f} s (a bare command {startup:.2f} s)"


def test_ctrl_c_during_a_stdin_send_says_what_was_sent(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("pipe", partitions=1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabric.cli", "send", "pipe", "-e", node.endpoint],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    for i in range(100):
        proc.stdin.write(f"{i}\n")
    proc.stdin.flush()
    time.sleep(2.0)  # sent and acknowledged; stdin stays open
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "100 line(s) sent, 100 acknowledged" in err, err


def test_send_reads_a_key_per_line_with_a_key_separator(node):
    """`fabric send -K SEP`: each stdin line (or argument) is KEY SEP VALUE. A line without the
    separator ends the send with a clear error naming it; the lines before it are sent and
    acknowledged, none after it; arguments are all checked before anything is sent."""
    e = ["-e", node.endpoint]
    with Admin(node.endpoint) as admin:
        admin.create_queue("keyed", partitions=4)
    r = fabric("send", "keyed", "-K", "\t", *e, stdin="a\tone\nb\ttwo\na\tthree=3\tx\n")
    assert r.returncode == 0, r.stderr
    r = fabric("send", "keyed", "-K", "\t", "--json", *e, stdin="c\tfour\nno separator\nc\tfive\n")
    assert r.returncode == 2 and "line 2 has no key separator" in r.stderr
    assert json.loads(r.stdout)["sent"] == 1
    r = fabric("send", "keyed", "-K", ":", "d:six", "seven", *e)
    assert r.returncode == 2 and "message 2 ('seven') has no ':': nothing was sent" in r.stderr
    assert fabric("send", "keyed", "-K", ":", "-k", "x", "d:six", *e).returncode == 2
    r = fabric("recv", "keyed", "--from", "earliest", "--json", "--timeout-ms", "500", *e)
    got = sorted((json.loads(x)["key"], json.loads(x)["value"]) for x in r.stdout.splitlines())
    assert got == [("a", "one"), ("a", "three=3\tx"), ("b", "two"), ("c", "four")]
    with Admin(node.endpoint) as admin:
        assert admin.describe_queue("keyed")["messages"] == 4
    # and back: recv -K prints KEY SEP VALUE, which send -K reads
    r = fabric("recv", "keyed", "--from", "earliest", "-K", "\t", "--timeout-ms", "500", *e)
    assert sorted(r.stdout.splitlines()) == ["a\tone", "a\tthree=3\tx", "b\ttwo", "c\tfour"]
