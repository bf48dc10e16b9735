"""Authentication, ACLs and quotas in a cluster (issue 12) on real processes: three `fabric node
start` stores and two `fabric router start` routers on 127.0.0.1 against the run's etcd, all
with one deployment keys dir. Clients are given only the routers (but for the checks that a
user cannot speak as a router or a node to a store)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
import zmq.auth

from fabric.client import Admin, Consumer, Producer, use_credentials
from fabric.errors import NotAuthorized
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from tests.cluster_procs import ClusterProcs

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def _fabric(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "fabric.cli", *args], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr[-800:]
    return r


def _as(keys: Path, name: str | None) -> None:
    if name is None:
        use_credentials(None, None)
    else:
        use_credentials(str(keys / "issued" / f"{name}.key_secret"), str(keys / "server.key"))


def _env(keys: Path, name: str, endpoint: str) -> dict[str, str]:
    return {
        **os.environ,
        "FABRIC_ENDPOINT": endpoint,
        "FABRIC_CLIENT_CERT": str(keys / "issued" / f"{name}.key_secret"),
        "FABRIC_SERVER_CERT": str(keys / "server.key"),
    }


def _raw_request(keys: Path, name: str, endpoint: str, frames: list[bytes]) -> fr.Message:
    """One request on a bare CurveZMQ DEALER as client ``name``, and its reply."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    public, secret = zmq.auth.load_certificate(str(keys / "issued" / f"{name}.key_secret"))
    server, _ = zmq.auth.load_certificate(str(keys / "server.key"))
    sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server
    try:
        sock.connect(endpoint)
        sock.send_multipart(frames)
        assert sock.poll(5000), "no reply"
        return fr.decode(sock.recv_multipart())
    finally:
        sock.close(0)


