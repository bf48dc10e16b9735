"""The front door's rule (fabric/federation/front_door.py) and the directory view a router
follows (fabric/federation/directory_view.py), in memory."""

from __future__ import annotations

import dataclasses

import pytest

from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.meta import MetaUnavailable
from fabric.errors import NotLeader, QueueElsewhere
from fabric.federation.directory import QueuePlacement, cluster_key, queue_key
from fabric.federation.directory_view import DirectoryView
from fabric.federation.front_door import FrontDoor
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from tests.federation.reports import report

SPLIT = QueuePlacement("split", ("east", "west", "east", "west"), 1)
WEST = QueuePlacement("wq", ("west", "west"), 1)
EAST = QueuePlacement("eq", ("east",), 1)
ROUTERS = {"east": ("tcp://e:1",), "west": ("tcp://w:1", "tcp://w:2")}


def door(cluster: str = "east") -> FrontDoor:
    return FrontDoor(cluster, {p.queue: p for p in (SPLIT, WEST, EAST)}, ROUTERS)


def test_queues_outside_the_federation_and_wholly_here_are_served() -> None:
    d = door()
    local = {"plain", "eq", "split"}
    assert d.refusal(Op.PRODUCE, {"queue": "plain", "partition": 0}, local) is None
    assert d.refusal(Op.DESCRIBE_QUEUE, {"name": "eq"}, local) is None
    assert d.refusal(Op.SUBSCRIBE, {"queue": "eq"}, local) is None
    assert d.refusal(Op.PING, {}, local) is None  # names no queue


def test_a_queue_wholly_elsewhere_is_redirected_with_its_table_and_routers() -> None:
    err = door().refusal(Op.PRODUCE, {"queue": "wq", "partition": 1}, {"split"})
    assert isinstance(err, QueueElsewhere) and err.code == 41
    assert err.details == {
        "queue": "wq",
        "partitions": ["west", "west"],
        "routers": {"west": ["tcp://w:1", "tcp://w:2"]},
    }
    assert "west" in err.message and "'east'" in err.message


def test_a_split_queue_entry_redirects_a_client_that_does_not_name_the_cluster() -> None:
    d = door()
    local = {"split"}
    for op, key in ((Op.DESCRIBE_QUEUE, "name"), (Op.SUBSCRIBE, "queue")):
        err = d.refusal(op, {key: "split", "cluster": None}, local)
        assert isinstance(err, QueueElsewhere)
        assert err.details["partitions"] == list(SPLIT.partitions)
        assert err.details["routers"] == {"east": ["tcp://e:1"], "west": ["tcp://w:1", "tcp://w:2"]}
        assert d.refusal(op, {key: "split", "cluster": "east"}, local) is None  # a follower: this share
        assert isinstance(d.refusal(op, {key: "split", "cluster": "west"}, local), QueueElsewhere)
    # partition-addressed requests for the share held here are a follower's: served
    assert d.refusal(Op.PRODUCE, {"queue": "split", "partition": 1}, local) is None
    assert d.refusal(Op.FETCH, {"queue": "split", "partition": 0}, local) is None


def test_a_share_placed_here_but_not_created_yet_is_retriable() -> None:
    err = door().refusal(Op.SUBSCRIBE, {"queue": "split", "cluster": "east"}, set())
    assert isinstance(err, NotLeader) and err.retriable and "not created yet" in err.message
    # without the cluster named: the client must learn the split first
    assert isinstance(door().refusal(Op.PRODUCE, {"queue": "split", "partition": 0}, set()), QueueElsewhere)


def test_a_cluster_without_routers_is_named_with_none() -> None:
    d = FrontDoor("east", {"wq": WEST}, {})
    err = d.refusal(Op.DESCRIBE_QUEUE, {"name": "wq"}, set())
    assert isinstance(err, QueueElsewhere) and err.details["routers"] == {"west": []}


def test_metadata_settings_leave_out_shares_of_split_queues() -> None:
    raw = fr.encode_params({"settings": {"split": {"partitions": 2}, "eq": {"partitions": 1}, "plain": {}}, "x": 1})
    out = fr.decode_params(door().without_shares(raw))
    assert set(out["settings"]) == {"eq", "plain"} and out["x"] == 1
    untouched = fr.encode_params({"settings": {"plain": {}}})
    assert door().without_shares(untouched) is untouched
    assert door().without_shares(b"not json") == b"not json"


def test_the_directory_view_follows_placements_and_routers() -> None:
    etcd = MemoryEtcd()
    etcd.put(queue_key("split"), SPLIT.to_json())
    etcd.put(cluster_key("west"), report("west").to_json())
    etcd.put("/federation/manager", b"{}")  # not the view's
    view = DirectoryView(etcd, "test")
    view.follow()
    assert view.placements == {"split": SPLIT}
    assert view.routers == {"west": report("west").routers}
    v = view.version
    # a report rewritten with the same routers is no change
    etcd.put(cluster_key("west"), dataclasses.replace(report("west"), published_ms=5).to_json())
    view.follow()
    assert view.version == v
    etcd.put(cluster_key("west"), dataclasses.replace(report("west"), routers=("tcp://new:1",)).to_json())
    etcd.put(queue_key("wq"), WEST.to_json())
    view.follow()
    assert view.version > v and view.routers["west"] == ("tcp://new:1",) and set(view.placements) == {"split", "wq"}
    v = view.version
    etcd.delete(queue_key("split"))
    etcd.put(queue_key("bad"), b"{not json")
    view.follow()
    assert set(view.placements) == {"wq"} and view.version > v


@pytest.mark.parametrize("lost", ["compacted", "unavailable"])
def test_the_directory_view_reads_everything_again_after_losing_its_watch(lost: str) -> None:
    etcd = MemoryEtcd(history_max=2)
    view = DirectoryView(etcd, "test")
    view.follow()
    for i in range(5):
        etcd.put(queue_key(f"q{i}"), dataclasses.replace(WEST, queue=f"q{i}").to_json())
    if lost == "compacted":
        etcd.compact(etcd.revision)
    else:
        etcd.set_available(False)
        with pytest.raises(MetaUnavailable):
            view.follow()
        etcd.set_available(True)
    view.follow()
    view.follow()
    assert set(view.placements) == {f"q{i}" for i in range(5)}


def test_a_deletion_request_round_trips_and_the_manager_drops_the_queue() -> None:
    from fabric.federation.directory import QueueDeletion, deletion_key
    from fabric.federation.manager import Manager, read_deletions, read_table

    d = QueueDeletion("split", ("east", "west"))
    assert QueueDeletion.from_json(d.to_json()) == d
    with pytest.raises(ValueError, match="clusters"):
        QueueDeletion.from_json(b'{"queue": "q", "clusters": "east"}')
    etcd = MemoryEtcd()
    etcd.put(queue_key("split"), SPLIT.to_json())
    etcd.put(queue_key("wq"), WEST.to_json())
    etcd.put(deletion_key("split"), d.to_json())
    etcd.put(deletion_key("bad"), b"{")
    manager = Manager(etcd, "east/n1", "tcp://m", lease_ttl_s=3)
    manager.step(0)  # elected; requests and deletions served
    assert manager.is_manager
    assert set(read_table(etcd)) == {"wq"}
    assert read_deletions(etcd) == [d]  # the asker removes it once no cluster holds a share
