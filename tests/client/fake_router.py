"""A fake fabric peer for client tests: a ROUTER socket on 127.0.0.1 served by a thread of its own.
Subclasses write ``_serve`` (bounded in time: it must stop by itself) and answer with ``reply``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import zmq

from fabric.protocol import frames as fr


class FakeRouter:
    def __init__(self, port: int = 0) -> None:
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if port:
            self.sock.bind(f"tcp://127.0.0.1:{port}")
            self.port = port
        else:
            self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def reply(self, ident: bytes, h: fr.Header, params: dict[str, Any], status: int = 0) -> None:
        self.sock.send_multipart([ident, *fr.encode(fr.Header(h.op, h.request_id, fr.FLAG_REPLY, status), params)])

    def requests(self, seconds: float) -> Iterator[tuple[bytes, fr.Header]]:
        """Each request that arrives (its sender and header) until ``stop()`` or ``seconds`` pass."""
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.sock.poll(50):
                ident, *frames = self.sock.recv_multipart()
                yield ident, fr.decode_header(frames[0])

    def _serve(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
