"""When a follower sends REPLICA_FETCH to its leader: one fetch in flight per partition.

Theory of operation
-------------------
A follower keeps one fetch in flight per partition, over the DEALER the server keeps per peer.
An answered fetch is followed by the next at once (acks=all on the leader waits on it); the
leader parks a fetch with nothing to send, so an idle partition costs one fetch per wait.
The wait adapts: an empty answer after the whole wait doubles it (up to
``FETCH_WAIT_IDLE_MAX_MS``), two answers with data in a row halve it (down to
``FETCH_WAIT_MS``). This module decides when to fetch and what to ask for; applying the
answer (appending, truncating) is the replication's (``fabric.node.replication``).

Each follower role's fetching is one ``FollowerFetch`` in one of four states
(``TRANSITIONS``)::

    READY --sent--> IN_FLIGHT --answered / timed out--> READY
    READY --pipe full--> BACKING_OFF --retry due--> READY
    READY --link down--> AWAITING_LINK --link up--> READY
    IN_FLIGHT --refused--> BACKING_OFF
    IN_FLIGHT --link down--> AWAITING_LINK
    AWAITING_LINK --sent--> IN_FLIGHT        (down longer than LINK_PROBE_MS: tried anyway)
    AWAITING_LINK --link down--> AWAITING_LINK   (tried, still down)
    AWAITING_LINK --pipe full--> BACKING_OFF

* READY: no fetch in flight; the next goes at the next pass (a new role, an answer, a link
  back). IN_FLIGHT: one fetch sent, with a timer at its wait + ``FETCH_RETRY_MS``; with no
  answer by then it is forgotten (``timed out``: the partition is idle, the next wait doubles)
  and sent again. BACKING_OFF: refused by the leader, or the pipe to it was full: nothing before
  ``retry_at_ms`` (``FETCH_BACKOFF_MS`` later). AWAITING_LINK: the link to the leader is down
  (a peer's monitor said so): the fetch goes when it is back, and a fetch in flight on it is
  forgotten (its answer may be lost with it).

Any other (state, event) pair is a bug in this module and raises ``InternalError`` naming both.
Time is a parameter (``now_ms``) or the clock handed in; the tests drive it by hand
(``tests/node/test_follower_fetches.py``).
"""

from __future__ import annotations

import enum
import heapq
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fabric.cluster.partition import PartitionRecord
from fabric.cluster.replica import FetchRequest, FollowerReplica
from fabric.errors import FabricError, InternalError, OffsetOutOfRange
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op

log = logging.getLogger("fabric.replication")
FETCH_WAIT_MS = (
    2000  # a follower's fetch waits this long at the leader for new data (idle partitions: one fetch each per 2 s)
)
# an idle partition's fetch waits longer each round, up to this: thousands of idle partitions cost
# one fetch each per this long. A fetch lost with a broken link is sent again when the link is back
# (Peers' monitor), so the wait bounds only a loss nothing reported. REPLICA_FETCH's wait_ms is at
# most 60,000: a longer one would be refused by the nodes of a cluster not upgraded yet
FETCH_WAIT_IDLE_MAX_MS = 60_000
FETCH_BYTES = 4 * 1024 * 1024
FETCH_RETRY_MS = 1000  # a fetch without an answer this long past its wait is sent again
FETCH_BACKOFF_MS = 100  # after a refused fetch, or with no link to the leader
LINK_PROBE_MS = 5000  # a link down this long is tried anyway (its monitor's "up" may have been missed)

Key = tuple[str, int]
PeerSend = Callable[[str, list[Any]], bool]


class FetchState(enum.Enum):
    READY = "ready"  # no fetch in flight: the next goes at the next pass
    IN_FLIGHT = "in flight"  # one fetch sent, its timer armed
    BACKING_OFF = "backing off"  # refused, or the pipe was full: nothing before retry_at_ms
    AWAITING_LINK = "awaiting link"  # the link to the leader is down: the fetch goes when it is back


class FetchEvent(enum.Enum):
    SENT = "sent"
    ANSWERED = "answered"
    REFUSED = "refused"
    TIMED_OUT = "timed out"
    PIPE_FULL = "pipe full"
    RETRY_DUE = "retry due"
    LINK_DOWN = "link down"
    LINK_UP = "link up"


