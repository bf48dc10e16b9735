"""An inproc PAIR by which another thread wakes a ZeroMQ event loop (the flusher's reports, the
cluster thread's events, a router's new map): the loop polls the receiving end beside its
sockets; only the other thread sends on the sending end (a ZeroMQ socket has one owner)."""

from __future__ import annotations

from typing import Any

import zmq


def wake_pair(ctx: zmq.Context[Any], name: str) -> tuple[zmq.Socket[Any], zmq.Socket[Any]]:
    """``(receiving end, sending end)`` of a new inproc PAIR named ``name`` (unique per context)."""
    address = f"inproc://{name}"
    rx = ctx.socket(zmq.PAIR)
    rx.bind(address)
    tx = ctx.socket(zmq.PAIR)
    tx.connect(address)
    return rx, tx


def drain(rx: zmq.Socket[Any]) -> None:
    """Read and drop every wake-up waiting on ``rx`` (what woke the loop is read elsewhere)."""
    while True:
        try:
            rx.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
