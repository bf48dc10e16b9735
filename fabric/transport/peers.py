"""A node's DEALER sockets to the other nodes of its cluster (replica fetches go out on them).

One socket per peer node, created when the cluster map first names the peer and re-made when
its endpoint changes; each sits in the node's poller beside the ROUTER socket, so replies are
read by the event loop like requests are. Sends never block: a full pipe or an unknown peer
makes ``send`` return False, and the caller retries on its next tick. Each socket's monitor
tells ``on_link(peer, up)`` when its link goes down (a message in flight on it may be lost) and
when a handshake brings it back (a new peer is down until its first). With authentication on,
each socket is a CurveZMQ client with the cluster's internal key pair (``curve``: public, secret,
the nodes' public key), so the peer names it the internal principal.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

import zmq

from fabric.transport.endpoints import ipv6


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
        self._monitors: dict[str, zmq.Socket[Any]] = {}
        self.on_link: Callable[[str, bool], None] = lambda peer, up: None

    def update(self, endpoints: Mapping[str, str]) -> None:
        """Connect to every peer in ``endpoints`` (node id -> endpoint); drop the ones gone."""
        for name in list(self.sockets):
            if endpoints.get(name) != self._endpoints.get(name):
                self._close(name)
        for name, endpoint in endpoints.items():
            if name not in self.sockets:
                sock = self._ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.IPV6, ipv6(endpoint))  # a peer at tcp://[::1]:PORT
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 1000)
                sock.setsockopt(zmq.IMMEDIATE, 1)
                sock.setsockopt(zmq.HEARTBEAT_IVL, 250)  # a paused or cut-off peer is down within 1 s
                sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 1000)
                sock.setsockopt(zmq.RECONNECT_IVL, 100)
                sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
                if self._curve is not None:
                    use_curve(sock, self._curve)
                mon = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
                sock.connect(endpoint)
                self._poller.register(sock, zmq.POLLIN)
                self._poller.register(mon, zmq.POLLIN)
                self.sockets[name] = sock
                self._monitors[name] = mon
                self._endpoints[name] = endpoint
                self.on_link(name, False)

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
        """Read every waiting reply from the peers that ``events`` says are readable, and what
        their monitors say of their links."""
        for name, mon in self._monitors.items():
            if mon in events:
                self._link_events(name, mon)
        for sock in self.sockets.values():
            if sock in events:
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    on_message(frames)

    def _link_events(self, name: str, mon: zmq.Socket[Any]) -> None:
        while True:
            try:
                frames = mon.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = struct.unpack_from("=H", frames[0])[0] if len(frames[0]) >= 6 else 0
            if event == zmq.EVENT_DISCONNECTED:
                self.on_link(name, False)
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.on_link(name, True)

    def _close(self, name: str) -> None:
        sock = self.sockets.pop(name)
        self._endpoints.pop(name, None)
        self._poller.unregister(sock)
        mon = self._monitors.pop(name, None)
        if mon is not None:
            self._poller.unregister(mon)
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
            mon.close(0)
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