S, E = FetchState, FetchEvent
TRANSITIONS: dict[tuple[FetchState, FetchEvent], FetchState] = {
    (S.READY, E.SENT): S.IN_FLIGHT,
    (S.READY, E.PIPE_FULL): S.BACKING_OFF,
    (S.READY, E.LINK_DOWN): S.AWAITING_LINK,
    (S.IN_FLIGHT, E.ANSWERED): S.READY,
    (S.IN_FLIGHT, E.TIMED_OUT): S.READY,
    (S.IN_FLIGHT, E.REFUSED): S.BACKING_OFF,
    (S.IN_FLIGHT, E.LINK_DOWN): S.AWAITING_LINK,
    (S.BACKING_OFF, E.RETRY_DUE): S.READY,
    (S.AWAITING_LINK, E.LINK_UP): S.READY,
    (S.AWAITING_LINK, E.SENT): S.IN_FLIGHT,
    (S.AWAITING_LINK, E.LINK_DOWN): S.AWAITING_LINK,
    (S.AWAITING_LINK, E.PIPE_FULL): S.BACKING_OFF,
}
del S, E


@dataclass(slots=True)
class FollowerFetch:
    """One follower role's fetching: its state, and what that state needs."""

    state: FetchState = FetchState.READY
    sent_ms: int = -1  # IN_FLIGHT: when the fetch went out
    id: int = 0  # IN_FLIGHT: its request id
    req: FetchRequest | None = None  # IN_FLIGHT: what it asked (its answer applies only if still current)
    sent_wait_ms: int = 0  # IN_FLIGHT: the wait it carried (wait_ms, jittered)
    retry_at_ms: int = 0  # BACKING_OFF: no fetch before then
    # how long the next fetch may wait at the leader. A new role starts idle (most of thousands
    # of partitions are): a busy one is down to FETCH_WAIT_MS within a few answers
    wait_ms: int = FETCH_WAIT_IDLE_MAX_MS
    had_data: bool = False  # the last answer brought records
    timer_due: int = 0  # when its entry in the timer heap comes due (0: none)

    def move(self, event: FetchEvent) -> None:
        """Apply one row of TRANSITIONS; leaving IN_FLIGHT forgets the fetch."""
        nxt = TRANSITIONS.get((self.state, event))
        if nxt is None:
            raise InternalError(f"follower fetch: illegal event {event.value!r} in state {self.state.value!r}")
        if self.state is FetchState.IN_FLIGHT and nxt is not FetchState.IN_FLIGHT:
            self.sent_ms = -1
            self.req = None
        self.state = nxt

    def timed_out(self, now_ms: int) -> bool:
        """IN_FLIGHT with no answer within its wait and FETCH_RETRY_MS."""
        return self.state is FetchState.IN_FLIGHT and now_ms - self.sent_ms > self.sent_wait_ms + FETCH_RETRY_MS

    def may_send(self, now_ms: int) -> bool:
        """No fetch in flight and none held back: READY, AWAITING_LINK (the send looks at the
        link), or BACKING_OFF whose time has come (moved to READY here)."""
        if self.state is FetchState.BACKING_OFF and now_ms >= self.retry_at_ms:
            self.move(FetchEvent.RETRY_DUE)
        return self.state is FetchState.READY or self.state is FetchState.AWAITING_LINK


class Followed(Protocol):
    """What this module reads of a replication role (``fabric.node.roles.Role``)."""

    record: PartitionRecord
    follower: FollowerReplica | None
    fetch: FollowerFetch | None
    delay_cursor: int


