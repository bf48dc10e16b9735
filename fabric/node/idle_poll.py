"""Adaptive busy-polling of the node's loop (``[node] idle_poll_us``).

When the loop runs out of work it sleeps in the poller until the next request. Under a steady
stream of requests that sleep is short but costly: the wake-up takes tens of microseconds, and
whatever ran on the CPU meanwhile has evicted the node's code and data from the caches, so the
next request costs about four times what it does warm (docs/performance.md). Like
Seastar's reactor (``--idle-poll-time-us``), the loop then keeps polling for up to
``idle_poll_us`` before it sleeps, yielding the CPU between looks so that anything else runnable
there still runs.

It polls only while polling pays: every idle spell (spun or slept) that ended within the budget
counts as a hit, and the loop spins only while at least half of the recent spells were hits. An
idle node, or one serving occasional requests, never spins; one serving a steady stream spends up
to the budget per idle spell, at most one core. ``idle_poll_us = 0`` turns it off (a laptop, a
host with more nodes than cores).

Sans-IO: the loop asks :meth:`IdlePoll.spin_s` how long to poll before it sleeps and reports each
spell's length to :meth:`IdlePoll.idle_ended`.
"""

from __future__ import annotations

from fabric.settings import IDLE_POLL_US_MAX

HIT_RATE = 0.5  # spin while at least this share of recent idle spells ended within the budget
WEIGHT = 0.1  # of the newest spell in the running share (about the last ten count)


class IdlePoll:
    def __init__(self, budget_us: int) -> None:
        if not 0 <= budget_us <= IDLE_POLL_US_MAX:
            raise ValueError(f"idle_poll_us must be 0..{IDLE_POLL_US_MAX}, got {budget_us}")
        self.budget_s = budget_us / 1e6
        self.hit_rate = 0.0
        self.spells = 0  # idle spells seen, and how many were spun through
        self.spun = 0

    def spin_s(self) -> float:
        """How long to poll without sleeping now: the budget while polling pays, else 0."""
        if self.budget_s and self.hit_rate >= HIT_RATE:
            self.spun += 1
            return self.budget_s
        return 0.0

    def idle_ended(self, idle_s: float) -> None:
        """An idle spell lasted ``idle_s`` (until a request came, or a timer fell due)."""
        self.spells += 1
        hit = 1.0 if idle_s <= self.budget_s else 0.0
        self.hit_rate += WEIGHT * (hit - self.hit_rate)
