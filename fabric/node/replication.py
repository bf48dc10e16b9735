"""The node's side of replicated partitions: the cluster's state machines wired to the broker.

Theory of operation
-------------------
For every partition this node holds a replica of, the cluster map (``fabric.cluster``, read
from etcd by the node's cluster thread) says who leads and in which leader epoch. This module
keeps one ``Role`` per such partition (``fabric.node.roles``) and hands the work to one helper
per job:

* **Leader**: PRODUCE appends as on a single node, stamping each batch with the leader epoch.
  When the append is durable locally (at once, or after the covering fdatasync), the
  ``LeaderReplica`` learns the new log end; consumers see only what is below the *high
  watermark* (the lowest log end among the committed in-sync replicas), and an ``acks=all``
  reply waits until the high watermark covers its records. Followers ask with REPLICA_FETCH;
  each fetch reports the follower's log end, which may move the high watermark and so release
  replies and pushes. Serving those fetches, and parking the ones with nothing to send, is
  ``fabric.node.leader_fetches``.
* **Follower**: ``fabric.node.follower_fetches`` sends REPLICA_FETCH to the leader (one in
  flight per partition, over the DEALER socket the server keeps per peer node); the reply's
  batches are appended byte for byte, keeping the leader's offsets and epochs
  (``fabric.node.replica_log``); a *diverging* reply (our log has a suffix the leader never
  had, KIP-279/320) truncates first. Producer-id state is recorded from the appended batches,
  so the idempotent producer carries on after a failover.
* **Routing and forwarding**: a request for a partition this node does not lead is passed on to
  the leader (``route``, ``fabric.node.routing``), its reply relayed back
  (``fabric.node.forwarding``).

Delayed batches wait in the delay store of every replica (``fabric.node.delay_replication``):
the follower's fetch carries its delay cursor, the leader's reply the rows past it.

The leader-epoch cache of each partition lives in its directory (``leader-epochs``), written
atomically whenever it changes (rare: once per leadership change), read back at start; every
replica's high watermark is checkpointed in one file of the data directory about once a second.
Both files are the store's (``fabric.store.checkpoints``).
ISR changes the leader proposes are handed to the cluster thread, which compare-and-swaps
them in etcd; only a committed ISR counts for the high watermark.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from time import monotonic_ns
from typing import TYPE_CHECKING, Any, Protocol

from fabric.cluster.epochs import LeaderEpochCache
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.replica import FollowerReplica, LeaderReplica
from fabric.errors import (
    FabricError,
    FencedLeaderEpoch,
    NotEnoughReplicas,
    NotLeader,
)
from fabric.histogram import LATENCY_BUCKETS, Histogram
from fabric.node.delay_replication import ReplicatedDelays
from fabric.node.follower_fetches import FollowerFetch, FollowerFetches
from fabric.node.forwarding import Forwarding, PeerSend
from fabric.node.leader_fetches import LeaderFetches
from fabric.node.replica_log import append_copy, reset_copy, truncate_copy
from fabric.node.roles import Role
from fabric.node.routing import Routing
from fabric.node.throttle import TokenBucket
from fabric.protocol import frames as fr
from fabric.store.checkpoints import (
    EPOCH_FILE,
    HighWatermarkCheckpoint,
    read_leader_epochs,
    read_partition_hw,
    write_leader_epochs,
)

if TYPE_CHECKING:
    from fabric.errors import FabricError as _Error
    from fabric.node.delay_replication import DelayedRows
    from fabric.node.partition import NodePartition
    from fabric.store.flusher import Flusher
    from fabric.store.store import Store

__all__ = ["PeerSend", "Replication", "Role"]

log = logging.getLogger("fabric.replication")
HW_SAVE_MS = 1000  # the high-watermark checkpoint (fabric.store.checkpoints) is written this often, if one moved
TIMERS_PER_SCAN = 1000  # fetches sent (timers, answered) per pass; 10,000 at once held the loop ~90 ms
SCAN_MS = 10  # the pass over the roles in flux (retries, ISR changes under way) runs at most this often
SWEEP_MS = 1000  # a slice of the safety pass over every role runs this often
FULL_SWEEP_MS = 10_000  # ... so that every role is looked at once in this long, whatever else happened


class NodeSide(Protocol):
    """What replication needs of the node it runs in (``fabric.node.broker.Broker``)."""

    @property
    def store(self) -> Store: ...

    @property
    def flusher(self) -> Flusher: ...

    @property
    def partitions(self) -> dict[tuple[str, int], NodePartition]: ...

    @property
    def delayed(self) -> DelayedRows: ...

    @property
    def _now_ms(self) -> int: ...

    def visible(self, queue: str, p: int, default: int) -> int: ...

    def _on_visible(self, queue: str, p: int) -> None: ...

    def on_trimmed(self, queue: str, p: int, start: int) -> None: ...

    def _send_or_count(self, client: bytes, frames: list[Any]) -> None: ...

    def _error(self, client: bytes, header: fr.Header | None, frames: Sequence[Any], exc: _Error) -> None: ...

    def _reply(self, client: bytes, header: fr.Header, params: dict[str, Any], data: Sequence[Any] = ()) -> None: ...


class Replication:
    """Leader and follower roles of this node's replicas, driven by the broker's event loop."""

    def __init__(
        self,
        broker: NodeSide,
        node_id: str,
        send_peer: PeerSend,
        propose_isr: Callable[[str, int, PartitionRecord, PartitionRecord], None],
        *,
        min_insync: int,
        lag_time_ms: int,
        leader_lookup: Callable[[str, int], str | None] = lambda q, p: None,
        replicas_lookup: Callable[[str], list[list[str]] | None] = lambda q: None,
        catch_up: TokenBucket | None = None,
    ) -> None:
        self.broker = broker
        self.node_id = node_id
        self.send_peer = send_peer
        self.propose_isr = propose_isr
        self.min_insync = min_insync
        self.lag_time_ms = lag_time_ms
        self.roles: dict[tuple[str, int], Role] = {}
        self.endpoints: dict[str, str] = {}  # node id -> client endpoint, from the cluster map
        self._next_scan = 0  # the pass over the roles in flux
        self._next_sweep = 0  # the next slice of the safety pass over every role
        self._sweep_keys: list[tuple[str, int]] = []  # that pass: what is left of it
        # roles in flux, looked at every SCAN_MS: a leader that appended, was fetched from, or
        # whose in-sync followers are behind its log end; a follower waiting to retry. An idle
        # partition costs nothing per second: its follower's fetch in flight has a timer
        # (follower_fetches), and every event that can change a leader's ISR (an append, a fetch,
        # a map change, an ISR result) marks it hot; the safety pass looks at every role once in
        # FULL_SWEEP_MS
        self._hot: set[tuple[str, int]] = set()
        self._hot_turn: list[tuple[str, int]] = []  # the hot roles this round still to look at
        self._hw_dirty: set[tuple[str, int]] = set()  # high watermarks moved since the last checkpoint
        # every replica's high watermark on this node, in one file of the data directory
        self.hw_checkpoint = HighWatermarkCheckpoint(broker.store.data_dir)
        self._next_hw_save = 0
        self.leader_lookup = leader_lookup  # the whole map's leaders
        # every partition's replica list, as the map says (None: the map does not name the queue)
        self.replicas_lookup = replicas_lookup
        # request ids of this node's messages to peers (fetches, requests passed on): one counter,
        # since the replies come back on the same sockets
        ids = itertools.count(1)
        self.forwarding = Forwarding(
            node_id,
            send_peer,
            ids.__next__,
            self._now,
            broker._send_or_count,
            broker._error,
            lambda n: self.endpoints.get(n),
        )
        self.delays = ReplicatedDelays(self, broker.delayed, broker.store)
        # where a replicated acks=all message's time goes on its leader (metrics, bench-cluster):
        # isr_wait, from the append durable here to the reply (the followers' fetches passing it);
        # follower_fetch, from an answer with data to that follower's next fetch (its round trip)
        self.stage_seconds = {"isr_wait": Histogram(LATENCY_BUCKETS), "follower_fetch": Histogram(LATENCY_BUCKETS)}
        self.leader_fetches = LeaderFetches(
            self.roles,
            broker.store,
            self._now,
            broker._reply,
            broker._error,
            self.check_leader,
            self.delays.rows_for,
            self._hot.add,
            self._advance,
            self.stage_seconds["follower_fetch"],
        )
        self.routing = Routing(
            node_id,
            self.roles,
            lambda q, p: self.leader_lookup(q, p),
            lambda q: self.replicas_lookup(q),
            lambda: self.endpoints,
            broker.store,
            self.forwarding.pass_on,
        )
        self.leader_fetches.catch_up = catch_up
        self.follower_fetches = FollowerFetches(self.roles, node_id, send_peer, ids.__next__, self._now, self._hot)

    def _now(self) -> int:
        return self.broker._now_ms

    @property
    def catch_up(self) -> TokenBucket | None:
        """What this leader sends replicas outside the ISR, shared by every partition it leads:
        [cluster] move_throttle_bytes_per_s (None: no limit)."""
        return self.leader_fetches.catch_up

    @catch_up.setter
    def catch_up(self, bucket: TokenBucket | None) -> None:
        self.leader_fetches.catch_up = bucket

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
            self.broker.partitions[key].truncate(role.saved_hw)
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
            role.leader = role.follower = role.fetch = None
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
        record = role.record
        if record.leader == self.node_id and not may_lead:
            log.info(
                "%s/%d: named leader in epoch %d, but not for this incarnation: waiting", queue, p, record.leader_epoch
            )
        elif record.leader == self.node_id:
            if epochs.latest_epoch() < record.leader_epoch:
                epochs.assign(record.leader_epoch, plog.next_offset)
                self._save_epochs(plog, epochs)
            hw = min(self.broker.visible(queue, p, 0), plog.next_offset)
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
            hw = min(self.broker.visible(queue, p, 0), plog.next_offset)
            role.follower = FollowerReplica(
                self.node_id,
                record.leader,
                record.leader_epoch,
                log_end=plog.next_offset,
                high_watermark=hw,
                epochs=epochs,
            )
            role.fetch = FollowerFetch()
            log.info("following %s/%d: leader %s, epoch %d", queue, p, record.leader, record.leader_epoch)

    def forget(self, queue: str, p: int) -> None:
        role = self.roles.pop((queue, p), None)
        if role is not None:
            self._fail_waiting(role, NotLeader(f"{queue}/{p} is no longer on this node"))
        self.hw_checkpoint.drop((queue, p))
        self.delays.forget(queue, p)

    def leads(self, queue: str, p: int) -> bool:
        role = self.roles.get((queue, p))
        return role is not None and role.leader is not None

    def check_leader(self, queue: str, p: int) -> None:
        """Raise NOT_LEADER (naming the leader and its endpoint) unless this node leads ``queue/p``."""
        self.routing.check_leader(queue, p)

    def route(self, client: bytes, header: fr.Header, params: Mapping[str, Any], data: Sequence[Any]) -> None:
        """A request for one partition: return to handle it here (this node leads it), or pass it
        on to the leader and raise Deferred (``fabric.node.routing``)."""
        self.routing.route(client, header, params, data)

    def partition_known(self, queue: str, p: int) -> bool:
        """Does this node know where ``queue/p`` is served (a role here, or a leader in the map)?"""
        return self.routing.partition_known(queue, p)

    def check_coordinator(self, queue: str) -> None:
        """A group's SUBSCRIBE: NOT_COORDINATOR unless this node coordinates ``queue``'s groups."""
        self.routing.check_coordinator(queue)

    def holds(self, queue: str) -> bool | None:
        """Does the map place a replica of ``queue`` here (None: the map does not name it)."""
        return self.routing.holds(queue)

    def check_local(self, queue: str, partitions: list[int] | None, coordinated: bool) -> None:
        """Refuse a subscription naming a partition this node holds no replica of."""
        self.routing.check_local(queue, partitions, coordinated)

    def produce_elsewhere(self, queue: str, p: int, batch: bytes, done: Callable[[FabricError | None], None]) -> bool:
        """Send a batch this node made (dead letters) to ``queue/p``'s leader on another node with
        acks=all; ``done(None)`` once it is stored there, ``done(error)`` if refused or unanswered
        within forwarding's INTERNAL_TIMEOUT_MS. False (and no call) when no leader elsewhere is reachable now."""
        leader = self.leader_lookup(queue, p)
        if leader is None or leader == self.node_id:
            return False
        return self.forwarding.send_internal(leader, queue, p, batch, done)

    def pass_on(
        self,
        client: bytes,
        header: fr.Header,
        params: Mapping[str, Any],
        data: Sequence[Any],
        node: str,
        queue: str,
        p: int = -1,
    ) -> None:
        """Send a request to node ``node`` and raise Deferred; its reply goes back to ``client``
        as is (``p`` -1: not tied to one partition's leader). See ``fabric.node.forwarding``."""
        self.forwarding.pass_on(client, header, params, data, node, queue, p)

    def on_leader_moved(self, queue: str, p: int, leader: str | None) -> None:
        """The map names a new leader for ``queue/p`` (or a peer is gone, ``queue`` ""): the
        requests passed on to the old one are answered NOT_LEADER now."""
        self.forwarding.on_leader_moved(queue, p, leader)

    def on_link(self, peer: str, up: bool) -> None:
        """The link to ``peer`` went down or came up (the follower's fetches over it)."""
        self.follower_fetches.on_link(peer, up)

    # ------------------------------------------------------------------ leader side

    def on_durable(
        self, queue: str, p: int, end: int, client: bytes | None, reply: list[Any] | None, acks_all: bool
    ) -> None:
        """A leader's append up to ``end`` is durable on this node: replicate, then release."""
        role = self.roles[(queue, p)]
        assert role.leader is not None
        waiting = self.leader_fetches.waiting_replicas((queue, p))
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
                    role.waiting.append((end, client, reply, monotonic_ns()))
            else:
                self.broker._send_or_count(client, reply)
        self.leader_fetches.wake(queue, p)
        self._advance(queue, p, role)

    def handle_fetch(self, client: bytes, header: fr.Header, params: Mapping[str, Any]) -> bool:
        """REPLICA_FETCH: answer now (True) or park until data arrives (False)."""
        return self.leader_fetches.handle(client, header, params)

    def _advance(self, queue: str, p: int, role: Role) -> None:
        """Make the high watermark visible to consumers and release the acks=all it covers."""
        if role.leader is not None:
            hw = role.leader.high_watermark
        elif role.follower is not None:
            hw = role.follower.high_watermark
        else:
            return
        key = (queue, p)
        part = self.broker.partitions.get(key)
        if part is not None and part.advance_to(hw):
            self._hw_dirty.add(key)
            self.broker._on_visible(queue, p)  # a follower's subscribers read its copy too
            if role.leader is not None and key in self.leader_fetches.parked:
                self.leader_fetches.wake_behind(key, hw)
        if role.waiting and role.leader is not None:
            if role.leader.acked(role.waiting[0][0]):
                isr_wait, now_ns = self.stage_seconds["isr_wait"], monotonic_ns()
                while role.waiting and role.leader.acked(role.waiting[0][0]):
                    _, client, reply, durable_ns = role.waiting.popleft()
                    isr_wait.observe((now_ns - durable_ns) / 1e9)
                    self.broker._send_or_count(client, reply)
            problem = role.leader.not_enough_replicas() if role.waiting else None
            if problem is not None:  # the ISR shrank under min_insync_replicas after the append
                exc = NotEnoughReplicas(f"{queue}/{p}: {problem} (stored on the leader, not on enough replicas)")
                while role.waiting:
                    _, client, reply, _ = role.waiting.popleft()
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
        while role.waiting:
            _, client, reply, _ = role.waiting.popleft()
            self.broker._error(client, fr.decode_header(reply[0]), (), exc)
        self._fail_delayed(role, exc)

    # ------------------------------------------------------------------ follower side

    def on_peer_reply(self, frames: Sequence[bytes]) -> None:
        """A leader answered one of our REPLICA_FETCH requests, or a request we passed on."""
        if self.forwarding.relay(frames) or self.forwarding.internal_reply(frames):
            return
        answer = self.follower_fetches.on_answer(list(frames))
        if answer is None:
            return
        (queue, p), msg, waited = answer
        role = self.roles[(queue, p)]
        assert role.follower is not None and role.fetch is not None
        params = msg.params
        plog = self.broker.store.partition(queue, p)
        follower = role.follower
        if msg.header.status:  # OffsetOutOfRange with the leader's log start (FollowerFetches.on_answer)
            self._reset_copy(queue, p, role, plog, params["log_start_offset"])
            return
        if params["diverging"] is not None:
            epoch, end = params["diverging"]
            cut = follower.on_diverging(epoch, end)
            if cut < plog.next_offset:
                truncate_copy(self.broker.store, plog, queue, p, cut, self.broker._now_ms)
                self.delays.on_truncated(queue, p, cut)
                part = self.broker.partitions[(queue, p)]
                part.truncate(min(part.visible, plog.next_offset))
                self._hw_dirty.add((queue, p))
            self._save_epochs(plog, role.epochs)
            return
        batch_epochs: list[tuple[int, int]] = []
        data = msg.data[0] if msg.data else b""
        self.follower_fetches.after_answer(role.fetch, bool(data), waited)
        if "delayed_upto" in params:  # delayed rows first: a later append of one must find it here
            self.delays.on_rows(queue, p, role, params, list(msg.data[1:]))
        if data:
            b = self.broker
            batch_epochs, marks = append_copy(
                b.store, b.flusher, plog, queue, p, data, role.epochs, b._now_ms, self._save_epochs
            )
            if marks:
                self.delays.on_appended(queue, p, marks)
        try:
            follower.on_appended(plog.next_offset, batch_epochs, params["high_watermark"])
        except ValueError as exc:
            log.error("%s/%d: the leader's answer does not check out (%s); fetching again", queue, p, exc)
        self._advance(queue, p, role)
        self._follow_start(queue, p, plog, params.get("log_start_offset"))

    def _reset_copy(self, queue: str, p: int, role: Role, plog: Any, start: int) -> None:
        """Our copy ends below the leader's log start: empty it and start it there (Kafka's
        ``truncateFullyAndStartAt``), then fetch from there. The epochs file is emptied first, so a
        crash before the log is reset fetches again from the old end with no epoch and is told the
        same; consumers see nothing below the new start, and groups and readers skip to it."""
        follower = role.follower
        assert follower is not None
        if start <= plog.next_offset:
            return  # an answer to an older fetch: the next one asks from where the log ends
        follower.reset_to(start)
        self._save_epochs(plog, role.epochs)
        reset_copy(self.broker.store, plog, queue, p, start, self.broker._now_ms)
        self.broker.on_trimmed(queue, p, start)  # visible moves up to the start (the log end)
        self._hw_dirty.add((queue, p))
        self._advance(queue, p, role)

    def _follow_start(self, queue: str, p: int, plog: Any, leader_start: Any) -> None:
        """Start this copy where the leader's log starts (a purge, dead_letter_oldest overflow),
        up to the high watermark this copy knows: below it, both copies hold the same records."""
        if type(leader_start) is not int or leader_start <= plog.log_start_offset:
            return
        upto = min(leader_start, self.broker.visible(queue, p, 0), plog.next_offset)
        if upto > plog.log_start_offset:
            plog.advance_start(upto)
            self.broker.on_trimmed(queue, p, upto)

    def tick(self, now_ms: int) -> None:
        self.forwarding.expire_internal(now_ms)
        if now_ms >= self._next_hw_save:
            self._next_hw_save = now_ms + HW_SAVE_MS
            self._save_hws()
            self.forwarding.forget_old(now_ms)
        self.leader_fetches.expire(now_ms)
        self.follower_fetches.send_answered(now_ms, TIMERS_PER_SCAN)
        if now_ms < self._next_scan:
            return
        # the roles in flux at most every SCAN_MS, the fetches whose timers ran out, and a slice
        # of the safety pass: with thousands of partitions, a pass over all of them per loop
        # wake-up (or per second: thousands of idle partitions) would take the loop's CPU
        self._next_scan = now_ms + SCAN_MS
        # thousands due at once (a restart): the rest at the next wake-up
        self.follower_fetches.fire_timers(now_ms, TIMERS_PER_SCAN, lambda k, t: self._visit(k, self.roles[k], t))
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
        if self.follower_fetches.more_ready():  # not those waiting for a retry time: ticks find them
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
        keys, visible = self._sweep_keys, self.broker.visible
        for _ in range(min(count, len(keys))):
            key = keys.pop()
            role = self.roles.get(key)
            if role is not None:
                if visible(key[0], key[1], 0) != role.saved_hw:
                    self._hw_dirty.add(key)
                self._visit(key, role, now_ms)

    def _visit(self, key: tuple[str, int], role: Role, now_ms: int) -> None:
        """One look at a role: a follower's fetch that timed out or waits to be retried, a
        leader's ISR change; the role stays in the hot set while something is under way."""
        queue, p = key
        if role.follower is not None:
            self.follower_fetches.visit(key, role, now_ms)
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

    # ------------------------------------------------------------------ checkpoints

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
        checkpoint = self.hw_checkpoint
        changed = checkpoint.unwritten or durable
        for key in keys:
            role = self.roles.get(key)
            if role is None:
                continue
            hw = self.broker.visible(key[0], key[1], 0)
            if hw != role.saved_hw or (durable and key not in checkpoint.saved):
                try:
                    qid = str(self.broker.store.record(key[0]).get("id", ""))
                except FabricError:
                    continue
                checkpoint.put(key, qid, hw)
                role.saved_hw = hw
                changed = True
        if changed:
            checkpoint.write(durable=durable)

    def _load_hw(self, queue: str, p: int, plog: Any) -> int:
        """The checkpointed high watermark of a partition, if the checkpoint names this very
        queue (its id: not one deleted and created again by the same name), capped by the log;
        else the partition's own file of earlier builds; else the log start."""
        try:
            qid: str | None = str(self.broker.store.record(queue).get("id", ""))
        except FabricError:
            qid = None
        saved = self.hw_checkpoint.get((queue, p), qid)
        if saved is None:
            saved = read_partition_hw(plog.directory)
        if saved is None:
            saved = plog.log_start_offset
        return min(saved, plog.next_offset)

    def save(self) -> None:
        """Checkpoint every high watermark now, durably (the node is stopping)."""
        self._save_hws(durable=True)

    def _load_epochs(self, plog: Any) -> LeaderEpochCache:
        data = read_leader_epochs(plog.directory)
        if data is None:
            return LeaderEpochCache()
        try:
            return LeaderEpochCache.decode(data)
        except ValueError as exc:
            log.error("%s is unreadable (%s): starting an empty epoch cache", plog.directory / EPOCH_FILE, exc)
            return LeaderEpochCache()

    def _save_epochs(self, plog: Any, epochs: LeaderEpochCache) -> None:
        write_leader_epochs(plog.directory, epochs.encode())