class FollowerFetches:
    """The fetches this node sends as follower: which are in flight, due, or waiting for a link."""

    def __init__(
        self,
        roles: Mapping[Key, Followed],
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
        self.fetch_ids: dict[int, Key] = {}  # the fetches in flight, by request id
        self.fetch_now: set[Key] = set()  # followers whose last fetch was answered (or link came back)
        self._fetch_more = False  # more of them were due than one pass sends
        # followers' fetches in flight: (due, seq, partition), one entry per role at a time (its
        # timer_due), so a lost fetch is sent again when its wait and FETCH_RETRY_MS are over
        self._timers: list[tuple[int, int, Key]] = []
        self._seq = 0
        # peers whose link is down (or not up yet), and the followers waiting for it to fetch
        self.links_down: dict[str, int] = {}  # peer -> since when (ms)
        self._awaiting_link: dict[str, set[Key]] = {}
        self._jitter = random.Random(node_id)

    def _fetch_of(self, key: Key | None) -> tuple[Followed, FollowerFetch] | None:
        role = self.roles.get(key) if key is not None else None
        if role is None or role.fetch is None:
            return None
        return role, role.fetch

    # ------------------------------------------------------------------ answers

    def on_answer(self, frames: list[Any]) -> tuple[Key, fr.Message, int] | None:
        """A leader's answer to one of our fetches: (partition, message, how long it took)
        when it applies to the role as it is now and was not a refusal; None otherwise."""
        try:
            msg = fr.decode(frames)
        except FabricError as exc:
            log.warning("bad reply from a leader: %s", exc)
            return None
        key = self.fetch_ids.pop(msg.header.request_id, None)
        found = self._fetch_of(key)
        if key is None or found is None or found[1].id != msg.header.request_id:
            return None  # an answer for a role we no longer have
        role, fetch = found
        if fetch.state is not FetchState.IN_FLIGHT or role.follower is None:
            return None
        now = self.clock()
        waited = now - fetch.sent_ms
        req = fetch.req
        self.fetch_now.add(key)
        if req is None or not role.follower.is_current(req):
            fetch.move(FetchEvent.ANSWERED)
            return None  # the log moved since this fetch went out: its answer no longer applies
        if msg.header.status == OffsetOutOfRange.code and type(msg.params.get("log_start_offset")) is int:
            # our copy ends below the leader's log start (purged or retained while we were away):
            # the replication starts it there, and the next fetch goes at once
            fetch.move(FetchEvent.ANSWERED)
            return key, msg, waited
        if msg.header.status:
            queue, p = key
            log.info("fetch of %s/%d from %s refused: %s", queue, p, role.record.leader, msg.params.get("message", ""))
            fetch.move(FetchEvent.REFUSED)
            fetch.retry_at_ms = now + FETCH_BACKOFF_MS
            self.hot.add(key)
            return None
        fetch.move(FetchEvent.ANSWERED)
        return key, msg, waited

    def after_answer(self, fetch: FollowerFetch, had_data: bool, waited: int) -> None:
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
            if fetch.had_data:
                fetch.wait_ms = max(FETCH_WAIT_MS, fetch.wait_ms // 2)
            fetch.had_data = True
        elif waited >= fetch.wait_ms:
            fetch.wait_ms = min(FETCH_WAIT_IDLE_MAX_MS, fetch.wait_ms * 2)
            fetch.had_data = False

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
            found = self._fetch_of(key)
            if found is not None and found[1].state is not FetchState.IN_FLIGHT:
                if found[1].may_send(now_ms):
                    self._send(key, found[0], found[1], now_ms)
                else:
                    self.fetch_now.add(key)

    def more_ready(self) -> bool:
        """More answered fetches were ready than the last pass sent: come back at once."""
        return self._fetch_more and bool(self.fetch_now)

    def fire_timers(self, now_ms: int, budget: int, visit: Callable[[Key, int], None]) -> None:
        """``visit`` the roles whose fetch timer ran out, ``budget`` at most."""
        timers = self._timers
        while timers and timers[0][0] <= now_ms and budget:
            budget -= 1
            due, _, key = heapq.heappop(timers)
            found = self._fetch_of(key)
            if found is not None and found[1].timer_due == due:
                found[1].timer_due = 0
                visit(key, now_ms)

    def visit(self, key: Key, role: Followed, now_ms: int) -> None:
        """One look at a follower: a fetch that timed out is forgotten and sent again, one whose
        back-off is over is sent; the role stays in the hot set while it backs off."""
        fetch = role.fetch
        assert fetch is not None
        if fetch.timed_out(now_ms):
            # no answer within the wait: the leader keeps an idle partition's fetch (or it was
            # lost), so the partition is idle: wait longer next time; forget this one
            self.fetch_ids.pop(fetch.id, None)
            fetch.move(FetchEvent.TIMED_OUT)
            fetch.wait_ms = min(FETCH_WAIT_IDLE_MAX_MS, fetch.wait_ms * 2)
            fetch.had_data = False
        if fetch.may_send(now_ms):
            self._send(key, role, fetch, now_ms)
        if fetch.state is FetchState.BACKING_OFF:
            self.hot.add(key)
        else:
            self.hot.discard(key)
            if fetch.state is FetchState.IN_FLIGHT:
                self._arm(key, fetch, fetch.sent_ms + fetch.sent_wait_ms + FETCH_RETRY_MS + 1)

    # ------------------------------------------------------------------ sending

    def _arm(self, key: Key, fetch: FollowerFetch, due: int) -> None:
        """A timer for a follower's fetch in flight; the earliest one of a role is kept (when it
        fires, ``visit`` arms the next if the fetch it found has not timed out)."""
        if fetch.timer_due and fetch.timer_due <= due:
            return
        fetch.timer_due = due
        self._seq += 1
        heapq.heappush(self._timers, (due, self._seq, key))

    def _send(self, key: Key, role: Followed, fetch: FollowerFetch, now_ms: int) -> None:
        """Send the role's next fetch (READY or AWAITING_LINK), or find the link down or the pipe
        full."""
        assert role.follower is not None and role.record.leader is not None
        leader = role.record.leader
        down_since = self.links_down.get(leader)
        if down_since is not None and now_ms - down_since < LINK_PROBE_MS:
            # sent when the link is up: not tried every 100 ms, and not into a pipe that libzmq
            # is about to drop (it reports the disconnect a moment before)
            fetch.move(FetchEvent.LINK_DOWN)
            self._awaiting_link.setdefault(leader, set()).add(key)
            return
        req = role.follower.next_fetch()
        rid = self.new_id()
        params = {
            "queue": key[0],
            "partition": key[1],
            "replica": self.node_id,
            "leader_epoch": req.leader_epoch,
            "fetch_offset": req.fetch_offset,
            "last_fetched_epoch": req.last_fetched_epoch,
            "max_bytes": FETCH_BYTES,
            "wait_ms": (wait := self._wait_for(fetch)),
            "delay_cursor": role.delay_cursor,
            "high_watermark": role.follower.high_watermark,
        }
        frames = fr.encode(fr.Header(Op.REPLICA_FETCH, rid), params)
        if not self.send_peer(leader, frames):
            if down_since is not None:
                fetch.move(FetchEvent.LINK_DOWN)
                self._awaiting_link.setdefault(leader, set()).add(key)
            else:
                fetch.move(FetchEvent.PIPE_FULL)
                fetch.retry_at_ms = now_ms + FETCH_BACKOFF_MS  # a full pipe: not in a hot loop
                self.hot.add(key)
        else:
            fetch.move(FetchEvent.SENT)
            fetch.sent_ms = now_ms
            fetch.sent_wait_ms = wait
            fetch.id = rid
            fetch.req = req
            self.fetch_ids[rid] = key
            self._arm(key, fetch, now_ms + wait + FETCH_RETRY_MS + 1)

    def _wait_for(self, fetch: FollowerFetch) -> int:
        """The fetch's wait at the leader; an idle one's is cut by up to a quarter at random, so
        that thousands of idle fetches parked at once (a message to each queue, a restart) do not
        all run out in the same second every FETCH_WAIT_IDLE_MAX_MS."""
        wait = fetch.wait_ms
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
                found = self._fetch_of(key)
                if found is not None and found[1].state is FetchState.AWAITING_LINK and found[0].record.leader == peer:
                    found[1].move(FetchEvent.LINK_UP)
                self.fetch_now.add(key)
            return
        self.links_down.setdefault(peer, self.clock())
        waiting = self._awaiting_link.setdefault(peer, set())
        for rid, key in list(self.fetch_ids.items()):
            found = self._fetch_of(key)
            if (
                found is not None
                and found[1].id == rid
                and found[1].state is FetchState.IN_FLIGHT
                and found[0].record.leader == peer
            ):
                del self.fetch_ids[rid]
                found[1].move(FetchEvent.LINK_DOWN)
                waiting.add(key)
