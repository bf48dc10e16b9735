"""Rate limits: token buckets per queue and per principal (issue 12, item 4).

Theory of operation
-------------------
A quota names a target, ``queue:NAME`` or ``principal:NAME`` (the client's name from its key
when authentication is on; every client is ``principal:anonymous`` without it), and a rate in
messages per second and/or bytes per second, with a burst of ``burst_ms`` worth of it. Each
PRODUCE is charged to every bucket that applies (its queue's, its principal's) when it arrives;
a request is admitted while its buckets have tokens, and its charge may take them into debt.
The reply then carries ``throttle_ms``, the time the deepest debt takes to repay, and the client
waits that long before it sends more (Kafka's quota behaviour). A request that arrives while a
bucket is still in debt (a client with several requests in flight, or one that does not wait) is
refused with THROTTLED and ``retry_after_ms`` before anything is written; the client library
waits that long and sends it again (not counted as a retry). A producer over its quota is slowed,
not failed, and nothing is lost. Quotas are set in the config (``[quotas]``) and
at runtime (QUOTA_SET; stored in meta.sqlite, they override the config's).
"""

from __future__ import annotations

from dataclasses import dataclass

from fabric.errors import BadParameter, Throttled
from fabric.node.throttle import TokenBucket


@dataclass(frozen=True, slots=True)
class Quota:
    target: str  # "queue:NAME" or "principal:NAME"
    messages_per_s: int = 0  # 0 = no limit
    bytes_per_s: int = 0
    burst_ms: int = 1000

    @classmethod
    def checked(cls, target: str, messages_per_s: int, bytes_per_s: int, burst_ms: int = 1000) -> Quota:
        kind, _, name = target.partition(":")
        if kind not in ("queue", "principal") or not name:
            raise BadParameter(f"quota target {target!r}: queue:NAME or principal:NAME")
        for what, v in (("messages_per_s", messages_per_s), ("bytes_per_s", bytes_per_s)):
            if type(v) is not int or v < 0:
                raise BadParameter(f"quota {what} must be an integer >= 0 (0 = no limit), got {v!r}")
        if type(burst_ms) is not int or not 1 <= burst_ms <= 60_000:
            raise BadParameter(f"quota burst_ms must be 1..60000, got {burst_ms!r}")
        return cls(target, messages_per_s, bytes_per_s, burst_ms)

    def to_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "messages_per_s": self.messages_per_s,
            "bytes_per_s": self.bytes_per_s,
            "burst_ms": self.burst_ms,
        }


class Quotas:
    def __init__(self) -> None:
        self.quotas: dict[str, Quota] = {}
        self._buckets: dict[str, tuple[TokenBucket | None, TokenBucket | None]] = {}
        # target -> the waits its clients were told, summed: throttle_ms of the replies and
        # retry_after_ms of THROTTLED (a client sends nothing more for that long)
        self.throttled_ms: dict[str, int] = {}
        self.refused: dict[str, int] = {}  # target -> requests refused THROTTLED

    @property
    def active(self) -> bool:
        return bool(self.quotas)

    def set(self, q: Quota, now_ms: int) -> None:
        if not q.messages_per_s and not q.bytes_per_s:
            self.quotas.pop(q.target, None)
            self._buckets.pop(q.target, None)
            return
        self.quotas[q.target] = q

        def bucket(rate: int) -> TokenBucket | None:
            return TokenBucket(rate, max(1, rate * q.burst_ms // 1000), now_ms=now_ms) if rate else None

        self._buckets[q.target] = (bucket(q.messages_per_s), bucket(q.bytes_per_s))

    def charge(self, principal: str, queue: str, messages: int, nbytes: int, now_ms: int) -> int:
        """Charge one PRODUCE; returns the throttle time (ms) to hand back. Raises THROTTLED
        (nothing charged) when a bucket is still in debt. Either wait told to the client (it
        sends nothing more for that long) is added to its targets' ``throttled_ms``."""
        targets = [t for t in (f"queue:{queue}", f"principal:{principal}") if t in self._buckets]
        if not targets:
            return 0
        debts = {}
        for t in targets:
            for b in self._buckets[t]:
                if b is not None:
                    b.allowance(0, now_ms)  # refill to now
            debts[t] = max((b.debt_ms() for b in self._buckets[t] if b is not None), default=0)
        in_debt = {t: d for t, d in debts.items() if d > 0}
        if in_debt:
            t, debt = max(in_debt.items(), key=lambda x: x[1])
            for target in in_debt:
                self.refused[target] = self.refused.get(target, 0) + 1
                self.throttled_ms[target] = self.throttled_ms.get(target, 0) + debt
            exc = Throttled(f"{t} is {debt} ms over its quota; retry after that")
            exc.details = {"retry_after_ms": debt}
            raise exc
        owed = {}
        for t in targets:
            mb, bb = self._buckets[t]
            for b, n in ((mb, messages), (bb, nbytes)):
                if b is not None:
                    b.spend(n)
            owed[t] = max((b.debt_ms() for b in (mb, bb) if b is not None), default=0)
        throttle = max(owed.values())
        if throttle:
            for t, d in owed.items():
                if d:
                    self.throttled_ms[t] = self.throttled_ms.get(t, 0) + throttle
        return throttle
