"""Issue 33's CLI defects, as a new user met them from the shell: what commands leave in the
checkout, errors, Ctrl-C, a piped send that fails partway, unreachable endpoints, --json."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.testing import Node

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory) -> Iterator[Node]:
    """One node for the whole module (every test uses its own queue names)."""
    n = Node(str(tmp_path_factory.mktemp("first-hour") / "data"))
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
