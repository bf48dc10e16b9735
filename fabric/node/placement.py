"""Where a queue's partitions are served: the one seam between a single node and a cluster node.

Theory of operation
-------------------
The broker's handlers do the same work on a single node and on a cluster node; what differs is
*where* a request is served and *who* decides about queues, groups, ACLs and quotas. The broker
asks its ``Placement`` and does not branch on which one it has:

* ``SingleNode`` (here): the node leads every partition of every queue it holds and coordinates
  every group; queue, ACL and quota changes are its own store's; its METADATA is a map of one node.
* ``ClusterPlacement`` (``fabric.node.cluster_placement``): the cluster map in etcd decides;
  requests for partitions led elsewhere are passed on, queue changes go through the controller,
  appends are replicated before consumers see them.

A method that hands the request to someone else (another node, the cluster thread) raises
``Deferred``: the reply comes later. One that returns lets the handler carry on here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fabric.errors import BadParameter, FabricError
from fabric.node import cluster_status
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
    from fabric.node.replication import Replication
    from fabric.security.acl import Rule


class Placement(Protocol):
    """What the broker asks about where requests are served (see the module's docstring)."""

    replication: Replication | None  # this node's replicas (None: nothing is replicated)
    cluster_ops: ClusterMember | None  # the cluster thread (None: no etcd)
    usage_here: bool  # the node writes usage records itself (a cluster's come with its front end)

    def route(self, client: bytes, header: fr.Header, params: Mapping[str, Any], data: Sequence[Any]) -> None:
        """A request for one partition: return to serve it here, or pass it on (Deferred)."""

    def leads(self, queue: str, p: int) -> bool:
        """Does this node lead ``queue/p``?"""

    def expand(self, queue: str, partitions: int, done: Callable[[FabricError | None], None]) -> None:
        """Grow ``queue`` to ``partitions`` partitions (auto-expand); ``done`` gets the outcome,
        at once or once the controller has answered."""

    def check_subscribe(self, queue: str, params: SubscribeParams) -> None:
        """Refuse a subscription this node cannot serve (not the coordinator, no replica here)."""

    def check_internal_append(self, queue: str, p: int) -> None:
        """Refuse an append the node makes itself (dead letters, redrive) to a partition it does not lead."""

    def check_coordinator(self, queue: str) -> None:
        """Refuse a request for ``queue``'s groups (SETTLE) at a node that does not coordinate them."""

    def internal_target(
        self,
        target: str,
        like: QueueSettings,
        batches: Sequence[bytes | bytearray],
        now_ms: int,
        done: Callable[[FabricError | None], None] | None,
    ) -> bool:
        """Internal ``batches`` (dead letters, redrive, .late) are for ``target``, created (like
        ``like``) if missing. False: append them here; True: they went to ``target``'s leader
        elsewhere and ``done`` gets the outcome. Raises DeadLetterDeferred (``fabric.node.shared``)
        while ``target`` is being created, or when it is led elsewhere and there is no ``done``."""

    def group_checkpointed(self, queue: str, group: str, state: dict[str, Any]) -> None:
        """A queue group's checkpoint was stored here: the next coordinator starts from it."""

    def trimmed(self, queue: str, p: int) -> None:
        """``queue/p`` starts later (a purge): the followers' parked fetches answer now."""

    def stamp_delays(self, queue: str, p: int, batches: list[tuple[bytearray, BatchHeader]]) -> list[int] | None:
        """Delayed batches for ``queue/p``: each gets its delay id, for the followers (None: no ids)."""

    def delays_stored(self, queue: str, p: int, row_id: int) -> None:
        """Stamped delayed rows up to ``row_id`` are stored: the followers fetch them."""

    def delay_acks_all(self, queue: str, p: int, acks: str) -> bool:
        """A delayed PRODUCE with ``acks``: True when its reply waits for the replicas
        (``reply_delayed``); refuses (NOT_ENOUGH_REPLICAS) before anything is stored."""

    def reply_delayed(
        self, queue: str, p: int, row_id: int, client: bytes, header: fr.Header, reply: dict[str, Any]
    ) -> None:
        """Send a delayed PRODUCE's reply once the replicas hold its rows up to ``row_id``."""

    def replicas_of(self, queue: str) -> list[list[str]] | None:
        """Every partition's replicas of ``queue`` in the map (None: the map does not name it)."""

    def produce_elsewhere(self, queue: str, p: int, batch: bytes, done: Callable[[FabricError | None], None]) -> bool:
        """Send a batch this node made to ``queue/p``'s leader elsewhere; ``done`` gets the
        outcome. False (and no call) when no leader elsewhere is reachable now."""

    def replica_rows(self, queue: str, partitions: int) -> list[dict[str, Any]]:
        """Metrics: ``queue``'s replicated partitions here (ISR size, leader, follower lag)."""

    def replicate(
        self, queue: str, p: int, end: int, client: bytes | None, reply: list[Any] | None, acks_all: bool
    ) -> bool:
        """An append up to ``end`` is durable here. True: the replication takes it from here
        (visibility and the reply); False: consumers may see it and the reply may go now."""

    def park_unknown(self, client: bytes, frames: Sequence[Any], params: Mapping[str, Any]) -> bool:
        """A request met UNKNOWN_QUEUE / UNKNOWN_PARTITION: True if it waits for the map instead."""

    def queue_op(
        self, client: bytes, header: fr.Header, params: Mapping[str, Any], settings: QueueSettings | None
    ) -> None:
        """CREATE_QUEUE (``settings``) / DELETE_QUEUE (None): return to do it here, or Deferred."""

    def alter_op(self, client: bytes, header: fr.Header, params: AlterQueueParams) -> None:
        """ALTER_QUEUE: return to grow the queue or change its settings here, or Deferred."""

    def describe_elsewhere(
        self, client: bytes, header: fr.Header, params: DescribeQueueParams, data: Sequence[Any]
    ) -> None:
        """DESCRIBE_QUEUE of a queue served elsewhere: pass it on (Deferred), or return."""

    def metadata(self, client: bytes, header: fr.Header, params: MetadataParams, data: Sequence[Any]) -> dict[str, Any]:
        """METADATA's map (``cluster``, ``controller``, ``nodes``, ``queues``), before the
        client's view is applied; Deferred while a queue it names is not in the map yet."""

    def mapped_queues(self) -> Mapping[str, Any]:
        """Queues the map names that this node may hold no copy of, with their partitions."""

    def replica_fetch(self, client: bytes, header: fr.Header, params: ReplicaFetchParams) -> None:
        """REPLICA_FETCH from a follower: answered now or later (Deferred either way)."""

    def init_producer(self, client: bytes, header: fr.Header, name: str | None) -> dict[str, Any]:
        """A producer id and epoch: from the store here, or from etcd (Deferred)."""

    def check_forget_group(self) -> None:
        """Refuse COMMIT ``forget`` where it is not supported."""

    def group_committed(self, queue: str, group: str, offsets: dict[int, int]) -> None:
        """A group's commit was stored here: the other nodes learn it too."""

    def set_quota(self, client: bytes, header: fr.Header, quota: Quota) -> None:
        """QUOTA_SET: return to store it here, or Deferred while etcd stores it."""

    def change_acl(self, client: bytes, header: fr.Header, rule: Rule, add: bool) -> None:
        """ACL_ADD / ACL_REMOVE: return to store it here, or Deferred while etcd stores it."""

    def cluster_status(self, client: bytes, header: fr.Header) -> None:
        """CLUSTER_STATUS: answered now, or once etcd was read (Deferred)."""

    def tick(self, now_ms: int) -> None:
        """The loop's turn: timers of the requests and roles this placement holds."""

    def next_due_ms(self) -> int | None:
        """When the loop must pass again for work left over (None: nothing)."""


class SingleNode:
    """The embedded single node: it leads every partition it holds and coordinates every group."""

    replication: Replication | None = None
    cluster_ops: ClusterMember | None = None
    usage_here = True

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def route(self, client: bytes, header: fr.Header, params: Mapping[str, Any], data: Sequence[Any]) -> None:
        return None

    def leads(self, queue: str, p: int) -> bool:
        return True

    def expand(self, queue: str, partitions: int, done: Callable[[FabricError | None], None]) -> None:
        try:
            self.broker.grow_queue(queue, partitions)
        except FabricError as exc:
            done(exc)
        else:
            done(None)

    def check_subscribe(self, queue: str, params: SubscribeParams) -> None:
        return None

    def check_internal_append(self, queue: str, p: int) -> None:
        return None

    def replicate(
        self, queue: str, p: int, end: int, client: bytes | None, reply: list[Any] | None, acks_all: bool
    ) -> bool:
        return False

    def check_coordinator(self, queue: str) -> None:
        return None

    def internal_target(
        self,
        target: str,
        like: QueueSettings,
        batches: Sequence[bytes | bytearray],
        now_ms: int,
        done: Callable[[FabricError | None], None] | None,
    ) -> bool:
        b = self.broker
        if target not in b.store.queue_names():
            dlq_settings = QueueSettings.from_dict(
                {"partitions": 1, "fsync": like.fsync, "retention_ms": like.retention_ms, "encrypt": like.encrypt}
            )
            b.create_queue(target, dlq_settings)
        return False

    def group_checkpointed(self, queue: str, group: str, state: dict[str, Any]) -> None:
        return None

    def trimmed(self, queue: str, p: int) -> None:
        return None

    def stamp_delays(self, queue: str, p: int, batches: list[tuple[bytearray, BatchHeader]]) -> list[int] | None:
        return None

    def delays_stored(self, queue: str, p: int, row_id: int) -> None:
        return None

    def delay_acks_all(self, queue: str, p: int, acks: str) -> bool:
        return False  # nothing to wait for: the reply goes once the rows are stored here

    def reply_delayed(
        self, queue: str, p: int, row_id: int, client: bytes, header: fr.Header, reply: dict[str, Any]
    ) -> None:
        self.broker._reply(client, header, reply)  # not reached: delay_acks_all is False

    def replicas_of(self, queue: str) -> list[list[str]] | None:
        return None

    def produce_elsewhere(self, queue: str, p: int, batch: bytes, done: Callable[[FabricError | None], None]) -> bool:
        return False

    def replica_rows(self, queue: str, partitions: int) -> list[dict[str, Any]]:
        return []

    def park_unknown(self, client: bytes, frames: Sequence[Any], params: Mapping[str, Any]) -> bool:
        return False

    def queue_op(
        self, client: bytes, header: fr.Header, params: Mapping[str, Any], settings: QueueSettings | None
    ) -> None:
        return None

    def alter_op(self, client: bytes, header: fr.Header, params: AlterQueueParams) -> None:
        return None

    def describe_elsewhere(
        self, client: bytes, header: fr.Header, params: DescribeQueueParams, data: Sequence[Any]
    ) -> None:
        return None

    def metadata(self, client: bytes, header: fr.Header, params: MetadataParams, data: Sequence[Any]) -> dict[str, Any]:
        """This node, leading every partition of the queues it holds (those named, or all)."""
        store, node = self.broker.store, self.broker.config.node_id
        names = params["queues"] if params["queues"] is not None else store.queue_names()
        queues = {}
        for name in names:
            if store.has_queue(name):
                queues[name] = [
                    {"partition": p, "leader": node, "leader_epoch": 0, "replicas": [node], "isr": [node]}
                    for p in range(store.settings(name).log_partitions)
                ]
        return {"cluster": None, "controller": None, "nodes": {node: None}, "queues": queues}

    def mapped_queues(self) -> Mapping[str, Any]:
        return {}

    def replica_fetch(self, client: bytes, header: fr.Header, params: ReplicaFetchParams) -> None:
        raise BadParameter("REPLICA_FETCH is for cluster nodes; this node is not in a cluster")

    def init_producer(self, client: bytes, header: fr.Header, name: str | None) -> dict[str, Any]:
        producer_id, epoch = self.broker.store.producer_ids.allocate(name)
        return {"producer_id": producer_id, "epoch": epoch}

    def check_forget_group(self) -> None:
        return None

    def group_committed(self, queue: str, group: str, offsets: dict[int, int]) -> None:
        return None

    def set_quota(self, client: bytes, header: fr.Header, quota: Quota) -> None:
        return None

    def change_acl(self, client: bytes, header: fr.Header, rule: Rule, add: bool) -> None:
        return None

    def cluster_status(self, client: bytes, header: fr.Header) -> None:
        b = self.broker
        cluster_status.single_node(b._reply, client, header, b.config.node_id, b.endpoint, b.store)

    def tick(self, now_ms: int) -> None:
        return None

    def next_due_ms(self) -> int | None:
        return None


PlacementFactory = Callable[["Broker"], Placement]  # builds a broker's placement once the broker exists
