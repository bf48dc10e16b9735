"""A connection counts the links it lost (``generation``), so the Producer resends at once
instead of waiting for its request timeout; with ``heartbeat_ms`` a silent peer counts too."""

from __future__ import annotations

import socket
import time

import zmq

from fabric.transport.connection import Connection
from fabric.transport.stream_client import StreamConnection


def _wait_for(pred, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_zeromq_link_loss_moves_the_generation():
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    conn = Connection(f"tcp://127.0.0.1:{port}", heartbeat_ms=500)
    try:
        assert conn.watch_fds()
        assert _wait_for(lambda: conn.send_frames([b"x"]))  # connected
        assert conn.generation() == 0
        router.close(0)
        assert _wait_for(lambda: conn.generation() == 1)
    finally:
        conn.close()


def test_zeromq_without_heartbeat_keeps_no_watch():
    conn = Connection("tcp://127.0.0.1:1", timeout_ms=100)
    try:
        assert conn.watch_fds() == [] and conn.generation() == 0
    finally:
        conn.close()


def test_stream_keepalive_options_and_a_closed_link():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    conn = StreamConnection(f"fabric://127.0.0.1:{port}", heartbeat_ms=1000)
    try:
        peer, _ = listener.accept()
        sock = conn._sock
        assert sock is not None
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 1000
        assert conn.generation() == 0
        peer.close()
        assert _wait_for(lambda: conn.recv_nowait() is None and conn.generation() == 1)
    finally:
        conn.close()
        listener.close()
