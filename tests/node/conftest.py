"""Fixtures of the node's in-memory tests: a real broker on a temporary store (tests/node/harness.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.harness import BrokerHarness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[BrokerHarness]:
    """A single node's broker, driven in memory, its clock at ``START_MS`` until advanced."""
    h = BrokerHarness(tmp_path)
    try:
        yield h
    finally:
        h.close()
