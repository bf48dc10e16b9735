"""Each cluster's side of a queue move: its elected controller brings its own copy of every moving
queue to what the move's phase says (``fabric.federation.moves.wanted``): created sealed, sealed,
unsealed, or deleted, through its ordinary fenced queue operations (``LocalQueues``; the node
passes its ``Controller``, the simulation one of its own). Pure: no sockets, files or clocks."""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

from fabric.cluster.keys import queue_key as cluster_queue_key
from fabric.cluster.meta import KeyValue, MetaStore
from fabric.cluster.namespace import cluster_prefix
from fabric.federation.directory import QueuePlacement, queue_key
from fabric.federation.moves import MOVES_PREFIX, Move, move_key, wanted

log = logging.getLogger(__name__)


class LocalQueues(Protocol):
    def create(self, queue: str, settings: dict[str, Any]) -> None: ...

    def delete(self, queue: str) -> None: ...

    def seal(self, queue: str, sealed: bool) -> None: ...


def read_moves(meta: MetaStore) -> list[tuple[KeyValue, Move]]:
    """Every readable move under ``/federation/moves/`` with its key (unreadable ones logged)."""
    out = []
    for kv in meta.get_prefix(MOVES_PREFIX)[0]:
        try:
            move = Move.from_json(kv.value)
        except (ValueError, TypeError) as e:
            log.warning("cannot read %s: %s", kv.key, e)
            continue
        if kv.key == move_key(move.queue):
            out.append((kv, move))
    return out


def local_queue(meta: MetaStore, cluster: str, queue: str) -> dict[str, Any] | None:
    """The queue key of ``queue`` in ``cluster``'s namespace (settings under ``settings``), or None."""
    kv = meta.get(cluster_prefix(cluster) + cluster_queue_key(queue))
    return json.loads(kv.value) if kv is not None else None


def apply_moves(meta: MetaStore, cluster: str, queues: LocalQueues) -> list[str]:
    """One pass over the moves for ``cluster`` (``meta`` un-namespaced). Returns what it did
    (``"<queue> created|deleted|sealed|unsealed"``). Raises what ``queues`` raises."""
    done = []
    for _, move in read_moves(meta):
        want = wanted(move, cluster)
        if want.present is None and want.sealed is None:
            continue
        q = move.queue
        held = local_queue(meta, cluster, q)
        if want.present is False:
            if held is not None:
                queues.delete(q)
                done.append(f"{q} deleted")
        elif held is None and want.present:
            pkv = meta.get(queue_key(q))
            settings = QueuePlacement.from_json(pkv.value).settings if pkv is not None else {}
            queues.create(q, {**settings, "partitions": move.partitions, "sealed": bool(want.sealed)})
            done.append(f"{q} created")
        elif held is not None and want.sealed is not None and bool(held["settings"].get("sealed")) != want.sealed:
            queues.seal(q, want.sealed)
            done.append(f"{q} {'sealed' if want.sealed else 'unsealed'}")
    return done
