"""The progress line of long CLI work: drawn on a real terminal (a pty), absent under --json
and on a pipe."""

from __future__ import annotations

import io
import os
import select

import pytest

from fabric.cli.progress import Progress


def _read_all(fd: int) -> bytes:
    out = b""
    for _ in range(100):  # bounded: the line is a few hundred bytes
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
    return out


def test_a_terminal_gets_the_line_with_the_time_taken():
    if not hasattr(os, "openpty"):
        pytest.skip("no pseudo-terminals here")
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=False) as tty:
            assert tty.isatty()
            with Progress(stream=tty) as progress:
                assert progress.enabled
                progress.update("rebalance: 1 of 3 move(s) carried out")
                progress.update("rebalance: 2 of 3 move(s) carried out")
            tty.flush()
        shown = _read_all(master).decode(errors="replace")
        assert "2 of 3 move(s) carried out (0 s)" in shown
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize("quiet", [True, False])
def test_json_or_a_pipe_gets_nothing(quiet):
    stream = io.StringIO()  # not a terminal
    with Progress(quiet, stream=stream) as progress:
        assert not progress.enabled
        progress.update("usage report: starting Spark")
    assert stream.getvalue() == ""
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=False) as tty, Progress(True, stream=tty) as progress:
            progress.update("quiet under --json")  # a terminal, but --json
        assert _read_all(master) == b""
    finally:
        os.close(master)
        os.close(slave)
