"""LeaderProducer: bootstrap through any entry point (a router or a store), then send each
partition's batches straight to that partition's leader.

Theory of operation
-------------------
A ``Producer`` talks to one endpoint; in a cluster the node (or router) it talks to passes each
batch on to the partition's leader: one more hop per batch for a node that does not lead it. A
``LeaderProducer`` asks the bootstrap endpoint for the cluster map (METADATA: each partition's
leader and every node's endpoint) and keeps one inner ``Producer`` per leader node, so every batch
goes to the node that appends it. The map is read again every ``refresh_ms`` in the background
and at once when a queue is first used.

Order per partition is kept across leader changes: when a partition's leader moves, the next send
to it first flushes the inner producer that had been carrying it (its batches are acknowledged,
by the old leader or passed on by it to the new one), then goes to the new leader's producer.
Partitioning is the ``Producer``'s: ``crc32c(key) % partitions`` for a keyed message; unkeyed
messages stick to one partition for ``sticky_messages`` sends, then move round-robin. The
partition count comes from the map, so partitions added to a queue are used after the next
refresh.

On a single node (METADATA names no endpoints) it is one ``Producer`` on the bootstrap endpoint.
Each inner producer is idempotent on its own (its own producer id); a ``name`` given for epoch
fencing becomes ``name@node`` per inner producer, so they do not fence each other.

Which to use: routers (a ``Producer`` given the routers' endpoints) are the default in the docs,
for simplicity (clients need reach only the routers; stores can stay private) and because the
router tier costs little: ``fabric bench-cluster`` measures both side by side
(docs/performance.md).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from crc32c import crc32c

from fabric.client.admin import Admin
from fabric.client.batches import RecordFuture
from fabric.client.producer import Producer
from fabric.errors import BadParameter, FabricError

REFRESH_MS = 2000


class LeaderProducer:
    def __init__(
        self,
        bootstrap: str,
        *,
        refresh_ms: int = REFRESH_MS,
        sticky_messages: int = 1000,
        **producer_options: Any,
    ) -> None:
        if refresh_ms < 100 or sticky_messages < 1:
            raise BadParameter("refresh_ms >= 100 and sticky_messages >= 1")
        self.bootstrap = bootstrap
        self._options = producer_options
        self._name = producer_options.pop("name", None)
        self._refresh_s = refresh_ms / 1000
        self._sticky_messages = sticky_messages
        self._admin = Admin(bootstrap)
        self._admin_lock = threading.Lock()  # the refresher thread and senders share the Admin
        self._lock = threading.RLock()  # the routing tables and the inner producers
        self._leaders: dict[tuple[str, int], str] = {}  # (queue, partition) -> leader endpoint
        self._partitions: dict[str, int] = {}  # queue -> partition count
        self._levels: dict[str, int] = {}  # queue -> priority levels (its logs: levels * partitions)
        self._single = False  # a single node: everything goes to the bootstrap endpoint
        self._nodes: dict[str, str] = {}  # node -> endpoint
        self._inner: dict[str, Producer] = {}  # endpoint -> its producer
        self._carried_by: dict[tuple[str, int], str] = {}  # (queue, partition) -> endpoint last sent to
        self._sticky: dict[str, tuple[int, int]] = {}  # queue -> (partition, sends left)
        self._closed = threading.Event()
        self.refreshes = 0
        self.leader_moves = 0  # partitions whose sends moved to another leader (after a flush)
        self._refresher = threading.Thread(target=self._refresh_loop, name="fabric-leader-map", daemon=True)
        self._refresher.start()

    # ------------------------------------------------------------------ sending

    def send(
        self,
        queue: str,
        value: bytes | str,
        key: bytes | str | None = None,
        partition: int | None = None,
        **options: Any,
    ) -> RecordFuture:
        """As ``Producer.send``; the batch goes to the partition's leader."""
        nparts = self._partitions.get(queue) or self._learn(queue)
        if partition is None:
            if key is not None:
                partition = crc32c(key.encode() if isinstance(key, str) else key) % nparts
            else:
                partition = self._next_sticky(queue, nparts)
        producer = self._producer_for(queue, partition)
        return producer.send(queue, value, key=key, partition=partition, **options)

    def flush(self, timeout: float | None = None) -> None:
        for p in list(self._inner.values()):
            p.flush(timeout)

    def close(self, timeout: float | None = 30) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._refresher.join(5)
        errors = []
        for p in list(self._inner.values()):
            try:
                p.close(timeout)
            except FabricError as exc:
                errors.append(exc)
        self._admin.close()
        if errors:
            raise errors[0]

    def leaders(self) -> dict[tuple[str, int], str]:
        """The leader endpoint of each partition as this producer knows it."""
        return dict(self._leaders)

    def __enter__(self) -> LeaderProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _next_sticky(self, queue: str, nparts: int) -> int:
        current, left = self._sticky.get(queue, (0, self._sticky_messages))
        if left <= 0 or current >= nparts:
            current, left = (current + 1) % nparts, self._sticky_messages
        self._sticky[queue] = (current, left - 1)
        return current

    def _producer_for(self, queue: str, partition: int) -> Producer:
        endpoint = self.bootstrap if self._single else self._leaders.get((queue, partition))
        if endpoint is None:  # no leader known (an election under way): the node passes it on
            endpoint = self.bootstrap
        before = self._carried_by.get((queue, partition))
        producer = self._inner.get(endpoint)
        if before == endpoint and producer is not None:
            return producer  # the common case: no lock
        with self._lock:
            before = self._carried_by.get((queue, partition))
            if before is not None and before != endpoint:
                old = self._inner.get(before)
                if old is not None:
                    old.flush()  # what it carries for this partition goes first: order per partition
                self.leader_moves += 1
            producer = self._inner.get(endpoint)
            if producer is None:
                options = dict(self._options)
                if self._name is not None:
                    options["name"] = self._name if self._single else f"{self._name}@{endpoint}"
                # the leader first; the other nodes are its fallbacks (a dead leader's batches go
                # to a live node, which passes them on to the new leader)
                others = [e for e in sorted(set(self._nodes.values())) if e != endpoint]
                target = ",".join([endpoint, *others])
                producer = self._inner[endpoint] = Producer(target, spread=False, **options)
            self._carried_by[(queue, partition)] = endpoint
            return producer

    def _learn(self, queue: str) -> int:
        """A queue's first send: its partitions and priority levels (the bootstrap node creates
        it here if auto-creation is on, else answers UNKNOWN_QUEUE), then its leaders."""
        with self._admin_lock:
            d = self._admin.describe_queue(queue, auto_create=True)
        self._levels[queue] = int(d.get("priority_levels", 1))
        self._partitions[queue] = int(d["partitions"])
        self._refresh([queue])
        return self._partitions[queue]

    def _refresh(self, queues: list[str] | None = None) -> None:
        with self._admin_lock:
            meta = self._admin.metadata(queues)
        self.refreshes += 1
        nodes = {n: e for n, e in meta.get("nodes", {}).items() if e}
        if not nodes:
            self._single = True
        else:
            self._nodes = nodes
        for queue, records in meta.get("queues", {}).items():
            for rec in records:
                endpoint = nodes.get(rec.get("leader") or "")
                if endpoint is not None:
                    self._leaders[(queue, int(rec["partition"]))] = endpoint
            count = len(records) // self._levels.get(queue, 1)  # partitions added since: used now
            if count > self._partitions.get(queue, 0):
                self._partitions[queue] = count

    def _refresh_loop(self) -> None:
        while not self._closed.wait(self._refresh_s):
            known = sorted(self._partitions)
            if not known:
                continue
            try:
                self._refresh(known)
            except FabricError:
                time.sleep(0.1)  # the bootstrap endpoint is away: the last map serves meanwhile
