"""The replication roles' passes cost what is due, not what exists: a follower's lost fetch is
sent again by its own timer, a leader whose followers hold its whole log is not looked at
again until something happens, a high-watermark checkpoint writes only what moved, and an
idle partition's fetch waits longer. Driven in memory: a real Broker and Store, no sockets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fabric.cluster.partition import PartitionRecord
from fabric.errors import NotLeader
from fabric.node import leader_fetches
from fabric.node import replication as rmod
from fabric.node.broker import Broker
from fabric.node.cluster_member import ClusterMember
from fabric.node.cluster_placement import ClusterPlacement
from fabric.node.follower_fetches import (
    FETCH_RETRY_MS,
    FETCH_WAIT_IDLE_MAX_MS,
    FETCH_WAIT_MS,
    LINK_PROBE_MS,
    FetchState,
    FollowerFetch,
)
from fabric.node.replication import FULL_SWEEP_MS, Replication
from fabric.node.roles import Role
from fabric.protocol import frames as fr
from fabric.protocol.batch import encode_batch, parse_header
from fabric.protocol.ops import Op
from fabric.settings import ClusterConfig, NodeConfig, QueueSettings
from fabric.store import checkpoints
from fabric.store.flusher import Flusher
from fabric.store.store import Store

QUEUES = 50


class Node:
    def __init__(self, root: Path, name: str) -> None:
        self.store = Store(root / name, defaults=QueueSettings(), now_ms=0)
        self.sent: list[tuple[str, list[Any]]] = []  # to peers
        self.replies: list[tuple[bytes, list[Any]]] = []  # to clients
        # the cluster thread is never started: nothing here reaches etcd
        member = ClusterMember(name, "tcp://127.0.0.1:7001", ClusterConfig(etcd=("http://127.0.0.1:9",)), lambda: None)

        def placement(broker: Broker) -> ClusterPlacement:
            self.repl = Replication(
                broker,
                name,
                lambda peer, frames: self.sent.append((peer, frames)) or True,
                lambda *a: None,
                min_insync=2,
                lag_time_ms=10_000,
            )
            return ClusterPlacement(broker, member, self.repl)

        self.broker = Broker(
            NodeConfig(node_id=name, data_dir=str(root / name)),
            self.store,
            Flusher(lambda gen: None),
            lambda client, frames: self.replies.append((client, frames)) or True,
            now_ms=0,
            placement=placement,
        )

    def tick(self, now_ms: int) -> None:
        self.broker.tick(now_ms)

    def fetches(self) -> list[dict[str, Any]]:
        out = [fr.decode(frames).params for _, frames in self.sent]
        self.sent.clear()
        return out


def _record(leader: str) -> PartitionRecord:
    return PartitionRecord(("a", "b"), leader, 1, ("a", "b"), 1)


@pytest.fixture
def follower(tmp_path: Path):
    n = Node(tmp_path, "b")
    for i in range(QUEUES):
        n.broker.create_queue(f"q{i}", QueueSettings())
        n.repl.apply(f"q{i}", 0, _record("a"), 0)
    yield n
    n.store.close()


@pytest.fixture
def leader(tmp_path: Path):
    n = Node(tmp_path, "a")
    n.broker.create_queue("q", QueueSettings())
    n.repl.apply("q", 0, _record("a"), 0)
    n.tick(0)
    yield n
    n.store.close()


def test_a_lost_fetch_is_sent_again_by_its_timer_not_by_a_pass_over_every_partition(follower: Node) -> None:
    follower.tick(0)
    first = follower.fetches()
    waits = sorted(f["wait_ms"] for f in first)  # new roles are idle; their waits are spread
    assert len(waits) == QUEUES and FETCH_WAIT_IDLE_MAX_MS * 3 // 4 <= waits[0] < waits[-1] <= FETCH_WAIT_IDLE_MAX_MS
    visits: list[tuple[str, int]] = []
    visit = follower.repl._visit
    follower.repl._visit = lambda key, role, now: visits.append(key) or visit(key, role, now)  # type: ignore[method-assign]
    for t in range(1000, waits[0] + FETCH_RETRY_MS + 1, 1000):  # no answers: nothing is due yet
        follower.tick(t)
    assert follower.fetches() == []
    # only the safety pass's slices: every role once in FULL_SWEEP_MS, not once a second
    assert len(visits) <= (FETCH_WAIT_IDLE_MAX_MS // FULL_SWEEP_MS + 1) * QUEUES
    resent = []
    for t in range(waits[0] + FETCH_RETRY_MS + 1001, FETCH_WAIT_IDLE_MAX_MS + FETCH_RETRY_MS + 1002, 1000):
        follower.tick(t)
        resent.append(len(follower.fetches()))
    # every fetch once, when its own (jittered) wait ran out: not all in the same second again
    assert sum(resent) == QUEUES and max(resent) < QUEUES // 2


def test_an_idle_fetch_waits_longer_and_a_single_message_does_not_shorten_it(follower: Node) -> None:
    follower.tick(0)
    fetch = follower.sent[0]
    follower.fetches()
    role = follower.repl.roles[("q0", 0)]
    _fetch(role).wait_ms = FETCH_WAIT_MS  # as a busy partition's
    header = fr.decode(fetch[1]).header
    empty = {"high_watermark": 0, "log_start_offset": 0, "leader_epoch": 1, "diverging": None}
    # answered early (news of the high watermark): the wait is not a sign of idleness
    follower.broker._now_ms = 10
    follower.repl.on_peer_reply(fr.encode(fr.Header(Op.REPLICA_FETCH, header.request_id, fr.FLAG_REPLY), empty))
    assert _fetch(role).wait_ms == FETCH_WAIT_MS
    # the next one comes back empty after its whole wait: idle, so the next waits twice as long
    follower.tick(20)
    again = fr.decode(follower.sent[-1][1]).header
    follower.broker._now_ms = 20 + FETCH_WAIT_MS
    follower.repl.on_peer_reply(fr.encode(fr.Header(Op.REPLICA_FETCH, again.request_id, fr.FLAG_REPLY), empty))
    assert _fetch(role).wait_ms == 2 * FETCH_WAIT_MS


def test_a_settled_leader_is_not_looked_at_again_until_something_happens(leader: Node) -> None:
    parked = leader.repl.handle_fetch(b"b", fr.Header(Op.REPLICA_FETCH, 1), _fetch_params(30_000))
    assert parked is False  # nothing to send: parked
    assert ("q", 0) in leader.repl._hot
    leader.tick(100)
    assert ("q", 0) not in leader.repl._hot  # the follower holds the whole log: settled


def test_the_checkpoint_writes_only_when_a_high_watermark_moved_and_all_of_them_in_one_file(
    follower: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[tuple[Path, bytes, bool]] = []
    monkeypatch.setattr(
        checkpoints, "atomic_write", lambda path, data, durable=True: written.append((path, data, durable))
    )
    follower.repl._save_hws()
    assert written == []
    follower.broker.partitions[("q7", 0)].visible = 3  # as _advance does, and marks it
    follower.repl._hw_dirty.add(("q7", 0))
    follower.repl._save_hws()
    qid = follower.store.record("q7")["id"]
    assert written == [(follower.store.data_dir / checkpoints.HW_CHECKPOINT, f"q7\t{qid}\t0\t3\n".encode(), False)]
    written.clear()
    follower.repl._save_hws()
    assert written == []
    follower.broker.partitions[("q3", 0)].visible = 2  # moved without a mark: the running checkpoint skips it
    follower.repl._save_hws()
    assert written == []
    follower.repl.save()  # at a stop every role is looked at, and the file is fsynced
    [(_, data, durable)] = written
    assert (
        durable
        and len(data.splitlines()) == QUEUES
        and f"q3\t{follower.store.record('q3')['id']}\t0\t2" in data.decode()
    )


def test_the_checkpoint_is_read_back_for_the_same_queue_only(tmp_path: Path) -> None:
    n = Node(tmp_path, "b")
    try:
        for q in ("same", "again"):
            n.broker.create_queue(q, QueueSettings())
            batch = bytearray(encode_batch([b"x"] * 10))
            n.store.partition(q, 0).append(batch, parse_header(batch), now_ms=0, leader_epoch=0)
        same, again = n.store.partition("same", 0), n.store.partition("again", 0)
        n.repl.hw_checkpoint.saved = {
            ("same", 0): (n.store.record("same")["id"], 5),
            ("again", 0): ("an-older-queue", 5),
        }
        assert n.repl._load_hw("same", 0, same) == 5
        assert n.repl._load_hw("again", 0, again) == 0  # a deleted queue's entry: from the log start
        n.repl.hw_checkpoint.saved[("same", 0)] = (n.store.record("same")["id"], 99)
        assert n.repl._load_hw("same", 0, same) == 10  # never past the log
    finally:
        n.store.close()
    (tmp_path / "b" / checkpoints.HW_CHECKPOINT).write_text("same\tx\t0\t7\nnot a line\n")
    again_node = Node(tmp_path, "b")
    try:
        assert again_node.repl.hw_checkpoint.saved == {("same", 0): ("x", 7)}  # read at start; the bad line skipped
    finally:
        again_node.store.close()


def test_fetches_wait_for_a_link_that_is_down_and_go_when_it_is_up(follower: Node) -> None:
    follower.repl.on_link("a", False)  # as a new peer socket starts: down until its handshake
    follower.tick(0)
    assert follower.fetches() == []  # not tried every 100 ms either
    follower.tick(500)
    assert follower.fetches() == []
    follower.repl.on_link("a", True)
    follower.tick(510)
    assert len(follower.fetches()) == QUEUES


def test_fetches_in_flight_on_a_link_that_broke_are_sent_again_when_it_is_back(follower: Node) -> None:
    follower.tick(0)
    old = follower.sent[:]
    follower.fetches()
    follower.broker._now_ms = 1000
    follower.repl.on_link("a", False)
    follower.tick(1000)
    assert follower.fetches() == []
    # an answer to a forgotten fetch that comes through after all is ignored
    header = fr.decode(old[0][1]).header
    empty = {"high_watermark": 0, "log_start_offset": 0, "leader_epoch": 1, "diverging": None}
    follower.repl.on_peer_reply(fr.encode(fr.Header(Op.REPLICA_FETCH, header.request_id, fr.FLAG_REPLY), empty))
    follower.tick(1010)
    assert follower.fetches() == []
    follower.repl.on_link("a", True)
    follower.tick(1020)  # at once, not an idle wait later
    assert len(follower.fetches()) == QUEUES


def test_a_link_down_past_the_probe_time_is_tried_anyway(follower: Node) -> None:
    follower.repl.on_link("a", False)  # its "up" event never comes
    for t in range(0, LINK_PROBE_MS + FULL_SWEEP_MS + 1000, 1000):
        follower.tick(t)
    assert len(follower.fetches()) == QUEUES  # the safety pass tried each once the probe time was over


def _fetch(role: Role) -> FollowerFetch:
    assert role.fetch is not None
    return role.fetch


def _fetch_params(wait_ms: int) -> dict[str, Any]:
    return {
        "queue": "q",
        "partition": 0,
        "replica": "b",
        "leader_epoch": 1,
        "fetch_offset": 0,
        "last_fetched_epoch": -1,
        "max_bytes": 1 << 20,
        "wait_ms": wait_ms,
        "delay_cursor": 0,
        "high_watermark": 0,
    }


def test_a_leader_keeps_an_idle_fetch_past_its_wait_and_a_newer_one_replaces_it(leader: Node) -> None:
    assert leader.repl.handle_fetch(b"b", fr.Header(Op.REPLICA_FETCH, 1), _fetch_params(1000)) is False
    leader.tick(1500)
    leader.tick(2600)
    assert leader.replies == []  # nothing new: no empty answer that would only bring it back
    assert [x[2].request_id for x in leader.repl.leader_fetches.parked[("q", 0)]] == [1]
    assert leader.repl.handle_fetch(b"b", fr.Header(Op.REPLICA_FETCH, 2), _fetch_params(1000)) is False
    assert [x[2].request_id for x in leader.repl.leader_fetches.parked[("q", 0)]] == [2]  # the newer replaced it
    # news (a high watermark the follower has not seen) still answers at once
    leader.broker.partitions[("q", 0)].visible = 0
    leader.repl.leader_fetches.wake("q", 0)
    assert [fr.decode(frames).header.request_id for _, frames in leader.replies] == [2]


def test_an_idle_fetch_is_looked_at_again_only_after_the_followers_newer_one_was_due(
    leader: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks: list[int] = []
    fetches = leader.repl.leader_fetches
    real = fetches.handle
    monkeypatch.setattr(fetches, "handle", lambda c, h, p: looks.append(h.request_id) or real(c, h, p))
    assert leader.repl.handle_fetch(b"b", fr.Header(Op.REPLICA_FETCH, 1), _fetch_params(1000)) is False
    # the follower sends its next fetch when the wait and FETCH_RETRY_MS are over: until then the
    # leader does not run this one again (one look per idle fetch a round, not two)
    for t in range(0, 1000 + FETCH_RETRY_MS + 1, 100):
        leader.tick(t)
    assert looks == [1] and leader.replies == []
    assert leader_fetches.PARK_GRACE_MS > FETCH_RETRY_MS
    # a follower that never sent it: the leader looks again after the grace, and keeps holding it
    leader.tick(1000 + leader_fetches.PARK_GRACE_MS)
    assert looks == [1, 1] and leader.replies == []
    assert [x[2].request_id for x in leader.repl.leader_fetches.parked[("q", 0)]] == [1]


def test_a_fetch_without_an_answer_within_its_wait_makes_the_next_wait_longer(follower: Node) -> None:
    role = follower.repl.roles[("q0", 0)]
    _fetch(role).wait_ms = FETCH_WAIT_MS  # as a busy partition's, now gone quiet
    follower.tick(0)
    old = _fetch(role).id
    follower.fetches()
    follower.tick(FETCH_WAIT_MS + FETCH_RETRY_MS + 20)
    again = follower.fetches()
    assert [f["queue"] for f in again] == ["q0"] and again[0]["wait_ms"] == 2 * FETCH_WAIT_MS
    assert (
        old not in follower.repl.follower_fetches.fetch_ids
        and _fetch(role).id in follower.repl.follower_fetches.fetch_ids
    )


def test_a_fetch_that_timed_out_while_the_link_was_down_goes_when_it_is_back(follower: Node) -> None:
    role = follower.repl.roles[("q0", 0)]
    _fetch(role).wait_ms = FETCH_WAIT_MS
    follower.tick(0)
    follower.fetches()
    t = FETCH_WAIT_MS + FETCH_RETRY_MS + 20
    follower.broker._now_ms = t
    follower.repl.follower_fetches.links_down["a"] = t  # down, its fetches already forgotten or not: the timer runs out
    follower.tick(t)
    assert follower.fetches() == []  # it waits for the link
    follower.repl.on_link("a", True)
    follower.tick(t + 10)
    assert [f["queue"] for f in follower.fetches()] == ["q0"]  # at once, not a timer later


def test_roles_made_by_the_thousand_fetch_over_a_few_passes(follower: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rmod, "TIMERS_PER_SCAN", 20)  # as 1,000 of 50,000 new roles
    follower.broker._now_ms = 0
    sent = []
    for t in range(0, 100, rmod.SCAN_MS):
        follower.repl.tick(t)
        sent.append(len(follower.fetches()))
        if t == 0:
            assert follower.repl.next_due_ms() is not None  # the loop comes back for the rest
    # 20 a pass (and the safety pass's slice of 5 on the first): every role, over three passes
    assert sent[:3] == [25, 20, 5] and sum(sent) == QUEUES
    assert follower.repl.next_due_ms() is None


def _retention_slices(follower: Node, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The names each retention slice of the follower's broker looks at, as they happen."""
    seen: list[list[str]] = []
    store = follower.broker.store
    real = store.enforce_retention
    monkeypatch.setattr(
        store,
        "enforce_retention",
        lambda now, names=None, holders=None: seen.append(list(names or [])) or real(now, names, holders),
    )
    return seen


