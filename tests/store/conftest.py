"""Fixtures for the store tests: logs in pytest's tmp_path, never in the repository."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.store.log import PartitionLog
from tests.store.helpers import SMALL


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "q" / "0"


@pytest.fixture
def small_log(log_dir: Path) -> Iterator[PartitionLog]:
    log = PartitionLog.open(log_dir, SMALL, now_ms=1_000)
    yield log
    log.close(clean=False)
