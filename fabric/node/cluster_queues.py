"""A cluster node's side of queue requests: what a single node answers from its own store, a
cluster node answers from the cluster map as well.

Theory of operation
-------------------
* CREATE_QUEUE / DELETE_QUEUE go through the controller (``queue_op``); the reply waits, briefly,
  until this node can serve the queue: its own copy exists, or (holding no replica) its map names
  the queue's leaders. A client's next request to this node then finds the queue.
* DESCRIBE_QUEUE of a queue with no local copy (``describe_elsewhere``): passed on to a node that
  holds it, or parked up to QUEUE_KNOWN_WAIT_MS while the map does not name it yet (a queue just
  created through another node reaches this one within moments), then handled again.
* Any other request that meets UNKNOWN_QUEUE or UNKNOWN_PARTITION (``park_unknown``): a queue
  created a moment ago through another node (or a router), or partitions added by ``alter``, are
  in etcd before this node's watch brings them here. The request is parked and the cluster
  thread reads the queue's key from etcd: no queue, or fewer partitions than the request names,
  and the request is handled again at once and gets its error; there, it waits (up to
  QUEUE_KNOWN_WAIT_MS) until this node can serve the queue (the partition), then is handled
  again. So "create (or alter), then use at once, through any node" never sees UNKNOWN_QUEUE or
  UNKNOWN_PARTITION, and a wrong name costs one etcd read, not a wait.
* METADATA naming a queue the map does not name yet (``metadata_waits``): parked the same way,
  so a client's first look at a queue just created finds its partitions.
* Group coordination: the leader of a queue's partition 0 coordinates its groups; a node that
  stops leading it drops their members (``resign_coordination``), who subscribe again where the
  map now points.
* Other nodes' group commits arrive from etcd (``merge_offsets``) and are kept where newer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fabric.errors import FabricError, QueueExists, UnknownQueue
from fabric.node.purgatory import Deferred
from fabric.protocol import frames as fr
from fabric.protocol.requests import (
    AlterQueueParams,
    DescribeQueueParams,
    MetadataParams,
)
from fabric.settings import QueueSettings

if TYPE_CHECKING:
    from fabric.node.broker import Broker
    from fabric.node.cluster_member import ClusterMember
    from fabric.node.replication import Replication

log = logging.getLogger("fabric.broker")
QUEUE_PLACED_WAIT_MS = 5000  # CREATE_QUEUE: how long the reply waits for this node to know the queue
QUEUE_KNOWN_WAIT_MS = 2000  # DESCRIBE_QUEUE of a queue this node does not know yet: wait this long


class ClusterQueues:
    def __init__(self, broker: Broker, member: ClusterMember, replication: Replication) -> None:
        self.broker = broker
        self.member = member  # the cluster thread: etcd
        self.repl = replication
        self._awaiting: list[tuple[int, str, bytes, fr.Header, dict[str, Any]]] = []  # CREATE replies
        # requests for a queue (or partition) this node does not know yet: (deadline, name or
        # (name, partition), client, frames)
        self._parked: list[tuple[int, str | tuple[str, int], bytes, list[Any]]] = []
        self._redispatching = False
        self._checking: set[str] = set()  # queue names asked of etcd, answers not back yet
        self._altering: list[tuple[int, str, int, bytes, fr.Header, dict[str, Any]]] = []  # ALTER replies

    def queue_op(
        self,
        client: bytes,
        header: fr.Header,
        params: Mapping[str, Any],  # CreateQueueParams or DeleteQueueParams
        settings: QueueSettings | None,
    ) -> None:
        """CREATE_QUEUE (``settings``) / DELETE_QUEUE (None) through the controller (etcd); the
        reply comes when the controller has written the map. Every replica then creates or
        drops its copy when the map reaches it. Raises Deferred."""
        b = self.broker

        def done(result: Any) -> None:
            if isinstance(result, QueueExists) and params.get("if_not_exists"):
                result = {"name": params["name"], "existed": True}
            elif isinstance(result, UnknownQueue) and params.get("if_exists"):
                result = {"deleted": False}
            if isinstance(result, FabricError):
                b._error(client, header, (), result)
            elif not header.flags & fr.FLAG_NO_REPLY:
                if not self.ready(params["name"]):
                    # answer once this node has its copy (or, holding none, its map names the
                    # queue's leaders), so the client's next request here finds the queue
                    self._awaiting.append((b._now_ms + QUEUE_PLACED_WAIT_MS, params["name"], client, header, result))
                else:
                    b._reply(client, header, result)

        if settings is not None:
            self.member.create_queue(
                params["name"], settings, done, forwarded=params["forwarded"], leader_hint=params["leader_hint"]
            )
        else:
            self.member.delete_queue(params["name"], done, forwarded=params["forwarded"])
        raise Deferred

    def alter_op(self, client: bytes, header: fr.Header, params: AlterQueueParams) -> None:
        """ALTER_QUEUE through the controller (etcd): partitions (the reply waits, briefly, until
        this node knows where every new partition is served and, holding the queue, has grown its
        copy), or settings (each node holding the queue applies them from its watch). Raises Deferred."""
        b = self.broker
        name, partitions = params["name"], params["partitions"]
        if partitions is None:
            return self._alter_settings(client, header, params)

        def done(result: Any) -> None:
            if isinstance(result, FabricError):
                b._error(client, header, (), result)
            elif not header.flags & fr.FLAG_NO_REPLY:
                if self.grown(name, partitions):
                    b._reply(client, header, result)
                else:
                    self._altering.append((b._now_ms + QUEUE_PLACED_WAIT_MS, name, partitions, client, header, result))

        self.member.alter_queue(name, partitions, done, forwarded=params["forwarded"])
        raise Deferred

    def _alter_settings(self, client: bytes, header: fr.Header, params: AlterQueueParams) -> None:
        b = self.broker

        def done(result: Any) -> None:
            if isinstance(result, FabricError):
                b._error(client, header, (), result)
            elif not header.flags & fr.FLAG_NO_REPLY:
                b._reply(client, header, result)

        self.member.alter_settings(params["name"], params["settings"] or {}, done, forwarded=params["forwarded"])
        raise Deferred

    def grown(self, name: str, partitions: int) -> bool:
        """Does this node serve ``name`` with ``partitions`` partitions (its copy grown, and it
        knows where the last one is served)?"""
        b = self.broker
        if b.store.has_queue(name) and b.store.settings(name).partitions < partitions:
            return False
        return self.ready((name, partitions - 1))

    def ready(self, name: str | tuple[str, int]) -> bool:
        """Can this node serve requests for queue ``name`` (or partition ``(name, p)``) now?"""
        b = self.broker
        if isinstance(name, tuple):
            queue, p = name
            return self.ready(queue) and self.repl.partition_known(queue, p)
        if b.store.has_queue(name):
            return True
        # not held here: ready once the map names the queue (requests for it are passed on)
        return self.repl.holds(name) is False

    def describe_elsewhere(
        self, client: bytes, header: fr.Header, params: DescribeQueueParams, data: Sequence[Any]
    ) -> None:
        """DESCRIBE_QUEUE of a queue with no copy here: pass it on, or park it (Deferred), or
        return to answer here (UNKNOWN_QUEUE, or auto-creation) once the wait is over."""
        b = self.broker
        name = params["name"]
        held = self.repl.holds(name)
        holder = self.repl.leader_lookup(name, 0)
        if held is False and holder is not None and not header.flags & fr.FLAG_FORWARDED:
            self.repl.pass_on(client, header, params, data, holder, name)  # placed elsewhere only
        if held is not False and not self._redispatching:
            # the map does not name it yet, or names it here before the local copy exists
            frames = [header.encode(), fr.encode_params(params), *data]
            if held is None and self.park_unknown(client, frames, params):
                raise Deferred  # the map does not name it: etcd says whether to wait
            self._parked.append((b._now_ms + QUEUE_KNOWN_WAIT_MS, name, client, frames))
            raise Deferred

    def park_unknown(
        self, client: bytes, frames: Sequence[Any], params: Mapping[str, Any], name: str | None = None
    ) -> bool:
        """A request that met UNKNOWN_QUEUE or UNKNOWN_PARTITION on a cluster node (or names
        ``name``, a queue the map does not name yet): park it and ask etcd about the queue
        (True), or let it be answered now (False: handled again already, no queue named, or no
        cluster thread)."""
        b = self.broker
        if name is None:
            name = params.get("queue", params.get("name"))
        if self._redispatching or not isinstance(name, str):
            return False
        partition = params.get("partition")
        key = (name, partition) if isinstance(partition, int) else name
        self._parked.append((b._now_ms + QUEUE_KNOWN_WAIT_MS, key, client, [bytes(f) for f in frames]))
        if name not in self._checking:
            self._checking.add(name)
            self.member.queue_partitions(name, lambda partitions: self._checked(name, partitions))
        return True

    def metadata_waits(self, client: bytes, header: fr.Header, params: MetadataParams, data: Sequence[Any]) -> None:
        """METADATA naming a queue this node's map does not name yet: parked (raises Deferred)
        until it does, or etcd says there is no such queue, or QUEUE_KNOWN_WAIT_MS passed."""
        if self._redispatching or not params["queues"]:
            return
        missing = [q for q in params["queues"] if isinstance(q, str) and self.repl.holds(q) is None]
        if missing:
            frames = [header.encode(), fr.encode_params(params), *data]
            if self.park_unknown(client, frames, {}, missing[0]):
                raise Deferred

    def _checked(self, name: str, partitions: int | None) -> None:
        """etcd's answer for ``name``: its partition count (0: no such queue; None: etcd did not
        answer). Parked requests for a queue or partition that is not there are handled again at
        once (UNKNOWN_QUEUE, UNKNOWN_PARTITION); the others wait to be ready."""
        self._checking.discard(name)
        if partitions is not None:
            self._parked = [
                (0, *x[1:]) if _queue_of(x[1]) == name and _partition_of(x[1]) >= partitions else x
                for x in self._parked
            ]
        self.release(self.broker._now_ms)

    def release(self, now_ms: int) -> None:
        """CREATE_QUEUE replies and DESCRIBE_QUEUE requests waiting for this node to know their
        queue: answer what is ready or has waited long enough."""
        b = self.broker
        if self._parked:
            ready = [x for x in self._parked if x[0] <= now_ms or self.ready(x[1])]
            if ready:
                self._parked = [x for x in self._parked if x not in ready]
                self._redispatching = True
                try:
                    for _, _, client, frames in ready:
                        b.handle(client, frames, now_ms)
                finally:
                    self._redispatching = False
        if self._altering:
            waiting = []
            for item in self._altering:
                if self.grown(item[1], item[2]) or now_ms >= item[0]:
                    b._reply(item[3], item[4], item[5])
                else:
                    waiting.append(item)
            self._altering = waiting
        if not self._awaiting:
            return
        keep = []
        for entry in self._awaiting:
            deadline, name, client, header, result = entry
            if self.ready(name) or now_ms >= deadline:
                b._reply(client, header, result)
            else:
                keep.append(entry)
        self._awaiting = keep

    def resign_coordination(self, queue: str) -> None:
        """This node no longer coordinates ``queue``'s groups (it stopped leading its partition
        0). Their members here are dropped (leases given back, floors checkpointed and
        published); their next heartbeat sees it, and they subscribe again at the new
        coordinator."""
        b = self.broker
        assigned = {sid for (q, _), m in b.streams.members.items() if q == queue for sid in m.values()}
        members = [s for s in b.subs.by_id.values() if s.queue == queue and (s.kind != "stream" or s.id in assigned)]
        held = b.shared.groups_of(queue)
        if not members and not held:
            return
        b.shared.checkpoint(b._now_ms, force=True)
        for sub in members:
            b.subs.remove(sub.id)
        # the queue groups' tables go too: the new coordinator's checkpoints (through etcd) are
        # what this node opens if it coordinates again, not what it held when it stopped
        b.shared.forget_queue(queue)
        log.info(
            "no longer coordinating the groups of %r: %d member(s) sent to the new coordinator", queue, len(members)
        )

    def merge_group_state(self, queue: str, group: str, state: dict[str, Any]) -> None:
        """A queue group's checkpoint its coordinator published: kept in this node's store
        unless this node holds the group now (it is the coordinator: its own state is newer).
        Opened from there if this node becomes the coordinator."""
        b = self.broker
        if not b.store.has_queue(queue) or (queue, group) in b.shared.groups:
            return
        if state.get("kind") not in ("queue", "key_shared"):
            return
        b.store.meta.put_group_states({(queue, group): state})

    def merge_offsets(self, queue: str, group: str, offsets: dict[int, int]) -> None:
        """Another node's commits for a group: keep the newer offset per partition, never past
        this node's copy of the log (a follower may not have it yet: redelivery, not a skip)."""
        b = self.broker
        if not b.store.has_queue(queue):
            return
        settings = b.store.settings(queue)
        local = b.store.meta.committed(queue, group)
        newer = {}
        for p, off in offsets.items():
            if 0 <= p < settings.log_partitions:
                off = min(off, b.store.partition(queue, p).next_offset)
                if off > local.get(p, -1):
                    newer[p] = off
        if newer:
            b.store.meta.commit(queue, group, newer)


def _queue_of(key: str | tuple[str, int]) -> str:
    return key[0] if isinstance(key, tuple) else key


def _partition_of(key: str | tuple[str, int]) -> int:
    """The partition a parked request names (0 when it names only its queue)."""
    return key[1] if isinstance(key, tuple) else 0
