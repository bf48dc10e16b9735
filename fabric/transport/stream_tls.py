"""TLS on the stream transport: the contexts of both sides and a non-blocking TLS writer.

With authentication on (``[security] keys_dir``) a node's stream listener speaks TLS 1.2 or
1.3 (1.3 when both sides can) and requires a client certificate signed by the deployment's CA
(mutual TLS). The client checks the node's certificate against the same CA and the host name
of its endpoint. The certificate's common name is the connection's principal; which ones are
allowed (and which revoked) is the node's business (:class:`StreamAuth`), checked after the
handshake and again on every request, exactly as for a CurveZMQ connection.

The listener does its handshakes without blocking the node's loop: the first byte of a new
connection says which it is (``0x16``: a TLS handshake record; anything else is served as a
plain stream connection whose every request the node refuses, so that a client without TLS
gets NOT_AUTHORIZED instead of a closed socket), and ``do_handshake`` is retried whenever the
socket is ready, within ``HANDSHAKE_S``.

OpenSSL wants a write it could not finish retried with the same bytes, so the writer keeps the
buffer of an unfinished write and offers it again (``tls_write``); ``sendmsg`` does not exist
on a TLS socket, so queued buffers are joined into chunks of at most ``WRITE_BYTES``.
"""

from __future__ import annotations

import ssl
from collections import deque
from typing import Any, Protocol

HANDSHAKE_S = 5.0  # a connection that has not finished its handshake by then is closed
PENDING_MAX = 256  # handshakes in progress at once; past this the oldest is closed
WRITE_BYTES = 256 * 1024
TLS_RECORD = 0x16  # the first byte of a TLS handshake record (ClientHello)
WAIT = (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError)


class StreamAuth(Protocol):
    """What a stream listener needs from the node's authentication (``fabric.node.access``)."""

    def stream_tls(self) -> ssl.SSLContext:
        """The server context: the nodes' certificate, the CA clients must be signed by."""
        ...

    def admit(self, client: bytes, cert: dict[str, Any] | None) -> None:
        """A connection finished its handshake with this peer certificate (None: it spoke no TLS)."""
        ...

    def handshake_failed(self, peer: str, why: str) -> None:
        """A handshake failed or timed out: count and log it."""
        ...

    def forget(self, client: bytes) -> None:
        """A connection closed."""
        ...


def server_context(cert: str, key: str, ca: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(cafile=ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.num_tickets = 0  # clients make few long-lived connections: no session resumption
    return ctx


def client_context(ca: str, cert_and_key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the server's certificate and host name
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(cafile=ca)
    ctx.load_cert_chain(cert_and_key)
    return ctx


def principal(cert: dict[str, Any] | None) -> tuple[str, int]:
    """(common name, serial number) of a peer certificate as ``SSLSocket.getpeercert()`` gives it."""
    if not cert:
        return "", -1
    name = ""
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                name = value
    try:
        serial = int(cert.get("serialNumber", ""), 16)
    except ValueError:
        serial = -1
    return name, serial


def is_refusal(exc: BaseException) -> bool:
    """True when the peer ended the handshake with an alert (it refused our certificate)."""
    return isinstance(exc, ssl.SSLError) and "ALERT" in str(getattr(exc, "reason", "") or exc).upper()


def tls_write(sock: ssl.SSLSocket, out: deque[Any], chunk: Any) -> tuple[int, Any]:
    """Write ``chunk`` (an unfinished earlier write, or None) and then ``out`` until the socket
    would block. Returns (bytes written, the chunk to offer again or None); raises OSError when
    the connection failed."""
    written = 0
    while True:
        if chunk is None:
            if not out:
                return written, None
            chunk = _take(out)
        try:
            n = sock.send(chunk)
        except WAIT:
            return written, chunk
        written += n
        chunk = None if n >= len(chunk) else memoryview(chunk)[n:]


def _take(out: deque[Any]) -> Any:
    """Up to ``WRITE_BYTES`` from the front of a write queue, as one buffer."""
    first = out.popleft()
    if len(first) >= WRITE_BYTES or not out:
        if len(first) > WRITE_BYTES:
            view = memoryview(first)
            out.appendleft(view[WRITE_BYTES:])
            return view[:WRITE_BYTES]
        return first
    parts, size = [first], len(first)
    while out and size + len(out[0]) <= WRITE_BYTES:
        b = out.popleft()
        parts.append(b)
        size += len(b)
    return b"".join(parts)
