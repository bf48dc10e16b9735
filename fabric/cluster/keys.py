"""The etcd key layout of a fabric cluster (docs: API.md "etcd key layout"), in one place.

Theory of operation
-------------------
Everything lives under ``/fabric/``: the controller's key (held under its lease; its
create_revision is the controller epoch), one key per live node (held under the node's lease;
its create_revision is the node epoch), one per queue and one per partition. Queue names never
contain ``/`` (``fabric.protocol.ops.QUEUE_NAME``), so ``/fabric/partitions/<queue>/`` is a
prefix of exactly that queue's partitions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fabric.cluster.meta import KeyValue

ROOT = "/fabric/"
CONTROLLER_KEY = "/fabric/controller"
NODES_PREFIX = "/fabric/nodes/"
LOAD_PREFIX = "/load/"  # /load/<node> -> its load and disk (fabric.federation.report.NodeLoad)
ROUTERS_PREFIX = "/fabric/routers/"  # one per live router, under its lease: {"name", "endpoint"}
QUEUES_PREFIX = "/fabric/queues/"
PARTITIONS_PREFIX = "/fabric/partitions/"
MOVES_PREFIX = "/fabric/moves/"  # replica moves under way, one per partition (fabric/cluster/moves.py)
GROUPS_PREFIX = "/groups/"  # consumer groups' committed offsets; outside /fabric/: not the agent's watch
GROUP_STATES_PREFIX = "/groupstates/"  # queue groups' lease tables (receive counts, settled ranges)


def node_key(name: str) -> str:
    return NODES_PREFIX + name


def router_key(name: str) -> str:
    return ROUTERS_PREFIX + name


def queue_key(queue: str) -> str:
    return QUEUES_PREFIX + queue


def partitions_prefix(queue: str) -> str:
    return f"{PARTITIONS_PREFIX}{queue}/"


def partition_key(queue: str, partition: int) -> str:
    return f"{PARTITIONS_PREFIX}{queue}/{partition}"


def groups_prefix(queue: str) -> str:
    return f"{GROUPS_PREFIX}{queue}/"


def group_key(queue: str, group: str) -> str:
    return f"{GROUPS_PREFIX}{queue}/{group}"


def group_states_prefix(queue: str) -> str:
    return f"{GROUP_STATES_PREFIX}{queue}/"


def group_state_key(queue: str, group: str) -> str:
    return f"{GROUP_STATES_PREFIX}{queue}/{group}"


def move_key(queue: str, partition: int) -> str:
    return f"{MOVES_PREFIX}{queue}/{partition}"


def _queue_partition(prefix: str, key: str) -> tuple[str, int] | None:
    if not key.startswith(prefix):
        return None
    queue, sep, number = key[len(prefix) :].rpartition("/")
    if not sep or not queue or not number.isdigit():
        return None
    return queue, int(number)


def parse_partition_key(key: str) -> tuple[str, int] | None:
    """``(queue, partition)`` of a partition key; None for anything else."""
    return _queue_partition(PARTITIONS_PREFIX, key)


def parse_move_key(key: str) -> tuple[str, int] | None:
    """``(queue, partition)`` of a replica move's key (fabric/cluster/moves.py); None for anything else."""
    return _queue_partition(MOVES_PREFIX, key)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A registered node: its key's create_revision is its epoch (a new one per registration)."""

    name: str
    endpoint: str
    zone: str | None
    epoch: int


def node_value(name: str, endpoint: str, zone: str | None) -> bytes:
    return json.dumps({"name": name, "endpoint": endpoint, "zone": zone}, sort_keys=True).encode()


def parse_node(kv: KeyValue) -> NodeInfo | None:
    """The node a ``/fabric/nodes/<name>`` key describes; None if the value is not valid."""
    name = kv.key[len(NODES_PREFIX) :]
    try:
        raw = json.loads(kv.value)
        endpoint = str(raw["endpoint"])
        zone = raw.get("zone")
    except (ValueError, KeyError, TypeError):
        return None
    return NodeInfo(name, endpoint, None if zone is None else str(zone), kv.create_revision)


def controller_value(name: str, endpoint: str) -> bytes:
    return json.dumps({"name": name, "endpoint": endpoint}, sort_keys=True).encode()
