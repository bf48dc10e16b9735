"""Endpoint strings: which forms a client accepts, checked before any socket is made. Pure."""

from __future__ import annotations

from fabric.errors import BadParameter

FORMS = "tcp://HOST:PORT (ZeroMQ), fabric://HOST:PORT (stream transport) or ipc://PATH"


def check_endpoint(endpoint: str) -> str:
    """``endpoint`` if it is one a client can connect to, else BadParameter naming the forms. A
    cluster may be given as a comma-separated list of tcp:// endpoints (any node is an entry
    point; the client uses one at a time and moves to the next when its link is lost)."""
    if "," in endpoint:
        parts = [e.strip() for e in endpoint.split(",")]
        for e in parts:
            if not e.startswith("tcp://"):
                raise BadParameter(f"a list of endpoints takes tcp://HOST:PORT entries only, got {e!r} in {endpoint!r}")
            _check_one(e)
        return ",".join(parts)
    return _check_one(endpoint)


def ipv6(endpoint: str) -> int:
    """1 for a ``tcp://[ADDRESS]:PORT`` endpoint (an IPv6 literal in brackets), else 0: the value
    of a ZeroMQ socket's IPV6 option before it binds or connects there. Only there: a listener
    with IPV6 on binds 127.0.0.1 as ``[::ffff:127.0.0.1]`` (dual stack), and a client with it may
    resolve ``localhost`` to ::1 where the node listens on 127.0.0.1 only."""
    return int(endpoint.startswith("tcp://["))


def _check_one(endpoint: str) -> str:
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "fabric", "ipc", "inproc"):
        raise BadParameter(f"endpoint {endpoint!r} is not one of {FORMS}")
    if scheme in ("ipc", "inproc"):
        if not rest:
            raise BadParameter(f"endpoint {endpoint!r} names no path; expected {FORMS}")
        return endpoint
    host, colon, port = rest.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [::1]
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadParameter(f"endpoint {endpoint!r} needs a host and a port 1-65535; expected {FORMS}")
    return endpoint
