"""Brokerless sockets for ``mode = "direct"`` queues: producers PUSH straight to consumers' PULL.

A direct consumer binds a PULL socket and registers its endpoint with the node that
coordinates the queue (SUBSCRIBE ``kind = "direct"``); producers learn the endpoints from
DESCRIBE_QUEUE and keep one PUSH socket per consumer. Nothing goes through a node and nothing is
stored: delivery is at most once. A consumer that is gone or not keeping up (its pipe full) makes
a send fail at once rather than wait: the message is dropped and the producer says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import zmq

from fabric.transport.endpoints import ipv6

NOBLOCK = int(zmq.NOBLOCK)
DEFAULT_BIND = os.environ.get("FABRIC_DIRECT_BIND", "tcp://127.0.0.1:*")
HWM = 100_000
CONNECT_WAIT_MS = 500  # a consumer just learnt of: how long its first send waits for the connection


class PeerPush:
    """One PUSH socket per consumer endpoint (so a key can pick its consumer)."""

    def __init__(self) -> None:
        self._ctx: zmq.Context = zmq.Context.instance()
        self.socks: dict[str, zmq.Socket] = {}
        self._fresh: set[str] = set()  # connected lately, not sent to yet

    def update(self, endpoints: Iterable[str]) -> None:
        wanted = set(endpoints)
        for e in [e for e in self.socks if e not in wanted]:
            self.socks.pop(e).close(linger=0)
            self._fresh.discard(e)
        for e in wanted - set(self.socks):
            s = self._ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.IPV6, ipv6(e))  # a consumer at tcp://[::1]:PORT
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, HWM)
            s.setsockopt(zmq.IMMEDIATE, 1)  # nothing queued for a consumer that is not connected
            s.connect(e)
            self.socks[e] = s
            self._fresh.add(e)

    def send(self, endpoint: str, frame: bytes | bytearray) -> bool:
        """False when that consumer cannot take it now (gone, or its pipe is full)."""
        s = self.socks.get(endpoint)
        if s is None:
            return False
        if endpoint in self._fresh:  # its TCP connection may still be on its way: wait for it once
            self._fresh.discard(endpoint)
            s.poll(CONNECT_WAIT_MS, zmq.POLLOUT)
        try:
            s.send(frame, NOBLOCK, copy=len(frame) < 65536)
            return True
        except zmq.ZMQError:
            return False

    def close(self) -> None:
        for s in self.socks.values():
            s.close(linger=200)
        self.socks.clear()


class PeerPull:
    """A direct consumer's PULL socket, bound where producers can reach it."""

    def __init__(self, bind: str | None = None) -> None:
        self._ctx: zmq.Context = zmq.Context.instance()
        self.sock = self._ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.IPV6, ipv6(bind or DEFAULT_BIND))
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, HWM)
        self.sock.bind(bind or DEFAULT_BIND)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def recv(self, timeout_ms: int) -> bytes | None:
        if not self.sock.poll(max(0, timeout_ms)):
            return None
        try:
            return self.sock.recv(NOBLOCK)
        except zmq.Again:
            return None

    def recv_nowait(self) -> bytes | None:
        try:
            return self.sock.recv(NOBLOCK)
        except zmq.Again:
            return None

    def close(self) -> None:
        self.sock.close(linger=0)
