"""`--json` prints valid JSON on every command that takes it (issue 15 #10): one document, or JSON
lines for the commands that print messages as they come (recv, tail)."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_cli import fabric

pytestmark = pytest.mark.integration

DOCUMENT = [
    ["ping"],
    ["queue", "create", "j", "--partitions", "2", "--max-receive-count", "1"],
    ["send", "j", "a", "b", "c"],
    ["queue", "list"],
    ["queue", "describe", "j"],
    ["group", "list", "j"],
    ["group", "reset-offsets", "j", "g", "--to", "earliest"],
    ["group", "list", "--all-queues"],
    ["lag", "--all-queues"],
    ["queue", "alter", "j", "--set", "retention_ms=60000"],
    ["dlq", "list"],
]
LINES = [
    ["recv", "j", "--from", "earliest", "-n", "3"],
    ["recv", "j", "-g", "g", "-n", "3"],
    ["tail", "j", "-n", "2"],
]


def test_every_json_output_parses(node):
    e = ["-e", node.endpoint]
    for args in DOCUMENT:
        r = fabric(*args, "--json", *e)
        assert r.returncode == 0, (args, r.stderr)
        json.loads(r.stdout)
    for args in LINES:
        r = fabric(*args, "--json", *e)
        assert r.returncode == 0, (args, r.stderr)
        rows = [json.loads(line) for line in r.stdout.splitlines()]
        assert rows and all("offset" in row for row in rows)
    r = fabric("group", "describe", "j", "g", "--json", *e)
    assert r.returncode == 0 and json.loads(r.stdout)
    r = fabric("recv", "j", "-g", "w", "--kind", "queue", "--no-ack", "-n", "1", "--json", *e)
    handle = json.loads(r.stdout)["receipt_handle"]
    for args in (
        ["change-visibility", "j", "w", handle, "--visibility-timeout", "1m"],
        ["ack", "j", "w", handle],
        ["nack", "j", "w", handle],
        ["queue", "purge", "j", "--yes"],
        ["group", "delete", "j", "w", "--yes"],
    ):
        r = fabric(*args, "--json", *e)
        assert r.returncode == 0, (args, r.stderr)
        json.loads(r.stdout)
