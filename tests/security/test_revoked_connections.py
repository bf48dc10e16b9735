"""Which open connections a revocation takes (AccessGuard.maybe_reload, fabric/node/access.py):
every connection of the revoked principal, direct over ZeroMQ, over TLS, behind a router, and
nobody else's; a certificate revoked alone takes only the TLS connections that presented it."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from fabric.node.access import AccessGuard
from fabric.security import certs, keys
from fabric.security.acl import Acl
from fabric.settings import SecurityConfig


@pytest.fixture
def guard(tmp_path: Path):
    d = keys.init(tmp_path / "keys")
    for name in ("alice", "bob"):
        keys.add_client(d, name)
    ctx = zmq.Context()
    g = AccessGuard(ctx, SecurityConfig(keys_dir=str(d)), Acl())
    try:
        yield g, d
    finally:
        g.close()
        ctx.term()


def _connect(g: AccessGuard) -> None:
    g.principals.update({b"z-alice": "alice", b"z-bob": "bob", b"internal": keys.INTERNAL})
    g.principals.update({b"t-alice": "alice", b"t-bob": "bob"})
    g.serials.update({b"t-alice": g.certs["alice"], b"t-bob": g.certs["bob"]})
    assert g.trust_routed(b"internal", b"r-alice", "alice")
    assert g.trust_routed(b"internal", b"r-internal", keys.INTERNAL)  # principal "": not a revoked one


def _reload(g: AccessGuard) -> list[tuple[bytes, str]]:
    g.keys._next_reload = 0.0  # due now (it looks every RELOAD_S)
    return sorted(g.maybe_reload())


def test_a_revoked_principal_loses_every_connection_and_nobody_else_does(guard) -> None:
    g, d = guard
    _connect(g)
    assert _reload(g) == []  # nothing changed
    keys.revoke(d, "alice")
    assert _reload(g) == [(b"r-alice", "alice"), (b"t-alice", "alice"), (b"z-alice", "alice")]
    assert _reload(g) == []  # once


def test_a_certificate_revoked_alone_takes_the_tls_connections_only(guard) -> None:
    g, d = guard
    _connect(g)
    assert certs.revoke_client(d, "bob")
    assert _reload(g) == [(b"t-bob", "bob")]
