"""Issue 33's CLI defects, as a new user met them from the shell: what commands leave in the
checkout, errors, Ctrl-C, a piped send that fails partway, unreachable endpoints, --json."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.client import Admin, Producer
from fabric.testing import Node

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory) -> Iterator[Node]:
    """One node for the whole module (every test uses its own queue names); it writes usage
    records to its internal queue __usage every 200 ms."""
    where = tmp_path_factory.mktemp("first-hour")
    (where / "node.toml").write_text("[node]\nusage_interval_ms = 200\n")
    n = Node(str(where / "data"), extra=["--config", str(where / "node.toml")])
    try:
        yield n
    finally:
        n.stop()


def test_what_commands_leave_in_the_checkout_is_ignored():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    dirs = ["fabric-cluster/", "keys/", "usage-report/", "orders-checkpoints/", "fabric-data/"]
    r = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", *dirs], capture_output=True, text=True)
    assert sorted(r.stdout.split()) == sorted(dirs), r.stdout


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fabric.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_ctrl_c_ends_long_running_commands_with_130_and_a_summary(shared_node):
    e = ["-e", shared_node.endpoint]
    with Producer(shared_node.endpoint) as p:
        for v in (b"a", b"b", b"c"):
            p.send("ctrlc", v)
    procs = {
        "recv --group": _start("recv", "ctrlc", "--group", "g", "--timeout-ms", "600000", *e),
        "tail -f": _start("tail", "ctrlc", "-f", *e),
    }
    for name, proc in procs.items():
        assert proc.stdout is not None
        assert [proc.stdout.readline() for _ in range(3)] == ["a\n", "b\n", "c\n"], name
        os.kill(proc.pid, signal.SIGINT)
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and "Aborted" not in err, (name, err)
        assert "interrupted: 3 message(s) printed" in err, (name, err)
    with Admin(shared_node.endpoint) as admin:
        lag = admin.describe_queue("ctrlc")["groups"]["g"]["total_lag"]
    assert lag == 0  # what recv printed before Ctrl-C is committed


def test_up_says_error_as_every_command_does():
    r = _run("up", "--stream-listen", "nonsense")
    assert r.returncode == 2 and "error: --stream-listen must look like" in r.stderr and "Error:" not in r.stderr
    r = _run("queue", "create", "x", "--partitions", "0")
    assert r.returncode == 2 and "error: Invalid value" in r.stderr and "Error:" not in r.stderr, r.stderr


def _run(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric.cli", *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )


def test_group_describe_prints_a_table_and_queue_list_hides_internal_queues(shared_node):
    e = ["-e", shared_node.endpoint]
    assert _run("send", "described", "x", "y", *e).returncode == 0
    assert _run("recv", "described", "-g", "g", "-n", "2", *e).returncode == 0
    r = _run("group", "describe", "described", "g", *e)
    assert r.returncode == 0 and r.stdout.startswith("group g on described: stream"), r.stdout
    assert "PARTITION" in r.stdout and "COMMITTED" in r.stdout and "{" not in r.stdout, r.stdout
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the usage records of that traffic make __usage
        every = json.loads(_run("queue", "list", "--all", "--json", *e).stdout)
        if any(q["name"] == "__usage" for q in every):
            break
        time.sleep(0.2)
    assert any(q["name"] == "__usage" for q in every), every
    shown = json.loads(_run("queue", "list", "--json", *e).stdout)
    assert "described" in {q["name"] for q in shown} and not any(q["name"].startswith("__") for q in shown)
    assert "__usage" not in _run("queue", "list", *e).stdout


def test_a_piped_send_that_fails_partway_says_what_it_stored(shared_node):
    e = ["-e", shared_node.endpoint]
    with Admin(shared_node.endpoint) as admin:
        admin.create_queue("mix", partitions=1, max_message_bytes=1024)
    lines = "before\n" + "x" * 2000 + "\nafter\n"
    r = _run("send", "mix", *e, stdin=lines)
    assert r.returncode == 1 and "MESSAGE_TOO_LARGE" in r.stderr, r.stderr
    assert "line 2" in r.stderr and "1 line(s) sent, 1 acknowledged, 1 failed" in r.stderr, r.stderr
    r = _run("send", "mix", "--skip-too-large", "--json", *e, stdin=lines)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["sent"] == 2 and summary["skipped_too_large"] == [2]
    r = _run("recv", "mix", "--from", "earliest", "--timeout-ms", "500", *e)
    assert r.stdout.split() == ["before", "before", "after"]


def test_an_unreachable_endpoint_is_reported_fast():
    with socket.socket() as closed:  # a port nothing listens on: the connection is refused
        closed.bind(("127.0.0.1", 0))
        refused = f"tcp://127.0.0.1:{closed.getsockname()[1]}"
    base = time.monotonic()
    _run("--version")
    startup = time.monotonic() - base  # what any CLI call costs on this machine now
    for args in (["ping"], ["queue", "list"], ["send", "q", "x"], ["recv", "q"]):
        t0 = time.monotonic()
        r = _run(*args, "-e", refused)
        took = time.monotonic() - t0 - startup
        assert r.returncode == 1 and "CONNECTION_FAILED" in r.stderr and refused in r.stderr, (args, r.stderr)
        assert took < 2.0, f"{args}: {took:.2f} s beyond startup (3 to 10 s before; a loaded machine needs room)"
    with socket.socket() as silent:  # listens, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        unanswered = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.monotonic()
        r = _run("queue", "list", "--timeout", "1s", "-e", unanswered)
        took = time.monotonic() - t0 - startup
    assert r.returncode == 1 and "CONNECTION_FAILED" in r.stderr and unanswered in r.stderr, r.stderr
    assert took < 3.0, f"{took:.2f} s beyond startup with --timeout 1s (10 s before)"


ONE_DOCUMENT = [
    ["ping"],
    ["queue", "create", "js", "--partitions", "2", "--max-receive-count", "1"],
    ["queue", "create", "js.dlq"],
    ["send", "js", "a", "b", "c"],
    ["send", "js.dlq", "dead"],
    ["queue", "list"],
    ["queue", "describe", "js"],
    ["queue", "alter", "js", "--partitions", "3"],
    ["group", "list", "js"],
    ["group", "describe", "js", "g"],
    ["group", "reset-offsets", "js", "g", "--to", "earliest"],
    ["dlq", "list"],
    ["dlq", "redrive", "js.dlq", "--dry-run"],
    ["cluster", "status"],
    ["quota", "set", "queue:js", "--messages-per-s", "100000"],
    ["quota", "list"],
    ["spark", "queries"],
    ["spark", "forget", "enrich", "--yes"],
    ["queue", "delete", "js.dlq", "--yes"],
    ["bench", "--messages", "2000", "--size", "16"],
]
# acl needs a node with authentication on (tests/integration/test_auth.py); `usage report`: below
JSON_LINES = [  # the commands that print messages as they come
    ["recv", "js", "-g", "g", "-n", "3"],
    ["recv", "js", "--from", "earliest", "-n", "3"],
    ["tail", "js", "-n", "2"],
    ["dlq", "peek", "js.dlq"],
]


def test_every_client_commands_json_is_one_document_or_json_lines(shared_node):
    from fabric.spark.queries import hold_retention  # no Spark needed: the hold is a group

    e = ["-e", shared_node.endpoint]
    for args in ONE_DOCUMENT[:5]:
        r = _run(*args, "--json", *e)
        assert r.returncode == 0, (args, r.stderr)
        json.loads(r.stdout)
    for args in JSON_LINES:  # recv -g makes the group the next commands show
        r = _run(*args, "--json", *e)
        assert r.returncode == 0, (args, r.stderr)
        assert [json.loads(line) for line in r.stdout.splitlines()], args
    with Admin(shared_node.endpoint) as admin:
        hold_retention(admin, "js", "enrich", {"0": 1})
    for args in ONE_DOCUMENT[5:]:
        r = _run(*args, "--json", *e)
        assert r.returncode == 0, (args, r.stderr)
        try:
            json.loads(r.stdout)
        except ValueError:
            pytest.fail(f"{args}: not one JSON document: {r.stdout[:300]!r}")


@pytest.mark.spark
@pytest.mark.slow  # a Spark job of its own: ~45 s
def test_usage_report_json_is_one_document(shared_node, tmp_path):
    pytest.importorskip("pyspark")
    with Producer(shared_node.endpoint) as p:  # traffic, so that there is a __usage to report on
        p.send("reported", b"x").result(10)
    with Admin(shared_node.endpoint) as admin:
        deadline = time.monotonic() + 10
        while "__usage" not in {q["name"] for q in admin.list_queues()} and time.monotonic() < deadline:
            time.sleep(0.2)
    r = _run("usage", "report", "--out", str(tmp_path / "usage"), "--json", "-e", shared_node.endpoint, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"] >= 0
