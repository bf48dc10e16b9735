"""The ZeroMQ ROUTER socket a storage node and a router take requests on: set up once, here.

Both tiers want the same socket: ``ROUTER_MANDATORY`` (a reply to a client that is gone fails
at once instead of vanishing), high-water marks of ``HWM`` messages each way, a ceiling on a
message's size (``MAXMSGSIZE``: a hard limit against memory exhaustion; each tier answers
what is under it but over its own limit), CurveZMQ when authentication is on (``secure``,
before the bind), and a bind whose failure is a ConfigError naming the endpoint. What a request
must be to pass the door is :mod:`fabric.protocol.admission`, which is pure; this module is the
socket.

With authentication on, libzmq attaches the client's principal to each message's frames
(``User-Id``): :func:`authenticated_recv` reads it from the first frame of a connection's first
message and has the caller remember it, so the per-message path stays one ``recv_multipart``
for everything after that first frame.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

import zmq

from fabric.errors import AddressInUse, ConfigError
from fabric.transport.endpoints import ipv6

HWM = 100_000  # messages queued per client each way before sends fail (EAGAIN) or reads stop


def bind_front_door(
    ctx: zmq.Context[Any],
    listen: str,
    *,
    max_message_bytes: int,
    linger_ms: int,
    secure: Callable[[zmq.Socket[Any]], None] | None = None,
) -> tuple[zmq.Socket[Any], str]:
    """A ROUTER socket bound to ``listen`` and the endpoint it got (a port 0 resolved). Raises
    AddressInUse when another process has that address, ConfigError when it cannot bind for
    another reason (the socket closed again)."""
    sock = ctx.socket(zmq.ROUTER)
    if secure is not None:
        secure(sock)
    sock.setsockopt(zmq.IPV6, ipv6(listen))  # tcp://[::1]:PORT
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    try:
        sock.bind(listen)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        if exc.errno == zmq.EADDRINUSE:
            raise AddressInUse(f"{listen} is in use (by another fabric process or another program)") from None
        raise ConfigError(f"cannot listen on {listen}: {exc}") from None
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def authenticated_recv(
    sock: zmq.Socket[Any], known: Container[bytes], learn: Callable[[bytes, zmq.Frame], None]
) -> Callable[[int], list[bytes]]:
    """A ``recv_multipart(flags)`` for an authenticated front door: ``[client, frames...]`` as
    usual, and ``learn(client, first frame)`` called for a client not in ``known`` (the caller
    remembers its principal there)."""
    recv_multipart, getsockopt = sock.recv_multipart, sock.getsockopt

    def recv(flags: int) -> list[bytes]:
        first = sock.recv(flags, copy=False)
        client = first.bytes
        if client not in known:
            learn(client, first)
        rest = recv_multipart(flags) if getsockopt(zmq.RCVMORE) else []
        return [client, *rest]

    return recv
