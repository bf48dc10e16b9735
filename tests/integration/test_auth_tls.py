"""TLS on the stream transport (issue 12): a real node with [security] keys_dir and stream_listen.
An authorized client produces and consumes over fabric://; a client without a certificate, one
whose certificate another CA signed, one revoked while the node runs, and one whose principal
has no ACL are each refused with NotAuthorized (at once, not after a timeout), and nothing they
sent is written. Refusals are counted in fabric_auth_refused_total."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fabric.client import Admin, Consumer, Producer, use_credentials
from fabric.errors import ConfigError, NotAuthorized
from fabric.security import keys

from ..conftest import JsonNode

pytestmark = pytest.mark.integration


def _fabric(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabric.cli", *args], capture_output=True, text=True, timeout=60)


def _secured_node(tmp_path: Path, keys_dir: Path) -> JsonNode:
    config = tmp_path / "node.toml"
    config.write_text(f'[security]\nkeys_dir = "{keys_dir}"\nadmins = ["ops"]\n')
    return JsonNode(
        tmp_path / "data",
        "--config",
        str(config),
        "--stream-listen",
        "fabric://127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    )


@pytest.fixture
def tls_node(tmp_path: Path):
    keys_dir = tmp_path / "keys"
    r = _fabric("auth", "init", "--dir", str(keys_dir), "--host", "node1.example")
    assert r.returncode == 0, r.stderr
    for name in ("ops", "alice", "mallory"):
        r = _fabric("auth", "add-client", name, "--dir", str(keys_dir))
        assert r.returncode == 0, r.stderr
    node = _secured_node(tmp_path, keys_dir)
    try:
        yield node, keys_dir
    finally:
        use_credentials(None, None)
        code = node.stop()
        assert code == 0, node.stderr[-3000:]


def _as(keys_dir: Path, name: str, server_dir: Path | None = None) -> None:
    """Credentials of client ``name`` (its files in keys_dir/issued), trusting server_dir's CA."""
    server_dir = server_dir or keys_dir
    use_credentials(str(keys_dir / "issued" / f"{name}.key_secret"), str(server_dir / "server.key"))


def _messages(node: JsonNode, keys_dir: Path, queue: str) -> int:
    _as(keys_dir, "ops")
    with Admin(node.info["stream_endpoint"], timeout_ms=5000) as admin:
        return int(admin.describe_queue(queue)["messages"])


def _refused_metric(node: JsonNode) -> dict[str, float]:
    with urllib.request.urlopen(node.info["metrics_endpoint"], timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("fabric_auth_refused_total{"):
            principal = line.split('principal="', 1)[1].split('"', 1)[0]
            out[principal] = float(line.rsplit(" ", 1)[1])
    return out


def test_tls_clients_are_authenticated_by_certificate(tls_node, tmp_path: Path) -> None:
    node, keys_dir = tls_node
    stream = node.info["stream_endpoint"]
    _as(keys_dir, "ops")
    with Admin(stream, timeout_ms=5000) as admin:
        admin.create_queue("orders")
        admin.acl_add("alice", "produce", "orders")
        admin.acl_add("alice", "consume", "orders")

    # an authorized client: produce and consume over TLS
    _as(keys_dir, "alice")
    with Producer(stream, acks="all") as prod:
        assert prod.send("orders", b"one").result(10).offset == 0
        assert prod.send("orders", b"two").result(10).offset == 1
    with Consumer("orders", stream, start="earliest", group=None) as cons:
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got += [m.value for m in cons.poll(200)]
    assert got == [b"one", b"two"]

    # a principal without the ACL: refused naming principal, operation and resource
    _as(keys_dir, "mallory")
    with Producer(stream) as prod, pytest.raises(NotAuthorized, match=r"'mallory' may not produce 'orders'"):
        prod.send("orders", b"evil").result(10)

    # no certificate: a client with CurveZMQ keys only speaks plain TCP; the node answers it
    # NOT_AUTHORIZED at once
    plain = tmp_path / "plain"
    plain.mkdir()
    shutil.copy(keys_dir / "issued" / "alice.key_secret", plain)
    shutil.copy(keys_dir / "server.key", plain)
    use_credentials(str(plain / "alice.key_secret"), str(plain / "server.key"))
    t0 = time.monotonic()
    with Producer(stream) as prod, pytest.raises(NotAuthorized, match="requires TLS"):
        prod.send("orders", b"no-cert").result(10)
    assert time.monotonic() - t0 < 3
    # ... and a TLS client without a certificate fails the handshake
    ctx = ssl.create_default_context(cafile=str(keys_dir / "ca.crt"))
    host, port = stream.removeprefix("fabric://").rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        pytest.raises((ssl.SSLError, ConnectionError)),
        ctx.wrap_socket(raw, server_hostname=host) as s,
    ):
        assert s.version() in ("TLSv1.3", "TLSv1.2")
        s.recv(8)  # TLS 1.3: the refusal arrives after the client's side of the handshake

    # a certificate from another deployment's CA: the handshake is refused, at once
    other = tmp_path / "other"
    assert _fabric("auth", "init", "--dir", str(other)).returncode == 0
    assert _fabric("auth", "add-client", "alice", "--dir", str(other)).returncode == 0
    _as(other, "alice", server_dir=keys_dir)  # trusts the right CA, presents a foreign certificate
    t0 = time.monotonic()
    with pytest.raises(NotAuthorized, match="refused the TLS handshake"), Producer(stream) as prod:
        prod.send("orders", b"foreign").result(10)
    assert time.monotonic() - t0 < 3

    # the client checks the node's certificate: trusting the other CA, it does not talk to this node
    _as(keys_dir, "alice", server_dir=other)
    with pytest.raises(Exception, match="does not verify"), Admin(stream, timeout_ms=3000) as admin:
        admin.ping()

    assert _messages(node, keys_dir, "orders") == 2  # nothing the refused clients sent was written
    refused = _refused_metric(node)
    assert refused.get("mallory", 0) >= 1 and refused.get("(no TLS)", 0) >= 1
    assert refused.get("(tls handshake)", 0) >= 2  # no certificate, foreign CA


