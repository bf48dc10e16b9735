"""A token bucket over a millisecond clock the caller passes in (pure: no clock of its own).

Used by a leader to hold what it sends replicas outside the ISR (replica moves, a replica
catching up) to ``[cluster] move_throttle_bytes_per_s``, so that a move never takes the disk or
the network from producers and consumers. Tokens may go negative: a read is granted whole and
paid for afterwards, and the debt is waited out before the next one.
"""

from __future__ import annotations

MIN_GRANT = 64 * 1024  # a grant below this would not hold one typical batch


class TokenBucket:
    def __init__(self, rate_per_s: int, burst: int | None = None, *, now_ms: int = 0) -> None:
        if rate_per_s <= 0:
            raise ValueError("a token bucket needs a positive rate")
        self.rate = rate_per_s
        self.burst = burst if burst is not None else rate_per_s  # one second's worth
        self.tokens = float(self.burst)
        self._at = now_ms

    def _refill(self, now_ms: int) -> None:
        if now_ms > self._at:
            self.tokens = min(float(self.burst), self.tokens + (now_ms - self._at) * self.rate / 1000)
            self._at = now_ms

    def allowance(self, wanted: int, now_ms: int) -> int:
        """How much may be sent now (up to ``wanted``); 0 while the bucket is in debt."""
        self._refill(now_ms)
        if self.tokens <= 0:
            return 0
        return min(wanted, max(int(self.tokens), MIN_GRANT))

    def spend(self, n: int) -> None:
        self.tokens -= n

    def debt_ms(self) -> int:
        """How long the bucket needs to get out of debt (0 when it has tokens)."""
        return int(-self.tokens * 1000 / self.rate) + 1 if self.tokens < 0 else 0

    def wait_ms(self) -> int:
        """How long until the bucket is out of debt (at least 1 ms)."""
        return max(1, int(-self.tokens * 1000 / self.rate) + 1) if self.tokens <= 0 else 1
