"""Revocation ends subscriptions (issue 31, item 6) on a real node with [security] keys_dir, over
ZeroMQ with CurveZMQ and over the fabric:// stream transport with TLS: after dave is revoked
nothing more reaches him later than 1 s after, his poll raises NotAuthorized, and erin, in the
same queue group, receives the rest, dave's unacknowledged leases included (tests/revocation.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import revocation

from ..conftest import JsonNode

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("revocation")
    keys_dir = root / "keys"
    for args in (("init",), *(("add-client", n) for n in ("ops", "dave", "erin", "dan", "eve"))):
        r = subprocess.run(
            [sys.executable, "-m", "fabric.cli", "auth", *args, "--dir", str(keys_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
    config = root / "node.toml"
    config.write_text(f'[security]\nkeys_dir = "{keys_dir}"\nadmins = ["ops"]\n')
    n = JsonNode(root / "data", "--config", str(config), "--stream-listen", "fabric://127.0.0.1:0")
    try:
        yield n, keys_dir
    finally:
        code = n.stop()
        assert code == 0, n.stderr[-3000:]


@pytest.mark.parametrize(("transport", "names"), [("tcp", ("dave", "erin")), ("tls", ("dan", "eve"))])
def test_a_revoked_consumer_gets_nothing_more(node, transport: str, names: tuple[str, str]) -> None:
    n, keys_dir = node
    endpoint = n.info["endpoint"] if transport == "tcp" else n.info["stream_endpoint"]
    assert endpoint.startswith("tcp://" if transport == "tcp" else "fabric://")
    queue = f"jobs-{transport}"
    revocation.setup(keys_dir, endpoint, queue, names)
    revocation.check(revocation.revoke_while_consuming(keys_dir, endpoint, queue, names), names[0])
