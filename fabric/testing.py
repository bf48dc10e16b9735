"""Processes for the tests, the benchmarks and the demo: a ``fabric up`` subprocess on a free
loopback port (:class:`Node`), and free loopback ports for the processes of a cluster."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack


class Node:
    """A ``fabric up`` subprocess on a free loopback port, stopped by its PID."""

    def __init__(
        self,
        data_dir: str,
        *,
        listen: str = "tcp://127.0.0.1:0",
        extra: list[str] | None = None,
        stream: str | None = None,
    ) -> None:
        """``stream``: also serve the stream transport there (e.g. ``fabric://127.0.0.1:0``)."""
        self.data_dir = data_dir
        cmd = [sys.executable, "-m", "fabric.cli", "up", "--listen", listen, "--data-dir", data_dir]
        if stream:
            cmd += ["--stream-listen", stream]
        # the node's log goes to a file, never to a pipe nobody reads (a full pipe would stop the node)
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (lives as long as the node)
        self.proc = subprocess.Popen(cmd + (extra or []), stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.endpoint = ""
        self.stream_endpoint = ""
        deadline = time.monotonic() + 30
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.search(r"ready on (\S+)", line)
            if m:
                self.endpoint = m.group(1)
                self.ready_line = line.strip()
                if stream:
                    m = re.search(r"stream transport on (\S+)", self.proc.stdout.readline())
                    self.stream_endpoint = m.group(1) if m else ""
                return
        self.stop()
        raise RuntimeError(f"fabric node did not start: {self.log_text()[-2000:]}")

    def log_text(self) -> str:
        """What the node has logged so far."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held open together while picked, so no repeats)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
