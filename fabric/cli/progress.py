"""A progress line for long work (a Spark job, moves being carried out, a cluster stopping): one
line on stderr, redrawn in place with the time taken so far (rich), when stderr is a terminal;
nothing at all under --json or when stderr is a pipe or a file, so scripts and logs see only
what the command prints anyway."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    """``update(text)`` shows ``text (N s)``; the line is started by the first update and removed
    by ``close()`` (or leaving the ``with`` block). Quiet when ``quiet`` (--json) or the stream is
    not a terminal."""

    def __init__(self, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and _isatty(self.stream)
        self._status: Any = None
        self._started = time.monotonic()

    def update(self, text: str) -> None:
        if not self.enabled:
            return
        line = f"{text} ({time.monotonic() - self._started:.0f} s)"
        if self._status is None:
            from rich.console import Console

            self._status = Console(file=self.stream).status(line)
            self._status.start()
        else:
            self._status.update(line)

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a real file
        return False
