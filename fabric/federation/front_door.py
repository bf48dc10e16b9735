"""The front door: what a router of a federated cluster answers for a federation queue.

Theory of operation
-------------------
A router of any cluster serves every queue of the federation. It does not forward a request to
another cluster: it answers QUEUE_ELSEWHERE, naming the cluster of each of the queue's
partitions and each of those clusters' routers, and the client follows (``fabric/client/
federated.py``). So the data path has no extra hop, and no router translates partition numbers
in requests, replies and pushes (docs/architecture.md, "The front door").

:meth:`FrontDoor.refusal` is the one rule, run for every request that names a queue
(``QUEUE_PARAM``), after the cheap test that the queue is a federation queue at all (one dict
lookup: other queues pass as before):

* a queue wholly on this cluster is an ordinary queue of it: served;
* a request that names this cluster (``cluster``, sent by a client that followed a redirect) is
  served from this cluster's share; a share placed here but not created yet is refused with the
  retriable NOT_LEADER;
* DESCRIBE_QUEUE and SUBSCRIBE (where a client first meets a queue) of a queue not wholly here
  get QUEUE_ELSEWHERE, even when this cluster holds a share: the client must learn the split
  before it numbers partitions;
* any other request is served when this cluster holds the queue (a follower's partition-addressed
  request, numbered locally), else it gets QUEUE_ELSEWHERE.

METADATA ``settings`` (a producer's bulk look-up of every queue a node holds) would show a split
queue's share here as a whole queue: :meth:`FrontDoor.without_shares` takes such queues out of
the reply, so the producer describes them one by one and meets QUEUE_ELSEWHERE.

Pure: the placements and routers come from :class:`~fabric.federation.directory_view.DirectoryView`.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any

from fabric.errors import FabricError, NotLeader, QueueElsewhere
from fabric.federation.directory import QueuePlacement
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op

# the ops that name a queue, and the param that names it
QUEUE_PARAM: dict[Op, str] = {
    Op.PRODUCE: "queue",
    Op.FETCH: "queue",
    Op.LIST_OFFSETS: "queue",
    Op.PURGE: "queue",
    Op.SUBSCRIBE: "queue",
    Op.COMMIT: "queue",
    Op.COMMITTED: "queue",
    Op.REDRIVE: "queue",
    Op.SETTLE: "queue",
    Op.DESCRIBE_QUEUE: "name",
}
ENTRY_OPS = frozenset({Op.DESCRIBE_QUEUE, Op.SUBSCRIBE})  # where a client first meets a queue


@dataclass(frozen=True)
class FrontDoor:
    """The directory as one router reads it: ``cluster`` is the router's own."""

    cluster: str
    placements: Mapping[str, QueuePlacement] = field(default_factory=dict)
    routers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # cluster -> its routers

    def refusal(self, op: Op, params: Mapping[str, Any], local: Container[str]) -> FabricError | None:
        """None: serve the request here. Else the reply to give: QUEUE_ELSEWHERE, or NOT_LEADER
        for a share placed here and not created yet. ``local``: the queues this cluster's map
        holds."""
        key = QUEUE_PARAM.get(op)
        if key is None:
            return None
        queue = params.get(key)
        placement = self.placements.get(queue)  # type: ignore[arg-type]
        if placement is None:
            return None
        clusters = placement.clusters
        if clusters == (self.cluster,):
            return None
        here = self.cluster in clusters
        if here and (params.get("cluster") == self.cluster or (op not in ENTRY_OPS and queue in local)):
            if queue in local:
                return None
            return NotLeader(f"queue {queue!r}: its share on cluster {self.cluster!r} is not created yet; retry")
        return self.elsewhere(placement)

    def elsewhere(self, placement: QueuePlacement) -> QueueElsewhere:
        clusters = placement.clusters
        where = ", ".join(clusters)
        return QueueElsewhere(
            f"queue {placement.queue!r} lives on cluster(s) {where}, not only on {self.cluster!r}: ask their routers",
            queue=placement.queue,
            partitions=list(placement.partitions),
            routers={c: list(self.routers.get(c, ())) for c in clusters},
        )

    def without_shares(self, raw: bytes) -> bytes:
        """A METADATA reply's params without the ``settings`` of federation queues that are not
        wholly on this cluster (the bytes as they were when there are none)."""
        try:
            params = fr.decode_params(raw)
        except FabricError:
            return raw
        settings = params.get("settings")
        if not isinstance(settings, dict):
            return raw
        own = (self.cluster,)
        drop = [q for q in settings if q in self.placements and self.placements[q].clusters != own]
        if not drop:
            return raw
        for q in drop:
            del settings[q]
        return fr.encode_params(params)
