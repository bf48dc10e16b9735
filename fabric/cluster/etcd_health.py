"""MemberHealth: which etcd members answer, which do not, and the order a call asks them in.

Theory of operation
-------------------
A member that failed a call (unreachable, no answer in time, "no leader") is *suspect* for a
back-off that doubles with each failure in a row (``backoff_s`` up to ``backoff_max_s``); one
that answers is healthy again at once. A call asks the healthy members first, starting with the
*preferred* one (the member that answered last: the client's connection to it is warm, and the
watch sits there), then the suspects whose back-off is over, then the other suspects, soonest
over first. So a member cut off silently costs one short attempt, after which calls and the
watch go to the others until its back-off is over and it is behind every healthy member anyway:
it is asked again only when no healthy member answers, or it recovers on its own turn.

Pure: time is the ``now`` (seconds, any monotonic origin) each method is given.
"""

from __future__ import annotations

__all__ = ["MemberHealth"]


class MemberHealth:
    """The health of ``n`` members, by index; see the module docstring."""

    def __init__(self, n: int, *, backoff_s: float = 0.5, backoff_max_s: float = 5.0) -> None:
        if n < 1:
            raise ValueError("MemberHealth needs at least one member")
        self.n = n
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.preferred = 0
        self._failures = [0] * n  # failures in a row
        self._suspect_until = [0.0] * n

    def suspect(self, i: int, now: float) -> bool:
        return self._failures[i] > 0 and now < self._suspect_until[i]

    def failures(self, i: int) -> int:
        return self._failures[i]

    def order(self, now: float) -> list[int]:
        """Every member, in the order a call asks them: healthy (preferred first), suspects
        whose back-off is over, the other suspects (soonest over first)."""
        rotation = [(self.preferred + k) % self.n for k in range(self.n)]
        healthy = [i for i in rotation if self._failures[i] == 0]
        lapsed = [i for i in rotation if self._failures[i] > 0 and now >= self._suspect_until[i]]
        waiting = sorted((i for i in rotation if self.suspect(i, now)), key=lambda i: self._suspect_until[i])
        return healthy + lapsed + waiting

    def answered(self, i: int) -> None:
        """Member ``i`` answered: healthy, and the preferred one from now on."""
        self._failures[i] = 0
        self._suspect_until[i] = 0.0
        self.preferred = i

    def failed(self, i: int, now: float) -> None:
        """Member ``i`` failed a call: suspect for the next back-off; the preferred member moves
        to the next healthy one (if any)."""
        self._failures[i] += 1
        backoff = min(self.backoff_max_s, self.backoff_s * 2 ** (self._failures[i] - 1))
        self._suspect_until[i] = now + backoff
        if self.preferred == i:
            healthy = [j for j in self.order(now) if self._failures[j] == 0]
            if healthy:
                self.preferred = healthy[0]
