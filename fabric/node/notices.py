"""Log lines an operator needs but that could come thousands a second: counted, then one line per
key at most every ``interval_ms`` (dead letters by queue and reason, a full disk, fenced producers).
Time is passed in."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field


@dataclass(slots=True)
class Notices:
    log: logging.Logger
    interval_ms: int = 5_000
    _last_ms: dict[tuple[str, ...], int] = field(default_factory=dict)
    _pending: dict[tuple[str, ...], int] = field(default_factory=dict)

    def note(self, now_ms: int, key: tuple[str, ...], count: int, text: str, level: int = logging.INFO) -> None:
        """Count ``count`` events of ``key``; log ``text`` (``{n}``: the count since the last line)
        now if this key was quiet for ``interval_ms``, else fold them into the next line."""
        n = self._pending.pop(key, 0) + count
        last = self._last_ms.get(key)
        if last is not None and now_ms - last < self.interval_ms:
            self._pending[key] = n
            return
        if len(self._last_ms) > 10_000:
            self._last_ms.clear()
        self._last_ms[key] = now_ms
        self.log.log(level, text.replace("{n}", str(n)))