def test_a_revoked_certificate_is_refused_without_a_restart(tls_node, tmp_path: Path) -> None:
    node, keys_dir = tls_node
    stream = node.info["stream_endpoint"]
    _as(keys_dir, "ops")
    with Admin(stream, timeout_ms=5000) as admin:
        admin.create_queue("q")
        admin.acl_add("alice", "produce", "q")
    # alice keeps her own copy of her files (revoke deletes the issued ones in the keys dir)
    mine = tmp_path / "alice"
    mine.mkdir()
    for f in ("issued/alice.key_secret", "issued/alice.pem", "server.key", "ca.crt"):
        shutil.copy(keys_dir / f, mine)
    use_credentials(str(mine / "alice.key_secret"), str(mine / "server.key"))
    prod = Producer(stream, request_timeout_ms=3000, retries=0)
    try:
        assert prod.send("q", b"before").result(10).offset == 0
        assert _fabric("auth", "revoke", "alice", "--dir", str(keys_dir)).returncode == 0
        deadline = time.monotonic() + 10
        refused = None
        while refused is None and time.monotonic() < deadline:
            try:
                prod.send("q", b"after").result(10)
                time.sleep(0.2)
            except NotAuthorized as exc:
                refused = exc
        assert refused is not None and "certificate is not allowed" in refused.message
        written = _messages(node, keys_dir, "q")
    finally:
        prod.close()
    use_credentials(str(mine / "alice.key_secret"), str(mine / "server.key"))
    with pytest.raises(NotAuthorized, match="'alice' may not connect"), Producer(stream) as again:
        again.send("q", b"new connection").result(10)  # a new connection: refused at its first request
    assert _messages(node, keys_dir, "q") == written  # nothing after the refusal was written
    listed = {c["name"]: c for c in keys.list_clients(keys_dir)}
    assert listed["alice"]["state"] == "revoked" and listed["alice"]["certificate"]
    assert not (keys_dir / "issued" / "alice.pem").exists()
    assert _refused_metric(node).get("alice", 0) >= 2


def test_a_keys_dir_made_before_tls(tmp_path: Path) -> None:
    """A keys directory without certificates still serves ZeroMQ, and a stream listener asks for
    them by name; `fabric auth init` on it adds them and keeps the keys."""
    keys_dir = tmp_path / "keys"
    assert _fabric("auth", "init", "--dir", str(keys_dir)).returncode == 0
    assert _fabric("auth", "add-client", "ops", "--dir", str(keys_dir)).returncode == 0
    shutil.rmtree(keys_dir / "tls")  # as made before this change
    for f in ("ca.crt", "clients/ops.crt", "issued/ops.pem"):
        (keys_dir / f).unlink()
    secret = (keys_dir / "server.key_secret").read_bytes()
    config = tmp_path / "node.toml"
    config.write_text(f'[security]\nkeys_dir = "{keys_dir}"\nadmins = ["ops"]\n')
    with pytest.raises(RuntimeError, match="no TLS certificates"):
        JsonNode(tmp_path / "d", "--config", str(config), "--stream-listen", "fabric://127.0.0.1:0")
    node = JsonNode(tmp_path / "d", "--config", str(config))
    try:
        _as(keys_dir, "ops")
        with Admin(node.info["endpoint"], timeout_ms=5000) as admin:
            assert admin.ping()["node"]
    finally:
        use_credentials(None, None)
        node.stop()
    r = _fabric("auth", "init", "--dir", str(keys_dir))
    assert r.returncode == 0 and "TLS certificates added" in r.stdout, r.stderr
    assert (keys_dir / "server.key_secret").read_bytes() == secret
    r = _fabric("auth", "add-client", "ops", "--dir", str(keys_dir))
    assert r.returncode == 0 and (keys_dir / "issued" / "ops.pem").exists(), r.stderr
    r = _fabric("auth", "init", "--dir", str(keys_dir))
    assert r.returncode != 0 and "nothing changed" in r.stderr
    with pytest.raises(ConfigError, match="nothing changed"):
        keys.init(keys_dir)


def test_a_stream_listener_beyond_loopback_needs_authentication(tmp_path: Path) -> None:
    from fabric.settings import check_exposure, load_config

    config = tmp_path / "n.toml"
    config.write_text("[node]\nstream_listen = 'fabric://0.0.0.0:0'\n")
    with pytest.raises(ConfigError, match="without authentication"):
        check_exposure(load_config(config), "node", ["fabric://0.0.0.0:0"])
    config.write_text(f"[node]\nstream_listen = 'fabric://0.0.0.0:0'\n[security]\nkeys_dir = '{tmp_path}'\n")
    check_exposure(load_config(config), "node", ["fabric://0.0.0.0:0"])  # TLS: allowed
