"""Several clusters in one etcd: a MetaStore that puts every key under ``/clusters/<name>``.

The cluster logic names its keys from ``/fabric/`` (``fabric.cluster.keys``). A cluster config
with ``[cluster] name = "orders-eu"`` runs against ``Namespaced(client, "orders-eu")``, which
prefixes every key it sends and strips the prefix from every key it returns, so two clusters
(or the tests of one run sharing one etcd) never see each other's keys. Revisions, leases and
watches are etcd's own and unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from fabric.cluster.meta import Compare, Delete, Get, KeyValue, MetaStore, Put, TxnOp, TxnResult, Watch, WatchEvent


def cluster_prefix(name: str) -> str:
    return f"/clusters/{name}"


class _NamespacedWatch:
    def __init__(self, inner: Watch, strip: int) -> None:
        self._inner = inner
        self._strip = strip

    def poll(self, timeout_s: float) -> list[WatchEvent]:
        return [
            WatchEvent(e.type, dataclasses.replace(e.kv, key=e.kv.key[self._strip :]))
            for e in self._inner.poll(timeout_s)
        ]

    def cancel(self) -> None:
        self._inner.cancel()


class Namespaced:
    """``MetaStore`` over another, every key under ``/clusters/<name>``."""

    def __init__(self, inner: MetaStore, name: str) -> None:
        self.inner = inner
        self.prefix = cluster_prefix(name)
        self._n = len(self.prefix)

    def _kv(self, kv: KeyValue) -> KeyValue:
        return dataclasses.replace(kv, key=kv.key[self._n :])

    def _op(self, op: Any) -> Any:
        return dataclasses.replace(op, key=self.prefix + op.key)

    def get(self, key: str) -> KeyValue | None:
        kv = self.inner.get(self.prefix + key)
        return self._kv(kv) if kv is not None else None

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        kvs, rev = self.inner.get_prefix(self.prefix + prefix)
        return [self._kv(kv) for kv in kvs], rev

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        return self.inner.put(self.prefix + key, value, lease)

    def delete(self, key: str, prefix: bool = False) -> int:
        return self.inner.delete(self.prefix + key, prefix)

    def txn(self, compare: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp] = ()) -> TxnResult:
        result = self.inner.txn(
            [self._op(c) for c in compare], [self._op(o) for o in success], [self._op(o) for o in failure]
        )
        return TxnResult(result.succeeded, result.revision, [[self._kv(kv) for kv in r] for r in result.responses])

    def lease_grant(self, ttl_s: int) -> int:
        return self.inner.lease_grant(ttl_s)

    def lease_keepalive(self, lease: int) -> int:
        return self.inner.lease_keepalive(lease)

    def lease_revoke(self, lease: int) -> None:
        self.inner.lease_revoke(lease)

    def watch(self, prefix: str, start_revision: int) -> Watch:
        return _NamespacedWatch(self.inner.watch(self.prefix + prefix, start_revision), self._n)

    def close(self) -> None:
        self.inner.close()


__all__ = ["Delete", "Get", "Namespaced", "Put", "cluster_prefix"]
