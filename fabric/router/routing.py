"""Which storage node a router sends a request to: pure functions of the cluster map and what the
router remembers of each client. No sockets, no clocks passed in implicitly.

Theory of operation
-------------------
The router forwards each request whole to one storage node (HEARTBEAT to several, see below):

* PRODUCE, FETCH, LIST_OFFSETS name one partition: its **leader**. The leader answers; a node
  that is not (a map that moved since) passes it on itself or answers NOT_LEADER.
* SUBSCRIBE: a group, or a queue/key_shared subscription, is served by the queue's
  **coordinator**, the leader of partition 0; a plain stream subscription by a node that holds a
  replica of every partition it names (the coordinator when it does). COMMITTED, REDRIVE,
  COMMIT without a subscription and DESCRIBE_QUEUE (group state, a direct queue's registered
  consumers) go to the coordinator too.
* CREDIT, UNSUBSCRIBE, ACK, NACK, CHANGE_VISIBILITY, REVOKED, and COMMIT with a subscription
  name a subscription: the node that granted it (remembered from the SUBSCRIBE reply).
* PING that names a ``node`` goes to that node when the map has it: a probe of the router's link
  to one store (``fabric up`` waits until every router reaches every store).
* Everything else (PING, INIT_PRODUCER, METADATA, CLUSTER_STATUS, queue administration) goes to the client's
  **home** node: the live node with the highest rendezvous weight for the client's identity, so
  one client's requests stay in order on one node while clients spread over all of them.
* HEARTBEAT goes to every node the client has sent anything to (its sessions live there); the
  router answers with the union of the subscriptions they hold.

A request for a queue the map does not name goes to the home node, which knows best (a queue
being created, or UNKNOWN_QUEUE).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fabric.protocol.ops import Op

PARTITION_OPS = frozenset({Op.PRODUCE, Op.FETCH, Op.LIST_OFFSETS, Op.PURGE})
SUBSCRIPTION_OPS = frozenset({Op.CREDIT, Op.UNSUBSCRIBE, Op.ACK, Op.NACK, Op.CHANGE_VISIBILITY, Op.REVOKED})
COORDINATOR_OPS = frozenset({Op.COMMITTED, Op.REDRIVE, Op.SETTLE})
FANOUT = "*"  # target of a HEARTBEAT: every node of the client's session


@dataclass(frozen=True)
class RouteMap:
    """The part of the cluster map a router routes by (built from the watched map)."""

    nodes: Mapping[str, str] = field(default_factory=dict)  # live node -> endpoint
    leaders: Mapping[tuple[str, int], str | None] = field(default_factory=dict)
    replicas: Mapping[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)  # queue -> per partition

    @classmethod
    def build(
        cls, nodes: Mapping[str, str], partitions: Iterable[tuple[str, int, str | None, Iterable[str]]]
    ) -> RouteMap:
        """From live nodes and ``(queue, partition, leader, replicas)`` rows."""
        leaders: dict[tuple[str, int], str | None] = {}
        per_queue: dict[str, dict[int, tuple[str, ...]]] = {}
        for queue, p, leader, replicas in partitions:
            leaders[(queue, p)] = leader if leader in nodes else None
            per_queue.setdefault(queue, {})[p] = tuple(replicas)
        replicas = {q: tuple(parts.get(i, ()) for i in range(max(parts) + 1)) for q, parts in per_queue.items()}
        return cls(dict(nodes), leaders, replicas)

    def with_changes(self, changes: Mapping[tuple[str, int], tuple[str | None, Iterable[str]] | None]) -> RouteMap:
        """The same map with these partitions' ``(leader, replicas)`` replaced (None: the partition
        is gone), over the same live nodes: what ``build`` would give for the changed rows, at
        the cost of two dict copies and the changed queues instead of a pass over every
        partition (a router with 10,000 queues rebuilt its map on every change)."""
        leaders = dict(self.leaders)
        replicas = dict(self.replicas)
        by_queue: dict[str, dict[int, tuple[str | None, Iterable[str]] | None]] = {}
        for (queue, p), row in changes.items():
            if row is None:
                leaders.pop((queue, p), None)
            else:
                leaders[(queue, p)] = row[0] if row[0] in self.nodes else None
            by_queue.setdefault(queue, {})[p] = row
        for queue, rows in by_queue.items():
            parts = {i: r for i, r in enumerate(replicas.get(queue, ())) if r}
            for p, row in rows.items():
                if row is None:
                    parts.pop(p, None)
                else:
                    parts[p] = tuple(row[1])
            if parts:
                replicas[queue] = tuple(parts.get(i, ()) for i in range(max(parts) + 1))
            else:
                replicas.pop(queue, None)
        return RouteMap(self.nodes, leaders, replicas)

    def leader(self, queue: str, p: int) -> str | None:
        return self.leaders.get((queue, p))


@dataclass
class ClientState:
    """What a router remembers of one client (by its routing id)."""

    nodes: set[str] = field(default_factory=set)  # nodes its requests went to: where its sessions are
    subscriptions: dict[int, str] = field(default_factory=dict)  # subscription id -> the node that granted it
    queue_nodes: dict[str, str] = field(default_factory=dict)  # queue -> node of its latest subscription there
    last_seen: float = 0.0


def home(client: bytes, nodes: Iterable[str]) -> str | None:
    """The client's home node: highest rendezvous weight of (client, node); None when no node lives."""
    best, best_w = None, b""
    for n in nodes:
        w = hashlib.blake2b(client + b"\x00" + n.encode(), digest_size=8).digest()
        if best is None or w > best_w:
            best, best_w = n, w
    return best


