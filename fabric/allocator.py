"""The C allocator's settings for a process that moves batches of hundreds of KiB.

glibc's malloc gives an allocation of 128 KiB or more its own ``mmap`` and hands the pages back on
free, and trims the heap's free top back to the kernel past 128 KiB. A producer encoding 256 KiB
batches, a node reading them and a consumer taking pushes of that size allocate and free such
buffers thousands of times a second, so every one of them page-faults its memory in again: on the
2-vCPU VM of docs/performance.md that made encoding a batch of 1 KiB records cost 2.2 us a record
instead of 0.17, and the whole producer -> node -> consumer pipeline 35-45% slower. ``tune()``
raises both thresholds to 32 MiB, so freed buffers stay in the heap and are reused warm. The price
is memory the process keeps: at most 32 MiB of freed heap per malloc arena, which the next batch
reuses.

Called by the node, the router and the first Producer or Consumer of a process; does nothing
where the C library is not glibc, and nothing when ``FABRIC_MALLOC=default`` is in the
environment (to leave the allocator as the application set it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
THRESHOLD_BYTES = 32 << 20  # glibc's ceiling for the mmap threshold on 64-bit is 32 MiB

_lock = threading.Lock()
_done: bool | None = None  # None: not tried yet; else whether the settings took


def tune() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True when they are in effect."""
    global _done
    with _lock:
        if _done is None:
            _done = _apply()
        return _done


def _apply() -> bool:
    if os.environ.get("FABRIC_MALLOC", "").strip().lower() == "default":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only (musl has mallopt as a no-op)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, THRESHOLD_BYTES))
    if not ok:
        log.debug("mallopt refused the thresholds; the allocator keeps its defaults")
    return ok
