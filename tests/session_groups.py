"""One etcd cluster and one SparkSession a run, also under pytest-xdist (tests/conftest.py groups
the tests that use them on one worker each); ``one_per_run`` checks that the grouping held."""

from __future__ import annotations

import os

import pytest


def one_per_run(kind: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Under xdist, fail if a second worker starts the run's ``kind`` (etcd cluster, SparkSession):
    the grouping below did not hold (a pytest or pytest-xdist upgrade that changed how groups
    reach the scheduler)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    flag = tmp_path_factory.getbasetemp().parent / f"{kind}-started-by"
    try:
        fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        other = flag.read_text().strip()
        if other != worker:
            pytest.fail(f"a second {kind} for this run on {worker} ({other} started one): xdist_group did not hold")
        return
    os.write(fd, worker.encode())
    os.close(fd)
