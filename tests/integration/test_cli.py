"""The documented CLI, driven as a user would: real `fabric` processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ..conftest import JsonNode

pytestmark = pytest.mark.integration


def fabric(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric.cli", *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )


def test_queue_lifecycle_send_recv(node):
    e = ["-e", node.endpoint]
    r = fabric("queue", "create", "orders", "--partitions", "2", "--retention-ms", "3600000", *e)
    assert r.returncode == 0, r.stderr
    assert "orders" in r.stdout
    r = fabric("queue", "create", "orders", *e)
    assert r.returncode == 1 and "QUEUE_EXISTS" in r.stderr
    assert fabric("queue", "create", "orders", "--if-not-exists", *e).returncode == 0
    r = fabric("send", "orders", "one", "two", "three", "--key", "k", *e)
    assert r.returncode == 0 and "sent 3 message(s)" in r.stdout, r.stderr
    r = fabric("send", "orders", "--json", *e, stdin="a\nb\nc\nd\n")
    assert json.loads(r.stdout)["sent"] == 4
    r = fabric("recv", "orders", "--from", "earliest", "--count", "7", "--json", *e)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert sorted(x["value"] for x in lines) == sorted(["one", "two", "three", "a", "b", "c", "d"])
    keyed = [x for x in lines if x.get("key") == "k"]
    assert [x["value"] for x in keyed] == ["one", "two", "three"]
    r = fabric("recv", "orders", "--group", "g", "--count", "7", *e)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 7
    r = fabric("queue", "describe", "orders", "--json", *e)
    d = json.loads(r.stdout)
    assert d["messages"] == 7 and d["groups"]["g"]["total_lag"] == 0
    r = fabric("queue", "list", *e)
    assert "orders" in r.stdout and "PARTITIONS" in r.stdout
    r = fabric("tail", "orders", "-n", "1", *e)
    assert r.returncode == 0 and 1 <= len(r.stdout.splitlines()) <= 4
    assert fabric("queue", "delete", "orders", "--yes", *e).returncode == 0
    r = fabric("queue", "describe", "orders", *e)
    assert r.returncode == 1 and "UNKNOWN_QUEUE" in r.stderr


def test_clear_errors(node):
    e = ["-e", node.endpoint]
    r = fabric("send", "nope.dlq", "x", *e)
    assert r.returncode == 1 and "UNKNOWN_QUEUE" in r.stderr and "nope.dlq" in r.stderr
    r = fabric("queue", "describe", "nope", *e)
    assert r.returncode == 1 and "UNKNOWN_QUEUE" in r.stderr
    r = fabric("queue", "create", "q", "--set", "partitons=3", *e)
    assert r.returncode == 1 and "partitons" in r.stderr
    r = fabric("queue", "create", "q", "--set", "fsync=sometimes", *e)
    assert r.returncode == 1 and "fsync" in r.stderr
    r = fabric("ping", "-e", "tcp://127.0.0.1:1", timeout=30)
    assert r.returncode == 1 and "error:" in r.stderr
    assert fabric("ping", *e).returncode == 0


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ("[node]\nlisten = 'tcp://127.0.0.1:0'\nbogus = 1\n", "node.bogus"),
        ("[queue_defaults]\npartitions = '3'\n", "partitions"),
        ("[queue_defaults]\nfsync = 'sometimes'\n", "fsync"),
        ("[limits]\nmax_request_bytes = -1\n", "limits.max_request_bytes"),
        ("[nodes]\nid = 'x'\n", "nodes"),
        ("[node\n", "not valid TOML"),
    ],
)
def test_bad_config_names_the_key(tmp_path, toml, named):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(toml)
    r = fabric("up", "--config", str(cfg), "--data-dir", str(tmp_path / "d"), timeout=30)
    assert r.returncode == 1
    assert named in r.stderr and "CONFIG_ERROR" in r.stderr


def test_config_file_queues_exist_at_start(tmp_path):
    from fabric.client import Admin
    from fabric.testing import Node

    cfg = tmp_path / "node.toml"
    cfg.write_text("[queue_defaults]\npartitions = 3\n\n[queues.events]\nretention_ms = 60000\n")
    n = Node(str(tmp_path / "d"), extra=["--config", str(cfg)])
    try:
        with Admin(n.endpoint) as admin:
            d = admin.describe_queue("events")
            assert d["partitions"] == 3 and d["settings"]["retention_ms"] == 60000
            assert admin.create_queue("later")["partitions"] == 3
    finally:
        n.stop()


def test_port_in_use_is_a_clear_error(node):
    r = fabric("up", "--listen", node.endpoint, "--data-dir", "/tmp/unused-fabric-data-dir", timeout=30)
    assert r.returncode == 1 and f"error: ADDRESS_IN_USE: {node.endpoint} is in use" in r.stderr, r.stderr
    assert "CONFIG_ERROR" not in r.stderr  # a port in use is not a config error


def test_groups_and_dead_letters_from_the_cli(node):
    e = ["-e", node.endpoint]
    assert fabric("queue", "create", "work", "--set", "max_receive_count=2", *e).returncode == 0
    assert fabric("send", "work", "a", "b", "c", *e).returncode == 0
    r = fabric("recv", "work", "--group", "crew", "--kind", "queue", "--count", "2", "--json", *e)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr
    rows = {x["group"]: x for x in json.loads(fabric("group", "list", "work", "--json", *e).stdout)}
    assert rows["crew"]["kind"] == "queue" and rows["crew"]["backlog"] == 1  # the unprinted one went back
    r = fabric("recv", "work", "--group", "crew", "--kind", "queue", "--count", "1", "--json", *e)
    assert json.loads(r.stdout)["value"] == "c"
    rows = {x["group"]: x for x in json.loads(fabric("group", "list", "work", "--json", *e).stdout)}
    assert rows["crew"]["backlog"] == 0
    # stream group offsets: reset is a dry run unless --execute
    assert fabric("recv", "work", "--group", "readers", "--count", "3", *e).returncode == 0
    r = fabric("group", "reset-offsets", "work", "readers", "--to", "earliest", "--json", *e)
    assert json.loads(r.stdout) == {"executed": False, "offsets": {"0": 0}}
    assert json.loads(fabric("group", "describe", "work", "readers", "--json", *e).stdout)["committed"] == {"0": 3}
    assert fabric("group", "reset-offsets", "work", "readers", "--to", "1", "--execute", "--yes", *e).returncode == 0
    assert json.loads(fabric("group", "describe", "work", "readers", "--json", *e).stdout)["committed"] == {"0": 1}
    # a queue that dead-letters on the first give-back
    assert fabric("queue", "create", "poison", "--set", "max_receive_count=1", *e).returncode == 0
    assert fabric("send", "poison", "y", *e).returncode == 0
    from fabric.client import Consumer

    with Consumer("poison", node.endpoint, group="crew", kind="queue") as c:
        got = []
        while not got:
            got = c.poll(500)
        c.nack(got)  # its one delivery is spent: dead-lettered
    r = fabric("dlq", "list", "--json", *e)
    assert [q["name"] for q in json.loads(r.stdout)] == ["poison.dlq"]
    # a queue named as another's dead_letter_queue is one too (read from the list's entries)
    assert fabric("queue", "create", "graveyard", *e).returncode == 0
    assert fabric("queue", "create", "risky", "--set", "dead_letter_queue=graveyard", *e).returncode == 0
    r = fabric("dlq", "list", "--json", *e)
    assert [q["name"] for q in json.loads(r.stdout)] == ["graveyard", "poison.dlq"]
    r = fabric("dlq", "peek", "poison.dlq", "--json", *e)
    dead = json.loads(r.stdout.splitlines()[0])
    assert dead["value"] == "y" and dead["headers"]["x-dlq-source"] == "poison"
    groups_before = fabric("group", "list", "poison.dlq", "--json", *e).stdout
    assert "would move 1" in fabric("dlq", "redrive", "poison.dlq", "--dry-run", *e).stdout
    assert fabric("group", "list", "poison.dlq", "--json", *e).stdout == groups_before  # a dry run changes nothing
    assert "moved 1" in fabric("dlq", "redrive", "poison.dlq", "--yes", *e).stdout
    assert "moved 0" in fabric("dlq", "redrive", "poison.dlq", "-y", *e).stdout
    r = fabric("recv", "poison", "--group", "crew", "--kind", "queue", "--count", "1", *e)
    assert r.stdout.strip() == "y"


def test_up_json_ready_line_and_ready_file(tmp_path):
    """Scripts learn the picked ports and the PID from one JSON line or a ready file, not a sentence."""
    ready_file = tmp_path / "ready.json"
    node = JsonNode(tmp_path / "data", "--ready-file", str(ready_file), "--stream-listen", "fabric://127.0.0.1:0")
    try:
        info = node.info
        assert info["event"] == "ready" and info["pid"] == node.proc.pid
        assert info["endpoint"].startswith("tcp://127.0.0.1:") and not info["endpoint"].endswith(":0")
        assert info["stream_endpoint"].startswith("fabric://127.0.0.1:")
        assert json.loads(ready_file.read_text()) == info
        r = fabric("ping", "-e", info["endpoint"], "--json", timeout=30)
        assert r.returncode == 0 and json.loads(r.stdout)["node"] == info["node"]
    finally:
        code = node.stop()
    assert code == 0
    assert node.stdout == ""  # nothing but the JSON line on stdout
    assert not ready_file.exists()  # removed at a clean stop


def test_json_log_lines(tmp_path):
    """--log-format json: every stderr line is one JSON object a log shipper can index."""
    node = JsonNode(tmp_path / "data", "--log-format", "json")
    try:
        r = fabric("queue", "create", "logged", "-e", node.info["endpoint"], timeout=30)
        assert r.returncode == 0, r.stderr
    finally:
        node.stop()
    lines = [json.loads(line) for line in node.stderr.splitlines() if line.strip()]
    assert lines and all({"ts", "level", "logger", "node", "msg"} <= set(x) for x in lines)
    created = [x for x in lines if "'logged' created" in x["msg"]]
    assert created and created[0]["level"] == "info" and created[0]["node"] == "node-1"
    assert created[0]["ts"].endswith("Z")


def test_top_shows_queues_groups_and_rates_in_80_columns(node):
    """`fabric top` against a real node: every table fits 80 columns; rates appear from the second
    refresh on (a frame is printed plainly when stdout is not a terminal)."""
    from fabric.client import Admin, Consumer, Producer

    with Admin(node.endpoint) as admin:
        admin.create_queue("topq", partitions=2)
    with Producer(node.endpoint) as p:
        for _ in range(50):
            p.send("topq", b"x")
    with Consumer("topq", node.endpoint, group="viewers", start="earliest") as c:
        c.poll_batch(2000)
        c.commit()
    r = fabric("top", "-e", node.endpoint, "-n", "2", "--interval", "0.3", timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    frames = r.stdout.split("QUEUES")
    assert len(frames) == 3  # two refreshes
    assert "topq" in frames[1] and "viewers" in frames[1]
    row = next(line for line in frames[2].splitlines() if line.startswith("topq"))
    cells = [c.strip() for c in row.split("│")]
    assert cells[2] == "50" and cells[3] != "-"  # messages; in/s is a rate on the second frame
    # past --limit, the queues holding the most messages (one list, not a describe per queue)
    with Admin(node.endpoint) as admin:
        admin.create_queue("topq.empty")
    r = fabric("top", "-e", node.endpoint, "-n", "1", "--limit", "1", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "1 more: --limit, --prefix" in r.stdout and "topq.empty" not in r.stdout and "topq" in r.stdout
    r = fabric("top", "-e", node.endpoint, "-n", "1", "--prefix", "topq.", timeout=60)
    assert "topq.empty" in r.stdout and "more:" not in r.stdout