def target(op: Op, params: Mapping[str, Any], client: bytes, state: ClientState, rmap: RouteMap) -> str | None:
    """The node for this request (FANOUT for HEARTBEAT); None when no node is live."""
    if op in PARTITION_OPS:
        return rmap.leader(params["queue"], params["partition"]) or home(client, rmap.nodes)
    if op == Op.HEARTBEAT:
        return FANOUT
    if op in SUBSCRIPTION_OPS or (op == Op.COMMIT and params.get("subscription") is not None):
        node = state.subscriptions.get(params["subscription"])
        if node is None and "queue" in params:
            node = state.queue_nodes.get(params["queue"])
        if node in rmap.nodes:
            return node
        return home(client, rmap.nodes)
    if op == Op.PING and params.get("node") in rmap.nodes:
        return str(params["node"])  # a probe of one store through this router (`fabric up` waits for it)
    if op == Op.SUBSCRIBE:
        return subscribe_target(params, rmap) or home(client, rmap.nodes)
    if op in COORDINATOR_OPS or op == Op.COMMIT:
        return rmap.leader(params["queue"], 0) or home(client, rmap.nodes)
    if op == Op.DESCRIBE_QUEUE:  # groups and a direct queue's consumers live on the coordinator
        return rmap.leader(params["name"], 0) or home(client, rmap.nodes)
    return home(client, rmap.nodes)


def subscribe_target(params: Mapping[str, Any], rmap: RouteMap) -> str | None:
    queue = params["queue"]
    coordinator = rmap.leader(queue, 0)
    parts = rmap.replicas.get(queue)
    if params.get("group") is not None or params.get("kind", "stream") != "stream" or parts is None:
        return coordinator
    wanted = params.get("partitions")
    wanted = list(range(len(parts))) if wanted is None else [p for p in wanted if p < len(parts)]
    holders = [n for n in rmap.nodes if all(n in parts[p] for p in wanted)]
    if coordinator in holders or not holders:
        return coordinator
    return sorted(holders)[0]


def merge_heartbeats(replies: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One HEARTBEAT reply from the replies of every node of the client's session."""
    subs: set[int] = set()
    for r in replies:
        subs.update(s for s in r.get("subscriptions", []) if isinstance(s, int))
    return {"subscriptions": sorted(subs)}
