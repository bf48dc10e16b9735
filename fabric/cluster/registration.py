"""A registration in the metadata store: a key held under a lease, never taken from a live one.

A storage node (``/fabric/nodes/<name>``, :class:`~fabric.cluster.agent.NodeAgent`) and a router
(``/fabric/routers/<name>``, :class:`~fabric.router.map_follower.MapFollower`) register the same
way: grant a lease (or keep the one held), create the key under it only if the key is absent,
and read it back in the same transaction. The key's create_revision names the registration
(a node's *node epoch*). If another lease holds the key (an earlier incarnation whose lease has
not lapsed yet, or another process wrongly using the name) the lease just granted is revoked and
the caller tries again later: a live registration is never stolen. If the key is held by the
caller's own lease, an earlier try whose answer was lost did succeed. On a graceful stop the
lease is revoked at once (:func:`release`) instead of left to lapse.

Pure: the store is passed in; a caller that keeps the lease alive decides when (its own clock).
"""

from __future__ import annotations

from fabric.cluster.meta import Compare, Get, MetaStore, MetaUnavailable, Put


def register(meta: MetaStore, key: str, value: bytes, lease: int, ttl_s: int) -> tuple[int, int]:
    """``(lease, create_revision)`` of ``key`` created with ``value`` under ``lease`` (kept if
    etcd still knows it, else a new one of ``ttl_s``); ``(0, 0)`` when another lease holds the
    key. Raises MetaUnavailable when etcd cannot be reached (try again later)."""
    if lease and meta.lease_keepalive(lease) == 0:
        lease = 0
    if not lease:
        lease = meta.lease_grant(ttl_s)
    result = meta.txn([Compare.absent(key)], [Put(key, value, lease)], [Get(key)])
    if result.succeeded:
        return lease, result.revision
    held = result.responses[0][0] if result.responses and result.responses[0] else None
    if held is None or held.lease != lease:  # someone else's (an older incarnation)
        meta.lease_revoke(lease)
        return 0, 0
    return lease, held.create_revision  # an earlier try whose answer was lost did succeed


def release(meta: MetaStore, lease: int) -> None:
    """Give a registration up now (a graceful stop): its key goes with the lease. Best effort:
    with etcd out of reach the lease lapses by itself."""
    if lease:
        try:
            meta.lease_revoke(lease)
        except MetaUnavailable:
            pass
