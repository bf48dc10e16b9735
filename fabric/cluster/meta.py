"""The metadata store interface the cluster logic is written against: the part of etcd's v3 API
that fabric uses (KV, transactions, leases, watches), as plain data and one Protocol.

Theory of operation
-------------------
Two implementations keep this contract: ``fabric.cluster.etcd.EtcdClient`` talks to real etcd
members over the v3 JSON gateway, rotating across endpoints; ``fabric.cluster.memetcd.MemoryEtcd``
is an in-memory model with a virtual clock and injectable outages, driven by the deterministic
simulation. The controller and the nodes' cluster code only ever see ``MetaStore``, so the code
the simulation exercises is the code that runs against etcd.

Keys and values are ``str`` and ``bytes``. Revisions are etcd's: one cluster-wide counter bumped
by every write; a key's ``create_revision`` is the revision of the write that created it (the
controller epoch is the ``create_revision`` of ``/fabric/controller``), ``mod_revision`` that of
its last write, ``version`` the number of writes since creation. A key that does not exist has
create_revision, mod_revision and version 0, so ``Compare.create_revision(k, "==", 0)`` means
"k is absent".

Every call may raise ``MetaUnavailable`` (no member reachable, no quorum, timeout): callers
keep serving with the last map they have and retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from fabric.errors import MetaUnavailable

__all__ = ["MetaUnavailable"]  # re-exported: every MetaStore call may raise it

CompareOp = Literal["==", "!=", "<", ">"]
CompareTarget = Literal["value", "create_revision", "mod_revision", "version"]


class WatchCompacted(MetaUnavailable):
    """A watch asked for history that etcd has compacted away: re-read and watch again."""


class LeaseNotFound(MetaUnavailable):
    """A put (or a txn's put) named a lease that has lapsed or was revoked: grant a new one."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Compare:
    key: str
    target: CompareTarget
    op: CompareOp
    value: bytes | int

    @staticmethod
    def value_is(key: str, value: bytes) -> Compare:
        return Compare(key, "value", "==", value)

    @staticmethod
    def created_at(key: str, revision: int) -> Compare:
        """``key`` exists with this create_revision (0: ``key`` is absent)."""
        return Compare(key, "create_revision", "==", revision)

    @staticmethod
    def modified_at(key: str, revision: int) -> Compare:
        return Compare(key, "mod_revision", "==", revision)

    @staticmethod
    def absent(key: str) -> Compare:
        return Compare(key, "create_revision", "==", 0)


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    key: str
    prefix: bool = False


TxnOp = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    # one entry per op of the branch that ran: the KeyValues a Get found, [] for Put and Delete
    responses: list[list[KeyValue]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: Literal["put", "delete"]
    kv: KeyValue  # for a delete: key and mod_revision of the deletion, value b""


class Watch(Protocol):
    def poll(self, timeout_s: float) -> list[WatchEvent]:
        """Events since the last poll, waiting up to ``timeout_s`` for the first one; raises
        ``WatchCompacted`` or ``MetaUnavailable`` when the watch is lost (re-read, watch again)."""
        ...

    def cancel(self) -> None: ...


class MetaStore(Protocol):
    def get(self, key: str) -> KeyValue | None: ...

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix``, sorted by key, and the store's revision at the read."""
        ...

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Returns the revision of the write."""
        ...

    def delete(self, key: str, prefix: bool = False) -> int:
        """Returns how many keys were deleted."""
        ...

    def txn(self, compare: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp] = ()) -> TxnResult: ...

    def lease_grant(self, ttl_s: int) -> int:
        """A new lease id; keys put with it vanish when it lapses or is revoked."""
        ...

    def lease_keepalive(self, lease: int) -> int:
        """Refresh ``lease``; returns its remaining TTL in seconds, 0 when it no longer exists."""
        ...

    def lease_revoke(self, lease: int) -> None: ...

    def watch(self, prefix: str, start_revision: int) -> Watch:
        """Every change under ``prefix`` from ``start_revision`` on (inclusive)."""
        ...

    def close(self) -> None: ...


def cancel_quietly(watch: Watch | None) -> None:
    """Cancel ``watch`` if there is one; a store that cannot be reached has dropped it anyway."""
    if watch is not None:
        try:
            watch.cancel()
        except MetaUnavailable:
            pass
