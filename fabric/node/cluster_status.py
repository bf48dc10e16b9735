"""CLUSTER_STATUS: ``fabric cluster status`` answered by a node, for a client that reaches only
the routers or one store (no etcd, no config).

A cluster node reads etcd with its own client on its cluster thread (the loop never waits on
etcd) and answers with what ``fabric.cluster.status.read_status`` gives; the embedded single
node answers at once with itself as the whole cluster. The reply's params hold everything but
the partitions, which go as one JSON data frame: a cluster with thousands of partitions would
not fit the params frame's 1 MiB.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fabric.cluster.status import single_node_status
from fabric.errors import FabricError
from fabric.node.purgatory import Deferred
from fabric.protocol import frames as fr

if TYPE_CHECKING:
    from fabric.node.cluster_member import ClusterMember
    from fabric.store.store import Store

ReplyFn = Callable[[bytes, fr.Header, dict[str, Any], Sequence[Any]], None]
ErrorFn = Callable[[bytes, fr.Header | None, Sequence[Any], FabricError], None]


def single_node(reply: ReplyFn, client: bytes, header: fr.Header, node_id: str, endpoint: str, store: Store) -> None:
    """The embedded single node's answer, at once: itself as the whole cluster."""
    queues = [(q, store.settings(q).partitions) for q in store.queue_names()]
    _reply(reply, client, header, single_node_status(node_id, endpoint, queues))


def from_etcd(reply: ReplyFn, error: ErrorFn, member: ClusterMember, client: bytes, header: fr.Header) -> None:
    """A cluster node's answer, once its cluster thread has read etcd. Raises Deferred."""

    def done(result: Any) -> None:
        if isinstance(result, FabricError):
            error(client, header, (), result)
        else:
            _reply(reply, client, header, result)

    member.cluster_status(done)
    raise Deferred


def _reply(reply: ReplyFn, client: bytes, header: fr.Header, status: dict[str, Any]) -> None:
    if header.flags & fr.FLAG_NO_REPLY:
        return
    params = {k: v for k, v in status.items() if k != "partitions"}
    params["partitions"] = len(status["partitions"])
    reply(client, header, params, [json.dumps(status["partitions"]).encode()])