def test_retention_looks_at_a_slice_of_the_queues_each_second(follower: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    from fabric.node import retention

    seen = _retention_slices(follower, monkeypatch)
    store = follower.broker.store
    for t in range(1000, retention.RETENTION_CHECK_MS + 1001, 1000):
        follower.broker.tick(t)
    per_second = [len(names) for names in seen]
    assert max(per_second) <= -(-QUEUES * retention.RETENTION_SLICE_MS // retention.RETENTION_CHECK_MS)
    rounds = seen[: retention.RETENTION_CHECK_MS // retention.RETENTION_SLICE_MS]
    assert sorted(name for names in rounds for name in names) == sorted(store.queue_names())


def test_a_fetch_waiting_for_its_retry_time_does_not_make_the_loop_spin(follower: Node) -> None:
    follower.repl.tick(0)
    follower.fetches()
    key = ("q0", 0)
    role = follower.repl.roles[key]
    fetch = _fetch(role)
    refused = fr.Header(Op.REPLICA_FETCH, fetch.id, fr.FLAG_REPLY, NotLeader.code)
    follower.broker._now_ms = 0
    follower.repl.on_peer_reply(fr.encode(refused, {"message": "no"}))  # refused: backing off
    assert fetch.state is FetchState.BACKING_OFF and key in follower.repl.follower_fetches.fetch_now
    follower.repl.tick(10)
    assert key in follower.repl.follower_fetches.fetch_now  # still waiting for its time...
    assert follower.repl.next_due_ms() is None  # ...which the loop's own tick finds: no zero timeout
    assert follower.broker.next_timeout_ms(10) > 0


def test_a_queue_created_during_a_retention_round_is_looked_at_in_its_next_slice(
    follower: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fabric.node import retention

    seen = _retention_slices(follower, monkeypatch)
    follower.broker.tick(1000)  # a round begins
    follower.broker.create_queue("zz-new", QueueSettings())
    follower.broker.tick(1000 + retention.RETENTION_SLICE_MS)
    assert "zz-new" in seen[-1]  # not at the end of this round, nor in the next one


def test_the_leader_times_the_isr_wait_and_each_followers_round_trip(leader: Node) -> None:
    stages = leader.repl.stage_seconds
    plog = leader.store.partition("q", 0)
    batch = bytearray(encode_batch([b"x"] * 3))
    plog.append(batch, parse_header(batch), now_ms=0, leader_epoch=1)
    reply = fr.encode(fr.Header(Op.PRODUCE, 9, fr.FLAG_REPLY), {})
    leader.repl.on_durable("q", 0, plog.next_offset, b"producer", reply, True)  # acks=all: waits for b
    assert leader.replies == [] and sum(stages["isr_wait"].counts) == 0
    assert leader.repl.handle_fetch(b"b", fr.Header(Op.REPLICA_FETCH, 1), _fetch_params(1000)) is True  # the data
    assert sum(stages["follower_fetch"].counts) == 0
    after = {**_fetch_params(1000), "fetch_offset": 3, "last_fetched_epoch": 1}
    leader.repl.handle_fetch(b"b", fr.Header(Op.REPLICA_FETCH, 2), after)  # b holds it: the reply goes
    assert sum(stages["follower_fetch"].counts) == 1 and sum(stages["isr_wait"].counts) == 1
    assert [c for c, _ in leader.replies if c == b"producer"] == [b"producer"]
