"""PURGE: remove every message of a partition and keep the queue, its settings and its groups.

Theory of operation
-------------------
A purge is a move of the partition's log start, the same move retention and the
``dead_letter_oldest`` overflow make: the log starts at the partition's high watermark (what
consumers can see), whole segments below it are deleted, and the new start is written to the
partition's ``start-offset`` file, so it survives a restart. ``Broker.on_trimmed`` then settles
every queue group's leases below it and moves every subscription's cursor up to it: nobody is
handed a purged message, and a group's lag counts from the log start at the least. Records
appended but not yet visible (an ``fsync = "always"`` write not yet on disk, a strict-ordering
window) stay, as do delayed messages not yet due: they were not in the queue yet when it was
purged.

In a cluster the request is served by the partition's leader (passed on there like LIST_OFFSETS);
each follower advances its own log start to the leader's, which every REPLICA_FETCH answer
carries (``Replication.on_peer_reply``), up to what it holds; the leader answers their parked
fetches at once. The high watermark never passes
what the in-sync replicas hold, so they can always follow.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fabric.errors import BadParameter
from fabric.protocol import frames as fr
from fabric.protocol.ops import INTERNAL_PREFIX
from fabric.protocol.requests import PurgeParams

log = logging.getLogger(__name__)


def purge_op(b: Any, client: bytes, header: fr.Header, params: PurgeParams, data: Sequence[Any]) -> dict | None:
    """PURGE: served at the partition's leader (a cluster passes it on there)."""
    b.placement.route(client, header, params, data)
    return purge_partition(b, params["queue"], params["partition"])


def purge_partition(broker: Any, queue: str, p: int) -> dict[str, Any]:
    """Start ``queue/p`` at its high watermark. Returns ``{"queue", "partition", "purged",
    "log_start_offset"}`` (``purged``: offsets removed by this request)."""
    if queue.startswith(INTERNAL_PREFIX):
        raise BadParameter(f"queue {queue!r}: the node's own queues are not purged")
    settings = broker.store.settings(queue)
    if settings.mode == "direct":
        raise BadParameter(f"queue {queue!r} is a direct queue: it stores nothing to purge")
    plog = broker._partition(queue, p, settings)
    before = plog.log_start_offset
    upto = broker.visible(queue, p, before)
    start = plog.advance_start(upto) if upto > before else before
    if start > before:
        broker.on_trimmed(queue, p, start)
        broker.placement.trimmed(queue, p)  # a cluster: the followers' parked fetches answer now, with the new start
        log.info("queue %r partition %d purged: offsets %d..%d removed", queue, p, before, start)
    return {"queue": queue, "partition": p, "purged": start - before, "log_start_offset": start}
