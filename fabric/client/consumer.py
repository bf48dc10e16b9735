"""The consumer: pushed batches under credit-based flow control, plus pull fetch.

Theory of operation
-------------------
A Consumer opens one push subscription to a queue (all partitions, or the ones
named) with a credit window. The node streams whole record batches as long as
credit lasts (and, with any credit left, at least the next whole batch); the
consumer gives credit back once the application has taken what it was handed, in
grants of a quarter of the window (:mod:`fabric.client.credit`), so the pipe
stays full without the server ever running far past it.

The consumer keeps a *position* per partition: the next offset it expects.
Records before it (the head of a batch that straddles the start, or anything
seen again after a re-subscribe) are skipped, so delivery is in order and without
repeats per partition. ``commit()`` stores, for the consumer group, the position
after the last record the application was *given*: everything ``poll()`` or
``poll_batch()`` returned, and for iteration each message as it is yielded (leave
a ``for`` loop early and the rest of that batch is neither committed nor lost: the
next poll or iteration hands it out). With ``auto_commit`` those positions are
committed every ``auto_commit_interval_ms`` and on close (at-least-once: a crash
repeats at most what was given since the last commit). ``commit()`` does not wait
for the node's reply (:mod:`fabric.client.commits`): the next push is not held
behind that round trip; a refusal is raised by the next ``commit()``.

Acks of queue subscriptions are asynchronous: they travel in batches of offset
ranges at most ``ack_interval_ms`` late. ``flush_acks()`` (or ``ack(..., wait=True)``)
waits until the node has recorded every ack sent so far, saved to disk, and raises
if any was refused, for workers that must not do an effect twice.

Liveness: the consumer sends HEARTBEAT every ``heartbeat_ms``; the reply lists
the subscriptions the node still holds for it. If ours is gone (the node
restarted, or the session expired) the consumer subscribes again from its
positions: nothing is lost and nothing is repeated. It does the same at once when
its link is lost (the node or router it uses died, or went silent for
``LINK_HEARTBEAT_MS``: ZeroMQ heartbeats, or the stream transport's keepalive), on
the endpoint the connection moves to, rather than waiting for a heartbeat's reply.
A federation queue that lives on another cluster is answered QUEUE_ELSEWHERE by a federated
router: the consumer moves to that cluster's routers and subscribes there, naming the cluster.
One split over several clusters makes it a :class:`~fabric.client.split_consumer.SplitConsumer`,
a consumer per cluster merged into one (``fabric/client/split_consumer.py``).

A consumer whose principal was revoked (``fabric auth revoke``) has its subscription
ended by the node: the PUSH event that says so, or a heartbeat refused, raises
NotAuthorized from poll.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from fabric import allocator
from fabric.client.acks import PendingAcks, change_visibility
from fabric.client.commits import PendingCommits
from fabric.client.credit import CreditDebt, chunk_records
from fabric.client.direct import DirectReceiver
from fabric.client.handles import make_handle
from fabric.client.hlc import CLOCK
from fabric.client.messages import (
    Message,
    ReceivedBatch,
    decode_leased,
    decode_pushed,
    fetched_messages,
    held_ranges,
    join_following,
    offset_spans,
    tail,
)
from fabric.client.seek import seek_target
from fabric.client.subscribe import request_subscribe
from fabric.errors import (
    BadParameter,
    ConnectionFailed,
    FabricError,
    NotAuthorized,
    QueueElsewhere,
    Timeout,
)
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from fabric.transport.connection import BaseConnection, connect, raise_for_status

log = logging.getLogger("fabric.consumer")
LINK_HEARTBEAT_MS = 1000  # a link silent this long is lost: re-subscribe (on the next endpoint, if given several)
LINK_CHECK_S = 0.05  # how often a waiting consumer looks whether its link was lost


class Consumer:
    def __init__(
        self,
        queue: str,
        endpoint: str | None = None,
        *,
        group: str | None = None,
        partitions: list[int] | None = None,
        start: str | int = "committed",
        offsets: dict[int, int] | None = None,
        credit_messages: int = 20_000,
        credit_bytes: int = 32 * 1024 * 1024,
        auto_commit: bool = True,
        auto_commit_interval_ms: int = 1000,
        heartbeat_ms: int = 3000,
        timeout_ms: int = 30_000,
        kind: str = "stream",
        session_timeout_ms: int = 10_000,
        visibility_ms: int | None = None,
        auto_ack: bool = False,
        ack_interval_ms: int = 10,
        direct_bind: str | None = None,
        cluster: str | None = None,
    ) -> None:
        """``cluster``: subscribe to that federation cluster's share of a split queue (the
        split consumer's inner consumers do); the partitions are that cluster's."""
        allocator.tune()
        if kind not in ("stream", "queue", "key_shared", "direct"):
            raise BadParameter(f"kind must be stream, queue, key_shared or direct, got {kind!r}")
        if kind not in ("stream", "direct") and group is None:
            raise BadParameter(f"a {kind!r} consumer needs a group")
        self.kind = kind
        self.shared = kind != "stream"
        # a stream group member whose partitions the node's coordinator assigns
        self.coordinated = kind == "stream" and group is not None and partitions is None and offsets is None
        self._session_timeout_ms = session_timeout_ms
        self.generation = 0
        self._visibility_ms = visibility_ms
        self.auto_ack = auto_ack  # at-most-once: settle each message as it is handed out
        self._acks = PendingAcks(ack_interval_ms / 1000)
        self._commits = PendingCommits()  # commit()'s COMMITs whose reply has not come yet
        if auto_commit and (group is None or self.shared):
            auto_commit = False
        self.queue = queue
        self.group = group
        self._cluster = cluster  # a federation cluster whose share this consumer reads (named in SUBSCRIBE)
        self._follows = cluster is None  # follows QUEUE_ELSEWHERE (a split consumer's inner ones do not)
        # what a split queue's consumer per cluster is made with (fabric/client/split_consumer.py)
        self._inner_settings: dict[str, Any] = dict(
            group=group,
            start=start,
            credit_messages=credit_messages,
            credit_bytes=credit_bytes,
            auto_commit=auto_commit,
            auto_commit_interval_ms=auto_commit_interval_ms,
            heartbeat_ms=heartbeat_ms,
            timeout_ms=timeout_ms,
            kind=kind,
            session_timeout_ms=session_timeout_ms,
            visibility_ms=visibility_ms,
            auto_ack=auto_ack,
            ack_interval_ms=ack_interval_ms,
        )
        # the start of this consumer's COMMIT params, {"queue":...,"group":... (see commit)
        self._commit_head = fr.encode_params({"queue": queue, "group": group})[:-1]
        self.auto_commit = auto_commit
        self._auto_commit_s = auto_commit_interval_ms / 1000
        self._heartbeat_s = heartbeat_ms / 1000
        self._window = (credit_messages, credit_bytes)
        self._conn = connect(endpoint, timeout_ms=timeout_ms, heartbeat_ms=LINK_HEARTBEAT_MS)
        self._link_gen = 0  # links lost before the current subscription was made
        self._next_link_check = 0.0
        self._timeout_ms = timeout_ms
        self._partitions = partitions
        self.positions: dict[int, int] = dict(offsets or {})  # explicit start per partition
        self._returned: dict[int, int] = {}  # positions after what poll() handed out
        self._committed: dict[int, int] = {}
        self._debt = CreditDebt(credit_messages, credit_bytes)  # credit the node spent on what we received
        self._held: deque[ReceivedBatch] = deque()
        # the batch that iteration is handing out one message at a time, and how far it got
        self._cur: ReceivedBatch | None = None
        self._cur_messages: list[Message] = []
        self._cur_i = 0
        self._sub = 0
        self._closed = False
        self._next_commit = time.monotonic() + self._auto_commit_s
        self._next_heartbeat = time.monotonic() + self._heartbeat_s
        self._heartbeat_rid = 0
        # a direct (brokerless) queue: producers send to this consumer's PULL socket (client/direct.py)
        self._direct: DirectReceiver | None = None
        self._direct_bind = direct_bind
        if kind == "direct":
            self._go_direct()
            return
        try:
            self._subscribe(start)
        except QueueElsewhere as exc:
            if not self._follows:
                raise
            self._follow(exc.details, start)
        except BadParameter as exc:
            if exc.details.get("mode") != "direct" or group is not None or partitions or offsets:
                raise
            self._go_direct()

    def _follow(self, details: dict[str, Any], start: str | int) -> None:
        """QUEUE_ELSEWHERE: subscribe through the routers of the cluster holding the queue, or,
        when it is split over several, become a SplitConsumer (a consumer per cluster)."""
        from fabric.client.split_consumer import SplitConsumer, placement_of

        placement = placement_of(details)
        if placement.split:
            self._conn.close()
            SplitConsumer.take_over(self, placement, self._partitions, self.positions)
            return
        cluster = placement.clusters[0]
        self._conn.close()
        self._conn = connect(placement.endpoint(cluster), timeout_ms=self._timeout_ms, heartbeat_ms=LINK_HEARTBEAT_MS)
        self._cluster = cluster
        self._subscribe(start)

    def _direct_request(self, op: Op, params: dict[str, Any]) -> dict[str, Any]:
        if op == Op.SUBSCRIBE:  # in a cluster, registered with the queue's coordinator
            return self._request_coordinator(params)
        return self._conn.request(op, params).params

    def _go_direct(self) -> None:
        self.kind, self.shared, self.coordinated, self.auto_commit = "direct", False, False, False
        self._direct = DirectReceiver(
            self.queue,
            self._direct_request,
            bind=self._direct_bind,
            heartbeat_s=self._heartbeat_s,
            session_timeout_ms=self._session_timeout_ms,
        )
        self._sub = self._direct.subscription

    # ------------------------------------------------------------------ subscription

    def _subscribe(self, start: str | int, *, replaces: int | None = None) -> None:
        params: dict[str, Any] = {
            "queue": self.queue,
            "group": self.group,
            "partitions": self._partitions,
            "start": start,
            "credit_messages": self._window[0],
            "credit_bytes": self._window[1],
            "kind": self.kind,
            "visibility_ms": self._visibility_ms,
            "session_timeout_ms": self._session_timeout_ms,
        }
        if self.positions and not self.shared and not self.coordinated:
            params["offsets"] = {str(p): off for p, off in self.positions.items()}
        if replaces:
            params["replaces"] = replaces
        if self._cluster is not None:
            params["cluster"] = self._cluster
        gen = self._conn.generation()
        reply = self._request_coordinator(params)
        self._link_gen = gen
        self._sub = reply["subscription"]
        self._debt.forget()
        self.generation = reply.get("generation", 0)
        if self.coordinated:
            self.positions.clear()
            self._returned.clear()
            self._held.clear()
            self._drop_current()
        for p, off in reply["partitions"].items():
            self.positions[int(p)] = off
            self._returned[int(p)] = off

    def _request_coordinator(self, params: dict[str, Any]) -> dict[str, Any]:
        """SUBSCRIBE, asked again until the group's coordinator answers (fabric/client/subscribe.py);
        this consumer's connection follows it when NOT_COORDINATOR moves it."""
        reply, self._conn = request_subscribe(
            self._conn,
            params,
            timeout_ms=self._timeout_ms,
            heartbeat_ms=LINK_HEARTBEAT_MS,
            group=self.group,
            queue=self.queue,
            moved=self._moved,
        )
        return reply

    def _moved(self, conn: BaseConnection) -> None:
        self._conn = conn

    @property
    def connected_to(self) -> str:
        """The endpoint this consumer's connection uses now (of a list of routers or nodes: one)."""
        return self._conn.current_endpoint()

    def receipt_handle(self, message: Message) -> str:
        """A queue subscription's handle for ``message``: after :meth:`close` with ``keep_leases``,
        anyone may settle it by ``Admin.settle(queue, group, [handle], ...)`` until its lease ends
        (as an SQS receipt handle)."""
        self._require_shared("receipt_handle")
        return make_handle(self._sub, message.partition, message.offset)

    def assignment(self) -> list[int]:
        """The partitions this consumer receives now."""
        return sorted(self.positions)

    def _on_assignment(self, params: dict[str, Any]) -> None:
        """The group coordinator moved partitions: take the new ones, give back the revoked ones."""
        self.generation = params.get("generation", self.generation)
        revoked = [p for p in params.get("revoked", []) if isinstance(p, int)]
        if revoked:
            # Drop what was not handed out yet, commit what was, then confirm.
            self._held = deque(b for b in self._held if b.partition not in revoked)
            if self._cur is not None and self._cur.partition in revoked:
                self._drop_current()
            done = {p: self._returned[p] for p in revoked if p in self._returned}
            if done and self.group:
                try:
                    self._conn.request(
                        Op.COMMIT,
                        {
                            "queue": self.queue,
                            "group": self.group,
                            "subscription": self._sub,
                            "offsets": {str(p): o for p, o in done.items()},
                        },
                    )
                    self._committed.update(done)
                except FabricError as exc:
                    log.warning("commit before giving back partitions %s failed: %s", revoked, exc.message)
            for p in revoked:
                self.positions.pop(p, None)
                self._returned.pop(p, None)
            self._conn.request(Op.REVOKED, {"subscription": self._sub, "partitions": revoked})
        for p, off in params.get("assigned", {}).items():
            self.positions[int(p)] = off
            self._returned[int(p)] = off

    def _return_credit(self, force: bool) -> None:
        grant = self._debt.due(force=force)
        if grant is None:
            return
        try:
            self._conn.send(
                Op.CREDIT,
                {"subscription": self._sub, "messages": grant[0], "bytes": grant[1]},
                flags=fr.FLAG_NO_REPLY,
                timeout_ms=0,
            )
        except ConnectionFailed:
            self._debt.received(*grant)  # still owed; a re-subscribe after reconnecting resets the window

    def _housekeeping(self, now: float) -> None:
        """Heartbeat, flush acks and auto-commit when due; ``now`` is time.monotonic()."""
        if now >= self._next_link_check:
            self._next_link_check = now + LINK_CHECK_S
            if self._conn.generation() != self._link_gen:
                self._resubscribe(f"the link to {self._conn.current_endpoint()} was lost")
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self._heartbeat_s
            try:
                self._heartbeat_rid = self._conn.send(Op.HEARTBEAT, {}, timeout_ms=0)
            except ConnectionFailed:
                pass
        if self._acks.pending and now >= self._acks.next_send:
            self._acks.send(self._conn, self._sub)
        if self.auto_commit and now >= self._next_commit:
            self._next_commit = now + self._auto_commit_s
            try:
                self._commit_async(self._returned)
            except ConnectionFailed:
                pass

    # ------------------------------------------------------------------ receiving

    def poll_batch(self, timeout_ms: int = 1000) -> ReceivedBatch | None:
        """The next batch of records, or None if none arrived within ``timeout_ms``: the next
        pushed batch joined with the records of its partition already received right after it,
        up to ``credit_messages`` records (no more than the node may have pushed unasked)."""
        return self._take_batch(timeout_ms, self._window[0])

    def _take_batch(self, timeout_ms: int, cap: int) -> ReceivedBatch | None:
        if self._cur is not None:  # what an iteration left of its batch comes first
            b: ReceivedBatch | None = tail(self._cur, self._cur_i)
            self._drop_current()
        else:
            b = self._next_batch(timeout_ms)
            if b is not None and not self.shared and self._direct is None:
                b = self._gather(b, cap)
                if self.coordinated and b.partition not in self.positions:
                    # an assignment picked up while gathering revoked its partition: it is another
                    # member's now, and the group's offsets say where that member starts
                    b = None
        if b is not None:
            self._given(b.partition, b.base_offset, b.base_offset + len(b.values))
        return b

    def _gather(self, b: ReceivedBatch, cap: int) -> ReceivedBatch:
        """``b`` joined with the records already received right after it in its partition (up
        to ``cap`` records in all). A consumer that falls behind (it commits after every poll,
        say) then gets what piled up in one poll instead of one pushed batch at a time, so its
        per-poll costs (a commit's round trip) shrink as its backlog grows, as Kafka's poll
        does: with batches of 2,500 records, a consumer that committed every one spent 80% of
        its time waiting for commits and fell behind its producer."""
        conn = self._conn
        n = len(b.values)
        # pick up what already arrived, without waiting for more (counted as it comes: held may be
        # thousands of one-record batches from a producer with linger_ms=0)
        have = n + sum(len(h.values) for h in self._held)
        while have < cap:
            msg = conn.events.popleft() if conn.events else conn.recv_buffered() or conn.recv_nowait()
            if msg is None:
                break
            held = self._held
            before = len(held)
            self._on_message(msg)
            if self._held is held:
                have += sum(len(held[-1 - i].values) for i in range(len(held) - before))
            else:  # an assignment revoked partitions: what is held was rebuilt without them
                have = n + sum(len(h.values) for h in self._held)
        held = self._held
        if not held:
            return b
        return join_following(b, held, cap)

    def _given(self, p: int, start: int, end: int) -> None:
        """Records [start, end) of partition ``p`` went to the application."""
        if self.shared:
            if self.auto_ack:
                self._acks.add(p, start, end)  # sent by the housekeeping's interval
        else:
            self._returned[p] = end

    def _drop_current(self) -> None:
        self._cur, self._cur_messages, self._cur_i = None, [], 0

    def _next_batch(self, timeout_ms: int) -> ReceivedBatch | None:
        """The next batch off the wire (not yet counted as given), or None after ``timeout_ms``."""
        if self._closed:
            raise FabricError("consumer is closed")
        if self._direct is not None:
            b = self._direct.next_batch(timeout_ms)
            if b is not None:
                self._sub = self._direct.subscription
            return b
        now = time.monotonic()
        deadline = now + timeout_ms / 1000
        conn = self._conn
        if self._held:
            # heartbeats, acks and commits go out while the application works through what it
            # holds too, or a busy consumer would look dead to the node (its session would expire)
            self._housekeeping(now)
        while not self._held:
            self._housekeeping(time.monotonic())
            # everything received was taken: pay what is owed before waiting (see fabric.client.credit)
            self._return_credit(force=False)
            msg = conn.events.popleft() if conn.events else conn.recv_buffered()
            if msg is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    msg = conn.recv_nowait()  # out of time: one last look, without waiting
                    if msg is None:
                        return None
                else:
                    wait = min(left, 0.1)
                    if self._acks.pending:
                        wait = min(wait, max(0.0, self._acks.next_send - time.monotonic()))
                    msg = conn.recv(max(1, int(wait * 1000)))
                    if msg is None:
                        continue
            self._on_message(msg)
        b = self._held.popleft()
        self._return_credit(force=False)
        return b

    def poll(self, timeout_ms: int = 1000) -> list[Message]:
        """The messages received so far, up to POLL_RECORDS_MAX: the next batch (waiting up to
        ``timeout_ms`` for one; empty if none came) and the batches already received behind it,
        of any partition, without waiting for more. A queue or key_shared member's pushes hold
        many short leased runs (a key_shared member's keys are interleaved with other members'),
        one batch each: one poll takes them all, not one run per call."""
        b = self._take_batch(timeout_ms, POLL_RECORDS_MAX)
        if b is None:
            return []
        out = b.messages()
        held = self._held
        if held and len(out) + len(held[0].values) <= POLL_RECORDS_MAX:
            while held and len(out) + len(held[0].values) <= POLL_RECORDS_MAX:
                nxt = held.popleft()
                self._given(nxt.partition, nxt.base_offset, nxt.base_offset + len(nxt.values))
                out += nxt.messages()
            self._return_credit(force=False)  # taken: the node may push more while the application works
        return out

    def __iter__(self) -> Iterator[Message]:
        """Messages one at a time; each counts as given (committed, auto-acked) as it is yielded."""
        while not self._closed:
            if self._cur is None:
                b = self._next_batch(1000)
                if b is None:
                    continue
                self._cur, self._cur_messages, self._cur_i = b, b.messages(), 0
            m = self._cur_messages[self._cur_i]
            self._cur_i += 1
            if self._cur_i == len(self._cur_messages):
                self._drop_current()
            self._given(m.partition, m.offset, m.offset + 1)
            yield m

    def _on_message(self, msg: fr.Message) -> None:
        h = msg.header
        if h.flags & fr.FLAG_EVENT and h.op == Op.PUSH:
            if h.request_id != self._sub:
                return  # a push for a subscription we have since replaced
            if h.status:  # the node ended the subscription (its principal was revoked): nothing more comes
                raise_for_status(msg)
            self._on_push(msg)
            return
        if h.op == Op.COMMIT and not self._commits.on_reply(msg) and h.status:
            log.warning("commit failed: %s", msg.params.get("message"))  # an auto-commit's
        if h.op == Op.ACK:
            self._acks.on_reply(msg)
        if h.op == Op.ASSIGNMENT and h.flags & fr.FLAG_EVENT:
            if h.request_id == self._sub:
                self._on_assignment(msg.params)
            return
        if h.request_id == self._heartbeat_rid and h.op == Op.HEARTBEAT and h.status == NotAuthorized.code:
            raise_for_status(msg)  # revoked: subscribing again would only be refused
        gone = self._sub not in msg.params.get("subscriptions", [])
        if h.request_id == self._heartbeat_rid and h.op == Op.HEARTBEAT and not h.status and gone:
            self._resubscribe("it is gone on the node")

    def _on_push(self, msg: fr.Message) -> None:
        """Records pushed to this subscription: decoded, held for the application, and counted
        as credit the node spent."""
        params = msg.params
        p = params.get("partition")
        spans = params.get("leases")
        # owe back what the node spent: every record of the whole batches it sent (or, leased,
        # every record of the spans), kept or skipped, and every byte
        data = msg.data
        nbytes = sum(map(len, data))
        owed = True  # what this push spent is still to be counted
        if spans is not None or not isinstance(p, int) or p < 0 or p not in self.positions:
            leased = sum(e - s for s, e, _ in spans) if spans is not None else sum(map(chunk_records, data))
            self._debt.received(leased, nbytes)
            owed = False
            if not isinstance(p, int) or p < 0:
                return
            if p not in self.positions:
                if self._partitions is not None or self.coordinated:
                    return  # not ours (a stream member's partitions come by ASSIGNMENT)
                self.positions[p] = 0  # a partition added to the queue since we subscribed (queue alter)
            if spans is not None:
                for chunk in data:
                    for b in decode_leased(self.queue, p, chunk, spans):
                        CLOCK.observe(b.timestamps[-1] if b.timestamps else b.first_timestamp_ms)
                        self._held.append(b)
                return
        # a stream's push: each chunk's headers walked once, for its records and its batches
        records = 0
        try:
            for chunk in data:
                batches, n = decode_pushed(self.queue, p, chunk, self.positions[p])
                records += n
                for b in batches:
                    CLOCK.observe(b.timestamps[-1] if b.timestamps else b.first_timestamp_ms)
                    self._held.append(b)
                    self.positions[p] = b.base_offset + len(b.values)
        finally:
            if owed:
                self._debt.received(records, nbytes)

    def _resubscribe(self, why: str) -> None:
        """Subscribe again from our positions, replacing the subscription we had."""
        log.info("subscription %d: %s; subscribing again from %s", self._sub, why, self.positions)
        if self._conn.generation() != self._commits.generation:
            self._commits.forget()  # sent on a link now lost: no reply will come
        if self.coordinated and self._returned:
            try:  # the group starts our partitions from here, whoever gets them
                self.commit(dict(self._returned))
            except FabricError as exc:
                log.warning("commit before re-joining failed: %s", exc.message)
        try:
            self._subscribe("committed", replaces=self._sub)
        except QueueElsewhere as exc:  # the queue moved to another cluster (fabric queue move): follow it
            if not self._follows:
                raise
            self._follow(exc.details, "committed")

    # ------------------------------------------------------------------ leases (queue subscriptions)

    @property
    def ack_errors(self) -> int:
        """Acks the node refused (their lease had expired): counted as their replies come back."""
        return self._acks.errors

    def ack(self, messages: Message | ReceivedBatch | list[Message], *, wait: bool = False) -> None:
        """Settle messages of a queue subscription. Asynchronous by default: acks travel in
        batches of offset ranges, at most ``ack_interval_ms`` late, and a refusal (the lease had
        expired and the message went to another member) is logged and counted in ``ack_errors``.
        ``wait=True`` is ``flush_acks()`` after it: returns once the node has saved them."""
        self._require_shared("ack")
        due = False
        for p, start, end in offset_spans(messages):
            due = self._acks.add(p, start, end)
        if wait:
            self.flush_acks()
        elif due:
            self._acks.send(self._conn, self._sub)

    def ack_offset(self, partition: int, offset: int) -> None:
        """Settle one message by its position (the cheapest per-message ack)."""
        if self._acks.add(partition, offset, offset + 1):
            self._acks.send(self._conn, self._sub)

    def nack(self, messages: Message | ReceivedBatch | list[Message], delay_ms: int = 0) -> int:
        """Give messages back for redelivery (to any member) after ``delay_ms``."""
        self._require_shared("nack")
        return self._acks.nack(self._conn, self._sub, messages, delay_ms)

    def change_visibility(self, messages: Message | ReceivedBatch | list[Message], visibility_ms: int) -> int:
        """Keep messages leased for ``visibility_ms`` more (0: redeliver at once)."""
        self._require_shared("change_visibility")
        return change_visibility(self._conn, self._sub, messages, visibility_ms)

    def flush_acks(self) -> None:
        """Send pending acks and wait until the node has recorded every ack this consumer sent,
        saved to disk (a crash of the node no longer redelivers them). Raises NotLeaseHolder if
        the node refused any of them since the last flush (their messages may be delivered again,
        to another member, or already were)."""
        self._require_shared("flush_acks")
        self._acks.send_and_wait(self._conn, self._sub, durable=True)

    def _require_shared(self, what: str) -> None:
        if not self.shared:
            raise BadParameter(f"{what} is for queue subscriptions; a stream consumer commits offsets")

    # ------------------------------------------------------------------ offsets

    def _commit_async(self, positions: dict[int, int]) -> None:
        todo = {str(p): off for p, off in positions.items() if self._committed.get(p) != off}
        if todo and self.group:
            params: dict[str, Any] = {"queue": self.queue, "group": self.group, "offsets": todo}
            if self.coordinated:
                params["subscription"] = self._sub
            self._conn.send(Op.COMMIT, params, timeout_ms=0)
            self._committed.update({int(p): off for p, off in todo.items()})

    def commit(self, offsets: dict[int, int] | None = None, *, wait: bool = False) -> None:
        """Store positions for the group (default: after everything poll() returned).

        Without ``offsets`` the COMMIT is sent and commit() returns without waiting for the
        node's reply (as confluent-kafka's ``commit()``; a consumer committing every poll would
        otherwise hold its next messages behind that round trip): a refusal is raised by the
        next commit() and logged by ``close()``, which waits for every reply; ``committed()`` on
        this consumer sees it (the node answers in order). With ``offsets``, or ``wait=True``, it
        waits for the reply and raises what the node refused (the commit is stored when it
        returns)."""
        if self.group is None:
            raise BadParameter("commit needs a consumer group")
        positions = dict(self._returned if offsets is None else offsets)
        if offsets is None and not wait:
            self._commits.make_room(self._conn, self._on_message, self._timeout_ms)
            sub = self._sub if self.coordinated else None
            self._commits.send(self._conn, self._commit_head, positions, sub)
        else:
            params: dict[str, Any] = {
                "queue": self.queue,
                "group": self.group,
                "offsets": {str(p): o for p, o in positions.items()},
            }
            self._conn.request(Op.COMMIT, params)
        self._committed.update(positions)

    def seek(self, partition: int, to: int | str, *, timestamp_ms: int | None = None) -> int:
        """Move a stream consumer's position in ``partition``: ``to`` is an offset, ``"earliest"``
        or ``"latest"``; or give ``timestamp_ms`` (``to="timestamp"``) for the first message at or
        after that time. Returns the offset; delivery resumes there (replay when it is behind).

        For consumers with a manual assignment or without a group. A member of a coordinated
        stream group resets the group's offsets instead (``Admin.reset_offsets`` /
        ``fabric group reset-offsets``, with the members stopped)."""
        if self.shared:
            raise BadParameter(f"a {self.kind!r} subscription settles by acks: it has no position to seek")
        if self.coordinated:
            raise BadParameter("a coordinated group member cannot seek; reset the group's offsets instead")
        if partition not in self.positions:
            raise BadParameter(f"this consumer does not receive partition {partition} of {self.queue!r}")
        at = seek_target(to, timestamp_ms)
        if at != -1:
            q = {"queue": self.queue, "partition": partition, "at": at}
            to = int(self._conn.request(Op.LIST_OFFSETS, q).params["offset"])
        assert isinstance(to, int)
        # a new subscription from the new positions: pushes already on their way for the old one
        # carry its id and are dropped on arrival
        old = self._sub
        self._held = deque(b for b in self._held if b.partition != partition)
        if self._cur is not None and self._cur.partition == partition:
            self._drop_current()
        self.positions[partition] = to
        self._returned[partition] = to
        self._conn.send(Op.UNSUBSCRIBE, {"subscription": old}, flags=fr.FLAG_NO_REPLY, timeout_ms=0)
        self._subscribe("committed")
        return self.positions[partition]

    def committed(self) -> dict[int, int]:
        if self.group is None:
            raise BadParameter("committed offsets belong to a consumer group")
        reply = self._conn.request(Op.COMMITTED, {"queue": self.queue, "group": self.group}).params
        return {int(p): o for p, o in reply["offsets"].items()}

    # ------------------------------------------------------------------ pull

    def fetch(self, partition: int, offset: int, *, max_bytes: int = 1 << 20, wait_ms: int = 0) -> list[Message]:
        """Pull records from ``offset`` on; long-polls up to ``wait_ms`` when none are there yet."""
        params = {
            "queue": self.queue,
            "partition": partition,
            "offset": offset,
            "max_bytes": max_bytes,
            "wait_ms": wait_ms,
        }
        reply = self._conn.request(Op.FETCH, params, timeout_ms=self._conn.timeout_ms + wait_ms)
        return fetched_messages(self.queue, partition, reply.data, offset)

    # ------------------------------------------------------------------ lifecycle

    def close(self, *, keep_leases: bool = False) -> None:
        """Leave: a queue subscription gives back what it received but never handed out, and,
        unless ``keep_leases`` (kind ``queue`` only), what it handed out and did not ack; with it,
        those stay leased until their visibility timeout, settled by receipt handle
        (:meth:`receipt_handle`, ``Admin.settle``)."""
        if keep_leases and self.kind != "queue":
            raise BadParameter(f"keep_leases is for a 'queue' subscription, not {self.kind!r}")
        if self._closed:
            return
        self._closed = True
        try:
            unseen = None
            if self.shared:
                self._acks.send_and_wait(self._conn, self._sub, durable=True)
                unseen = self._unseen()
            if self.auto_commit:
                self.commit(self._returned)
            self._commits.settle(self._conn, self._on_message, min(self._timeout_ms, 5000))
            if self._direct is not None:
                self._sub = self._direct.subscription
            params: dict[str, Any] = {"subscription": self._sub, "release": unseen}
            if keep_leases:
                params["keep_leases"] = True
            self._conn.request(Op.UNSUBSCRIBE, params, timeout_ms=2000)
            if keep_leases:
                self._give_back_late()
        except (FabricError, Timeout):
            pass
        finally:
            if self._direct is not None:
                self._direct.close()
            self._conn.close()

    def _give_back_late(self) -> None:
        """Leaving with ``keep_leases``: what the node pushed between our count of the unseen and
        its UNSUBSCRIBE (those pushes arrive before its reply) was never handed out either; give
        it back uncounted by receipt (SETTLE nack), so only what the application saw stays leased."""
        late = self._unseen()
        if late is not None and self.group is not None:
            settle = {"queue": self.queue, "group": self.group, "member": self._sub, "action": "nack"}
            self._conn.request(Op.SETTLE, {**settle, "ranges": late, "uncount": True}, timeout_ms=2000)

    def _unseen(self) -> dict[str, list[list[int]]] | None:
        """The leased ranges this consumer holds but never handed out (merged, at most RANGES_MAX):
        given back uncounted when it unsubscribes, so that a consumer closing is not a failed
        delivery toward the queue's max_receive_count."""
        while True:  # what has arrived already is held too
            msg = self._conn.events.popleft() if self._conn.events else self._conn.recv_nowait()
            if msg is None:
                break
            self._on_message(msg)
        if self._cur is not None:  # what an iteration left of its batch was never handed out either
            self._held.appendleft(tail(self._cur, self._cur_i))
            self._drop_current()
        out = held_ranges(self._held)
        self._held.clear()
        return out

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


POLL_RECORDS_MAX = 1000  # a poll returns up to this many records already received (poll_batch: contiguous ones)
