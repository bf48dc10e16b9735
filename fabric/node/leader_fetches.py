"""REPLICA_FETCH served by a partition's leader, and the fetches it parks.

Theory of operation
-------------------
A follower's fetch names the offset it wants and the epoch of its last batch; the pure
``LeaderReplica.on_fetch`` decides (an error for a stale epoch, a diverging point for a log
that went its own way, or where to read from) and learns the follower's log end, which may
move the high watermark. The answer carries the batches byte for byte as stored, up to the
leader's log end, plus the delayed rows past the follower's delay cursor.

A fetch with nothing to send (no data, no news of the high watermark, no delayed rows) is
*parked*, like a long-poll FETCH: by partition, so an append wakes only its own, with a due
time on a heap so that a pass costs what is due, not every parked fetch. A replica's newer
fetch replaces its older one. When its wait runs out a parked fetch with news is answered;
one with none stays parked, unanswered (an empty answer would only bring the same fetch back):
the follower sends a new one when its own timer runs out, and that replaces it.

Replicas outside the ISR (a move, a replica catching up) share the move throttle
(``catch_up``): over it, a fetch waits for tokens instead of reading.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from time import monotonic_ns
from typing import Any

from fabric.cluster.replica import FetchRequest
from fabric.errors import FabricError, OffsetOutOfRange
from fabric.histogram import Histogram
from fabric.node.follower_fetches import FETCH_RETRY_MS
from fabric.node.roles import Role
from fabric.node.throttle import TokenBucket
from fabric.protocol import frames as fr
from fabric.protocol.batch import whole_prefix
from fabric.store.store import Store

# a leader looks again at a parked fetch this long after its wait: later than the follower's newer
# fetch (wait + FETCH_RETRY_MS) that replaces it, so an idle fetch is handled once a round at the
# leader, not twice; the look stays as the net under a wake-up missed or a follower gone quiet
PARK_GRACE_MS = 5 * FETCH_RETRY_MS

Key = tuple[str, int]
Parked = tuple[int, bytes, fr.Header, Mapping[str, Any]]  # (due, client, header, params)
ReplyFn = Callable[[bytes, fr.Header, dict[str, Any], list[Any]], Any]
ErrorFn = Callable[[bytes, fr.Header, Sequence[Any], FabricError], Any]
# (queue, partition, role, the follower's delay cursor) -> (reply fields, row frames)
DelayRowsFn = Callable[[str, int, Role, int], tuple[dict[str, Any], list[bytes]]]


class LeaderFetches:
    """The fetches this node serves as leader: answered at once or parked until data comes."""

    def __init__(
        self,
        roles: dict[Key, Role],
        store: Store,
        clock: Callable[[], int],
        reply: ReplyFn,
        error: ErrorFn,
        check_leader: Callable[[str, int], None],
        delay_rows: DelayRowsFn,
        mark_hot: Callable[[Key], None],
        advance: Callable[[str, int, Role], None],
        round_trips: Histogram | None = None,
    ) -> None:
        self.roles = roles
        self.store = store
        self.clock = clock
        self.reply = reply
        self.error = error
        self.check_leader = check_leader
        self.delay_rows = delay_rows
        self.mark_hot = mark_hot
        self.advance = advance
        # a follower's round trip: from our answer with data to its next fetch of the partition
        # (its append, and the two hops); the answers still to be fetched past, by (partition, replica)
        self.round_trips = round_trips
        self._answered_ns: dict[tuple[Key, str], int] = {}
        # what this leader sends replicas outside the ISR (moves, a replica catching up), shared
        # by every partition it leads: [cluster] move_throttle_bytes_per_s (None: no limit)
        self.catch_up: TokenBucket | None = None
        # REPLICA_FETCHes waiting for data, by partition (an append wakes only its own), and the
        # earliest wait that runs out (the tick looks at them only from then on)
        self.parked: dict[Key, list[Parked]] = {}
        self.parked_due = 0
        self._due_heap: list[tuple[int, int, Key]] = []  # (due, seq, partition) of parked fetches
        self._due_seq = 0

    def handle(self, client: bytes, header: fr.Header, params: Mapping[str, Any]) -> bool:
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
        now = self.clock()
        if self.round_trips is not None:
            sent_ns = self._answered_ns.pop(((queue, p), req.replica), 0)
            if sent_ns:
                self.round_trips.observe((monotonic_ns() - sent_ns) / 1e9)
        decision = role.leader.on_fetch(req, now)
        self.mark_hot((queue, p))
        if decision.error is not None:
            err = decision.error
            raise err(
                f"{queue}/{p}: fetch in leader epoch {req.leader_epoch}, this leader is in {role.record.leader_epoch}"
            )
        self.advance(queue, p, role)
        plog = self.store.partition(queue, p)
        reply: dict[str, Any] = {
            "high_watermark": decision.high_watermark,
            "log_start_offset": plog.log_start_offset,
            "leader_epoch": role.record.leader_epoch,
            "diverging": list(decision.diverging) if decision.diverging is not None else None,
        }
        data = b""
        rows: list[bytes] = []
        if decision.diverging is None and decision.read_from is not None:
            delayed, rows = self.delay_rows(queue, p, role, params["delay_cursor"])
            reply.update(delayed)
            frm = decision.read_from
            if frm < plog.log_start_offset:
                raise OffsetOutOfRange(  # the follower starts its copy there (Replication._reset_copy)
                    f"{queue}/{p}: offset {frm} is below the leader's log start {plog.log_start_offset}",
                    log_start_offset=plog.log_start_offset,
                )
            upto = role.leader.log_end
            if frm < upto:
                max_bytes = params["max_bytes"]
                throttled = self.catch_up is not None and req.replica not in role.record.isr
                if throttled:
                    assert self.catch_up is not None
                    max_bytes = self.catch_up.allowance(max_bytes, self.clock())
                    if max_bytes <= 0 and params["wait_ms"] > 0:  # over the move throttle: wait for tokens
                        due = self.clock() + min(params["wait_ms"], self.catch_up.wait_ms())
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
            self._park(self.clock() + params["wait_ms"] + PARK_GRACE_MS, client, header, params)
            return False
        if data and self.round_trips is not None:
            self._answered_ns[((queue, p), req.replica)] = monotonic_ns()
        self.reply(client, header, reply, [data, *rows] if data or rows else [])
        return True

    def waiting_replicas(self, key: Key) -> Sequence[str]:
        """The replicas whose fetch of ``key`` is parked (they held the whole log until now)."""
        parked = self.parked.get(key)
        return [x[3]["replica"] for x in parked] if parked else ()

    def _park(self, due: int, client: bytes, header: fr.Header, params: Mapping[str, Any]) -> None:
        """Hold a fetch until ``due``; a replica's newer fetch of the partition replaces its older
        one (which it stopped waiting for)."""
        key = (params["queue"], params["partition"])
        entries = self.parked.get(key)
        if entries is None:
            self.parked[key] = [(due, client, header, params)]
        else:
            replica = params["replica"]
            entries[:] = [x for x in entries if x[3]["replica"] != replica]
            entries.append((due, client, header, params))
        self._due_seq += 1
        heapq.heappush(self._due_heap, (due, self._due_seq, key))
        self.parked_due = self._due_heap[0][0]

    def wake(self, queue: str, p: int) -> None:
        """New data in ``queue/p``: answer every fetch parked on it."""
        woken = self.parked.pop((queue, p), None)
        if woken:
            for _, client, header, params in woken:
                self._answer_parked(client, header, {**params, "wait_ms": 0})

    def wake_behind(self, key: Key, hw: int) -> None:
        """The high watermark moved: answer the parked fetches of followers that know an older
        one, so that what their consumers may read moves too (not a fetch wait later)."""
        entries = self.parked.get(key, [])
        behind = [x for x in entries if x[3].get("high_watermark") is not None and x[3]["high_watermark"] < hw]
        if not behind:
            return
        rest = [x for x in entries if x not in behind]
        if rest:
            self.parked[key] = rest
        else:
            del self.parked[key]
        for _, client, header, params in behind:
            self._answer_parked(client, header, {**params, "wait_ms": 0})

    def _answer_parked(self, client: bytes, header: fr.Header, params: Mapping[str, Any]) -> None:
        try:
            self.handle(client, header, params)
        except FabricError as exc:
            self.error(client, header, (), exc)

    def expire(self, now_ms: int) -> None:
        """Look again at the parked fetches whose wait ran out (the partitions are taken from a
        heap of due times, so a pass costs what is due, not every parked fetch). One with news
        is answered; one with none stays parked for another wait, unanswered: an empty answer
        would only bring the same fetch back, two messages per idle partition and follower a
        minute. The follower sends a new one when its own timer runs out, and it replaces this."""
        if not self.parked_due or now_ms < self.parked_due:
            return
        heap = self._due_heap
        while heap and heap[0][0] <= now_ms:
            _, _, key = heapq.heappop(heap)
            entries = self.parked.get(key)
            if not entries:
                continue  # woken by an append since
            due = [x for x in entries if x[0] <= now_ms]
            if not due:
                continue
            rest = [x for x in entries if x[0] > now_ms]
            if rest:
                self.parked[key] = rest
            else:
                del self.parked[key]
            for _, client, header, params in due:
                self._answer_parked(client, header, params)
        self.parked_due = heap[0][0] if heap else 0