def _wait(what: str, ok, timeout_s: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        got = ok()
        if got:
            return got
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def secured(etcd_cluster, tmp_path):
    keys = tmp_path / "keys"
    _fabric("auth", "init", "--dir", str(keys))
    for name in ("ops", "alice", "bob", "mallory"):
        _fabric("auth", "add-client", name, "--dir", str(keys))
    c = ClusterProcs(tmp_path, list(etcd_cluster.endpoints), routers=2, keys_dir=str(keys), admins=("ops",))
    try:
        c.start_all()
        yield c, keys
    finally:
        use_credentials(None, None)
        c.stop_all()


def test_a_secured_cluster_through_its_routers(secured) -> None:
    c, keys = secured
    r1, r2 = c.router_endpoints["r1"], c.router_endpoints["r2"]
    _as(keys, "ops")
    with Admin(c.all_routers, timeout_ms=10_000) as admin:
        admin.create_queue("orders", partitions=3)
    for node, endpoint in c.endpoints.items():  # two of them pass it on to the controller, as the internal identity
        with Admin(endpoint, timeout_ms=10_000) as admin:
            assert admin.create_queue(f"q-{node}")["name"] == f"q-{node}"

    # ACLs through one router (the CLI, as an admin), in force on every store within ~2 s
    t0 = time.monotonic()
    _fabric("acl", "add", "alice", "produce", "orders", env=_env(keys, "ops", r1))
    _fabric("acl", "add", "alice", "consume", "orders", env=_env(keys, "ops", r1))
    _fabric("acl", "add", "alice", "consume", "group:billing", env=_env(keys, "ops", r1))
    _fabric("acl", "add", "bob", "produce", "orders", env=_env(keys, "ops", r2))
    for node, endpoint in c.endpoints.items():
        with Admin(endpoint) as admin:
            _wait(f"the ACLs on {node}", lambda a=admin: len(a.acl_list()["rules"]) == 4, 2.0)  # type: ignore[misc]
    assert time.monotonic() - t0 < 2.5 + 4 * 1.5  # the four CLI runs included

    # an authorized client: acks=all over three stores (replication), a group through the routers
    _as(keys, "alice")
    with Producer(c.all_routers, acks="all") as prod:
        futs = [prod.send("orders", b"m%d" % i, key=b"k%d" % (i % 11)) for i in range(300)]
        prod.flush(30)
    metas = [f.result(10) for f in futs]
    assert {m.partition for m in metas} == {0, 1, 2}
    got: list[bytes] = []
    with Consumer("orders", c.all_routers, group="billing", start="earliest") as cons:
        deadline = time.monotonic() + 20
        while len(got) < 300 and time.monotonic() < deadline:
            b = cons.poll_batch(500)
            if b is not None:
                got.extend(b.values)
        cons.commit()
    assert sorted(got) == sorted(b"m%d" % i for i in range(300))
    with pytest.raises(NotAuthorized, match="group:other"):  # refused by the store, naming alice's principal
        Consumer("orders", r1, group="other")

    # no key at all: the router refuses the handshake
    _as(keys, None)
    with pytest.raises(NotAuthorized, match="refused"), Admin(r1, timeout_ms=5000) as admin:
        admin.ping()
    # a known key with no ACL: refused by the partition's store, naming the principal
    _as(keys, "mallory")
    with Producer(c.all_routers, retries=0) as prod, pytest.raises(NotAuthorized, match="'mallory' may not produce"):
        prod.send("orders", b"evil").result(10)
    # revoked while connected: refused from its next request on, by the router
    _as(keys, "bob")
    prod = Producer(r2, request_timeout_ms=3000, retries=0)
    try:
        assert prod.send("orders", b"bob-1", partition=0).result(10).offset >= 0
        bob_stored = 1  # and what it sent before the routers read the clients dir again (<= 1 s)
        _fabric("auth", "revoke", "bob", "--dir", str(keys))
        refused = None
        deadline = time.monotonic() + 5
        while refused is None and time.monotonic() < deadline:
            try:
                prod.send("orders", b"bob-late", partition=0).result(10)
                bob_stored += 1
                time.sleep(0.1)
            except NotAuthorized as exc:
                refused = exc
        assert refused is not None and "'bob'" in refused.message and "not allowed" in refused.message
    finally:
        prod.close()

    # a user cannot speak as a router or as a node to a store
    store = c.endpoints["n1"]
    routed = fr.routed(fr.Header(Op.PRODUCE, 7).encode(), b"\x00fake", "ops", [b'{"queue":"orders"}', b"x"])
    reply = _raw_request(keys, "alice", store, routed)
    assert reply.header.status == NotAuthorized.code and "'alice' may not send 'routed requests'" in str(
        reply.params["message"]
    )
    fetch = {"queue": "orders", "partition": 0, "replica": "n1", "leader_epoch": 0, "fetch_offset": 0}
    for name in ("alice", "ops"):  # not even an admin of the config
        _as(keys, name)
        with Admin(store) as admin, pytest.raises(NotAuthorized, match=f"'{name}' may not send 'REPLICA_FETCH'"):
            admin._call(Op.REPLICA_FETCH, **fetch, last_fetched_epoch=-1)

    # nothing the refused requests carried was written: the leaders' offsets, through the routers
    _as(keys, "ops")
    with Admin(c.all_routers) as admin:
        total = sum(admin.list_offsets("orders", p)["offset"] for p in range(3))
        assert total == 300 + bob_stored, (total, bob_stored)

        # quotas through a router: in etcd, on every store
        admin.quota_set("principal:mallory", messages_per_s=100)
    for node, endpoint in c.endpoints.items():
        with Admin(endpoint) as admin:
            _wait(
                f"the quota on {node}",
                lambda a=admin: any(q["target"] == "principal:mallory" for q in a.quota_list()["quotas"]),  # type: ignore[misc]
                2.0,
            )
    isr = {(p["queue"], p["partition"]): len(p["isr"]) for p in c.status()["partitions"] if p["queue"] == "orders"}
    assert isr == {("orders", 0): 3, ("orders", 1): 3, ("orders", 2): 3}
    for proc in [*c.endpoints, *c.router_endpoints]:
        assert "Traceback" not in c.log_text(proc), proc
