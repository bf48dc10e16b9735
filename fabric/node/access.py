"""Authentication and authorization on a node (issue 12, items 1-2): CurveZMQ on its ROUTER
socket, a principal per client connection, and ACL checks per request.

Theory of operation
-------------------
With ``[security] keys_dir`` the node's ROUTER is a CurveZMQ server with the deployment's key
pair (``fabric auth init``). A ZAP handler (pyzmq's ThreadAuthenticator, in the node's ZeroMQ
context; ``fabric/security/zap.py``, shared with the routers) admits a connection only if its public key is one of ``keys_dir/clients/*.key``, and
names it by the file's name: that is the connection's **principal**, which libzmq attaches to
every message from it (the ``User-Id`` property). The server reads it from the first frame of a
connection's first message and remembers it per routing id.

The clients directory is read again when it changes (``fabric auth add-client`` / ``revoke``,
no restart; looked at every ``RELOAD_S``): a revoked principal's connection stays open, but its
every request is refused with NOT_AUTHORIZED from then on, and it cannot connect again. What it
holds ends at once: :meth:`AccessGuard.maybe_reload` names its connections (direct, TLS, or
behind a router) and the node ends their subscriptions (``Broker.end_revoked``).

The stream transport (``stream_listen``) is TLS with client certificates signed by the
deployment's CA (``fabric/security/certs.py``, ``fabric/transport/stream_tls.py``). A
connection's principal is its certificate's common name, and the certificate must be the one in
``keys_dir/clients/NAME.crt`` (its serial number), checked on every request like a CurveZMQ key:
a revoked client's TLS connection is refused from its next request, and so is a new one (its
handshake succeeds, as the CA signed it; its requests do not). A certificate the CA did not
sign, or none, fails the handshake; a client that speaks no TLS at all is answered, every
request NOT_AUTHORIZED. Failed handshakes count as refusals of principal ``(tls handshake)``.

Every request is checked by :meth:`AccessGuard.check` before its handler runs (one attribute
test per request when security is off). LIST_QUEUES and METADATA are open to every admitted
client but name only the queues it has some right on (``may_see``): the rest are not there for
it. Operations and resources (``fabric/security/acl.py``):
PRODUCE needs ``produce`` on the queue; FETCH, LIST_OFFSETS, COMMITTED need ``consume``;
SUBSCRIBE and COMMIT need ``consume`` on the queue and, with a group, on ``group:<group>``;
CREATE_QUEUE, DELETE_QUEUE, ALTER_QUEUE, REDRIVE and COMMIT ``forget`` need ``admin``; DESCRIBE_QUEUE needs
any right on the queue (``auto_create`` needs ``produce``); the ACL and quota ops need ``admin`` on
``*``.
Requests on a subscription (CREDIT, ACK, ...) are the subscriber's own (the broker checks that
the subscription belongs to the connection). ``[security] admins`` are allowed everything but
the cluster's internal requests (REPLICA_FETCH), which only the internal identity may send.

In a cluster the other nodes and the routers connect as the **internal identity**
(``keys_dir/internal.key_secret``, principal ``__internal``), allowed everything. A routed
message (``FLAG_ROUTED``) carries its client's principal; it is trusted only from a connection
authenticated as the internal identity (``trust_routed``), and the client behind the router is
then checked as that principal, like a direct client.
Refusals are logged (rate-limited) and counted per principal.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from fabric.errors import ConfigError, NotAuthorized
from fabric.protocol.ops import Op
from fabric.security import certs
from fabric.security.acl import GROUP_PREFIX, Acl
from fabric.security.keys import INTERNAL
from fabric.security.zap import ClientKeys
from fabric.settings import SecurityConfig
from fabric.transport import stream_tls

log = logging.getLogger("fabric.access")
OPEN_OPS = frozenset({Op.PING, Op.HEARTBEAT, Op.INIT_PRODUCER, Op.METADATA, Op.LIST_QUEUES})
SUBSCRIPTION_OPS = frozenset({Op.CREDIT, Op.UNSUBSCRIBE, Op.ACK, Op.NACK, Op.CHANGE_VISIBILITY, Op.REVOKED})
ACL_OPS = frozenset({Op.ACL_LIST, Op.ACL_ADD, Op.ACL_REMOVE, Op.QUOTA_SET, Op.QUOTA_LIST})
NODE_OPS = frozenset({Op.REPLICA_FETCH})  # the cluster's own requests: the internal principal only
NO_TLS = "(no TLS)"  # the principal of a stream connection that did not start with a TLS handshake
HANDSHAKE = "(tls handshake)"  # failed TLS handshakes are counted under this name


class AccessGuard:
    """A node's authentication and authorization."""

    def __init__(self, ctx: zmq.Context, config: SecurityConfig, acl: Acl) -> None:
        self.dir = Path(config.keys_dir)
        self.keys = ClientKeys(ctx, self.dir)
        self.admins = frozenset(config.admins)
        self.acl = acl
        self.principals: dict[bytes, str] = {}  # routing id -> principal
        self.certs: dict[str, int] = certs.allowed(self.dir)  # allowed client certificates: name -> serial
        self.serials: dict[bytes, int] = {}  # stream (TLS) connection -> its certificate's serial
        self._tls: ssl.SSLContext | None = None
        self.refused: dict[str, int] = {}  # principal -> requests refused
        self._last_log = 0.0

    @property
    def allowed(self) -> frozenset[str]:
        return self.keys.allowed

    def secure(self, sock: zmq.Socket) -> None:
        """Make ``sock`` (not bound yet) a CurveZMQ server with the deployment's key pair."""
        self.keys.secure(sock)

    def maybe_reload(self) -> list[tuple[bytes, str]]:
        """Read the clients directory again if it changed: the connections whose principal it
        revoked (their key, or the certificate a TLS connection presented, is no longer allowed),
        as (client, principal), for the node to end what they hold (their subscriptions)."""
        allowed, certs_before = self.keys.allowed, self.certs
        if not self.keys.maybe_reload():
            return []
        self.certs = certs.allowed(self.dir)
        keys_gone = allowed - self.keys.allowed
        certs_gone = {name for name, serial in certs_before.items() if self.certs.get(name) != serial}
        if not keys_gone and not certs_gone:
            return []
        serials = self.serials
        return [
            (client, principal)
            for client, principal in self.principals.items()
            if (principal in certs_gone and client in serials) or (principal in keys_gone and client not in serials)
        ]

    # ------------------------------------------------------------------ the stream transport (TLS)

    def stream_tls(self) -> ssl.SSLContext:
        """The TLS server context of the stream listener (ConfigError: no certificates)."""
        if self._tls is None:
            certs.require_tls(self.dir)
            cert, key = certs.server_files(self.dir)
            try:
                self._tls = stream_tls.server_context(str(cert), str(key), str(certs.ca_cert_path(self.dir)))
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"cannot load the TLS certificates in {self.dir}: {exc}") from None
        return self._tls

    def admit(self, client: bytes, cert: dict[str, Any] | None) -> None:
        """A stream connection finished its TLS handshake (``cert`` None: it spoke no TLS)."""
        if cert is None:
            self.principals[client] = NO_TLS
            return
        name, serial = stream_tls.principal(cert)
        self.principals[client] = name
        self.serials[client] = serial

    def handshake_failed(self, peer: str, why: str) -> None:
        self.refused[HANDSHAKE] = self.refused.get(HANDSHAKE, 0) + 1
        now = time.monotonic()
        if now - self._last_log > 1.0:
            self._last_log = now
            log.warning("refused: stream connection from %s: %s", peer, why)

    def learn(self, client: bytes, frame: zmq.Frame) -> None:
        """The principal of a connection, from the first frame of its first message."""
        self.principals[client] = ClientKeys.principal_of(frame)

    def forget(self, client: bytes) -> None:
        self.principals.pop(client, None)
        self.serials.pop(client, None)

    def trust_routed(self, conn: bytes, identity: bytes, principal: str) -> bool:
        """A routed message (``FLAG_ROUTED``) came on connection ``conn``: trusted only from a
        router, i.e. a connection authenticated as the internal identity; then the client behind
        it (``identity``) is ``principal``, checked like a direct client from here on."""
        if self.principals.get(conn) != INTERNAL or self.serials.get(conn) is not None:
            return False
        self.principals[identity] = principal if principal != INTERNAL else ""
        return True

    def routed_refusal(self, conn: bytes) -> NotAuthorized:
        """The error for a routed message from a connection that is not a router's."""
        try:
            self._refuse(self.principals.get(conn) or "(unknown)", "send", "routed requests", "only routers may")
        except NotAuthorized as exc:
            return exc
        raise AssertionError("unreachable")

    def check(self, client: bytes, op: Op, params: dict[str, Any]) -> None:
        principal = self.principals.get(client, "")
        serial = self.serials.get(client)
        if (principal not in self.allowed) if serial is None else (self.certs.get(principal) != serial):
            self._refuse(principal or "(unknown)", "connect", "this node", self._why_not(principal, serial))
        if principal == INTERNAL and serial is None:
            return  # the cluster's own nodes and routers: everything
        if op in NODE_OPS:
            self._refuse(principal, "send", op.name, "only the cluster's own nodes may")
        if op in OPEN_OPS or op in SUBSCRIPTION_OPS or principal in self.admins:
            return
        missing: list[tuple[str, str]] = []
        for operation, resource in self.required(op, params):
            if resource == "*any":
                queue = params["name"]
                if not any(self.acl.allows(principal, o, queue) for o in ("produce", "consume")):
                    self._refuse(principal, "describe", queue, "no ACL on it")
                continue
            if not self.acl.allows(principal, operation, resource):
                missing.append((operation, resource))
        if missing:
            self._refuse(principal, *missing[0], _lacks(principal, missing))

    def _unrestricted(self, client: bytes) -> str | None:
        """None for a client every queue is open to (the cluster's own identity, an admin of the
        config), else its principal, whose ACLs decide."""
        principal = self.principals.get(client, "")
        if (principal == INTERNAL and client not in self.serials) or principal in self.admins:
            return None
        return principal

    def may_see(self, client: bytes) -> Callable[[str], bool] | None:
        """Whether this (already admitted) client may know a queue exists: any right on it, as
        DESCRIBE_QUEUE needs. LIST_QUEUES and METADATA name only those. None: every queue."""
        principal = self._unrestricted(client)
        if principal is None:
            return None
        allows = self.acl.allows
        return lambda queue: allows(principal, "produce", queue) or allows(principal, "consume", queue)

    def may_produce(self, client: bytes) -> Callable[[str], bool]:
        """Whether this (already admitted) client may produce to a queue: METADATA ``settings``
        lists only those, as DESCRIBE_QUEUE ``auto_create`` needs ``produce``."""
        principal = self._unrestricted(client)
        if principal is None:
            return lambda queue: True
        return lambda queue: self.acl.allows(principal, "produce", queue)

    @staticmethod
    def required(op: Op, params: dict[str, Any]) -> list[tuple[str, str]]:
        if op == Op.PRODUCE:
            return [("produce", params["queue"])]
        if op in (Op.FETCH, Op.LIST_OFFSETS, Op.COMMITTED):
            return [("consume", params["queue"])]
        if op == Op.SUBSCRIBE:
            need = [("consume", params["queue"])]
            return need + ([("consume", GROUP_PREFIX + params["group"])] if params.get("group") else [])
        if op == Op.SETTLE:
            return [("consume", params["queue"]), ("consume", GROUP_PREFIX + params["group"])]
        if op == Op.COMMIT:
            if params.get("forget"):
                return [("admin", params["queue"])]
            return [("consume", params["queue"]), ("consume", GROUP_PREFIX + params["group"])]
        if op in (Op.CREATE_QUEUE, Op.DELETE_QUEUE, Op.ALTER_QUEUE):
            return [("admin", params["name"])]
        if op in (Op.REDRIVE, Op.PURGE):
            return [("admin", params["queue"])]
        if op == Op.DESCRIBE_QUEUE:
            return [("produce", params["name"])] if params.get("auto_create") else [("any", "*any")]
        if op in ACL_OPS:
            return [("admin", "*")]
        return [("admin", "*internal")]  # anything else: no ACL names it (NODE_OPS are refused before)

    def _why_not(self, principal: str, serial: int | None) -> str:
        if principal == NO_TLS:
            return (
                "its stream transport requires TLS with a client certificate (`fabric auth add-client`; "
                "the client finds NAME.pem beside FABRIC_CLIENT_CERT and ca.crt beside FABRIC_SERVER_CERT)"
            )
        if serial is None:
            return "its key is not allowed (revoked?)"
        return "its certificate is not allowed (revoked?)"

    def _refuse(self, principal: str, operation: str, resource: str, why: str) -> None:
        self.refused[principal] = self.refused.get(principal, 0) + 1
        now = time.monotonic()
        if now - self._last_log > 1.0:
            self._last_log = now
            log.warning("refused: principal %r may not %s %r: %s", principal, operation, resource, why)
        raise NotAuthorized(f"principal {principal!r} may not {operation} {resource!r}: {why}")

    def close(self) -> None:
        self.keys.close()


def _lacks(principal: str, missing: list[tuple[str, str]]) -> str:
    """Which ACLs a refused request lacks, every one of them (a SUBSCRIBE with a group needs
    ``consume`` on the queue and on the group), and the commands that would add them."""
    named = " and ".join(f"{o} on {r if r.startswith((GROUP_PREFIX, '*')) else 'queue:' + r}" for o, r in missing)
    adds = "; ".join(f"fabric acl add {principal} {o} {r}" for o, r in missing if not r.startswith("*"))
    return f"{principal} lacks {named}" + (f" ({adds})" if adds else "")
