"""When a follower sends REPLICA_FETCH to its leader: one fetch in flight per partition.

Theory of operation
-------------------
A follower keeps one fetch in flight per partition, over the DEALER the server keeps per peer.
An answered fetch is followed by the next at once (acks=all on the leader waits on it); the
leader parks a fetch with nothing to send, so an idle partition costs one fetch per wait.
The wait adapts: an empty answer after the whole wait doubles it (up to
``FETCH_WAIT_IDLE_MAX_MS``), two answers with data in a row halve it (down to
``FETCH_WAIT_MS``). A fetch with no answer within its wait and ``FETCH_RETRY_MS`` is
forgotten and sent again (a timer per fetch in flight, on one heap). A refused fetch, or one
that could not be queued, is retried after ``FETCH_BACKOFF_MS``. While the link to the leader
is down (a peer's monitor says so) the fetches wait for it to come back, and the ones in flight
on it are forgotten; a link down longer than ``LINK_PROBE_MS`` is tried anyway.

This module decides when to fetch and what to ask for; applying the answer (appending,
truncating) is the replication's (``fabric.node.replication``).
"""

from __future__ import annotations

import heapq
import logging
import random
from collections.abc import Callable
from typing import Any

from fabric.errors import FabricError
from fabric.node.roles import FETCH_WAIT_IDLE_MAX_MS, Role
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op

log = logging.getLogger("fabric.replication")
FETCH_WAIT_MS = (
    2000  # a follower's fetch waits this long at the leader for new data (idle partitions: one fetch each per 2 s)
)
FETCH_BYTES = 4 * 1024 * 1024
FETCH_RETRY_MS = 1000  # a fetch without an answer this long past its wait is sent again
FETCH_BACKOFF_MS = 100  # after a refused fetch, or with no link to the leader
LINK_PROBE_MS = 5000  # a link down this long is tried anyway (its monitor's "up" may have been missed)

Key = tuple[str, int]
PeerSend = Callable[[str, list[Any]], bool]


