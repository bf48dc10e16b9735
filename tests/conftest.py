"""Shared fixtures: real fabric nodes started as processes on 127.0.0.1."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from fabric.bench import Node


@pytest.fixture
def node(tmp_path) -> Iterator[Node]:
    """A `fabric up` process on a free loopback port with its own data dir."""
    n = Node(str(tmp_path / "data"))
    try:
        yield n
    finally:
        n.stop()


def drain(consumer, n: int, seconds: float = 30) -> list:
    """Poll ``consumer`` until it returned ``n`` messages or ``seconds`` passed."""
    import time

    got: list = []
    deadline = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < deadline:
        got.extend(consumer.poll(100))
    return got


def kill9(n: Node) -> None:
    """kill -9 the node we started, by its PID, and reap it."""
    os.kill(n.proc.pid, signal.SIGKILL)
    n.proc.wait(10)
