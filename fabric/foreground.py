"""A process's event loop in the foreground (a storage node's, a router's): it serves until
SIGINT or SIGTERM asks it to stop, and ``on_ready`` is told once it is built and bound."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any, Protocol, TypeVar


class Loop(Protocol):
    def stop(self) -> None: ...

    def serve_forever(self) -> None: ...


L = TypeVar("L", bound=Loop)


def serve_until_signalled(loop: L, on_ready: Callable[[L], Any] | None = None) -> None:
    """Serve ``loop`` on this (the main) thread until SIGINT or SIGTERM."""

    def _stop(signum: int, frame: Any) -> None:
        loop.stop()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    if on_ready is not None:
        on_ready(loop)
    loop.serve_forever()
