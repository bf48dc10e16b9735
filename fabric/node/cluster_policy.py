"""A cluster node's side of the cluster's ACLs and quotas (``fabric/cluster/policy.py``: one etcd
key each): changes go to etcd through the cluster thread without blocking the loop, and what
etcd holds is applied here whenever it moves.

Quotas in a cluster are enforced per store: each node charges the PRODUCE requests it takes as a
partition's leader to its own buckets (Kafka's per-broker quotas), so a principal writing to
partitions led by three nodes may send up to three times its quota in all.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fabric.errors import FabricError
from fabric.node.purgatory import Deferred
from fabric.node.quotas import Quota
from fabric.protocol import frames as fr
from fabric.security.acl import Acl, Rule

if TYPE_CHECKING:
    from fabric.node.broker import Broker
    from fabric.node.cluster_member import ClusterMember

log = logging.getLogger("fabric.broker")


def _answer(broker: Broker, client: bytes, header: fr.Header) -> Any:
    def done(result: Any) -> None:
        if isinstance(result, FabricError):
            broker._error(client, header, (), result)
        elif not header.flags & fr.FLAG_NO_REPLY:
            broker._reply(client, header, result)

    return done


def change_acl(broker: Broker, member: ClusterMember, client: bytes, header: fr.Header, rule: Rule, add: bool) -> None:
    """ACL_ADD / ACL_REMOVE: written to etcd; the reply once it is. Raises Deferred."""
    member.change_acl(rule.to_json(), add, _answer(broker, client, header))
    log.info("ACL %s (cluster): %s", "add" if add else "remove", rule.to_json())
    raise Deferred


def set_quota(broker: Broker, member: ClusterMember, client: bytes, header: fr.Header, quota: Quota) -> None:
    """QUOTA_SET: written to etcd; the reply once it is. Raises Deferred."""
    member.set_quota(quota.to_json(), _answer(broker, client, header))
    raise Deferred


def apply(broker: Broker, rules: list[dict[str, str]] | None, quotas: list[dict[str, Any]] | None) -> None:
    """What etcd holds now (None: unchanged) becomes this node's rules and quotas."""
    if rules is not None and broker.access is not None:
        acl = Acl()
        for raw in rules:
            try:
                acl.add(Rule.from_json(raw))
            except (FabricError, KeyError, TypeError):
                log.warning("ignoring an unreadable ACL rule from etcd: %r", raw)
        if acl.rules != broker.access.acl.rules:
            broker.access.acl = acl
            log.info("ACLs from etcd: %d rule(s)", len(acl.rules))
    for entry in quotas or ():
        try:
            q = Quota.checked(**entry)
        except (FabricError, TypeError) as exc:
            log.warning("ignoring an unreadable quota from etcd: %r (%s)", entry, exc)
            continue
        held = broker.quotas.quotas.get(q.target)
        if held != q and (held is not None or q.messages_per_s or q.bytes_per_s):
            broker.quotas.set(q, broker._now_ms)
            log.info(
                "quota %s from etcd: %d msg/s, %d B/s (burst %d ms)",
                q.target,
                q.messages_per_s,
                q.bytes_per_s,
                q.burst_ms,
            )
