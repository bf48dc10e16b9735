"""The move's document and state machine (fabric/federation/moves.py), asking for a move
(move_requests.py) and the manager's driver (move_driver.py) on the in-memory etcd."""

from __future__ import annotations

import json

import pytest

from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.meta import Put
from fabric.errors import BadParameter, QueueExists, UnknownQueue
from fabric.federation.directory import MANAGER_KEY, QueuePlacement, cluster_key, queue_key
from fabric.federation.move_driver import MoveDriver, MoveFailed
from fabric.federation.move_requests import cancel_move, plan_move, read_move, request_move
from fabric.federation.moves import (
    CANCELLED,
    CANCELLING,
    COPYING,
    CUTOVER,
    DONE,
    PHASES,
    REFUSED,
    SWITCHED,
    TRANSITIONS,
    Move,
    MoveError,
    PartitionProgress,
    move_key,
    next_event,
    wanted,
    writable,
)
from tests.federation.reports import report

NOW = 1_000_000
EVENTS = sorted({e for _, e in TRANSITIONS})


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("event", EVENTS)
def test_every_phase_and_event_moves_by_the_table_or_raises_naming_both(phase: str, event: str) -> None:
    m = Move("q", "a", "b", phase=phase)
    if (phase, event) in TRANSITIONS:
        assert m.on(event, 5).phase == TRANSITIONS[(phase, event)]
    else:
        with pytest.raises(MoveError, match=f"{event}.*{phase}"):
            m.on(event, 5)


@pytest.mark.parametrize("phase", PHASES)
def test_never_both_copies_writable_and_the_controllers_wants_agree(phase: str) -> None:
    m = Move("q", "a", "b", phase=phase)
    assert not (writable(m, "a") and writable(m, "b"))
    for c in ("a", "b"):
        w = wanted(m, c)
        if w.sealed is False:
            assert writable(m, c)
        if w.sealed is True or w.present is False:
            assert not writable(m, c)
    assert wanted(m, "elsewhere").present is None


def test_nothing_after_switched_leads_back_to_the_source() -> None:
    after = {SWITCHED}
    for _ in PHASES:
        after |= {v for (p, _), v in TRANSITIONS.items() if p in after}
    assert after == {SWITCHED, DONE}


def test_a_move_round_trips_and_bad_documents_are_named() -> None:
    m = Move("q", "a", "b", phase=SWITCHED, partitions=2, sealed_at=(5, 7), error=None, started_ms=1, updated_ms=2)
    assert Move.from_json(m.to_json()) == m
    doc = json.loads(m.to_json())
    for key, bad in (("phase", "flying"), ("partitions", -1), ("sealed_at", [-1]), ("cancel", "yes"), ("queue", "")):
        with pytest.raises(ValueError):
            Move.from_json(json.dumps({**doc, key: bad}))
    with pytest.raises(ValueError, match="newer"):
        Move.from_json(json.dumps({**doc, "version": 2}))


def test_next_event_needs_every_partition() -> None:
    m = Move("q", "a", "b", phase=COPYING, partitions=2)
    near = PartitionProgress(5000, 5000, False, 4500)
    far = PartitionProgress(5000, 5000, False, 10)
    assert next_event(m, [near, near]) == "caught_up"
    assert next_event(m, [near, far]) is None and next_event(m, [near]) is None and next_event(m, None) is None
    c = Move("q", "a", "b", phase=CUTOVER, partitions=2)
    cut = PartitionProgress(9, 9, True, 9)
    assert next_event(c, [cut, cut]) == "switch"
    assert next_event(c, [cut, PartitionProgress(9, 10, True, 9)]) is None  # a write awaits its replicas
    assert next_event(c, [cut, PartitionProgress(9, 9, False, 9)]) is None  # the leader has not sealed yet


class Plane:
    def __init__(self) -> None:
        self.progress: list[PartitionProgress] | None = None
        self.fail: str | None = None

    def copy(self, move: Move) -> list[PartitionProgress] | None:
        if self.fail:
            raise MoveFailed(self.fail)
        return self.progress

    def forget(self, queue: str) -> None:
        pass


def _world() -> tuple[MemoryEtcd, int]:
    etcd = MemoryEtcd(NOW)
    for name in ("a", "b"):
        etcd.put(cluster_key(name), report(name, published_ms=NOW).to_json())
    etcd.put(queue_key("q"), QueuePlacement("q", ("a", "a"), 1, {"partitions": 2}).to_json())
    etcd.put(queue_key("split"), QueuePlacement("split", ("a", "b"), 1).to_json())
    for name, settings in (
        ("prio", {"priority_levels": 3}),
        ("direct", {"mode": "direct"}),
        ("sealed", {"encrypt": True}),
    ):
        etcd.put(queue_key(name), QueuePlacement(name, ("a",), 1, settings).to_json())
    etcd.put("/clusters/a/groups/q/g1", b'{"0": 3, "1": 4}')
    etcd.put("/clusters/a/groupstates/q/w", b'{"state": 1}')
    epoch = etcd.put(MANAGER_KEY, b"{}")
    return etcd, etcd.get(MANAGER_KEY).create_revision if epoch else 0  # type: ignore[union-attr]


