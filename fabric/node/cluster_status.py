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
from typing import TYPE_CHECKING, Any

from fabric.cluster.status import single_node_status
from fabric.errors import FabricError
from fabric.node.purgatory import Deferred
from fabric.protocol import frames as fr

if TYPE_CHECKING:
    from fabric.node.broker import Broker


def answer(broker: Broker, client: bytes, header: fr.Header) -> None:
    """Reply to CLUSTER_STATUS now (single node) or once etcd was read (cluster: Deferred)."""
    if broker.cluster_ops is None:
        store = broker.store
        queues = [(q, store.settings(q).partitions) for q in store.queue_names()]
        _reply(broker, client, header, single_node_status(broker.config.node_id, broker.endpoint, queues))
        return

    def done(result: Any) -> None:
        if isinstance(result, FabricError):
            broker._error(client, header, (), result)
        else:
            _reply(broker, client, header, result)

    broker.cluster_ops.cluster_status(done)
    raise Deferred


def _reply(broker: Broker, client: bytes, header: fr.Header, status: dict[str, Any]) -> None:
    if header.flags & fr.FLAG_NO_REPLY:
        return
    params = {k: v for k, v in status.items() if k != "partitions"}
    params["partitions"] = len(status["partitions"])
    broker._reply(client, header, params, [json.dumps(status["partitions"]).encode()])
