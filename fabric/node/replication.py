"""The node's side of replicated partitions: the cluster's state machines wired to the broker.

Theory of operation
-------------------
For every partition this node holds a replica of, the cluster map (``fabric.cluster``, read
from etcd by the node's cluster thread) says who leads and in which leader epoch. This module
keeps one ``Role`` per such partition:

* **Leader**: PRODUCE appends as on a single node, stamping each batch with the leader epoch.
  When the append is durable locally (at once, or after the covering fdatasync), the
  ``LeaderReplica`` learns the new log end; consumers see only what is below the *high
  watermark* (the lowest log end among the committed in-sync replicas), and an ``acks=all``
  reply waits until the high watermark covers its records. Followers ask with REPLICA_FETCH;
  each fetch reports the follower's log end, which may move the high watermark and so release
  replies and pushes. A fetch with nothing to send is parked, like a long-poll FETCH.
* **Follower**: the loop sends REPLICA_FETCH to the leader (one in flight per partition, over
  the DEALER socket the server keeps per peer node); the reply's batches are appended byte for
  byte, keeping the leader's offsets and epochs; a *diverging* reply (our log has a suffix the
  leader never had, KIP-279/320) truncates first. Producer-id state is recorded from the
  appended batches, so the idempotent producer carries on after a failover.

Delayed batches wait in the delay store of every replica (``fabric.node.delay_replication``):
the follower's fetch carries its delay cursor, the leader's reply the rows past it.

The leader-epoch cache of each partition lives in its directory (``leader-epochs``), written
atomically whenever it changes (rare: once per leadership change), read back at start.
ISR changes the leader proposes are handed to the cluster thread, which compare-and-swaps
them in etcd; only a committed ISR counts for the high watermark.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fabric.cluster.epochs import LeaderEpochCache
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.replica import FetchRequest, FollowerReplica, LeaderReplica
from fabric.errors import (
    BadParameter,
    FabricError,
    FencedLeaderEpoch,
    NotCoordinator,
    NotEnoughReplicas,
    NotLeader,
    OffsetOutOfRange,
    Timeout,
    UnknownPartition,
    UnknownQueue,
    error_for_code,
)
from fabric.node.delay_replication import ReplicatedDelays
from fabric.node.throttle import TokenBucket
from fabric.protocol import frames as fr
from fabric.protocol.batch import iter_batches, parse_header, whole_prefix
from fabric.protocol.ops import Op
from fabric.store.files import atomic_write

if TYPE_CHECKING:
    from fabric.node.broker import Broker

log = logging.getLogger("fabric.replication")
EPOCH_FILE = "leader-epochs"
HW_FILE = "high-watermark"  # a partition's own checkpoint, before HW_CHECKPOINT: read when that lacks it
# every replica's high watermark, in one file in the data directory (Kafka's
# replication-offset-checkpoint): "queue<TAB>queue id<TAB>partition<TAB>hw" lines, written about once
# a second when one moved; a stale (lower) one is safe
HW_CHECKPOINT = "replication-high-watermarks"
HW_SAVE_MS = 1000
FORWARD_FORGET_MS = 120_000
FETCH_WAIT_MS = (
    2000  # a follower's fetch waits this long at the leader for new data (idle partitions: one fetch each per 2 s)
)
# an idle partition's fetch waits longer each round, up to this: thousands of idle partitions cost
# one fetch each per this long. A fetch lost with a broken link is sent again when the link is back
# (Peers' monitor), so the wait bounds only a loss nothing reported. REPLICA_FETCH's wait_ms is at
# most 60,000: a longer one would be refused by the nodes of a cluster not upgraded yet
FETCH_WAIT_IDLE_MAX_MS = 60_000
FETCH_BYTES = 4 * 1024 * 1024
FETCH_RETRY_MS = 1000  # a fetch without an answer this long is sent again
# a leader looks again at a parked fetch this long after its wait: later than the follower's newer
# fetch (wait + FETCH_RETRY_MS) that replaces it, so an idle fetch is handled once a round at the
# leader, not twice; the look stays as the net under a wake-up missed or a follower gone quiet
PARK_GRACE_MS = 5 * FETCH_RETRY_MS
TIMERS_PER_SCAN = 1000  # fetches sent (timers, answered) per pass; 10,000 at once held the loop ~90 ms
SCAN_MS = 10  # the pass over the roles in flux (retries, ISR changes under way) runs at most this often
SWEEP_MS = 1000  # a slice of the safety pass over every role runs this often
FULL_SWEEP_MS = 10_000  # ... so that every role is looked at once in this long, whatever else happened
FETCH_BACKOFF_MS = 100  # after a refused fetch, or with no link to the leader
LINK_PROBE_MS = 5000  # a link down this long is tried anyway (its monitor's "up" may have been missed)
INTERNAL_TIMEOUT_MS = 10_000  # a batch this node sent to another leader (dead letters) is given up after this

PeerSend = Callable[[str, list[Any]], bool]  # (node id, frames) -> False if it could not be queued


@dataclass
class Role:
    record: PartitionRecord
    epochs: LeaderEpochCache
    leader: LeaderReplica | None = None
    follower: FollowerReplica | None = None
    # leader: acks=all replies waiting for the high watermark: (end offset, client, reply frames)
    waiting: deque[tuple[int, bytes, list[Any]]] = field(default_factory=deque)
    fetch_sent_ms: int = -1  # follower: when the fetch in flight went out (-1: none in flight)
    fetch_id: int = 0
    fetch_req: FetchRequest | None = None  # follower: the fetch in flight (its answer applies only if current)
    saved_hw: int = -1
    retry_at_ms: int = 0  # follower: no fetch before then (after a refusal or an unreachable leader)
    isr_proposed: bool = False
    # leader: delayed acks=all replies waiting for the delay high watermark: (row id, client, reply)
    delay_waiting: deque[tuple[int, bytes, list[Any]]] = field(default_factory=deque)
    delay_cursor: int = 0  # follower: it holds the leader's delayed rows up to this row id
    # follower: how long its next fetch may wait at the leader. A new role starts idle (most of
    # thousands of partitions are): a busy one is down to FETCH_WAIT_MS within a few answers
    fetch_wait_ms: int = FETCH_WAIT_IDLE_MAX_MS
    sent_wait_ms: int = 0  # follower: the wait the fetch in flight carried (fetch_wait_ms, jittered)
    timer_due: int = 0  # follower: when its entry in the timer heap comes due (0: none)
    had_data: bool = False  # follower: the last answer brought records


class Replication:
    """Leader and follower roles of this node's replicas, driven by the broker's event loop."""

    def __init__(
        self,
        broker: Broker,
        node_id: str,
        send_peer: PeerSend,
        propose_isr: Callable[[str, int, PartitionRecord, PartitionRecord], None],
        *,
        min_insync: int,
        lag_time_ms: int,
    ) -> None:
        self.broker = broker
        self.node_id = node_id
        self.send_peer = send_peer
        self.propose_isr = propose_isr
        self.min_insync = min_insync
        self.lag_time_ms = lag_time_ms
        self.roles: dict[tuple[str, int], Role] = {}
        self.endpoints: dict[str, str] = {}  # node id -> client endpoint, from the cluster map
        # REPLICA_FETCHes waiting for data, by partition (an append wakes only its own), and the
        # earliest wait that runs out (the tick looks at them only from then on)
        self._parked: dict[tuple[str, int], list[tuple[int, bytes, fr.Header, dict[str, Any]]]] = {}
        self._parked_due = 0
        self._due_heap: list[tuple[int, int, tuple[str, int]]] = []  # (due, seq, partition) of parked fetches
        self._due_seq = 0
        self._fetch_now: set[tuple[str, int]] = set()  # followers whose last fetch was answered
        self._fetch_more = False  # more of them were due than one pass sends
        self._next_scan = 0  # the pass over the roles in flux
        self._next_sweep = 0  # the next slice of the safety pass over every role
        self._sweep_keys: list[tuple[str, int]] = []  # that pass: what is left of it
        # roles in flux, looked at every SCAN_MS: a leader that appended, was fetched from, or
        # whose in-sync followers are behind its log end; a follower waiting to retry. An idle
        # partition costs nothing per second: its follower's fetch in flight has a timer (below),
        # and every event that can change a leader's ISR (an append, a fetch, a map change, an
        # ISR result) marks it hot; the safety pass looks at every role once in FULL_SWEEP_MS
        self._hot: set[tuple[str, int]] = set()
        self._hot_turn: list[tuple[str, int]] = []  # the hot roles this round still to look at
        # followers' fetches in flight: (due, seq, partition), one entry per role at a time (its
        # timer_due), so a lost fetch is sent again when its wait and FETCH_RETRY_MS are over
        self._timers: list[tuple[int, int, tuple[str, int]]] = []
        self._hw_dirty: set[tuple[str, int]] = set()  # high watermarks moved since the last checkpoint
        # what HW_CHECKPOINT holds: partition -> (its queue's id, high watermark)
        self._hw_path = broker.store.data_dir / HW_CHECKPOINT
        self._hw_saved: dict[tuple[str, int], tuple[str, int]] = self._read_hw_checkpoint()
        self._hw_unwritten = False  # the last write of the file failed (or a partition left it)
        # peers whose link is down (or not up yet), and the followers waiting for it to fetch
        self._links_down: dict[str, int] = {}  # peer -> since when (ms)
        self._awaiting_link: dict[str, set[tuple[str, int]]] = {}
        self._jitter = random.Random(node_id)
        # what this leader sends replicas outside the ISR (moves, a replica catching up), shared
        # by every partition it leads: [cluster] move_throttle_bytes_per_s (None: no limit)
        self.catch_up: TokenBucket | None = None
        self._fetch_ids: dict[int, tuple[str, int]] = {}
        self._next_id = 1
        self._next_hw_save = 0
        # requests passed on to the partition's leader: our request id -> (client, its header, when)
        self._forwarded: dict[int, tuple[bytes, fr.Header, int, str, str, int]] = {}
        self.leader_lookup: Callable[[str, int], str | None] = lambda q, p: None  # the whole map's leaders
        # batches this node made and sent to a leader elsewhere: request id -> (done, sent at)
        self._internal: dict[int, tuple[Callable[[FabricError | None], None], int]] = {}
        # every partition's replica list, as the map says (None: the map does not name the queue)
        self.replicas_lookup: Callable[[str], list[list[str]] | None] = lambda q: None
        self.delays = ReplicatedDelays(self, broker)

    # ------------------------------------------------------------------ roles

    def apply(self, queue: str, p: int, record: PartitionRecord, now_ms: int, *, may_lead: bool = True) -> None:
        """The cluster map says ``record`` for a partition this node is a replica of. ``may_lead``
        False: the record names this node leader, but for an earlier incarnation of it or while
        its lease is lost: it serves nothing until the controller elects again."""
        key = (queue, p)
        old = self.roles.get(key)
        if (
            old is not None
            and old.record == record
            and (old.leader is not None) == (may_lead and record.leader == self.node_id)
        ):
            return
        plog = self.broker.store.partition(queue, p)
        epochs = old.epochs if old is not None else self._load_epochs(plog)
        role = Role(record, epochs)
        if old is None:
            # what consumers may see starts at the checkpointed high watermark, not the log end:
            # the tail past it may not be on the other replicas (and may be truncated)
            role.saved_hw = self._load_hw(queue, p, plog)
            self.broker._visible[key] = role.saved_hw
        else:
            role.saved_hw = old.saved_hw
        if (
            old is not None
            and old.leader is not None
            and record.leader == self.node_id
            and may_lead
            and old.record.leader_epoch == record.leader_epoch
        ):
            # only the ISR changed: keep the leader state (positions, waiting replies)
            role.leader, role.waiting, role.isr_proposed = old.leader, old.waiting, old.isr_proposed
            role.delay_waiting = old.delay_waiting
            role.leader.on_isr_result(record, True)
            self.roles[key] = role
            self._hot.add(key)
            self._advance(queue, p, role)
            return
        if old is not None:
            self._fail_waiting(old, NotLeader(f"{queue}/{p}: leadership moved to {record.leader}"))
        try:
            self._take_role(queue, p, plog, role, epochs, now_ms, may_lead)
        except FencedLeaderEpoch as exc:
            log.warning("%s/%d: the map is older than this replica's log (%s): waiting for a newer one", queue, p, exc)
            role.leader = role.follower = None
        if (
            old is not None
            and old.follower is not None
            and role.follower is not None
            and (old.record.leader, old.record.leader_epoch) == (record.leader, record.leader_epoch)
        ):
            role.delay_cursor = old.delay_cursor  # the same leader's rows: no need to send them again
        self.roles[key] = role
        self._hot.add(key)  # a new follower fetches at once; a new leader looks at its ISR
        self.delays.on_role(queue, p, role, plog.next_offset)
        self._advance(queue, p, role)

    def _take_role(
        self, queue: str, p: int, plog: Any, role: Role, epochs: LeaderEpochCache, now_ms: int, may_lead: bool
    ) -> None:
        record, key = role.record, (queue, p)
        if record.leader == self.node_id and not may_lead:
            log.info(
                "%s/%d: named leader in epoch %d, but not for this incarnation: waiting", queue, p, record.leader_epoch
            )
        elif record.leader == self.node_id:
            if epochs.latest_epoch() < record.leader_epoch:
                epochs.assign(record.leader_epoch, plog.next_offset)
                self._save_epochs(plog, epochs)
            hw = min(self.broker._visible.get(key, 0), plog.next_offset)
            role.leader = LeaderReplica(
                self.node_id,
                record,
                log_end=plog.next_offset,
                high_watermark=hw,
                epochs=epochs,
                # a queue placed on fewer replicas than min_insync_replicas needs all of them
                min_insync=min(self.min_insync, len(record.replicas)),
                lag_time_ms=self.lag_time_ms,
                now_ms=now_ms,
            )
            plog.leader_epoch = record.leader_epoch
            log.info("leading %s/%d in epoch %d (isr %s)", queue, p, record.leader_epoch, ",".join(record.isr))
        elif record.leader is not None and self.node_id in record.replicas:
            hw = min(self.broker._visible.get(key, 0), plog.next_offset)
            role.follower = FollowerReplica(
                self.node_id,
                record.leader,
                record.leader_epoch,
                log_end=plog.next_offset,
                high_watermark=hw,
                epochs=epochs,
            )
            log.info("following %s/%d: leader %s, epoch %d", queue, p, record.leader, record.leader_epoch)

    def forget(self, queue: str, p: int) -> None:
        role = self.roles.pop((queue, p), None)
        if role is not None:
            self._fail_waiting(role, NotLeader(f"{queue}/{p} is no longer on this node"))
        if self._hw_saved.pop((queue, p), None) is not None:
            self._hw_unwritten = True
        self.delays.forget(queue, p)

    def leads(self, queue: str, p: int) -> bool:
        role = self.roles.get((queue, p))
        return role is not None and role.leader is not None

    def check_leader(self, queue: str, p: int) -> None:
        """Raise NOT_LEADER (naming the leader and its endpoint) unless this node leads ``queue/p``."""
        role = self.roles.get((queue, p))
        if role is not None and role.leader is not None:
            return
        leader = role.record.leader if role is not None else None
        where = f" at {self.endpoints[leader]}" if leader in self.endpoints else ""
        if leader == self.node_id:  # named leader, yet not leading: fenced (cut off from etcd), or just restarted
            raise NotLeader(
                f"{self.node_id} is named leader of {queue}/{p} but may not lead it now", try_elsewhere=True
            )
        raise NotLeader(
            f"{self.node_id} does not lead {queue}/{p}; " + (f"leader: {leader}{where}" if leader else "leader unknown")
        )

    def route(self, client: bytes, header: fr.Header, params: dict[str, Any], data: Sequence[Any]) -> None:
        """A request for one partition: return to handle it here (this node leads it), or pass it
        on to the leader and raise Deferred; the leader's reply goes back to ``client`` as is."""
        queue, p = params["queue"], params["partition"]
        role = self.roles.get((queue, p))
        if role is not None and role.leader is not None:
            return
        leader = role.record.leader if role is not None else self.leader_lookup(queue, p)
        if role is None and leader is None:
            self._check_placed(queue, p)
        if leader is None or leader == self.node_id or header.flags & fr.FLAG_FORWARDED:
            self.check_leader(queue, p)  # raises NOT_LEADER naming what is known
            return
        self.pass_on(client, header, params, data, leader, queue, p)

    def _check_placed(self, queue: str, p: int) -> None:
        """``queue/p`` has no role here and no leader in the map: UNKNOWN_QUEUE / UNKNOWN_PARTITION
        when the map does not name it (the broker then asks etcd: a queue created a moment ago
        is waited for), else return (placed, no leader elected yet: NOT_LEADER follows)."""
        replicas = self.replicas_lookup(queue)
        if replicas is not None and p < len(replicas):
            return
        store = self.broker.store
        if store.has_queue(queue) and p >= store.settings(queue).log_partitions:
            raise UnknownPartition(
                f"queue {queue!r} has partitions 0..{store.settings(queue).log_partitions - 1}, not {p}"
            )
        raise UnknownQueue(f"queue {queue!r} does not exist" if replicas is None else f"{queue}/{p} is not placed yet")

    def partition_known(self, queue: str, p: int) -> bool:
        """Does this node know where ``queue/p`` is served (a role here, or a leader in the map)?"""
        return (queue, p) in self.roles or self.leader_lookup(queue, p) is not None

    def produce_elsewhere(self, queue: str, p: int, batch: bytes, done: Callable[[FabricError | None], None]) -> bool:
        """Send a batch this node made (dead letters) to ``queue/p``'s leader on another node with
        acks=all; ``done(None)`` once it is stored there, ``done(error)`` if refused or unanswered
        within INTERNAL_TIMEOUT_MS. False (and no call) when no leader elsewhere is reachable now."""
        leader = self.leader_lookup(queue, p)
        if leader is None or leader == self.node_id:
            return False
        rid = self._next_id
        self._next_id += 1
        params = {"queue": queue, "partition": p, "acks": "all"}
        frames = [fr.Header(Op.PRODUCE, rid, fr.FLAG_FORWARDED).encode(), fr.encode_params(params), batch]
        if not self.send_peer(leader, frames):
            return False
        self._internal[rid] = (done, self.broker._now_ms)
        return True

    def _internal_reply(self, frames: Sequence[Any]) -> bool:
        try:
            msg = fr.decode(list(frames))
        except FabricError:
            return False
        entry = self._internal.pop(msg.header.request_id, None)
        if entry is None:
            return False
        err = None
        if msg.header.status:
            err = error_for_code(msg.header.status, str(msg.params.get("message", "")))
        entry[0](err)
        return True

    def check_coordinator(self, queue: str) -> None:
        """A group's SUBSCRIBE: the leader of the queue's partition 0 coordinates its groups (one
        node holds each group's members, leases and assignment); anywhere else, NOT_COORDINATOR
        naming it. A queue the map does not name goes on to the usual UNKNOWN_QUEUE."""
        if self.holds(queue) is None:
            return
        leader = self.leader_lookup(queue, 0)
        if leader == self.node_id:
            return
        endpoint = self.endpoints.get(leader) if leader else None
        raise NotCoordinator(
            f"{self.node_id} does not coordinate the groups of {queue!r}: "
            + (f"{leader} at {endpoint} does" if endpoint else "no coordinator is elected yet; retry"),
            coordinator=endpoint,
        )

    def holds(self, queue: str) -> bool | None:
        """Does the map place a replica of ``queue`` here (None: the map does not name it)."""
        replicas = self.replicas_lookup(queue)
        return None if replicas is None else any(self.node_id in r for r in replicas)

    def check_local(self, queue: str, partitions: list[int] | None, coordinated: bool) -> None:
        """A subscription reads this node's copies: refuse one that names a partition this node
        holds no replica of (it would wait for ever on an empty local directory), sending the
        client to a node that holds them all when there is one."""
        replicas = self.replicas_lookup(queue)
        if replicas is None:
            return
        parts = list(range(len(replicas))) if partitions is None else partitions
        missing = [p for p in parts if p < len(replicas) and self.node_id not in replicas[p]]
        if not missing:
            return
        holders = [n for n in self.endpoints if all(p < len(replicas) and n in replicas[p] for p in parts)]
        where = f"queue {queue!r} partition(s) {missing} have no replica on {self.node_id}"
        if holders and not coordinated:
            raise NotCoordinator(f"{where}; {holders[0]} holds them", coordinator=self.endpoints[holders[0]])
        raise BadParameter(
            f"{where} (replication_factor below the number of nodes): "
            + (
                "a group needs every partition on its coordinator; use replication_factor = the number of nodes"
                if coordinated
                else "subscribe to each partition on a node that holds it (Admin.metadata() names them)"
            )
        )

    def pass_on(
        self,
        client: bytes,
        header: fr.Header,
        params: dict[str, Any],
        data: Sequence[Any],
        node: str,
        queue: str,
        p: int = -1,
    ) -> None:
        """Send a request to node ``node`` with FLAG_FORWARDED and raise Deferred; its reply goes
        back to ``client`` as is (``p`` -1: not tied to one partition's leader)."""
        rid = self._next_id
        self._next_id += 1
        flags = (header.flags & fr.FLAG_NO_REPLY) | fr.FLAG_FORWARDED
        frames = [fr.Header(header.op, rid, flags).encode(), fr.encode_params(params), *data]
        if not self.send_peer(node, frames):
            where = f" at {self.endpoints[node]}" if node in self.endpoints else ""
            what = f"does not lead {queue}/{p}" if p >= 0 else f"does not hold {queue}"
            raise NotLeader(f"{self.node_id} {what} and cannot reach {node}{where}", try_elsewhere=True)
        if not header.flags & fr.FLAG_NO_REPLY:
            self._forwarded[rid] = (client, header, self.broker._now_ms, node, queue, p)
        from fabric.node.produce import Deferred

        raise Deferred

    def _relay(self, frames: Sequence[Any]) -> bool:
        """A peer's reply to a request we passed on: back to the client with its request id."""
        if not frames:
            return False
        try:
            h = fr.decode_header(frames[0])
        except FabricError:
            return False
        entry = self._forwarded.pop(h.request_id, None)
        if entry is None:
            return False
        client, orig = entry[0], entry[1]
        out = fr.Header(orig.op, orig.request_id, fr.FLAG_REPLY, h.status).encode()
        self.broker._send_or_count(client, [out, *frames[1:]])
        return True

    def on_leader_moved(self, queue: str, p: int, leader: str | None) -> None:
        """The map names a new leader for ``queue/p`` (or a peer is gone, ``queue`` ""): requests
        passed on to the old one will get no answer; tell their clients now (NOT_LEADER is
        retriable: the producer resends at once instead of waiting out its request timeout)."""
        lost = [
            rid
            for rid, e in self._forwarded.items()
            if (e[4] == queue and e[5] == p and e[3] != leader) or (not queue and e[3] == leader)
        ]
        for rid in lost:
            client, header, _, old, q, part = self._forwarded.pop(rid)
            self.broker._error(client, header, (), NotLeader(f"{q}/{part}: its leader {old} is gone; retry"))

    # ------------------------------------------------------------------ leader side

    def on_durable(
        self, queue: str, p: int, end: int, client: bytes | None, reply: list[Any] | None, acks_all: bool
    ) -> None:
        """A leader's append up to ``end`` is durable on this node: replicate, then release."""
        role = self.roles[(queue, p)]
        assert role.leader is not None
        parked = self._parked.get((queue, p))
        waiting = [x[3]["replica"] for x in parked] if parked else ()
        role.leader.on_append(end, self.broker._now_ms, waiting)  # a parked follower was caught up until now
        self._hot.add((queue, p))
        if client is not None and reply is not None:
            if acks_all:
                problem = role.leader.not_enough_replicas()
                if problem is not None:
                    header = fr.decode_header(reply[0])
                    self.broker._error(
                        client, header, (), NotEnoughReplicas(f"{queue}/{p}: {problem} (written to the leader only)")
                    )
                else:
                    role.waiting.append((end, client, reply))
            else:
                self.broker._send_or_count(client, reply)
        self._wake_fetchers(queue, p)
        self._advance(queue, p, role)

    def handle_fetch(self, client: bytes, header: fr.Header, params: dict[str, Any]) -> bool:
        """REPLICA_FETCH: answer now (True) or park until data arrives (False)."""
        queue, p = params["queue"], params["partition"]
        role = self.roles.get((queue, p))
        if role is None or role.leader is None:
            self.check_leader(queue, p)
        assert role is not None and role.leader is not None
        req = FetchRequest(
            params["replica"],
            params["leader_epoch"],
            params["fetch_offset"],
            params["last_fetched_epoch"],
            params["delay_cursor"],
        )
        decision = role.leader.on_fetch(req, self.broker._now_ms)
        self._hot.add((queue, p))
        if decision.error is not None:
            err = decision.error
            raise err(
                f"{queue}/{p}: fetch in leader epoch {req.leader_epoch}, this leader is in {role.record.leader_epoch}"
            )
        self._advance(queue, p, role)
        plog = self.broker.store.partition(queue, p)
        reply: dict[str, Any] = {
            "high_watermark": decision.high_watermark,
            "log_start_offset": plog.log_start_offset,
            "leader_epoch": role.record.leader_epoch,
            "diverging": list(decision.diverging) if decision.diverging is not None else None,
        }
        data = b""
        rows: list[bytes] = []
        if decision.diverging is None and decision.read_from is not None:
            delayed, rows = self.delays.rows_for(queue, p, role, params["delay_cursor"])
            reply.update(delayed)
            frm = decision.read_from
            if frm < plog.log_start_offset:
                raise OffsetOutOfRange(
                    f"{queue}/{p}: offset {frm} is below the leader's log start {plog.log_start_offset}"
                )
            upto = role.leader.log_end
            if frm < upto:
                max_bytes = params["max_bytes"]
                throttled = self.catch_up is not None and req.replica not in role.record.isr
                if throttled:
                    assert self.catch_up is not None
                    max_bytes = self.catch_up.allowance(max_bytes, self.broker._now_ms)
                    if max_bytes <= 0 and params["wait_ms"] > 0:  # over the move throttle: wait for tokens
                        due = self.broker._now_ms + min(params["wait_ms"], self.catch_up.wait_ms())
                        self._park(due, client, header, params)
                        return False
                if max_bytes > 0:
                    raw = plog.read_stored(frm, max_bytes)  # an encrypted queue's batches stay sealed
                    data = bytes(raw[: whole_prefix(raw, upto)[0]])
                    if throttled and self.catch_up is not None:
                        self.catch_up.spend(len(data))
        known_hw = params.get("high_watermark")
        behind = known_hw is not None and decision.high_watermark > known_hw  # news for the follower's readers
        if (
            not data
            and not behind
            and "delayed_upto" not in reply
            and decision.diverging is None
            and params["wait_ms"] > 0
        ):
            self._park(self.broker._now_ms + params["wait_ms"] + PARK_GRACE_MS, client, header, params)
            return False
        self.broker._reply(client, header, reply, [data, *rows] if data or rows else [])
        return True

    def _park(self, due: int, client: bytes, header: fr.Header, params: dict[str, Any]) -> None:
        """Hold a fetch until ``due``; a replica's newer fetch of the partition replaces its older
        one (which it stopped waiting for)."""
        key = (params["queue"], params["partition"])
        entries = self._parked.get(key)
        if entries is None:
            self._parked[key] = [(due, client, header, params)]
        else:
            replica = params["replica"]
            entries[:] = [x for x in entries if x[3]["replica"] != replica]
            entries.append((due, client, header, params))
        self._due_seq += 1
        heapq.heappush(self._due_heap, (due, self._due_seq, key))
        self._parked_due = self._due_heap[0][0]

    def _wake_fetchers(self, queue: str, p: int) -> None:
        woken = self._parked.pop((queue, p), None)
        if woken:
            for _, client, header, params in woken:
                self._answer_parked(client, header, {**params, "wait_ms": 0})

    def _wake_behind(self, key: tuple[str, int], hw: int) -> None:
        """The high watermark moved: answer the parked fetches of followers that know an older
        one, so that what their consumers may read moves too (not a fetch wait later)."""
        entries = self._parked.get(key, [])
        behind = [x for x in entries if x[3].get("high_watermark") is not None and x[3]["high_watermark"] < hw]
        if not behind:
            return
        rest = [x for x in entries if x not in behind]
        if rest:
            self._parked[key] = rest
        else:
            del self._parked[key]
        for _, client, header, params in behind:
            self._answer_parked(client, header, {**params, "wait_ms": 0})

    def _answer_parked(self, client: bytes, header: fr.Header, params: dict[str, Any]) -> None:
        try:
            self.handle_fetch(client, header, params)
        except FabricError as exc:
            self.broker._error(client, header, (), exc)

    def _advance(self, queue: str, p: int, role: Role) -> None:
        """Make the high watermark visible to consumers and release the acks=all it covers."""
        if role.leader is not None:
            hw = role.leader.high_watermark
        elif role.follower is not None:
            hw = role.follower.high_watermark
        else:
            return
        key = (queue, p)
        if hw > self.broker._visible.get(key, 0):
            self.broker._visible[key] = hw
            self._hw_dirty.add(key)
            self.broker._on_visible(queue, p)  # a follower's subscribers read its copy too
            if role.leader is not None and key in self._parked:
                self._wake_behind(key, hw)
        if role.waiting and role.leader is not None:
            while role.waiting and role.leader.acked(role.waiting[0][0]):
                _, client, reply = role.waiting.popleft()
                self.broker._send_or_count(client, reply)
            problem = role.leader.not_enough_replicas() if role.waiting else None
            if problem is not None:  # the ISR shrank under min_insync_replicas after the append
                exc = NotEnoughReplicas(f"{queue}/{p}: {problem} (stored on the leader, not on enough replicas)")
                while role.waiting:
                    _, client, reply = role.waiting.popleft()
                    self.broker._error(client, fr.decode_header(reply[0]), (), exc)
        if role.delay_waiting and role.leader is not None:
            while role.delay_waiting and role.leader.delays_acked(role.delay_waiting[0][0]):
                _, client, reply = role.delay_waiting.popleft()
                self.broker._send_or_count(client, reply)
            problem = role.leader.not_enough_replicas() if role.delay_waiting else None
            if problem is not None:  # the ISR shrank under min_insync_replicas after they were stored
                self._fail_delayed(role, NotEnoughReplicas(f"{queue}/{p}: {problem} (stored, not on enough replicas)"))
        elif role.follower is not None:
            self.delays.on_high_watermark(queue, p, hw)

    def _fail_delayed(self, role: Role, exc: FabricError) -> None:
        while role.delay_waiting:
            _, client, reply = role.delay_waiting.popleft()
            self.broker._error(client, fr.decode_header(reply[0]), (), exc)

    def _fail_waiting(self, role: Role, exc: FabricError) -> None:
        for waiting in (role.waiting, role.delay_waiting):
            while waiting:
                _, client, reply = waiting.popleft()
                self.broker._error(client, fr.decode_header(reply[0]), (), exc)

    # ------------------------------------------------------------------ follower side

    def on_peer_reply(self, frames: Sequence[bytes]) -> None:
        """A leader answered one of our REPLICA_FETCH requests, or a request we passed on."""
        if self._forwarded and self._relay(frames):
            return
        if self._internal and self._internal_reply(frames):
            return
        try:
            msg = fr.decode(list(frames))
        except FabricError as exc:
            log.warning("bad reply from a leader: %s", exc)
            return
        key = self._fetch_ids.pop(msg.header.request_id, None)
        role = self.roles.get(key) if key is not None else None
        if key is None or role is None or role.follower is None or role.fetch_id != msg.header.request_id:
            return  # an answer for a role we no longer have
        waited = self.broker._now_ms - role.fetch_sent_ms
        role.fetch_sent_ms = -1
        self._fetch_now.add(key)
        queue, p = key
        req, role.fetch_req = role.fetch_req, None
        if req is None or not role.follower.is_current(req):
            return  # the log moved since this fetch went out: its answer no longer applies
        if msg.header.status:
            log.info("fetch of %s/%d from %s refused: %s", queue, p, role.record.leader, msg.params.get("message", ""))
            role.retry_at_ms = self.broker._now_ms + FETCH_BACKOFF_MS
            self._hot.add(key)
            return
        params = msg.params
        plog = self.broker.store.partition(queue, p)
        follower = role.follower
        if params["diverging"] is not None:
            epoch, end = params["diverging"]
            cut = follower.on_diverging(epoch, end)
            if cut < plog.next_offset:
                log.warning(
                    "%s/%d: truncating %d record(s) the leader does not have (from %d)",
                    queue,
                    p,
                    plog.next_offset - cut,
                    cut,
                )
                plog.truncate_to(cut)
                self.broker.store.producer_states(queue, p, self.broker._now_ms).truncate(cut)
                self.delays.on_truncated(queue, p, cut)
                key2 = (queue, p)
                self.broker._visible[key2] = min(self.broker._visible.get(key2, 0), plog.next_offset)
                self._hw_dirty.add(key2)
            self._save_epochs(plog, role.epochs)
            return
        batch_epochs: list[tuple[int, int]] = []
        data = msg.data[0] if msg.data else b""
        # an idle partition (an empty answer after the whole wait) waits longer next time,
        # doubling up to FETCH_WAIT_IDLE_MAX_MS: thousands of idle partitions cost few round
        # trips; an append or a high watermark that moves still answers a parked fetch at once,
        # so the wait costs no latency. Two answers with data in a row halve it (a busy partition
        # is back at FETCH_WAIT_MS within a few answers); a single one leaves it: one message to
        # each of thousands of quiet partitions would otherwise shorten all their waits, a storm
        # of empty fetches over the next minute. An empty answer before the wait was over (news
        # of the high watermark) says nothing either way
        if data:
            if role.had_data:
                role.fetch_wait_ms = max(FETCH_WAIT_MS, role.fetch_wait_ms // 2)
            role.had_data = True
        elif waited >= role.fetch_wait_ms:
            role.fetch_wait_ms = min(FETCH_WAIT_IDLE_MAX_MS, role.fetch_wait_ms * 2)
            role.had_data = False
        if "delayed_upto" in params:  # delayed rows first: a later append of one must find it here
            self.delays.on_rows(queue, p, role, params, list(msg.data[1:]))
        marks: list[tuple[int, int]] = []
        if data:
            buf = bytearray(data)
            states = None
            for pos, h in iter_batches(buf):
                if h.base_offset != plog.next_offset:
                    log.error(
                        "%s/%d: leader sent offset %d, log ends at %d; refetching",
                        queue,
                        p,
                        h.base_offset,
                        plog.next_offset,
                    )
                    break
                one = bytearray(buf[pos : pos + h.size])
                plog.append(one, parse_header(one), now_ms=self.broker._now_ms, leader_epoch=h.leader_epoch)
                if h.producer_id < -1:  # a delayed batch the leader appended: our row of it is done
                    marks.append((h.base_offset, -2 - h.producer_id))
                elif h.producer_id >= 0:
                    states = states or self.broker.store.producer_states(queue, p, self.broker._now_ms)
                    states.record(
                        h.producer_id,
                        h.producer_epoch,
                        h.base_sequence,
                        h.record_count,
                        h.base_offset,
                        self.broker._now_ms,
                    )
                if role.epochs.assign(h.leader_epoch, h.base_offset):
                    self._save_epochs(plog, role.epochs)
                batch_epochs.append((h.leader_epoch, h.base_offset))
            settings = self.broker.store.settings(queue)
            if settings.fsync == "always":
                self.broker.flusher.request(plog)
            elif settings.fsync == "interval":
                self.broker.flusher.request_interval(plog, settings.fsync_interval_ms)
            if marks:
                self.delays.on_appended(queue, p, marks)
        try:
            follower.on_appended(plog.next_offset, batch_epochs, params["high_watermark"])
        except ValueError as exc:
            log.error("%s/%d: the leader's answer does not check out (%s); fetching again", queue, p, exc)
        self._advance(queue, p, role)

    def tick(self, now_ms: int) -> None:
        if self._internal:
            late = [rid for rid, (_, sent) in self._internal.items() if now_ms - sent > INTERNAL_TIMEOUT_MS]
            for rid in late:
                self._internal.pop(rid)[0](Timeout(f"no answer from the leader within {INTERNAL_TIMEOUT_MS} ms"))
        if now_ms >= self._next_hw_save:
            self._next_hw_save = now_ms + HW_SAVE_MS
            self._save_hws()
            if self._forwarded:  # the leader died with them: the clients time out and retry
                old = [rid for rid, e in self._forwarded.items() if now_ms - e[2] > FORWARD_FORGET_MS]
                for rid in old:
                    del self._forwarded[rid]
        if self._parked_due and now_ms >= self._parked_due:
            self._expire_parked(now_ms)
        if self._fetch_now:  # answered fetches: the next one goes at once (acks=all waits on it)
            ready, self._fetch_now = self._fetch_now, set()
            self._fetch_more = len(ready) > TIMERS_PER_SCAN
            if self._fetch_more:  # thousands at once (roles just made): the rest at the next pass
                rest = list(ready)
                ready = set(rest[:TIMERS_PER_SCAN])
                self._fetch_now.update(rest[TIMERS_PER_SCAN:])
            for key in ready:
                role = self.roles.get(key)
                if role is not None and role.follower is not None and role.fetch_sent_ms < 0:
                    if now_ms >= role.retry_at_ms:
                        self._send_fetch(key[0], key[1], role, now_ms)
                    else:
                        self._fetch_now.add(key)
        if now_ms < self._next_scan:
            return
        # the roles in flux at most every SCAN_MS, the fetches whose timers ran out, and a slice
        # of the safety pass: with thousands of partitions, a pass over all of them per loop
        # wake-up (or per second: thousands of idle partitions) would take the loop's CPU
        self._next_scan = now_ms + SCAN_MS
        timers = self._timers
        budget = TIMERS_PER_SCAN  # thousands due at once (a restart): the rest at the next wake-up
        while timers and timers[0][0] <= now_ms and budget:
            budget -= 1
            due, _, key = heapq.heappop(timers)
            role = self.roles.get(key)
            if role is not None and role.timer_due == due:
                role.timer_due = 0
                self._visit(key, role, now_ms)
        if now_ms >= self._next_sweep:
            self._next_sweep = now_ms + SWEEP_MS
            self._sweep_slice(now_ms)
        if self._hot:
            # in turns of TIMERS_PER_SCAN: thousands of roles made at once (a restart, a node that
            # just learnt its replicas) are looked at over a few passes, not in one
            if not self._hot_turn:
                self._hot_turn = list(self._hot)
            turn = self._hot_turn
            for _ in range(min(TIMERS_PER_SCAN, len(turn))):
                key = turn.pop()
                if key not in self._hot:
                    continue
                role = self.roles.get(key)
                if role is None:
                    self._hot.discard(key)
                else:
                    self._visit(key, role, now_ms)

    def next_due_ms(self) -> int | None:
        """When the loop must pass again for work one pass left over (more fetches or roles in
        flux than it handles at once); None: nothing left over."""
        if self._fetch_more and self._fetch_now:  # not those waiting for a retry time: ticks find them
            return 0
        if self._hot_turn:
            return self._next_scan
        return None

    def _sweep_slice(self, now_ms: int) -> None:
        """The safety pass's next slice: every role once in FULL_SWEEP_MS, a high watermark the
        checkpoint has not seen marked for it. Nothing should depend on it (events and timers
        drive the roles); it bounds what a missed event could cost."""
        if not self._sweep_keys:
            self._sweep_keys = list(self.roles)
            self._sweep_keys.reverse()
        count = max(1, -(-len(self.roles) * SWEEP_MS // FULL_SWEEP_MS))
        keys, visible = self._sweep_keys, self.broker._visible
        for _ in range(min(count, len(keys))):
            key = keys.pop()
            role = self.roles.get(key)
            if role is not None:
                if visible.get(key, 0) != role.saved_hw:
                    self._hw_dirty.add(key)
                self._visit(key, role, now_ms)

    def _arm(self, key: tuple[str, int], role: Role, due: int) -> None:
        """A timer for a follower's fetch in flight; the earliest one of a role is kept (when it
        fires, ``_visit`` arms the next if the fetch it found has not timed out)."""
        if role.timer_due and role.timer_due <= due:
            return
        role.timer_due = due
        self._due_seq += 1
        heapq.heappush(self._timers, (due, self._due_seq, key))

    def _visit(self, key: tuple[str, int], role: Role, now_ms: int) -> None:
        """One look at a role: a follower's fetch that timed out or waits to be retried, a
        leader's ISR change; the role stays in the hot set while something is under way."""
        queue, p = key
        if role.follower is not None:
            if now_ms >= role.retry_at_ms and (
                role.fetch_sent_ms < 0 or now_ms - role.fetch_sent_ms > role.sent_wait_ms + FETCH_RETRY_MS
            ):
                if role.fetch_sent_ms >= 0:
                    # no answer within the wait: the leader keeps an idle partition's fetch (or it
                    # was lost), so the partition is idle: wait longer next time; forget this one
                    self._fetch_ids.pop(role.fetch_id, None)
                    role.fetch_sent_ms = -1
                    role.fetch_req = None
                    role.fetch_wait_ms = min(FETCH_WAIT_IDLE_MAX_MS, role.fetch_wait_ms * 2)
                    role.had_data = False
                self._send_fetch(queue, p, role, now_ms)
            if now_ms < role.retry_at_ms:
                self._hot.add(key)
            else:
                self._hot.discard(key)
                if role.fetch_sent_ms >= 0:
                    self._arm(key, role, role.fetch_sent_ms + role.sent_wait_ms + FETCH_RETRY_MS + 1)
        elif role.leader is not None and not role.isr_proposed:
            change = role.leader.isr_change(now_ms)
            if change is not None:
                role.isr_proposed = True
                self.propose_isr(queue, p, role.record, change)
            self._advance(queue, p, role)
            # settled: nothing can change without an event (a follower outside the ISR joins by
            # fetching; one in it can only fall behind after an append), so no need to look again
            settled = change is None and not role.waiting and not role.delay_waiting and not role.leader.isr_behind()
            if settled:
                self._hot.discard(key)
            else:
                self._hot.add(key)
        else:
            self._hot.discard(key)  # a leader with an ISR change proposed: its result marks it again

    def _expire_parked(self, now_ms: int) -> None:
        """Look again at the parked fetches whose wait ran out (the partitions are taken from a
        heap of due times, so a pass costs what is due, not every parked fetch). One with news
        is answered; one with none stays parked for another wait, unanswered: an empty answer
        would only bring the same fetch back, two messages per idle partition and follower a
        minute. The follower sends a new one when its own timer runs out, and it replaces this."""
        heap = self._due_heap
        while heap and heap[0][0] <= now_ms:
            _, _, key = heapq.heappop(heap)
            entries = self._parked.get(key)
            if not entries:
                continue  # woken by an append since
            due = [x for x in entries if x[0] <= now_ms]
            if not due:
                continue
            rest = [x for x in entries if x[0] > now_ms]
            if rest:
                self._parked[key] = rest
            else:
                del self._parked[key]
            for _, client, header, params in due:
                self._answer_parked(client, header, params)
        self._parked_due = heap[0][0] if heap else 0

    def on_isr_result(self, queue: str, p: int, record: PartitionRecord, committed: bool) -> None:
        role = self.roles.get((queue, p))
        if role is None or role.leader is None:
            return
        role.isr_proposed = False
        self._hot.add((queue, p))
        if not role.leader.on_isr_result(record, committed):
            log.warning("%s/%d: fenced as leader (epoch %d)", queue, p, role.record.leader_epoch)
        if committed:
            role.record = record
        self._advance(queue, p, role)

    def _send_fetch(self, queue: str, p: int, role: Role, now_ms: int) -> None:
        assert role.follower is not None and role.record.leader is not None
        leader = role.record.leader
        down_since = self._links_down.get(leader)
        if down_since is not None and now_ms - down_since < LINK_PROBE_MS:
            # sent when the link is up: not tried every 100 ms, and not into a pipe that libzmq
            # is about to drop (it reports the disconnect a moment before)
            self._awaiting_link.setdefault(leader, set()).add((queue, p))
            return
        req = role.follower.next_fetch()
        rid = self._next_id
        self._next_id += 1
        params = {
            "queue": queue,
            "partition": p,
            "replica": self.node_id,
            "leader_epoch": req.leader_epoch,
            "fetch_offset": req.fetch_offset,
            "last_fetched_epoch": req.last_fetched_epoch,
            "max_bytes": FETCH_BYTES,
            "wait_ms": (wait := self._wait_for(role)),
            "delay_cursor": role.delay_cursor,
            "high_watermark": role.follower.high_watermark,
        }
        frames = fr.encode(fr.Header(Op.REPLICA_FETCH, rid), params)
        if not self.send_peer(leader, frames):
            if down_since is not None:
                self._awaiting_link.setdefault(leader, set()).add((queue, p))
            else:
                role.retry_at_ms = now_ms + FETCH_BACKOFF_MS  # a full pipe: not in a hot loop
                self._hot.add((queue, p))
        else:
            role.fetch_sent_ms = now_ms
            role.sent_wait_ms = wait
            role.fetch_id = rid
            role.fetch_req = req
            self._fetch_ids[rid] = (queue, p)
            self._arm((queue, p), role, now_ms + wait + FETCH_RETRY_MS + 1)

    def on_link(self, peer: str, up: bool) -> None:
        """The link to ``peer`` went down: the fetches in flight to it may be lost with it (their
        answers too), so they are forgotten and sent again once a handshake brings it back, not
        a whole idle wait later. Up: the followers that waited for it fetch at once. (An event
        missed costs no more than the fetch timers and the safety pass.)"""
        if up:
            self._links_down.pop(peer, None)
            for key in self._awaiting_link.pop(peer, ()):
                self._fetch_now.add(key)
            return
        self._links_down.setdefault(peer, self.broker._now_ms)
        waiting = self._awaiting_link.setdefault(peer, set())
        for rid, key in list(self._fetch_ids.items()):
            role = self.roles.get(key)
            if role is not None and role.follower is not None and role.fetch_id == rid and role.record.leader == peer:
                del self._fetch_ids[rid]
                role.fetch_sent_ms = -1
                role.fetch_req = None
                waiting.add(key)

    def _wait_for(self, role: Role) -> int:
        """The fetch's wait at the leader; an idle one's is cut by up to a quarter at random, so
        that thousands of idle fetches parked at once (a message to each queue, a restart) do not
        all run out in the same second every FETCH_WAIT_IDLE_MAX_MS."""
        wait = role.fetch_wait_ms
        if wait >= FETCH_WAIT_IDLE_MAX_MS:
            wait -= self._jitter.randrange(wait // 4)
        return wait

    # ------------------------------------------------------------------ checkpoint files

    def _save_hws(self, *, durable: bool = False) -> None:
        """Checkpoint the high watermarks that moved, every replica's in one file (one write a
        second however many partitions moved: one file per partition was a rename each, and a
        message to each of 10,000 queues left the filesystem digesting them for seconds). Not
        fsynced while the node runs: a stale, empty or missing file is safe (``_load_hw`` reads a
        lower one, or the log start, and the leader's answers move it on); the one written at a
        stop is. While it runs only those marked since the last checkpoint are looked at."""
        if durable:
            keys: Any = list(self.roles)
        else:
            keys, self._hw_dirty = self._hw_dirty, set()
        changed = self._hw_unwritten or durable
        for key in keys:
            role = self.roles.get(key)
            if role is None:
                continue
            hw = self.broker._visible.get(key, 0)
            if hw != role.saved_hw or (durable and key not in self._hw_saved):
                try:
                    qid = str(self.broker.store.record(key[0]).get("id", ""))
                except FabricError:
                    continue
                self._hw_saved[key] = (qid, hw)
                role.saved_hw = hw
                changed = True
        if not changed:
            return
        lines = [f"{q}\t{qid}\t{p}\t{hw}\n" for (q, p), (qid, hw) in self._hw_saved.items()]
        try:
            atomic_write(self._hw_path, "".join(lines).encode(), durable=durable)
            self._hw_unwritten = False
        except FabricError as exc:
            self._hw_unwritten = True
            log.warning("could not checkpoint the high watermarks in %s: %s", self._hw_path, exc)

    def _read_hw_checkpoint(self) -> dict[tuple[str, int], tuple[str, int]]:
        """HW_CHECKPOINT as it was left; an unreadable line is skipped (its partition falls back
        to a lower high watermark: safe)."""
        out: dict[tuple[str, int], tuple[str, int]] = {}
        try:
            text = self._hw_path.read_text()
        except FileNotFoundError:
            return out
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("%s is unreadable (%s): high watermarks start from the logs", self._hw_path, exc)
            return out
        for line in text.splitlines():
            parts = line.split("\t")
            if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
                out[(parts[0], int(parts[2]))] = (parts[1], int(parts[3]))
        return out

    def _load_hw(self, queue: str, p: int, plog: Any) -> int:
        """The checkpointed high watermark of a partition, if the checkpoint names this very
        queue (its id: not one deleted and created again by the same name), capped by the log;
        else the partition's own file of earlier builds; else the log start."""
        saved = self._hw_saved.get((queue, p))
        try:
            qid = str(self.broker.store.record(queue).get("id", ""))
        except FabricError:
            qid = None
        if saved is not None and qid is not None and saved[0] == qid:
            return min(saved[1], plog.next_offset)
        try:
            return min(int((plog.directory / HW_FILE).read_bytes()), plog.next_offset)
        except (FileNotFoundError, ValueError):
            return min(plog.log_start_offset, plog.next_offset)

    def save(self) -> None:
        """Checkpoint every high watermark now, durably (the node is stopping)."""
        self._save_hws(durable=True)

    def _load_epochs(self, plog: Any) -> LeaderEpochCache:
        path = plog.directory / EPOCH_FILE
        try:
            return LeaderEpochCache.decode(path.read_bytes())
        except FileNotFoundError:
            return LeaderEpochCache()
        except ValueError as exc:
            log.error("%s is unreadable (%s): starting an empty epoch cache", path, exc)
            return LeaderEpochCache()

    def _save_epochs(self, plog: Any, epochs: LeaderEpochCache) -> None:
        atomic_write(plog.directory / EPOCH_FILE, epochs.encode())