def test_asking_checks_the_move_and_a_dry_run_says_what_it_would_do() -> None:
    etcd, _ = _world()
    plan = plan_move(etcd, "q", "b", NOW)
    assert plan == {
        "queue": "q",
        "source": "a",
        "destination": "b",
        "partitions": 2,
        "groups": ["g1", "w"],
        "problem": None,
    }
    assert "split" in plan_move(etcd, "split", "b", NOW)["problem"]
    assert "already" in plan_move(etcd, "q", "a", NOW)["problem"]
    assert "does not report" in plan_move(etcd, "q", "zz", NOW)["problem"]
    for name, why in (("prio", "priority levels"), ("direct", "direct queue"), ("sealed", "encrypted")):
        assert why in plan_move(etcd, name, "b", NOW)["problem"]
    with pytest.raises(UnknownQueue):
        request_move(etcd, "nope", "b", NOW)
    with pytest.raises(BadParameter):
        request_move(etcd, "split", "b", NOW)
    assert read_move(etcd, "q") is None  # a dry run and a refusal write nothing
    request_move(etcd, "q", "b", NOW)
    with pytest.raises(QueueExists, match="being moved already"):
        request_move(etcd, "q", "b", NOW)


def _step(etcd: MemoryEtcd, epoch: int, plane: Plane) -> Move:
    MoveDriver(etcd, "m").step(NOW + 10, epoch, plane)
    m = read_move(etcd, "q")
    assert m is not None
    return m


def test_the_driver_carries_a_move_through_and_switches_the_directory_with_the_groups() -> None:
    etcd, epoch = _world()
    request_move(etcd, "q", "b", NOW)
    plane = Plane()
    assert _step(etcd, 0, plane).phase == "requested"  # not the manager: nothing
    assert _step(etcd, epoch + 1, plane).phase == "requested"  # a deposed manager's epoch: fenced
    m = _step(etcd, epoch, plane)
    assert m.phase == COPYING and m.partitions == 2
    assert _step(etcd, epoch, plane).phase == COPYING  # no progress known yet
    plane.progress = [PartitionProgress(100, 100, False, 90)] * 2
    assert _step(etcd, epoch, plane).phase == CUTOVER
    plane.progress = [PartitionProgress(120, 120, True, 120), PartitionProgress(80, 80, True, 80)]
    m = _step(etcd, epoch, plane)
    assert m.phase == SWITCHED and m.sealed_at == (120, 80)
    placement = QueuePlacement.from_json(etcd.get(queue_key("q")).value)  # type: ignore[union-attr]
    assert placement.partitions == ("b", "b") and placement.settings == {"partitions": 2}
    assert etcd.get("/clusters/b/groups/q/g1").value == b'{"0": 3, "1": 4}'  # type: ignore[union-attr]
    assert etcd.get("/clusters/b/groupstates/q/w") is not None
    with pytest.raises(BadParameter, match="too late"):
        cancel_move(etcd, "q")
    assert _step(etcd, epoch, plane).phase == SWITCHED  # until the clusters have done their part
    etcd.put("/clusters/b/fabric/queues/q", json.dumps({"settings": {"sealed": False}}).encode())
    assert _step(etcd, epoch, plane).phase == DONE


def test_a_cancel_or_a_lost_cluster_or_a_failed_copy_rolls_back() -> None:
    etcd, epoch = _world()
    plane = Plane()
    request_move(etcd, "q", "b", NOW)
    _step(etcd, epoch, plane)
    cancel_move(etcd, "q")
    m = _step(etcd, epoch, plane)
    assert m.phase == CANCELLING and m.error == "cancelled on request"
    etcd.put("/clusters/a/fabric/queues/q", json.dumps({"settings": {"sealed": False}}).encode())
    assert _step(etcd, epoch, plane).phase == CANCELLED
    assert QueuePlacement.from_json(etcd.get(queue_key("q")).value).partitions == ("a", "a")  # type: ignore[union-attr]

    request_move(etcd, "q", "b", NOW)  # a finished move is replaced by a new one
    _step(etcd, epoch, plane)
    etcd.put(cluster_key("a"), report("a", published_ms=NOW - 60_000).to_json())
    m = _step(etcd, epoch, plane)
    assert m.phase == CANCELLING and "has not reported" in (m.error or "")

    etcd.put(cluster_key("a"), report("a", published_ms=NOW).to_json())
    etcd.put(move_key("q"), Move("q", "a", "b", phase=CUTOVER, partitions=2).to_json())
    plane.fail = "offsets disagree"
    assert "offsets disagree" in (_step(etcd, epoch, plane).error or "")


def test_a_move_of_a_queue_not_wholly_on_its_source_is_refused() -> None:
    etcd, epoch = _world()
    etcd.put(move_key("q"), Move("q", "b", "a").to_json())  # written by hand, or the queue moved since
    m = _step(etcd, epoch, Plane())
    assert m.phase == REFUSED and "already" in (m.error or "")
    etcd.txn([], [Put(move_key("q"), Move("q", "a", "b", phase=CANCELLED).to_json())])
    assert _step(etcd, epoch, Plane()).phase == CANCELLED  # finished moves are left alone
