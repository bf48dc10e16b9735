"""Revocation ends subscriptions in a cluster (issue 31, item 6): two `fabric node start` stores
and a `fabric router start` router on 127.0.0.1 against the run's etcd, one keys dir; clients
are given only the router. The store that coordinates the group knows each routed subscriber's
principal from the router's envelope and ends the revoked one's subscription itself: nothing
reaches dave later than 1 s after the revoke, his poll raises NotAuthorized, erin gets the rest
(tests/revocation.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fabric.client import Admin, use_credentials
from tests import revocation
from tests.cluster_procs import ClusterProcs

pytestmark = [pytest.mark.cluster, pytest.mark.integration]
NAMES = ("dave", "erin")


@pytest.fixture
def secured(etcd_cluster, tmp_path):
    keys = tmp_path / "keys"
    for args in (("init",), *(("add-client", n) for n in ("ops", *NAMES))):
        r = subprocess.run(
            [sys.executable, "-m", "fabric.cli", "auth", *args, "--dir", str(keys)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
    c = ClusterProcs(
        tmp_path,
        list(etcd_cluster.endpoints),
        size=2,
        rf=2,
        min_insync=1,
        routers=1,
        keys_dir=str(keys),
        admins=("ops",),
    )
    try:
        c.start_all()
        yield c, keys
    finally:
        use_credentials(None, None)
        c.stop_all()


def test_a_revoked_consumer_behind_a_router_gets_nothing_more(secured) -> None:
    c, keys = secured
    router = c.router_endpoints["r1"]
    revocation.setup(keys, router, "jobs", NAMES)
    revocation.as_client(keys, "ops")
    try:  # the ACLs (in etcd) on every store
        for endpoint in c.endpoints.values():
            with Admin(endpoint) as admin:
                deadline = time.monotonic() + 5
                while len(admin.acl_list()["rules"]) < 4:
                    assert time.monotonic() < deadline, f"the ACLs did not reach {endpoint}"
                    time.sleep(0.05)
    finally:
        use_credentials(None, None)
    revocation.check(revocation.revoke_while_consuming(keys, router, "jobs", NAMES), "dave")
    for proc in [*c.endpoints, *c.router_endpoints]:
        assert "Traceback" not in c.log_text(proc), proc
    assert "principal 'dave' was revoked" in c.log_text("n1") + c.log_text("n2")