class FollowerFetches:
    """The fetches this node sends as follower: which are in flight, due, or waiting for a link."""

    def __init__(
        self,
        roles: dict[Key, Role],
        node_id: str,
        send_peer: PeerSend,
        new_id: Callable[[], int],
        clock: Callable[[], int],
        hot: set[Key],
    ) -> None:
        self.roles = roles
        self.node_id = node_id
        self.send_peer = send_peer
        self.new_id = new_id
        self.clock = clock
        self.hot = hot  # the replication's roles in flux, looked at every scan
        self.fetch_ids: dict[int, Key] = {}
        self.fetch_now: set[Key] = set()  # followers whose last fetch was answered
        self._fetch_more = False  # more of them were due than one pass sends
        # followers' fetches in flight: (due, seq, partition), one entry per role at a time (its
        # timer_due), so a lost fetch is sent again when its wait and FETCH_RETRY_MS are over
        self._timers: list[tuple[int, int, Key]] = []
        self._seq = 0
        # peers whose link is down (or not up yet), and the followers waiting for it to fetch
        self.links_down: dict[str, int] = {}  # peer -> since when (ms)
        self._awaiting_link: dict[str, set[Key]] = {}
        self._jitter = random.Random(node_id)

    # ------------------------------------------------------------------ answers

    def on_answer(self, frames: list[Any]) -> tuple[Key, Role, fr.Message, int] | None:
        """A leader's answer to one of our fetches: (partition, role, message, how long it took)
        when it applies to the role as it is now and was not a refusal; None otherwise."""
        try:
            msg = fr.decode(frames)
        except FabricError as exc:
            log.warning("bad reply from a leader: %s", exc)
            return None
        key = self.fetch_ids.pop(msg.header.request_id, None)
        role = self.roles.get(key) if key is not None else None
        if key is None or role is None or role.follower is None or role.fetch_id != msg.header.request_id:
            return None  # an answer for a role we no longer have
        now = self.clock()
        waited = now - role.fetch_sent_ms
        role.fetch_sent_ms = -1
        self.fetch_now.add(key)
        req, role.fetch_req = role.fetch_req, None
        if req is None or not role.follower.is_current(req):
            return None  # the log moved since this fetch went out: its answer no longer applies
        if msg.header.status:
            queue, p = key
            log.info("fetch of %s/%d from %s refused: %s", queue, p, role.record.leader, msg.params.get("message", ""))
            role.retry_at_ms = now + FETCH_BACKOFF_MS
            self.hot.add(key)
            return None
        return key, role, msg, waited

    def after_answer(self, role: Role, had_data: bool, waited: int) -> None:
        """Adapt the next fetch's wait to what this answer brought.

        An idle partition (an empty answer after the whole wait) waits longer next time,
        doubling up to FETCH_WAIT_IDLE_MAX_MS: thousands of idle partitions cost few round
        trips; an append or a high watermark that moves still answers a parked fetch at once,
        so the wait costs no latency. Two answers with data in a row halve it (a busy partition
        is back at FETCH_WAIT_MS within a few answers); a single one leaves it: one message to
        each of thousands of quiet partitions would otherwise shorten all their waits, a storm
        of empty fetches over the next minute. An empty answer before the wait was over (news
        of the high watermark) says nothing either way."""
        if had_data:
            if role.had_data:
                role.fetch_wait_ms = max(FETCH_WAIT_MS, role.fetch_wait_ms // 2)
            role.had_data = True
        elif waited >= role.fetch_wait_ms:
            role.fetch_wait_ms = min(FETCH_WAIT_IDLE_MAX_MS, role.fetch_wait_ms * 2)
            role.had_data = False

    # ------------------------------------------------------------------ passes

    def send_answered(self, now_ms: int, budget: int) -> None:
        """Answered fetches: the next one goes at once (acks=all waits on it), ``budget`` a pass."""
        if not self.fetch_now:
            return
        ready, self.fetch_now = self.fetch_now, set()
        self._fetch_more = len(ready) > budget
        if self._fetch_more:  # thousands at once (roles just made): the rest at the next pass
            rest = list(ready)
            ready = set(rest[:budget])
            self.fetch_now.update(rest[budget:])
        for key in ready:
            role = self.roles.get(key)
            if role is not None and role.follower is not None and role.fetch_sent_ms < 0:
                if now_ms >= role.retry_at_ms:
                    self._send(key[0], key[1], role, now_ms)
                else:
                    self.fetch_now.add(key)

    def more_ready(self) -> bool:
        """More answered fetches were ready than the last pass sent: come back at once."""
        return self._fetch_more and bool(self.fetch_now)

    def fire_timers(self, now_ms: int, budget: int, visit: Callable[[Key, Role, int], None]) -> None:
        """``visit`` the roles whose fetch timer ran out, ``budget`` at most."""
        timers = self._timers
        while timers and timers[0][0] <= now_ms and budget:
            budget -= 1
            due, _, key = heapq.heappop(timers)
            role = self.roles.get(key)
            if role is not None and role.timer_due == due:
                role.timer_due = 0
                visit(key, role, now_ms)

    def visit(self, key: Key, role: Role, now_ms: int) -> None:
        """One look at a follower: a fetch that timed out or waits to be retried is sent; the
        role stays in the hot set while it waits for its retry time."""
        if now_ms >= role.retry_at_ms and (
            role.fetch_sent_ms < 0 or now_ms - role.fetch_sent_ms > role.sent_wait_ms + FETCH_RETRY_MS
        ):
            if role.fetch_sent_ms >= 0:
                # no answer within the wait: the leader keeps an idle partition's fetch (or it
                # was lost), so the partition is idle: wait longer next time; forget this one
                self.fetch_ids.pop(role.fetch_id, None)
                role.fetch_sent_ms = -1
                role.fetch_req = None
                role.fetch_wait_ms = min(FETCH_WAIT_IDLE_MAX_MS, role.fetch_wait_ms * 2)
                role.had_data = False
            self._send(key[0], key[1], role, now_ms)
        if now_ms < role.retry_at_ms:
            self.hot.add(key)
        else:
            self.hot.discard(key)
            if role.fetch_sent_ms >= 0:
                self._arm(key, role, role.fetch_sent_ms + role.sent_wait_ms + FETCH_RETRY_MS + 1)

    # ------------------------------------------------------------------ sending

    def _arm(self, key: Key, role: Role, due: int) -> None:
        """A timer for a follower's fetch in flight; the earliest one of a role is kept (when it
        fires, ``visit`` arms the next if the fetch it found has not timed out)."""
        if role.timer_due and role.timer_due <= due:
            return
        role.timer_due = due
        self._seq += 1
        heapq.heappush(self._timers, (due, self._seq, key))

    def _send(self, queue: str, p: int, role: Role, now_ms: int) -> None:
        assert role.follower is not None and role.record.leader is not None
        leader = role.record.leader
        down_since = self.links_down.get(leader)
        if down_since is not None and now_ms - down_since < LINK_PROBE_MS:
            # sent when the link is up: not tried every 100 ms, and not into a pipe that libzmq
            # is about to drop (it reports the disconnect a moment before)
            self._awaiting_link.setdefault(leader, set()).add((queue, p))
            return
        req = role.follower.next_fetch()
        rid = self.new_id()
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
                self.hot.add((queue, p))
        else:
            role.fetch_sent_ms = now_ms
            role.sent_wait_ms = wait
            role.fetch_id = rid
            role.fetch_req = req
            self.fetch_ids[rid] = (queue, p)
            self._arm((queue, p), role, now_ms + wait + FETCH_RETRY_MS + 1)

    def _wait_for(self, role: Role) -> int:
        """The fetch's wait at the leader; an idle one's is cut by up to a quarter at random, so
        that thousands of idle fetches parked at once (a message to each queue, a restart) do not
        all run out in the same second every FETCH_WAIT_IDLE_MAX_MS."""
        wait = role.fetch_wait_ms
        if wait >= FETCH_WAIT_IDLE_MAX_MS:
            wait -= self._jitter.randrange(wait // 4)
        return wait

    def on_link(self, peer: str, up: bool) -> None:
        """The link to ``peer`` went down: the fetches in flight to it may be lost with it (their
        answers too), so they are forgotten and sent again once a handshake brings it back, not
        a whole idle wait later. Up: the followers that waited for it fetch at once. (An event
        missed costs no more than the fetch timers and the safety pass.)"""
        if up:
            self.links_down.pop(peer, None)
            for key in self._awaiting_link.pop(peer, ()):
                self.fetch_now.add(key)
            return
        self.links_down.setdefault(peer, self.clock())
        waiting = self._awaiting_link.setdefault(peer, set())
        for rid, key in list(self.fetch_ids.items()):
            role = self.roles.get(key)
            if role is not None and role.follower is not None and role.fetch_id == rid and role.record.leader == peer:
                del self.fetch_ids[rid]
                role.fetch_sent_ms = -1
                role.fetch_req = None
                waiting.add(key)
