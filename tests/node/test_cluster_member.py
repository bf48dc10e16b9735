"""ClusterMember's requests on the cluster thread (in-memory etcd; the thread's steps run by hand):
an ISR swap whose outcome etcd left unknown is read back before the leader hears of it, and a
request that hits a bug is still answered."""

from __future__ import annotations

import pytest

from fabric.cluster.agent import NodeAgent
from fabric.cluster.keys import partition_key
from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.partition import PartitionRecord
from fabric.errors import MetaUnavailable
from fabric.node.cluster_member import ClusterMember
from fabric.settings import ClusterConfig

REC = PartitionRecord(("a", "b", "c"), "a", 0, ("a", "b"), 1)
GROWN = REC.with_isr(["a", "b", "c"])


@pytest.fixture
def member() -> tuple[ClusterMember, MemoryEtcd]:
    m = MemoryEtcd()
    cm = ClusterMember("a", "tcp://127.0.0.1:7001", ClusterConfig(etcd=("http://127.0.0.1:9",)), wake=lambda: None)
    cm.agent = NodeAgent(m, "a", "tcp://127.0.0.1:7001", lease_ttl_s=3)  # in memory, not the configured etcd
    cm.agent.step(0)
    assert cm.agent.registered
    m.put(partition_key("q", 0), REC.to_json())
    return cm, m


def _run_requests(cm: ClusterMember) -> None:
    while not cm._requests.empty():
        cm._requests.get_nowait()()


def test_a_swap_lost_with_etcd_is_reported_not_done_once_etcd_answers(member) -> None:  # type: ignore[no-untyped-def]
    cm, m = member
    m.set_available(False)
    cm.propose_isr("q", 0, REC, GROWN)
    _run_requests(cm)
    cm.settle_isr_swaps()
    assert cm.events.empty()  # unknown: the leader keeps the proposal (and its high watermark's wait)
    m.set_available(True)
    cm.settle_isr_swaps()
    ev = cm.events.get_nowait()
    assert ev.kind == "isr" and ev.args == ("q", 0, GROWN, False)  # still REC in the store: not done
    assert cm.events.empty() and not cm._unsettled


def test_a_swap_that_went_in_before_etcd_went_away_is_reported_done(member, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cm, _ = member
    real = cm.agent.cas_partition

    def applied_then_lost(*args):  # type: ignore[no-untyped-def]
        real(*args)
        raise MetaUnavailable("the reply was lost")

    monkeypatch.setattr(cm.agent, "cas_partition", applied_then_lost)
    cm.propose_isr("q", 0, REC, GROWN)
    _run_requests(cm)
    assert cm.events.empty()
    cm.settle_isr_swaps()
    ev = cm.events.get_nowait()
    assert ev.kind == "isr" and ev.args == ("q", 0, GROWN, True)


def test_a_swap_refused_by_etcd_is_reported_at_once(member) -> None:  # type: ignore[no-untyped-def]
    cm, _ = member
    cm.propose_isr("q", 0, REC.with_isr(["a"]), GROWN)  # not what the store holds
    _run_requests(cm)
    ev = cm.events.get_nowait()
    assert ev.kind == "isr" and ev.args[3] is False and not cm._unsettled


def test_a_swap_that_raised_anything_else_is_read_back_too(member, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cm, _ = member

    def broken(*args):  # type: ignore[no-untyped-def]
        raise ValueError("a bug in the client")

    monkeypatch.setattr(cm.agent, "cas_partition", broken)
    cm.propose_isr("q", 0, REC, GROWN)
    _run_requests(cm)  # the exception does not leave the leader waiting for an answer forever
    cm.settle_isr_swaps()
    ev = cm.events.get_nowait()
    assert ev.kind == "isr" and ev.args == ("q", 0, GROWN, False)


def test_a_request_that_hits_a_bug_on_the_cluster_thread_is_answered_with_an_internal_error(member) -> None:  # type: ignore[no-untyped-def]
    from fabric.errors import InternalError
    from fabric.settings import QueueSettings

    cm, _ = member

    class Broken:
        is_controller = True

        def create_queue(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise KeyError("a bug")

    cm.controller = Broken()  # type: ignore[assignment]
    answers: list[object] = []
    cm.create_queue("q2", QueueSettings(), answers.append, forwarded=False)
    _run_requests(cm)
    ev = cm.events.get_nowait()
    assert ev.kind == "done"
    done, result = ev.args
    done(result)
    assert len(answers) == 1 and isinstance(answers[0], InternalError) and "KeyError" in str(answers[0])


def test_producer_ids_in_a_federation_are_unique_across_its_clusters() -> None:
    """A moved queue carries its producers' ids in its batches: the destination must never hand
    out one the source did. In a federation every cluster takes its blocks from one counter
    (above its own, so ids handed out before it joined stay below)."""
    from fabric.cluster.namespace import Namespaced

    m = MemoryEtcd()
    members = []
    for name in ("east", "west", "solo"):
        cm = ClusterMember(
            "a", "tcp://127.0.0.1:7001", ClusterConfig(name=name, etcd=("http://x:9",)), wake=lambda: None
        )
        cm.meta = Namespaced(m, name)
        members.append(cm)
    east, west, solo = members
    east.federation = west.federation = object()  # type: ignore[assignment]  # in a federation
    for name in ("east", "west"):  # their reports: the clusters of the federation
        m.put(f"/federation/clusters/{name}", b"{}")
    m.put("/clusters/west/fabric/producer-ids", b'{"next": 5000}')  # west handed out ids before joining
    a, b = east._fresh_producer_id(), west._fresh_producer_id()
    assert a == 5000 and b == 6000 and east._fresh_producer_id() == 5001
    assert solo._fresh_producer_id() == 0  # a cluster outside the federation keeps its own counter
