"""A cluster node's placement (``fabric.node.placement``): the cluster map in etcd decides.

Requests for a partition led elsewhere are passed on (``fabric.node.replication``); queue
changes, producer ids, group commits, ACLs and quotas go through the cluster thread
(``fabric.node.cluster_member``) and its controller; appends are replicated before consumers
see them; requests for a queue the map does not name yet wait for it (``fabric.node.cluster_queues``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fabric.errors import BadParameter, FabricError, QueueExists
from fabric.node import cluster_policy, cluster_status
from fabric.node.cluster_queues import ClusterQueues
from fabric.node.purgatory import Deferred
from fabric.node.replication import Replication
from fabric.node.shared import DeadLetterDeferred
from fabric.protocol import frames as fr
from fabric.protocol.batch import BatchHeader
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

log = logging.getLogger("fabric.shared")  # its messages (dead-letter queues) kept their logger

CREATE_RETRY_MS = 5000  # a DLQ (or .late queue) asked of the controller is asked again after this


class ClusterPlacement:
    usage_here = False  # a cluster's usage records come with its front end

    def __init__(self, broker: Broker, member: ClusterMember, replication: Replication) -> None:
        self.broker = broker
        self.cluster_ops: ClusterMember | None = member
        self.member = member
        self.replication: Replication | None = replication
        self.repl = replication
        self.queues = ClusterQueues(broker, member, replication)
        self._creating: dict[str, int] = {}  # internal queues asked of the controller -> when to ask again

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

    def check_coordinator(self, queue: str) -> None:
        self.repl.check_coordinator(queue)

    def internal_target(
        self,
        target: str,
        like: QueueSettings,
        batches: Sequence[bytes | bytearray],
        now_ms: int,
        done: Callable[[FabricError | None], None] | None,
    ) -> bool:
        """``target`` is a cluster queue: created through the controller (this node its first
        leader) and written by its leader, here or elsewhere (with acks=all)."""
        if self.repl.holds(target) is None:
            self._create_internal(target, like, now_ms)
            raise DeadLetterDeferred(f"{target!r} is being created in the cluster")
        if self.repl.leads(target, 0):
            return False
        if done is None:
            raise DeadLetterDeferred(f"{target!r} is led by another node")
        left = [len(batches)]
        first_error: list[FabricError | None] = [None]

        def one(err: FabricError | None) -> None:
            first_error[0] = first_error[0] or err
            left[0] -= 1
            if left[0] == 0:
                done(first_error[0])

        for batch in batches:
            if not self.repl.produce_elsewhere(target, 0, bytes(batch), one):
                one(DeadLetterDeferred(f"no link to the leader of {target!r}"))
        return True

    def _create_internal(self, target: str, like: QueueSettings, now_ms: int) -> None:
        """Ask the controller for ``target`` (a DLQ or .late queue) once every few seconds."""
        if now_ms < self._creating.get(target, 0):
            return
        self._creating[target] = now_ms + CREATE_RETRY_MS
        settings = QueueSettings.from_dict(
            {"partitions": 1, "fsync": like.fsync, "retention_ms": like.retention_ms, "encrypt": like.encrypt}
        )

        def created(result: Any) -> None:
            if isinstance(result, FabricError) and not isinstance(result, QueueExists):
                log.warning("could not create %r in the cluster: %s; will retry", target, result.message)
            else:
                log.info("queue %r created in the cluster for dead letters", target)

        self.member.create_queue(target, settings, created, forwarded=False, leader_hint=self.broker.config.node_id)

    def group_checkpointed(self, queue: str, group: str, state: dict[str, Any]) -> None:
        self.member.group_checkpointed(queue, group, state)

    def trimmed(self, queue: str, p: int) -> None:
        self.repl.leader_fetches.wake(queue, p)

    def stamp_delays(self, queue: str, p: int, batches: list[tuple[bytearray, BatchHeader]]) -> list[int] | None:
        return self.repl.delays.stamp(queue, p, batches)

    def delays_stored(self, queue: str, p: int, row_id: int) -> None:
        self.repl.delays.stored(queue, p, row_id)

    def delay_acks_all(self, queue: str, p: int, acks: str) -> bool:
        if acks != "all":
            return False
        self.repl.delays.check_acks_all(queue, p)  # NOT_ENOUGH_REPLICAS before anything is stored
        return True

    def reply_delayed(
        self, queue: str, p: int, row_id: int, client: bytes, header: fr.Header, reply: dict[str, Any]
    ) -> None:
        # the reply waits until every in-sync replica holds the rows (fabric.node.delay_replication)
        self.repl.delays.reply_when_replicated(queue, p, row_id, client, header, reply)

    def replicas_of(self, queue: str) -> list[list[str]] | None:
        return self.repl.replicas_lookup(queue)

    def produce_elsewhere(self, queue: str, p: int, batch: bytes, done: Callable[[FabricError | None], None]) -> bool:
        return self.repl.produce_elsewhere(queue, p, batch, done)

    def replica_rows(self, queue: str, partitions: int) -> list[dict[str, Any]]:
        repl, rows = self.repl, []
        for p in range(partitions):
            role = repl.roles.get((queue, p))
            if role is None:
                continue
            row: dict[str, Any] = {"queue": queue, "partition": p, "isr": len(role.record.isr), "leader": 0}
            if role.leader is not None and repl.leads(queue, p):
                row["leader"] = 1
                ends = [role.leader.follower_end(r) for r in role.record.isr if r != repl.node_id]
                known = [e for e in ends if e is not None]
                row["lag"] = max((role.leader.log_end - e for e in known), default=0)
                row["under_replicated"] = int(len(role.record.isr) < len(role.record.replicas))
            rows.append(row)
        return rows

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
