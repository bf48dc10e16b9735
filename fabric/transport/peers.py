"""A node's DEALER sockets to the other nodes of its cluster (replica fetches go out on them).

One socket per peer node, created when the cluster map first names the peer and re-made when
its endpoint changes; each sits in the node's poller beside the ROUTER socket, so replies are
read by the event loop like requests are. Sends never block: a full pipe or an unknown peer
makes ``send`` return False, and the caller retries on its next tick. With authentication on,
each socket is a CurveZMQ client with the cluster's internal key pair (``curve``: public, secret,
the nodes' public key), so the peer names it the internal principal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import zmq


class Peers:
    def __init__(
        self,
        ctx: zmq.Context[Any],
        poller: zmq.Poller,
        *,
        identity: bytes,
        curve: tuple[bytes, bytes, bytes] | None = None,
    ) -> None:
        self._ctx = ctx
        self._curve = curve
        self._poller = poller
        self._identity = identity
        self.sockets: dict[str, zmq.Socket[Any]] = {}
        self._endpoints: dict[str, str] = {}

    def update(self, endpoints: Mapping[str, str]) -> None:
        """Connect to every peer in ``endpoints`` (node id -> endpoint); drop the ones gone."""
        for name in list(self.sockets):
            if endpoints.get(name) != self._endpoints.get(name):
                self._close(name)
        for name, endpoint in endpoints.items():
            if name not in self.sockets:
                sock = self._ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 1000)
                sock.setsockopt(zmq.IMMEDIATE, 1)
                sock.setsockopt(zmq.HEARTBEAT_IVL, 500)
                sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 2000)
                sock.setsockopt(zmq.RECONNECT_IVL, 100)
                sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
                if self._curve is not None:
                    use_curve(sock, self._curve)
                sock.connect(endpoint)
                self._poller.register(sock, zmq.POLLIN)
                self.sockets[name] = sock
                self._endpoints[name] = endpoint

    def send(self, name: str, frames: list[Any]) -> bool:
        sock = self.sockets.get(name)
        if sock is None:
            return False
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            return False

    def receive(self, events: Mapping[Any, int], on_message: Any) -> None:
        """Read every waiting reply from the peers that ``events`` says are readable."""
        for sock in self.sockets.values():
            if sock in events:
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    on_message(frames)

    def _close(self, name: str) -> None:
        sock = self.sockets.pop(name)
        self._endpoints.pop(name, None)
        self._poller.unregister(sock)
        sock.close(0)

    def close(self) -> None:
        for name in list(self.sockets):
            self._close(name)


def use_curve(sock: zmq.Socket[Any], curve: tuple[bytes, bytes, bytes]) -> None:
    """Make ``sock`` (not connected yet) a CurveZMQ client: (its public key, its secret key, the
    server's public key)."""
    sock.setsockopt(zmq.CURVE_PUBLICKEY, curve[0])
    sock.setsockopt(zmq.CURVE_SECRETKEY, curve[1])
    sock.setsockopt(zmq.CURVE_SERVERKEY, curve[2])
