"""One leader election on a ``MetaStore``: the cluster controller's and the federation manager's.

Theory of operation
-------------------
A candidate's ``step`` tries, at most every ``retry_ms``, to create its leader key under a lease
with a txn guarded by ``Compare.absent``. The winner's epoch is that key's create_revision; it
keeps the lease alive every ttl/3. A try whose outcome was not seen (the txn's answer lost) is
found out on the next: the key held under our own lease means an earlier try won after all.
Losers revoke the lease they granted for the try and stay standby until the key has vanished
(the winner's lease lapsed or was revoked).

Fencing. Every write the leader makes checks ``fence()`` (``Compare.created_at(key, epoch)``) and
reads the key back (``Get(key)``) so that a failed txn tells whether the key is still ours:
``check_still(result, epoch)`` steps down when it is not. Keepalive finding the lease gone steps
down too; a candidate that stepped down campaigns again like any standby.

What differs between users (the key, its value, the name in the logs, what to clear on winning
or stepping down) is passed in. Time is passed in (``now_ms``); nothing here sleeps or reads a
clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fabric.cluster.meta import Compare, Delete, Get, MetaStore, Put, TxnResult


class Election:
    """One candidate for the post held by ``key``. ``role`` and ``name`` name it in ``log``'s lines;
    ``on_won()`` runs when it wins (before the line is logged), ``on_step_down()`` when it steps
    down (first of all)."""

    def __init__(
        self,
        meta: MetaStore,
        key: str,
        value: bytes,
        *,
        role: str,
        name: str,
        log: logging.Logger,
        lease_ttl_s: int = 10,
        retry_ms: int | None = None,
        on_won: Callable[[], None] | None = None,
        on_step_down: Callable[[], None] | None = None,
    ) -> None:
        self._meta = meta
        self.key = key
        self._value = value
        self._role = role
        self._name = name
        self._log = log
        self._ttl_s = lease_ttl_s
        self._keepalive_ms = max(1, lease_ttl_s * 1000 // 3)
        self._retry_ms = retry_ms if retry_ms is not None else max(1, lease_ttl_s * 1000 // 4)
        self._on_won = on_won
        self._on_step_down = on_step_down
        self.lease = 0  # our lease, held while leader or while a campaign's outcome is unknown
        self.epoch = 0  # the key's create_revision while we hold it; 0 when standby
        self._keepalive_due = 0
        self._campaign_due = 0

    def step(self, now_ms: int) -> None:
        """Keep the lease alive when due, campaign when standby and due. Raises MetaUnavailable."""
        if self.epoch and now_ms >= self._keepalive_due:
            if self._meta.lease_keepalive(self.lease) == 0:
                self.step_down("lease lost")
            else:
                self._keepalive_due = now_ms + self._keepalive_ms
        if not self.epoch and now_ms >= self._campaign_due:
            self._campaign_due = now_ms + self._retry_ms
            self._campaign(now_ms)

    def fence(self) -> Compare:
        """The compare every write of the leader carries: the key is still the one we created."""
        return Compare.created_at(self.key, self.epoch)

    def check_still(self, result: TxnResult, epoch: int) -> None:
        """After a failed txn that read the key back first (``Get(key)``): step down if the key
        is not the one created at ``epoch`` any more."""
        held = result.responses[0] if result.responses else []
        if not held or held[0].create_revision != epoch:
            self.step_down(f"fenced: the {self._role} key is not ours")

    def fenced_txn(self, compares: list[Compare], ops: list[Put | Delete]) -> TxnResult:
        """A write guarded by our epoch; steps down if the key is not ours (the caller raises)."""
        epoch = self.epoch
        result = self._meta.txn([Compare.created_at(self.key, epoch), *compares], ops, [Get(self.key)])
        if not result.succeeded:
            self.check_still(result, epoch)
        return result

    def step_down(self, why: str) -> None:
        if self._on_step_down is not None:
            self._on_step_down()
        if self.epoch:
            self._log.info("%s %s: stepping down from epoch %d (%s)", self._role, self._name, self.epoch, why)
        self.epoch = 0
        self.lease = 0

    def _campaign(self, now_ms: int) -> None:
        current = self._meta.get(self.key)
        if current is not None:
            if self.lease and current.lease == self.lease:  # an earlier try won after all
                self._won(current.create_revision, now_ms)
            return
        if self.lease and self._meta.lease_keepalive(self.lease) == 0:
            self.lease = 0
        if not self.lease:
            self.lease = self._meta.lease_grant(self._ttl_s)
        result = self._meta.txn([Compare.absent(self.key)], [Put(self.key, self._value, self.lease)])
        if result.succeeded:
            self._won(result.revision, now_ms)
        else:
            self._meta.lease_revoke(self.lease)
            self.lease = 0

    def _won(self, epoch: int, now_ms: int) -> None:
        self.epoch = epoch
        self._keepalive_due = now_ms + self._keepalive_ms
        if self._on_won is not None:
            self._on_won()
        self._log.info("%s %s: elected, epoch %d", self._role, self._name, epoch)
