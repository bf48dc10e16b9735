"""The single node's placement (fabric/node/placement.py): it leads every partition it holds,
coordinates every group and decides queue changes itself; driven through the broker in memory."""

from __future__ import annotations

from fabric.node.placement import Placement, SingleNode
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from tests.node.harness import BrokerHarness


def test_a_single_node_broker_has_the_single_node_placement(harness: BrokerHarness) -> None:
    placement: Placement = harness.broker.placement
    assert isinstance(placement, SingleNode)
    assert placement.replication is None and placement.cluster_ops is None and placement.usage_here


def test_metadata_is_a_map_of_one_node_leading_every_partition(harness: BrokerHarness) -> None:
    h = harness
    h.create_queue("q", partitions=2)
    h.create_queue("r")
    reply = h.call(Op.METADATA, {"queues": ["q", "missing"]})
    assert reply == {
        "cluster": None,
        "controller": None,
        "nodes": {"n1": None},
        "queues": {
            "q": [
                {"partition": p, "leader": "n1", "leader_epoch": 0, "replicas": ["n1"], "isr": ["n1"]} for p in (0, 1)
            ]
        },
    }
    assert sorted(h.call(Op.METADATA, {})["queues"]) == ["q", "r"]


def test_every_partition_is_served_here_and_an_internal_append_is_allowed(harness: BrokerHarness) -> None:
    h = harness
    h.create_queue("q", partitions=3)
    placement = h.broker.placement
    for p in range(3):
        assert placement.route(b"c", fr.Header(Op.PRODUCE, 1), {"queue": "q", "partition": p}, ()) is None
        placement.check_internal_append("q", p)
        assert placement.replicate("q", p, 0, None, None, False) is False  # visible and replied here
    assert placement.mapped_queues() == {}
    assert placement.next_due_ms() is None


def test_replica_fetch_is_refused_on_a_single_node(harness: BrokerHarness) -> None:
    h = harness
    h.create_queue("q")
    params = {
        "queue": "q",
        "partition": 0,
        "replica": "n2",
        "leader_epoch": 0,
        "fetch_offset": 0,
        "last_fetched_epoch": 0,
        "max_bytes": 1024,
    }
    m = h.request(Op.REPLICA_FETCH, params)
    assert m.params["error"] == "BAD_PARAMETER" and "not in a cluster" in m.params["message"]


def test_producer_ids_come_from_the_nodes_own_store(harness: BrokerHarness) -> None:
    h = harness
    first = h.call(Op.INIT_PRODUCER, {"name": "p"})
    again = h.call(Op.INIT_PRODUCER, {"name": "p"})
    assert again["producer_id"] == first["producer_id"] and again["epoch"] == first["epoch"] + 1


def test_queue_changes_and_group_forgetting_happen_here_at_once(harness: BrokerHarness) -> None:
    h = harness
    assert h.create_queue("q", partitions=1)["partitions"] == 1
    assert h.call(Op.ALTER_QUEUE, {"name": "q", "partitions": 2})["added"] == 1
    h.call(Op.COMMIT, {"queue": "q", "group": "g", "offsets": {"0": 0}})
    assert h.call(Op.COMMIT, {"queue": "q", "group": "g", "offsets": {}, "forget": True}) == {}
    assert h.call(Op.DELETE_QUEUE, {"name": "q"}) == {"deleted": True}


def test_expand_grows_the_queue_here_and_reports_the_outcome(harness: BrokerHarness) -> None:
    h = harness
    h.create_queue("q", partitions=1)
    outcomes: list[object] = []
    h.broker.placement.expand("q", 2, outcomes.append)
    h.broker.placement.expand("missing", 2, outcomes.append)
    assert outcomes[0] is None and h.store.settings("q").partitions == 2
    assert getattr(outcomes[1], "name", None) == "UNKNOWN_QUEUE"
    assert all(h.broker.placement.leads("q", p) for p in range(2))
