"""Authentication and ACLs on a real node (issue 12, items 1-2): CurveZMQ keys from `fabric auth`,
a principal per client, deny by default; refusals name principal, operation and resource, and
nothing is written."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabric.client import Admin, Consumer, Producer, use_credentials
from fabric.errors import ConfigError, NotAuthorized
from fabric.protocol.ops import Op
from fabric.settings import load_config
from fabric.testing import Node

pytestmark = pytest.mark.integration


def _fabric(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric.cli", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.fixture
def secured(tmp_path: Path):
    keys = tmp_path / "keys"
    assert _fabric("auth", "init", "--dir", str(keys)).returncode == 0
    for name in ("ops", "alice", "mallory"):
        r = _fabric("auth", "add-client", name, "--dir", str(keys))
        assert r.returncode == 0, r.stderr
    assert oct((keys / "server.key_secret").stat().st_mode & 0o777) == "0o600"
    assert oct((keys / "issued" / "alice.key_secret").stat().st_mode & 0o777) == "0o600"
    config = tmp_path / "node.toml"
    config.write_text(f'[security]\nkeys_dir = "{keys}"\nadmins = ["ops"]\n')
    node = Node(str(tmp_path / "data"), extra=["--config", str(config)])
    try:
        yield node, keys
    finally:
        use_credentials(None, None)
        node.stop()


def _as(keys: Path, name: str | None) -> None:
    if name is None:
        use_credentials(None, None)
    else:
        use_credentials(str(keys / "issued" / f"{name}.key_secret"), str(keys / "server.key"))


def test_only_known_keys_connect_and_acls_decide(secured) -> None:
    node, keys = secured
    _as(keys, None)  # no keys at all: the handshake is refused, and the client says why at once
    t0 = time.monotonic()
    with pytest.raises(NotAuthorized, match="refused"), Admin(node.endpoint, timeout_ms=5000) as admin:
        admin.ping()
    assert time.monotonic() - t0 < 5
    _as(keys, "ops")  # an admin of the config: everything
    with Admin(node.endpoint) as admin:
        admin.create_queue("orders.eu", partitions=2)
        admin.create_queue("audit")
        assert admin.acl_add("alice", "produce", "orders.*")
        assert admin.acl_add("alice", "consume", "orders.*")
        assert admin.acl_add("alice", "consume", "group:billing")
        assert not admin.acl_add("alice", "consume", "group:billing")  # there already
        assert len(admin.acl_list("alice")["rules"]) == 3
    _as(keys, "alice")
    with Producer(node.endpoint, acks="all") as prod:
        assert prod.send("orders.eu", b"ok").result(10).offset == 0
        with pytest.raises(NotAuthorized, match=r"'alice' may not produce 'audit'"):
            prod.send("audit", b"no").result(10)
        bulk = prod._meta_request(Op.METADATA, {"queues": [], "settings": True})["settings"]
        assert set(bulk) == {"orders.eu"}  # a producer's bulk look-up names only what it may produce to
    with Consumer("orders.eu", node.endpoint, group="billing", start="earliest") as cons:
        deadline = time.monotonic() + 10
        got = []
        while not got and time.monotonic() < deadline:
            got = cons.poll(200)
        assert [m.value for m in got] == [b"ok"]
    with pytest.raises(NotAuthorized, match="group:other"):
        Consumer("orders.eu", node.endpoint, group="other")
    with Admin(node.endpoint) as admin:
        # a list names only the queues it has a right on; the others are not there for it
        assert [q["name"] for q in admin.list_queues()] == ["orders.eu"]
        assert set(admin.metadata()["queues"]) == {"orders.eu"}
        with pytest.raises(NotAuthorized, match="admin"):
            admin.delete_queue("orders.eu")
        with pytest.raises(NotAuthorized, match="admin"):
            admin.acl_add("alice", "admin", "*")
    _as(keys, "mallory")  # a known key without any rule: deny by default
    with Admin(node.endpoint) as admin:
        assert admin.list_queues() == [] and admin.metadata()["queues"] == {}
    with Producer(node.endpoint) as prod, pytest.raises(NotAuthorized, match="'mallory' may not produce"):
        prod.send("orders.eu", b"evil").result(10)
    _as(keys, "ops")
    with Admin(node.endpoint) as admin:  # nothing the refused requests carried was written
        assert [q["name"] for q in admin.list_queues()] == ["audit", "orders.eu"]  # an admin sees all
        assert admin.describe_queue("audit")["messages"] == 0
        assert admin.describe_queue("orders.eu")["messages"] == 1


def test_a_revoked_key_is_refused_without_a_restart(secured) -> None:
    node, keys = secured
    _as(keys, "ops")
    with Admin(node.endpoint) as admin:
        admin.create_queue("q")
        admin.acl_add("alice", "produce", "q")
    _as(keys, "alice")
    prod = Producer(node.endpoint, request_timeout_ms=3000, retries=0)
    try:
        assert prod.send("q", b"before").result(10).offset == 0
        assert _fabric("auth", "revoke", "alice", "--dir", str(keys)).returncode == 0
        deadline = time.monotonic() + 10
        refused = None
        while refused is None and time.monotonic() < deadline:
            try:
                prod.send("q", b"after").result(10)
                time.sleep(0.2)
            except NotAuthorized as exc:
                refused = exc
        assert refused is not None and "not allowed" in refused.message
    finally:
        prod.close()
    with pytest.raises(NotAuthorized), Admin(node.endpoint, timeout_ms=3000) as admin:
        admin.ping()  # and it cannot connect again
    listed = {c["name"]: c["state"] for c in __import__("fabric.security.keys", fromlist=["x"]).list_clients(keys)}
    assert listed["alice"] == "revoked" and listed["ops"] == "allowed"


def test_a_node_beyond_loopback_needs_auth_or_says_insecure(tmp_path: Path) -> None:
    config = tmp_path / "n.toml"
    config.write_text("[node]\nlisten = 'tcp://0.0.0.0:0'\n")
    cfg = load_config(config)
    from fabric.settings import check_exposure

    with pytest.raises(ConfigError, match="without authentication"):
        check_exposure(cfg, "node", [cfg.listen])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "fabric.cli", "up", "--config", str(config), "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode != 0 and "insecure = true" in r.stderr, r.stderr[-500:]
    config.write_text("[node]\nlisten = 'tcp://0.0.0.0:0'\n[security]\ninsecure = true\n")
    check_exposure(load_config(config), "node", ["tcp://0.0.0.0:0"])  # said in so many words: allowed
    bad = tmp_path / "bad.toml"
    bad.write_text("[security]\nkeys = 'x'\n")
    with pytest.raises(ConfigError, match=r"security\.keys"):
        load_config(bad)
