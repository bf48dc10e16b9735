"""The README is executable (issue 15 #10): every shell line of its ```sh blocks runs, in order,
against a real node in a temp directory, and every ```python block runs too, so an example can
never use a queue before it is created, mix group kinds or suggest a command that fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fabric.testing import Node

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
# lines that start servers, install things, run the test suite or a long benchmark: run elsewhere
# (tests/integration/test_cli.py runs `fabric up`; CI runs `bash .ci/run`; the bench has its own)
SKIP = (
    r"^python3 -m venv ",  # the first command: installs into .venv and runs the 200,000-message demo
    r"^bash ",  # .ci/run, tools/check
    r"^python -m pytest",
    r"^FABRIC_TEST_DEPTH=",  # the property tests with more examples: a test run of its own
    r"^fabric recv .*--follow",  # runs until Ctrl-C: tests/integration/test_cli_gaps.py interrupts one
    r"^fabric up\b",  # a server; the test starts its own node
    r"^FABRIC_ENDPOINT=fabric://",  # needs a node with --stream-listen (tests/integration/test_stream_transport.py)
    r"^fabric bench\b",  # a minute of load; `fabric bench -n 20000` below stands in for it
    r"^python -m tools\.latency_floor",  # 15 s of probing, from the checkout: tests/tools/ runs it small
    r"^python -m tools\.federation_soak",  # minutes on a 2x3 federation, from the checkout (a soak command)
    r"^curl .*/metrics",  # needs a node with --metrics-listen: tests/integration/test_metrics.py scrapes one
    r"configs/cluster-3\.toml|127\.0\.0\.1:750[0-9]",  # cluster lines: tests/cluster/ runs them
    r"configs/federation-2x3",  # federation lines: tests/federation/test_federation_cluster.py runs them on free ports
    r"--set encrypt=true",  # needs a node with an at-rest key file: tests/integration/test_encryption.py
    r"^fabric acl ",  # needs a node with [security] keys_dir: tests/integration/test_first_hour_node.py
)


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README.read_text(), flags=re.S)


def shell_lines() -> list[str]:
    out = []
    for block in blocks("sh"):
        if "configs/cluster-3.toml" in block:
            continue  # the cluster block: tests/cluster/test_cluster_cli.py runs it against a cluster
        for line in block.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                out.append(line)
    return out


def test_the_readme_has_what_this_test_reads():
    lines = shell_lines()
    assert any(line.startswith("fabric queue create") for line in lines)
    assert blocks("python")


def test_every_shell_line_of_the_readme_works(tmp_path):
    node = Node(str(tmp_path / "data"))
    env = {
        **os.environ,
        "FABRIC_ENDPOINT": node.endpoint,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    ran = 0
    try:
        for line in shell_lines():
            if any(re.search(p, line) for p in SKIP):
                continue
            r = subprocess.run(
                ["bash", "-c", line],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                stdin=subprocess.DEVNULL,
            )
            assert r.returncode == 0, f"README line failed: {line}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
            ran += 1
        r = subprocess.run(
            ["fabric", "bench", "-n", "20000", "--json"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-1500:]
    finally:
        node.stop()
    assert ran >= 25


def test_every_python_block_of_the_readme_works(tmp_path):
    node = Node(str(tmp_path / "data"))
    try:
        for block in blocks("python"):
            code = block.replace("tcp://127.0.0.1:7420", node.endpoint)
            r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, f"README python block failed:\n{code}\n{r.stderr[-2000:]}"
    finally:
        node.stop()
