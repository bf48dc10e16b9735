"""The lease table of one key_shared (queue, group, partition): per-key order among parallel members.

Theory of operation
-------------------
A ``key_shared`` subscription is a ``queue`` subscription (:mod:`fabric.push.leases`:
leases of ``visibility_ms``, ack, nack with a delay, change_visibility, receive counts,
dead letters after ``max_receive_count``) with one more rule: **all messages with one
key go to one member at a time**, in offset order, so each key is processed in order
while many members work on different keys in parallel.

*Slots and owners* (:mod:`fabric.push.keyring`). A key hashes to one of ``SLOTS``
slots (:func:`slot_of`, stable across processes, machines and versions); keys that
share a slot share its order. A message without a key has no slot and goes to any
member, as in ``queue``. Each member puts ``virtual_points`` points on a consistent-hash
ring and owns the slots up to each of them, so a join takes, and a leave gives back,
only that member's arcs.

*Holders and hand-over.* A slot's holder is the one member holding leases on messages
of that slot. A member may take a slot's messages only when it owns the slot and no
other member holds it, so the new owner of a key never works while the old one may::

    slot        event                                              to
    free        the owner O takes a message                        held by O
    held by H   H's last lease of the slot is acked, nacked,       free
                expired or settled, or H leaves
    held by H   a join or leave moves the slot to O' != H          draining: H keeps its leases
                                                                   but gets no more, O' gets none
    draining    H's last lease of the slot goes                    free (O' starts at the oldest)

*Order.* A slot's messages are leased lowest offset first: its redeliverable messages
(nacked, expired, released) go before any newer one, and a message waiting out a nack
delay **blocks its slot** until it is delivered again (skipping it would break the
key's order; a consumer that wants to skip a message acks it and publishes it again).
Slots never block each other; keyless messages never block anything. The holder may
hold several messages of its slot at once (pipelining); handling them in the order
pushed is the consumer's part. Order is of deliveries: a message given back while its
holder still holds newer ones of its slot is delivered again after those, so a key's
acks follow offset order as long as none of its messages is given back. One deliver call merges everything the member may take,
lowest offsets first, into ranges of contiguous offsets with one receive count.

*Messages* move only along the rows of ``MESSAGE_TRANSITIONS`` (:mod:`fabric.push.keymessages`:
the table of offer, deliver, ack, nack, change_visibility, expiry, leave, take_dead,
return_dead and settle, and the illegal moves: :class:`NotLeaseHolder` *after* acting on
the offsets the member does hold, :class:`BadParameter`, :class:`UnknownMember`).

*Time* is a parameter: every method given ``now_ms`` first releases the leases whose
deadline is at or before it and ends the delays that passed, so a late ack finds its
lease gone; :meth:`next_deadline_ms` says when to call again.

*Data.* The caller reads batches from the log, decodes keys and ``offer``s them; there
is memory per offered, unsettled message only (``pending``; the caller bounds how far
ahead it offers, and ``max_pending`` refuses more). ``_msgs`` maps offset -> message;
the order of delivery lives in :class:`~fabric.push.keyslots.SlotQueues` (per slot a
heap and a deque, per member a heap of the slots it may take, all checked lazily), the
lease deadlines and delays in two :class:`~fabric.push.timers.TimerHeap`. Limits:
``max_pending`` messages, ``MEMBERS_MAX`` members, ``VIRTUAL_POINTS_MAX`` points each;
a join or leave costs O(slots with work).

*Restarts* (:mod:`fabric.push.keysnapshot`). A snapshot keeps the floor, the settled
offsets above it and the receive counts of delivered, unsettled offsets. A restored
table has no members and ``offered_upto == floor``: the caller offers again from there.
Offsets settled before they were offered (a purge) are kept as spans that
``offered_upto`` jumps over.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence

from fabric.errors import BadParameter, InternalError, NotLeaseHolder, UnknownMember
from fabric.push.keymessages import MESSAGE_TRANSITIONS, PUBLIC_STATES, Message, MessageEvent, MessageState
from fabric.push.keyring import SLOTS, mix32, ring_points, slot_of
from fabric.push.keyslots import NO_SLOT, SlotQueues
from fabric.push.keysnapshot import encode, read_floor, read_ranges
from fabric.push.keyverify import verify
from fabric.push.leases import (
    DELAY_MS_MAX,
    OFFSET_MAX,
    RECEIVE_COUNT_MAX,
    TAKE_DEAD_MAX,
    TIME_MS_MAX,
    VISIBILITY_MS_MAX,
    Delivery,
    check_int,
    check_member,
    check_range,
)
from fabric.push.ranges import RangeMap, RangeSet
from fabric.push.timers import TimerHeap

__all__ = ["MESSAGE_TRANSITIONS", "SLOTS", "KeySharedLeases", "MessageEvent", "MessageState", "ring_points", "slot_of"]

VIRTUAL_POINTS_MAX = 1024
MEMBERS_MAX = 10_000
PENDING_MAX = 100_000_000
UNOFFERED, NEW, LEASED, READY, DELAYED, DEAD, TAKEN, SETTLED = MessageState


class KeySharedLeases:
    """Leases of one (queue, group, partition) where each key goes to one member at a time, in order."""

    def __init__(
        self,
        floor: int,
        *,
        visibility_ms: int,
        max_receive_count: int,
        virtual_points: int = 64,
        max_pending: int = 1_000_000,
    ) -> None:
        self._floor = check_int("floor", floor, 0, OFFSET_MAX)
        self._offered_upto = floor
        self.visibility_ms = check_int("visibility_ms", visibility_ms, 1, VISIBILITY_MS_MAX)
        self.max_receive_count = check_int("max_receive_count", max_receive_count, 0, RECEIVE_COUNT_MAX)
        self.virtual_points = check_int("virtual_points", virtual_points, 1, VIRTUAL_POINTS_MAX)
        self.max_pending = check_int("max_pending", max_pending, 1, PENDING_MAX)
        self._msgs: dict[int, Message] = {}  # offered, unsettled
        self._count = dict.fromkeys(MessageState, 0)
        self._held: dict[str, set[int]] = {}  # member -> leased offsets
        self._delayed: set[int] = set()
        self._sq = SlotQueues(self._msgs, self._delayed, self.virtual_points)  # members, slots and their order
        self._dead: RangeMap[int] = RangeMap()  # rc; not reported yet
        self._taken: RangeMap[int] = RangeMap()  # rc; reported by take_dead, waiting for settle
        self._lease_timers = TimerHeap()
        self._delay_timers = TimerHeap()
        self._spans = RangeSet()  # settled without being offered, above the floor
        self._ahead: RangeMap[int] = RangeMap()  # rc of unoffered offsets, kept over a restart
        # the last ack handed a slot over to another member (its new owner on the ring, which
        # waited for the acking member to finish that key): the node wakes the group's members
        self.handed_over = False

    # -- positions and counts ----------------------------------------------------

    @property
    def floor(self) -> int:
        """Every offset below is settled: the committed offset to persist."""
        return self._floor

    @property
    def offered_upto(self) -> int:
        """The next offset to offer."""
        return self._offered_upto

    @property
    def pending(self) -> int:
        """Offered messages not settled yet, in any state."""
        return len(self._msgs)

    @property
    def in_flight(self) -> int:
        return self._count[LEASED]

    @property
    def redeliverable(self) -> int:
        """Messages given back (nack, expiry, departed member, restart), including those still delayed."""
        return self._count[READY] + self._count[DELAYED]

    @property
    def dead(self) -> int:
        """Dead messages not settled yet, reported by take_dead or not."""
        return self._count[DEAD] + self._count[TAKEN]

    def state(self, offset: int) -> str:
        """One of ``new``, ``leased``, ``redeliverable``, ``dead``, ``settled``, ``unoffered``."""
        check_int("offset", offset, 0, OFFSET_MAX)
        if offset < self._floor:
            return "settled"
        m = self._msgs.get(offset)
        if m is not None:
            return PUBLIC_STATES[m.state]
        return "settled" if offset < self._offered_upto or offset in self._spans else "unoffered"

    def holder(self, offset: int) -> str | None:
        m = self._msgs.get(offset)
        return m.member if m is not None else None

    def receive_count(self, offset: int) -> int:
        """Deliveries of an offered, unsettled message so far (0 otherwise)."""
        m = self._msgs.get(offset)
        return m.rc if m is not None else 0

    def held(self, member: str) -> int:
        return len(self._held.get(member, ()))

    def members(self) -> list[str]:
        return sorted(self._sq.queues)

    def owner(self, slot: int) -> str | None:
        """The member owning ``slot`` on the ring (None without members)."""
        return self._sq.ring.owner(check_int("slot", slot, 0, SLOTS - 1))

    def holder_of_slot(self, slot: int) -> str | None:
        """The member holding leases on messages of ``slot``, if any."""
        return self._sq.holder(check_int("slot", slot, 0, SLOTS - 1))

    # -- membership ------------------------------------------------------------------

    def join(self, member: str) -> None:
        """Add a member (a live member joining again changes nothing); it takes over its arcs of the ring."""
        if check_member(member) in self._sq.queues:
            return
        if len(self._sq.queues) >= MEMBERS_MAX:
            raise BadParameter(f"join of {member!r}: the group is full ({MEMBERS_MAX} members)")
        self._held[member] = set()
        self._sq.join(member)

    def leave(self, member: str, now_ms: int) -> int:
        """The member is gone: its leases are released at once (or dead); returns how many. 0 for a non-member."""
        check_member(member)
        self.expire(now_ms)
        if member not in self._sq.queues:
            return 0
        mine = sorted(self._held[member])
        for o in mine:
            self._release(o, self._msgs[o], MessageEvent.RELEASE, now_ms, now_ms)
        del self._held[member]
        self._sq.leave(member)
        return len(mine)

    # -- offers and delivery -----------------------------------------------------------

    def offer(self, records: Sequence[tuple[int, bytes | None]]) -> None:
        """Add ``(offset, key)`` records, offsets contiguous from ``offered_upto``; checked whole first."""
        start = self._offered_upto
        for i, item in enumerate(records):
            if not (isinstance(item, tuple) and len(item) == 2):
                raise BadParameter(f"record {i} is not an (offset, key) pair: {item!r}")
            o, key = item
            if type(o) is not int or o != start + i or o > OFFSET_MAX:
                raise BadParameter(f"record {i} has offset {o!r}; offers continue offered_upto {start} without gaps")
            if key is not None and not isinstance(key, bytes):
                raise BadParameter(f"record {o} has a key of type {type(key).__name__}, not bytes or None")
        if len(self._msgs) + len(records) > self.max_pending:
            raise BadParameter(f"offer of {len(records)} records: more than max_pending {self.max_pending} pending")
        end = start + len(records)
        msgs, count, push_new = self._msgs, self._count, self._sq.push_new
        spans = self._spans.overlaps(start, end)
        ahead = bool(self._ahead.intersect(start, end))
        touched: set[int] = set()
        for o, key in records:
            if spans and o in self._spans:
                continue  # settled before it was offered
            s = NO_SLOT if key is None else mix32(zlib.crc32(key)) >> 16
            rc = self._ahead.get(o) if ahead else None
            if rc is not None:
                m = msgs[o] = Message(s, UNOFFERED, rc)
                count[UNOFFERED] += 1
                self._release(o, m, MessageEvent.OFFER, 0, 0)
            else:
                msgs[o] = Message(s, NEW, 0)
                count[NEW] += 1
                if not push_new(o, s):
                    continue
            touched.add(s)
        self._offered_upto = end
        if ahead:
            self._ahead.pop(start, end)
        self._skip_spans()
        self._sq.touch_all(touched)
        self._advance_floor()

    def deliver(self, member: str, now_ms: int, max_records: int) -> list[Delivery]:
        """Lease to ``member`` at most ``max_records`` messages it may take now, lowest offsets first.

        Per slot that the member owns and nobody else holds: its oldest messages, up to the
        first one still delayed; and keyless messages, ready or new. Each :class:`Delivery`
        is a run of contiguous offsets with one receive count.
        """
        check_member(member)
        check_int("max_records", max_records, 0, OFFSET_MAX)
        if member not in self._sq.queues:
            raise UnknownMember(f"deliver to {member!r}: not a member of the group; join first")
        self.expire(now_ms)
        deadline = now_ms + self.visibility_ms
        got = self._sq.take(member, max_records)  # the slots' side of the leases is done
        if not got:
            return []
        for o in got:
            self._lease(member, o, deadline)
        self._lease_timers.push(deadline, got)
        self._lease_timers.compact(self.in_flight, self._live_leases)
        return self._runs(got, deadline)

    def _runs(self, offsets: list[int], deadline: int) -> list[Delivery]:
        msgs = self._msgs
        out: list[Delivery] = []
        start = prev = offsets[0]
        rc = msgs[start].rc
        for o in offsets[1:]:
            r = msgs[o].rc
            if o != prev + 1 or r != rc:
                out.append(Delivery(start, prev + 1, rc, deadline))
                start, rc = o, r
            prev = o
        out.append(Delivery(start, prev + 1, rc, deadline))
        return out

    # -- the member's moves --------------------------------------------------------

    def ack(self, member: str, start: int, end: int, now_ms: int) -> int:
        """Settle the messages of ``[start, end)`` leased to ``member``; returns how many."""
        mine, err = self._holdings("ack", member, start, end, now_ms)
        touched: set[int] = set()
        for o in mine:
            m = self._msgs.pop(o)
            self._unlease(o, m)
            self._step(o, m, MessageEvent.ACK, SETTLED)
            touched.add(m.slot)
        self.handed_over = self._sq.touch_all(touched, known=member)
        self._advance_floor()
        if err is not None:
            raise err
        return len(mine)

    def nack(self, member: str, start: int, end: int, now_ms: int, delay_ms: int = 0, *, uncount: bool = False) -> int:
        """Give back ``member``'s messages of ``[start, end)``: redeliverable at now + delay (blocking their slots).

        ``uncount``: the member never handed them to its application, so this delivery does not
        count toward max_receive_count (a message can be ready with a receive count of 0)."""
        check_int("delay_ms", delay_ms, 0, DELAY_MS_MAX)
        mine, err = self._holdings("nack", member, start, end, now_ms)
        if uncount:
            for o in mine:
                self._msgs[o].rc -= 1
        self._release_all(mine, MessageEvent.NACK, now_ms + delay_ms, now_ms)
        if err is not None:
            raise err
        return len(mine)

    def change_visibility(self, member: str, start: int, end: int, now_ms: int, visibility_ms: int) -> int:
        """Lease ``member``'s messages of ``[start, end)`` until now + visibility (0: give them back now)."""
        check_int("visibility_ms", visibility_ms, 0, VISIBILITY_MS_MAX)
        mine, err = self._holdings("change_visibility", member, start, end, now_ms)
        if visibility_ms == 0:
            self._release_all(mine, MessageEvent.VISIBILITY, now_ms, now_ms)
        elif mine:
            for o in mine:
                m = self._msgs[o]
                self._step(o, m, MessageEvent.VISIBILITY, LEASED)
                m.time_ms = now_ms + visibility_ms
            self._lease_timers.push(now_ms + visibility_ms, mine)
            self._lease_timers.compact(self.in_flight, self._live_leases)
        if err is not None:
            raise err
        return len(mine)

    def _holdings(
        self, verb: str, member: str, start: int, end: int, now_ms: int
    ) -> tuple[list[int], NotLeaseHolder | None]:
        """The member's leased offsets in the range, and the error for the first offset neither held nor settled."""
        check_member(member)
        check_range(start, end)
        self.expire(now_ms)
        mine: list[int] = []
        bad: int | None = None
        for o in self._pending_in(start, end):
            m = self._msgs[o]
            if m.state is LEASED and m.member == member:
                mine.append(o)
            elif bad is None:
                bad = o
        if bad is None and end > self._offered_upto:
            gap = self._spans.first_gap(max(start, self._offered_upto), end)
            bad = gap[0] if gap is not None else None
        if bad is None:
            return mine, None
        other = self._msgs.get(bad)
        what = self.state(bad)
        if other is not None and other.member is not None:
            what = f"leased to {other.member!r}"
        elif what in ("new", "unoffered"):
            what = "never delivered" if what == "new" else "not offered yet"
        return mine, NotLeaseHolder(f"{verb} of offset {bad} by {member!r}: it is {what}, not leased to {member!r}")

    def _pending_in(self, start: int, end: int) -> list[int]:
        """Offered, unsettled offsets of ``[start, end)`` in order: O(min(range, pending))."""
        s, e = max(start, self._floor), min(end, self._offered_upto)
        if s >= e:
            return []
        msgs = self._msgs
        if e - s <= 2 * len(msgs):
            return [o for o in range(s, e) if o in msgs]
        return sorted(o for o in msgs if s <= o < e)

    # -- time ----------------------------------------------------------------------

    def expire(self, now_ms: int) -> int:
        """Leases with deadline <= now are released; delays that passed end. Returns how many leases."""
        check_int("now_ms", now_ms, 0, TIME_MS_MAX)
        msgs = self._msgs
        n = 0
        touched: set[int] = set()
        for t, o in self._lease_timers.due(now_ms):
            m = msgs.get(o)
            if m is not None and m.state is LEASED and m.time_ms == t:
                self._release(o, m, MessageEvent.RELEASE, now_ms, now_ms)
                touched.add(m.slot)
                n += 1
        for t, o in self._delay_timers.due(now_ms):
            m = msgs.get(o)
            if m is not None and m.state is DELAYED and m.time_ms == t:
                self._step(o, m, MessageEvent.DUE, READY)
                self._delayed.discard(o)
                if m.slot == NO_SLOT:  # a keyed one waits in its slot's heap already
                    self._sq.push_released(o, NO_SLOT, True)
                touched.add(m.slot)
        self._sq.touch_all(touched)
        return n

    def next_deadline_ms(self) -> int | None:
        """The earliest lease deadline or end of a delay: when to call again with now_ms."""
        msgs = self._msgs

        def live(state: MessageState) -> Callable[[int, int], bool]:
            return lambda o, t: (m := msgs.get(o)) is not None and m.state is state and m.time_ms == t

        times = [self._lease_timers.top(live(LEASED)), self._delay_timers.top(live(DELAYED))]
        return min((t for t in times if t is not None), default=None)

    # -- dead letters and settling -------------------------------------------------

    def take_dead(self, now_ms: int, limit: int = TAKE_DEAD_MAX) -> list[tuple[int, int, int]]:
        """Dead ranges ``(start, end, receive_count)`` not reported before, lowest first, at most ``limit``.

        The caller copies them to the dead-letter queue, then calls :meth:`settle` (or
        :meth:`return_dead` if the copy failed, to have them reported again).
        """
        check_int("limit", limit, 1, TAKE_DEAD_MAX)
        self.expire(now_ms)
        out: list[tuple[int, int, int]] = []
        while len(out) < limit:
            first = self._dead.first()
            if first is None:
                break
            start, end, rc = first
            self._dead.pop(start, end)
            self._taken.set(start, end, rc)
            for o in range(start, end):
                self._step(o, self._msgs[o], MessageEvent.TAKE, TAKEN)
            out.append(first)
        return out

    def return_dead(self, start: int, end: int) -> int:
        """Dead messages of ``[start, end)`` reported by take_dead are reported again; returns how many."""
        check_range(start, end)
        parts = self._taken.pop(start, end)
        for s, e, rc in parts:
            self._dead.set(s, e, rc)
            for o in range(s, e):
                self._step(o, self._msgs[o], MessageEvent.RETURN, DEAD)
        return sum(e - s for s, e, _ in parts)

    def settle(self, start: int, end: int) -> int:
        """Settle ``[start, end)`` whatever its state (dead-lettered, expired by TTL, purged).

        Returns how many offsets were not settled before. Offsets not offered yet are
        remembered: they come back settled when offered (``offered_upto`` skips them).
        """
        check_range(start, end)
        start = max(start, self._floor)
        if start >= end:
            return 0
        touched: set[int] = set()
        pending = self._pending_in(start, end)
        for o in pending:
            m = self._msgs.pop(o)
            if m.state is LEASED:
                self._unlease(o, m)
            elif m.state is DELAYED:
                self._delayed.discard(o)
            self._step(o, m, MessageEvent.SETTLE, SETTLED)
            touched.add(m.slot)
        if start < self._offered_upto:
            self._dead.pop(start, min(end, self._offered_upto))
            self._taken.pop(start, min(end, self._offered_upto))
        n = len(pending)
        if end > self._offered_upto:
            lo = max(start, self._offered_upto)
            n += self._spans.add(lo, end)
            self._ahead.pop(lo, end)
            self._skip_spans()
        self._sq.touch_all(touched)
        self._advance_floor()
        return n

    # -- internals: messages -------------------------------------------------------

    def _step(self, o: int, m: Message, event: MessageEvent, to: MessageState) -> None:
        """Apply one row of MESSAGE_TRANSITIONS, or InternalError naming the state and the event."""
        if to not in MESSAGE_TRANSITIONS.get((m.state, event), ()):
            raise InternalError(f"offset {o}: illegal event {event.value!r} in state {m.state.value!r} to {to.value!r}")
        self._count[m.state] -= 1
        if to is not SETTLED:  # a settled message is forgotten
            self._count[to] += 1
        m.state = to

    def _lease(self, member: str, o: int, deadline: int) -> None:
        m = self._msgs[o]
        self._step(o, m, MessageEvent.DELIVER, LEASED)
        m.rc += 1
        m.member = member
        m.time_ms = deadline
        self._held[member].add(o)

    def _unlease(self, o: int, m: Message) -> None:
        if m.member is None:
            raise InternalError(f"offset {o}: unlease of a message in state {m.state.value!r}")
        self._held[m.member].discard(o)
        m.member = None
        self._sq.unlease(m.slot)

    def _release(self, o: int, m: Message, event: MessageEvent, not_before: int, now_ms: int) -> None:
        """A lease ends unacked (or a restored count is offered): dead if another delivery would pass max,
        else ready, or delayed until ``not_before``. The caller touches the slot and pushes delay timers."""
        if m.state is LEASED:
            self._unlease(o, m)
        if 0 < self.max_receive_count <= m.rc:
            self._step(o, m, event, DEAD)
            self._dead.set(o, o + 1, m.rc)
            return
        self._step(o, m, event, READY if not_before <= now_ms else DELAYED)
        if m.state is DELAYED:
            m.time_ms = not_before
            self._delayed.add(o)
        self._sq.push_released(o, m.slot, m.state is READY)

    def _release_all(self, offsets: list[int], event: MessageEvent, not_before: int, now_ms: int) -> None:
        touched: set[int] = set()
        delayed: list[int] = []
        for o in offsets:
            m = self._msgs[o]
            self._release(o, m, event, not_before, now_ms)
            touched.add(m.slot)
            if m.state is DELAYED:
                delayed.append(o)
        if delayed:
            self._delay_timers.push(not_before, delayed)
            self._delay_timers.compact(len(self._delayed), self._live_delays)
        self._sq.touch_all(touched)

    def _live_leases(self) -> Iterator[tuple[int, int]]:
        for offsets in self._held.values():
            for o in offsets:
                yield self._msgs[o].time_ms, o

    def _live_delays(self) -> Iterator[tuple[int, int]]:
        for o in self._delayed:
            yield self._msgs[o].time_ms, o

    def _skip_spans(self) -> None:
        span = self._spans.span_at(self._offered_upto)
        if span is not None:
            self._offered_upto = span[1]

    def _advance_floor(self) -> None:
        """Move the floor over settled offsets (one at a time, or a settled span at once)."""
        f, upto, msgs, spans = self._floor, self._offered_upto, self._msgs, self._spans
        if not msgs:
            f = upto
        while f < upto and f not in msgs:
            span = spans.span_at(f) if len(spans) else None
            f = span[1] if span is not None else f + 1
        self._floor = f
        first = spans.first()
        if first is not None and first < f:
            spans.remove(first, f)

    # -- persistence -----------------------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        """JSON-able state to survive a restart: the floor, settled offsets above it, receive counts."""
        msgs = self._msgs
        rcs = ((o, msgs[o].rc) for o in sorted(msgs))
        return encode(self._floor, self._offered_upto, rcs, self._spans, self._ahead)

    @classmethod
    def restore(
        cls,
        snapshot: Mapping[str, object],
        *,
        visibility_ms: int,
        max_receive_count: int,
        virtual_points: int = 64,
        max_pending: int = 1_000_000,
    ) -> KeySharedLeases:
        """The table after a restart, with no members and ``offered_upto == floor``: offered again,
        settled offsets stay settled and delivered ones come back released with their receive count."""
        floor = read_floor(snapshot)
        table = cls(
            floor,
            visibility_ms=visibility_ms,
            max_receive_count=max_receive_count,
            virtual_points=virtual_points,
            max_pending=max_pending,
        )
        table._spans, table._ahead = read_ranges(snapshot, floor)
        return table

    def verify(self) -> None:
        """Check every invariant of the table (O(pending), for tests): raises InternalError when one breaks."""
        verify(self)
