"""A cluster node's placement (``fabric.node.placement``): the cluster map in etcd decides.

Requests for a partition led elsewhere are passed on (``fabric.node.replication``); queue
changes, producer ids, group commits, ACLs and quotas go through the cluster thread
(``fabric.node.cluster_member``) and its controller; appends are replicated before consumers
see them; requests for a queue the map does not name yet wait for it (``fabric.node.cluster_queues``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fabric.errors import BadParameter, FabricError
from fabric.node import cluster_policy, cluster_status
from fabric.node.cluster_queues import ClusterQueues
from fabric.node.purgatory import Deferred
from fabric.node.replication import Replication
from fabric.protocol import frames as fr
from fabric.protocol.requests import (
    AlterQueueParams,
    DescribeQueueParams,
    MetadataParams,
    ReplicaFetchParams,
    SubscribeParams,
)
from fabric.settings import QueueSettings

if TYPE_CHECKING:
    from fabric.node.broker import Broker
    from fabric.node.cluster_member import ClusterMember
    from fabric.node.quotas import Quota
    from fabric.security.acl import Rule


class ClusterPlacement:
    usage_here = False  # a cluster's usage records come with its front end

    def __init__(self, broker: Broker, member: ClusterMember, replication: Replication) -> None:
        self.broker = broker
        self.cluster_ops: ClusterMember | None = member
        self.member = member
        self.replication: Replication | None = replication
        self.repl = replication
        self.queues = ClusterQueues(broker, member, replication)

    def route(self, client: bytes, header: fr.Header, params: Mapping[str, Any], data: Sequence[Any]) -> None:
        self.repl.route(client, header, params, data)

    def leads(self, queue: str, p: int) -> bool:
        return self.repl.leads(queue, p)

    def expand(self, queue: str, partitions: int, done: Callable[[FabricError | None], None]) -> None:
        self.member.alter_queue(
            queue, partitions, lambda result: done(result if isinstance(result, FabricError) else None), forwarded=False
        )

    def check_subscribe(self, queue: str, params: SubscribeParams) -> None:
        coordinated = _coordinated(params)
        if coordinated:
            self.repl.check_coordinator(queue)
        self.repl.check_local(queue, params["partitions"], coordinated)

    def check_internal_append(self, queue: str, p: int) -> None:
        """Only the partition's leader appends (a follower's log is the leader's copy)."""
        if self.repl.holds(queue) is not None:
            self.repl.check_leader(queue, p)

    def replicate(
        self, queue: str, p: int, end: int, client: bytes | None, reply: list[Any] | None, acks_all: bool
    ) -> bool:
        if (queue, p) not in self.repl.roles:
            return False  # not a replicated partition (a queue the map no longer places here)
        if self.repl.leads(queue, p):
            self.repl.on_durable(queue, p, end, client, reply, acks_all)
        return True

    def park_unknown(self, client: bytes, frames: Sequence[Any], params: Mapping[str, Any]) -> bool:
        return self.queues.park_unknown(client, frames, params)

    def queue_op(
        self, client: bytes, header: fr.Header, params: Mapping[str, Any], settings: QueueSettings | None
    ) -> None:
        self.queues.queue_op(client, header, params, settings)

    def alter_op(self, client: bytes, header: fr.Header, params: AlterQueueParams) -> None:
        self.queues.alter_op(client, header, params)

    def describe_elsewhere(
        self, client: bytes, header: fr.Header, params: DescribeQueueParams, data: Sequence[Any]
    ) -> None:
        b, name = self.broker, params["name"]
        if not b.store.has_queue(name):
            self.queues.describe_elsewhere(client, header, params, data)
        if b.store.settings(name).mode == "direct" and not header.flags & fr.FLAG_FORWARDED:
            # a direct queue's consumers register with its coordinator: the registry is there
            leader = self.repl.leader_lookup(name, 0)
            if leader is not None and leader != b.config.node_id:
                self.repl.pass_on(client, header, params, data, leader, name)

    def metadata(self, client: bytes, header: fr.Header, params: MetadataParams, data: Sequence[Any]) -> dict[str, Any]:
        self.queues.metadata_waits(client, header, params, data)  # a queue just created
        return self.member.metadata(params["queues"])

    def mapped_queues(self) -> Mapping[str, Any]:
        queues: Mapping[str, Any] = self.member.metadata(None)["queues"]
        return queues

    def replica_fetch(self, client: bytes, header: fr.Header, params: ReplicaFetchParams) -> None:
        self.repl.handle_fetch(client, header, params)
        raise Deferred

    def init_producer(self, client: bytes, header: fr.Header, name: str | None) -> dict[str, Any]:
        b = self.broker

        def done(result: Any) -> None:
            if isinstance(result, FabricError):
                b._error(client, header, (), result)
            else:
                b._reply(client, header, result)

        self.member.init_producer(name, done)
        raise Deferred

    def check_forget_group(self) -> None:
        raise BadParameter("forgetting a group is not supported in a cluster yet")

    def group_committed(self, queue: str, group: str, offsets: dict[int, int]) -> None:
        self.member.group_committed(queue, group, offsets)

    def set_quota(self, client: bytes, header: fr.Header, quota: Quota) -> None:
        cluster_policy.set_quota(self.broker, self.member, client, header, quota)  # etcd: raises Deferred

    def change_acl(self, client: bytes, header: fr.Header, rule: Rule, add: bool) -> None:
        cluster_policy.change_acl(self.broker, self.member, client, header, rule, add)  # etcd: raises Deferred

    def cluster_status(self, client: bytes, header: fr.Header) -> None:
        cluster_status.from_etcd(self.broker._reply, self.broker._error, self.member, client, header)

    def tick(self, now_ms: int) -> None:
        self.repl.tick(now_ms)
        self.queues.release(now_ms)

    def next_due_ms(self) -> int | None:
        return self.repl.next_due_ms()


def _coordinated(params: SubscribeParams) -> bool:
    """A subscription whose group state one node must hold: queue and key_shared groups, and
    stream groups whose partitions the group assigns."""
    if params["kind"] != "stream":
        return True
    return bool(params["group"]) and params["partitions"] is None and params["offsets"] is None
