"""Fixtures of the cluster tests that several modules share."""

from __future__ import annotations

import pytest

from tests.cluster_procs import ClusterProcs


@pytest.fixture
def routed(etcd_cluster, tmp_path):
    """Three `fabric node start` stores and two `fabric router start` routers on 127.0.0.1
    against the run's etcd; clients are given only the routers."""
    c = ClusterProcs(tmp_path, list(etcd_cluster.endpoints), routers=2)
    try:
        c.start_all()
        yield c
    finally:
        c.stop_all()


@pytest.fixture
def cluster(etcd_cluster, tmp_path):
    """Three `fabric node start` stores on 127.0.0.1 against the run's etcd, no routers."""
    c = ClusterProcs(tmp_path, list(etcd_cluster.endpoints))
    try:
        c.start_all()
        yield c
    finally:
        c.stop_all()
