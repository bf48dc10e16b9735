"""A CurveZMQ server's side of a deployment's keys: the ZAP handler, principals per connection,
key reloads. Shared by the storage node (``fabric/node/access.py``) and the router.

Theory of operation
-------------------
``ClientKeys`` makes a ROUTER socket a CurveZMQ server with the deployment's key pair
(``fabric auth init``). A ZAP handler (pyzmq's ThreadAuthenticator, in the socket's ZeroMQ
context) admits a connection only if its public key is one of ``keys_dir/clients/*.key``, and
names it by the file's name: that is the connection's **principal**, which libzmq attaches to
every message from it (the ``User-Id`` property). ``learn`` reads it from the first frame of a
connection's first message.

The clients directory is read again when it changes (``fabric auth add-client`` / ``revoke``, no
restart; looked at every ``RELOAD_S`` by ``maybe_reload``, a stat of the directory when nothing
changed): a revoked principal's connection stays open (ZeroMQ cannot close one authenticated
connection), so its owner checks the principal against ``allowed`` on every request, and a node
ends the subscriptions it holds; it cannot connect again.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import zmq
import zmq.auth.thread

from fabric.security import keys

log = logging.getLogger("fabric.access")
RELOAD_S = 0.25  # a revoked principal is refused, and its subscriptions end, this soon
DOMAIN = "fabric"


class _Authenticator(zmq.auth.thread.ThreadAuthenticator):
    def __init__(self, ctx: zmq.Context, names: dict[bytes, str]) -> None:
        super().__init__(context=ctx, log=logging.getLogger("fabric.zap"))
        self.names = names

    def curve_user_id(self, client_public_key: bytes) -> str:
        from zmq.utils import z85

        return self.names.get(z85.encode(client_public_key), "")


class ClientKeys:
    """The allowed client keys of ``keys_dir`` and the ZAP handler that names connections."""

    def __init__(self, ctx: zmq.Context, keys_dir: str | Path) -> None:
        self.dir = Path(keys_dir)
        self.public, self.secret = keys.server_pair(self.dir)
        self.names: dict[bytes, str] = keys.client_keys(self.dir)
        self.allowed = frozenset(self.names.values())
        self._stamp = self.dir_stamp()
        self._next_reload = time.monotonic() + RELOAD_S
        self.zap = _Authenticator(ctx, self.names)
        self.zap.start()
        self.zap.configure_curve(domain=DOMAIN, location=str(self.dir / "clients"))

    def secure(self, sock: zmq.Socket) -> None:
        """Make ``sock`` (not bound yet) a CurveZMQ server with the deployment's key pair."""
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.ZAP_DOMAIN, DOMAIN.encode())

    @staticmethod
    def principal_of(frame: zmq.Frame) -> str:
        """The principal libzmq attached to a message (its first frame): "" if none."""
        try:
            return str(frame.get("User-Id") or "")
        except zmq.ZMQError:
            return ""

    def dir_stamp(self) -> tuple[float, int, int]:
        d = self.dir / "clients"
        try:
            return d.stat().st_mtime, len(list(d.glob("*.key"))), len(list(d.glob("*.crt")))
        except OSError:
            return 0.0, 0, 0

    def maybe_reload(self) -> bool:
        """Read the clients directory again if it changed (at most once per RELOAD_S); True when
        it was read (the caller may reload what else it keeps from there)."""
        now = time.monotonic()
        if now < self._next_reload:
            return False
        self._next_reload = now + RELOAD_S
        stamp = self.dir_stamp()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        names = keys.client_keys(self.dir)
        self.zap.names.clear()
        self.zap.names.update(names)
        self.zap.configure_curve(domain=DOMAIN, location=str(self.dir / "clients"))
        gone = self.allowed - frozenset(names.values())
        self.allowed = frozenset(names.values())
        if gone:
            log.info("client keys revoked: %s (their connections are refused from now on)", ", ".join(sorted(gone)))
        return True

    def close(self) -> None:
        self.zap.stop()
