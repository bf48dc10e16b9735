"""Where a request is served: here, or passed on to the leader; who coordinates a queue's groups.

Theory of operation
-------------------
A cluster node serves a partition's requests only while it leads it (its ``Role`` has a
``LeaderReplica``). Anything else is passed on, one hop, to the leader the cluster map names
(``fabric.node.forwarding``), unless it was passed on already: then, as when no leader is known
or this node is named but may not lead now, the answer is a retriable NOT_LEADER naming what is
known. A partition the map does not name at all is UNKNOWN_QUEUE / UNKNOWN_PARTITION (the
broker then asks etcd: a queue created a moment ago is waited for).

Groups are coordinated by the leader of the queue's partition 0 (NOT_COORDINATOR elsewhere),
and a subscription reads this node's copies, so one naming a partition held elsewhere is sent
to a node that holds them all. The map is read through the lookups handed in; nothing here
changes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fabric.errors import BadParameter, NotCoordinator, NotLeader, UnknownPartition, UnknownQueue
from fabric.node.roles import Role
from fabric.protocol import frames as fr
from fabric.store.store import Store

Key = tuple[str, int]
# (client, header, params, data, node, queue, partition): send it on and raise Deferred
PassOn = Callable[[bytes, fr.Header, Mapping[str, Any], Sequence[Any], str, str, int], None]


class Routing:
    """The questions "who serves this?" for one node, answered from its roles and the map."""

    def __init__(
        self,
        node_id: str,
        roles: Mapping[Key, Role],
        leader_lookup: Callable[[str, int], str | None],
        replicas_lookup: Callable[[str], list[list[str]] | None],
        endpoints: Callable[[], Mapping[str, str]],
        store: Store,
        pass_on: PassOn,
    ) -> None:
        self.node_id = node_id
        self.roles = roles
        self.leader_lookup = leader_lookup  # the whole map's leaders
        self.replicas_lookup = replicas_lookup  # every partition's replicas (None: the map does not name the queue)
        self.endpoints = endpoints  # node id -> client endpoint, from the map
        self.store = store
        self.pass_on = pass_on

    def check_leader(self, queue: str, p: int) -> None:
        """Raise NOT_LEADER (naming the leader and its endpoint) unless this node leads ``queue/p``."""
        role = self.roles.get((queue, p))
        if role is not None and role.leader is not None:
            return
        leader = role.record.leader if role is not None else None
        endpoints = self.endpoints()
        where = f" at {endpoints[leader]}" if leader is not None and leader in endpoints else ""
        if leader == self.node_id:  # named leader, yet not leading: fenced (cut off from etcd), or just restarted
            raise NotLeader(
                f"{self.node_id} is named leader of {queue}/{p} but may not lead it now", try_elsewhere=True
            )
        raise NotLeader(
            f"{self.node_id} does not lead {queue}/{p}; " + (f"leader: {leader}{where}" if leader else "leader unknown")
        )

    def route(self, client: bytes, header: fr.Header, params: Mapping[str, Any], data: Sequence[Any]) -> None:
        """A request for one partition: return to handle it here (this node leads it), or pass it
        on to the leader and raise Deferred; the leader's reply goes back to ``client`` as is."""
        queue, p = params["queue"], params["partition"]
        role = self.roles.get((queue, p))
        if role is not None and role.leader is not None:
            return
        leader = role.record.leader if role is not None else self.leader_lookup(queue, p)
        if role is None and leader is None:
            self._check_placed(queue, p)
        if leader is None or leader == self.node_id or header.flags & fr.FLAG_FORWARDED:
            self.check_leader(queue, p)  # raises NOT_LEADER naming what is known
            return
        self.pass_on(client, header, params, data, leader, queue, p)

    def _check_placed(self, queue: str, p: int) -> None:
        """``queue/p`` has no role here and no leader in the map: UNKNOWN_QUEUE / UNKNOWN_PARTITION
        when the map does not name it (the broker then asks etcd: a queue created a moment ago
        is waited for), else return (placed, no leader elected yet: NOT_LEADER follows)."""
        replicas = self.replicas_lookup(queue)
        if replicas is not None and p < len(replicas):
            return
        store = self.store
        if store.has_queue(queue) and p >= store.settings(queue).log_partitions:
            raise UnknownPartition(
                f"queue {queue!r} has partitions 0..{store.settings(queue).log_partitions - 1}, not {p}"
            )
        raise UnknownQueue(f"queue {queue!r} does not exist" if replicas is None else f"{queue}/{p} is not placed yet")

    def partition_known(self, queue: str, p: int) -> bool:
        """Does this node know where ``queue/p`` is served (a role here, or a leader in the map)?"""
        return (queue, p) in self.roles or self.leader_lookup(queue, p) is not None

    def check_coordinator(self, queue: str) -> None:
        """A group's SUBSCRIBE: the leader of the queue's partition 0 coordinates its groups (one
        node holds each group's members, leases and assignment); anywhere else, NOT_COORDINATOR
        naming it. A queue the map does not name goes on to the usual UNKNOWN_QUEUE."""
        if self.holds(queue) is None:
            return
        leader = self.leader_lookup(queue, 0)
        if leader == self.node_id:
            return
        endpoint = self.endpoints().get(leader) if leader else None
        raise NotCoordinator(
            f"{self.node_id} does not coordinate the groups of {queue!r}: "
            + (f"{leader} at {endpoint} does" if endpoint else "no coordinator is elected yet; retry"),
            coordinator=endpoint,
        )

    def holds(self, queue: str) -> bool | None:
        """Does the map place a replica of ``queue`` here (None: the map does not name it)."""
        replicas = self.replicas_lookup(queue)
        return None if replicas is None else any(self.node_id in r for r in replicas)

    def check_local(self, queue: str, partitions: list[int] | None, coordinated: bool) -> None:
        """A subscription reads this node's copies: refuse one that names a partition this node
        holds no replica of (it would wait for ever on an empty local directory), sending the
        client to a node that holds them all when there is one."""
        replicas = self.replicas_lookup(queue)
        if replicas is None:
            return
        parts = list(range(len(replicas))) if partitions is None else partitions
        missing = [p for p in parts if p < len(replicas) and self.node_id not in replicas[p]]
        if not missing:
            return
        endpoints = self.endpoints()
        holders = [n for n in endpoints if all(p < len(replicas) and n in replicas[p] for p in parts)]
        where = f"queue {queue!r} partition(s) {missing} have no replica on {self.node_id}"
        if holders and not coordinated:
            raise NotCoordinator(f"{where}; {holders[0]} holds them", coordinator=endpoints[holders[0]])
        raise BadParameter(
            f"{where} (replication_factor below the number of nodes): "
            + (
                "a group needs every partition on its coordinator; use replication_factor = the number of nodes"
                if coordinated
                else "subscribe to each partition on a node that holds it (Admin.metadata() names them)"
            )
        )
