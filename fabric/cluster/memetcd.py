"""MemoryEtcd: an in-memory, deterministic model of the etcd v3 subset in ``fabric.cluster.meta``.

Theory of operation
-------------------
One store-wide revision counter starts at 1 and is bumped once by every write request (a put,
a delete that deletes something, a txn whose branch wrote something, a lease expiry that deleted
keys). Each key keeps etcd's ``create_revision`` / ``mod_revision`` / ``version``; an absent key
compares as 0 on those targets, and a ``value`` compare on an absent key is false (as in etcd).

Time is virtual: ``advance(now_ms)`` moves the clock and expires every lease whose deadline has
passed, deleting its keys in one revision per lease (lowest lease id first). Keepalive pushes a
lease's deadline to ``now + ttl``.

Every write is appended to a bounded history (``history_max`` events). A watch is a cursor
into it: ``poll`` returns the events under its prefix from its start revision on; if part of
that history has been dropped (or ``compact`` was called past it) the watch raises
``WatchCompacted`` and is dead. ``set_available(False)`` models an outage (no quorum): every
call raises ``MetaUnavailable``, every open watch is lost, and leases do not expire; when the
store comes back every lease gets its full TTL again, as etcd's new leader does on promotion.
Nothing here reads a clock or draws a random number, so a simulation that drives it is
reproducible from its seed.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from fabric.cluster.meta import (
    Compare,
    Get,
    KeyValue,
    MetaUnavailable,
    Put,
    TxnOp,
    TxnResult,
    WatchCompacted,
    WatchEvent,
)


@dataclass(slots=True)
class _Lease:
    ttl_s: int
    expires_ms: int
    keys: set[str] = field(default_factory=set)


class MemoryEtcd:
    """The MetaStore model. Not thread-safe; one simulation drives it."""

    def __init__(self, now_ms: int = 0, *, history_max: int = 10_000, max_txn_ops: int = 8192) -> None:
        self._now_ms = now_ms
        self._revision = 1
        self._kv: dict[str, KeyValue] = {}
        self._keys: list[str] = []  # sorted, for prefix reads
        self._leases: dict[int, _Lease] = {}
        self._next_lease = 0x1000
        self._history: list[WatchEvent] = []
        self._history_revs: list[int] = []
        self._history_max = history_max
        self._compacted = 0  # history up to and including this revision is gone
        self._available = True
        self._watches: list[_MemoryWatch] = []
        self._max_txn_ops = max_txn_ops

    # --- the model's own controls -------------------------------------------------------------

    @property
    def now_ms(self) -> int:
        return self._now_ms

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def available(self) -> bool:
        return self._available

    def advance(self, now_ms: int) -> list[int]:
        """Move the clock to ``now_ms`` (never back) and expire the leases that lapsed; returns
        their ids. While unavailable the clock moves but no lease expires."""
        self._now_ms = max(self._now_ms, now_ms)
        if not self._available:
            return []
        expired = sorted(lid for lid, lease in self._leases.items() if lease.expires_ms <= self._now_ms)
        for lid in expired:
            self._drop_lease(lid)
        return expired

    def set_available(self, available: bool) -> None:
        if available and not self._available:
            for lease in self._leases.values():  # a new etcd leader re-arms every lease
                lease.expires_ms = max(lease.expires_ms, self._now_ms + lease.ttl_s * 1000)
        if not available:
            for watch in self._watches:
                watch._lost = MetaUnavailable("etcd outage: watch lost")
            self._watches.clear()
        self._available = available

    def compact(self, revision: int) -> None:
        """Drop the history up to and including ``revision`` (etcd's compaction)."""
        self._compacted = max(self._compacted, min(revision, self._revision))
        cut = bisect.bisect_right(self._history_revs, self._compacted)
        del self._history[:cut]
        del self._history_revs[:cut]

    def lease_ids(self) -> list[int]:
        return sorted(self._leases)

    # --- MetaStore ----------------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        self._check()
        return self._kv.get(key)

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        self._check()
        return self._range(prefix), self._revision

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        return self.txn((), (Put(key, value, lease),)).revision

    def delete(self, key: str, prefix: bool = False) -> int:
        self._check()
        keys = [kv.key for kv in self._range(key)] if prefix else ([key] if key in self._kv else [])
        if keys:
            self._revision += 1
            for k in keys:
                self._remove(k)
        return len(keys)

    def txn(self, compare: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp] = ()) -> TxnResult:
        self._check()
        if len(success) > self._max_txn_ops or len(failure) > self._max_txn_ops:
            raise ValueError(f"too many operations in txn request (max {self._max_txn_ops})")
        ok = all(self._compare(c) for c in compare)
        ops = success if ok else failure
        puts = [op.key for op in ops if isinstance(op, Put)]
        if len(puts) != len(set(puts)):
            raise ValueError("duplicate key given in txn request")
        for op in ops:
            if isinstance(op, Put) and op.lease and op.lease not in self._leases:
                raise MetaUnavailable(f"requested lease not found ({op.lease:#x})")
        bumped = False
        responses: list[list[KeyValue]] = []
        for op in ops:
            if isinstance(op, Get):
                responses.append(self._range(op.key) if op.prefix else [kv for kv in [self._kv.get(op.key)] if kv])
                continue
            if isinstance(op, Put) or (self._range(op.key) if op.prefix else op.key in self._kv):
                if not bumped:
                    self._revision += 1
                    bumped = True
                if isinstance(op, Put):
                    self._write(op)
                else:
                    for k in [kv.key for kv in self._range(op.key)] if op.prefix else [op.key]:
                        self._remove(k)
            responses.append([])
        return TxnResult(ok, self._revision, responses)

    def lease_grant(self, ttl_s: int) -> int:
        self._check()
        if ttl_s < 1:
            raise ValueError(f"lease ttl must be >= 1 s, got {ttl_s}")
        lid = self._next_lease
        self._next_lease += 1
        self._leases[lid] = _Lease(ttl_s, self._now_ms + ttl_s * 1000)
        return lid

    def lease_keepalive(self, lease: int) -> int:
        self._check()
        found = self._leases.get(lease)
        if found is None:
            return 0
        found.expires_ms = self._now_ms + found.ttl_s * 1000
        return found.ttl_s

    def lease_revoke(self, lease: int) -> None:
        self._check()
        if lease in self._leases:
            self._drop_lease(lease)

    def watch(self, prefix: str, start_revision: int) -> _MemoryWatch:
        self._check()
        watch = _MemoryWatch(self, prefix, start_revision if start_revision > 0 else self._revision + 1)
        self._watches.append(watch)
        return watch

    def close(self) -> None:
        """The model is shared by every client of a simulation: closing one client is a no-op."""

    # --- internals ----------------------------------------------------------------------------

    def _check(self) -> None:
        if not self._available:
            raise MetaUnavailable("etcd unavailable (simulated outage)")

    def _range(self, prefix: str) -> list[KeyValue]:
        lo = bisect.bisect_left(self._keys, prefix)
        out = []
        for key in self._keys[lo:]:
            if not key.startswith(prefix):
                break
            out.append(self._kv[key])
        return out

    def _compare(self, c: Compare) -> bool:
        kv = self._kv.get(c.key)
        if c.target == "value":
            if kv is None:
                return False  # etcd: a value compare on a missing key always fails
            actual: bytes | int = kv.value
        else:
            actual = getattr(kv, c.target) if kv is not None else 0
        want = c.value
        if isinstance(actual, bytes) != isinstance(want, bytes):
            raise ValueError(f"compare {c.target} of {c.key!r} with {type(want).__name__}")
        if c.op == "==":
            return actual == want
        if c.op == "!=":
            return actual != want
        if c.op == "<":
            return actual < want  # type: ignore[operator]
        return actual > want  # type: ignore[operator]

    def _write(self, op: Put) -> None:
        old = self._kv.get(op.key)
        if old is None:
            bisect.insort(self._keys, op.key)
            kv = KeyValue(op.key, op.value, self._revision, self._revision, 1, op.lease)
        else:
            if old.lease and old.lease != op.lease and old.lease in self._leases:
                self._leases[old.lease].keys.discard(op.key)
            kv = KeyValue(op.key, op.value, old.create_revision, self._revision, old.version + 1, op.lease)
        if op.lease:
            self._leases[op.lease].keys.add(op.key)
        self._kv[op.key] = kv
        self._record(WatchEvent("put", kv))

    def _remove(self, key: str) -> None:
        old = self._kv.pop(key)
        del self._keys[bisect.bisect_left(self._keys, key)]
        if old.lease and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        self._record(WatchEvent("delete", KeyValue(key, b"", 0, self._revision, 0)))

    def _drop_lease(self, lid: int) -> None:
        lease = self._leases.pop(lid)
        if lease.keys:
            self._revision += 1
            for key in sorted(lease.keys):
                self._remove(key)

    def _record(self, event: WatchEvent) -> None:
        self._history.append(event)
        self._history_revs.append(event.kv.mod_revision)
        if len(self._history) > 2 * self._history_max:
            drop = len(self._history) - self._history_max
            self._compacted = max(self._compacted, self._history_revs[drop - 1])
            # keep whole revisions: a revision is either all there or compacted
            cut = bisect.bisect_right(self._history_revs, self._compacted)
            del self._history[:cut]
            del self._history_revs[:cut]

    def _events_from(self, revision: int) -> list[WatchEvent]:
        if revision <= self._compacted:
            raise WatchCompacted(f"revision {revision} compacted (history starts after {self._compacted})")
        return self._history[bisect.bisect_left(self._history_revs, revision) :]


class _MemoryWatch:
    def __init__(self, store: MemoryEtcd, prefix: str, start_revision: int) -> None:
        self._store = store
        self._prefix = prefix
        self._next = start_revision
        self._lost: MetaUnavailable | None = None

    def poll(self, timeout_s: float) -> list[WatchEvent]:
        """Never blocks (virtual time): ``timeout_s`` is ignored."""
        if self._lost is None and not self._store.available:
            self._lost = MetaUnavailable("etcd unavailable: watch lost")
        if self._lost is not None:
            raise self._lost
        try:
            events = self._store._events_from(self._next)
        except WatchCompacted as e:
            self._lost = e
            self.cancel()
            raise
        self._next = self._store.revision + 1
        return [ev for ev in events if ev.kv.key.startswith(self._prefix)]

    def cancel(self) -> None:
        if self in self._store._watches:
            self._store._watches.remove(self)
        if self._lost is None:
            self._lost = MetaUnavailable("watch cancelled")
