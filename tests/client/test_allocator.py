"""fabric.allocator: glibc's mmap and trim thresholds raised once per process, unless opted out."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Prints what tune() said (twice: it takes once per process) and how many allocations of their
# own mapping (glibc's hblks) one 256 KiB buffer made: 0 when it comes from the heap.
PROBE = """
import ctypes
from fabric import allocator
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
print(allocator.tune(), allocator.tune())
before = libc.mallinfo2().hblks
buf = libc.malloc(256 * 1024)
print(libc.mallinfo2().hblks - before)
libc.free(buf)
"""


def run_probe(**env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k != "FABRIC_MALLOC"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True, env={**base, **env}
    )
    return out.stdout.split()


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")


def test_tune_takes_once_and_big_buffers_come_from_the_heap() -> None:
    assert run_probe() == ["True", "True", "0"]


def test_fabric_malloc_default_leaves_the_allocator_alone() -> None:
    assert run_probe(FABRIC_MALLOC="default") == ["False", "False", "1"]
