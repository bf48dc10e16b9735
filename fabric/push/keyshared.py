"""The lease table of one key_shared (queue, group, partition): per-key order among parallel members.

Theory of operation
-------------------
A ``key_shared`` subscription is a ``queue`` subscription (:mod:`fabric.push.leases`:
leases of ``visibility_ms``, ack, nack with a delay, change_visibility, receive counts,
dead letters after ``max_receive_count``) with one more rule: **all messages with one
key go to one member at a time**, in offset order, so each key is processed in order
while many members work on different keys in parallel.

*Slots.* A key hashes to one of ``SLOTS`` slots (:func:`slot_of`: the CRC-32 of the key
bytes through MurmurHash3's 32-bit finalizer, top 16 bits; stable across processes,
machines and versions, unlike Python's salted ``hash``). Keys that share a slot share
its order. A message without a key has no slot and goes to any member, as in ``queue``.

*Owners.* Each member puts ``virtual_points`` points on the ring 0..65535
(:func:`ring_points`, the same hash over the member id and the point's index); a slot
belongs to the member with the first point at or after it (wrapping around; equal
points rank by member id). A join takes, and a leave gives back, only that member's arcs.

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

Messages (``max`` is max_receive_count; "released" means ready, or dead when
0 < max <= rc; :meth:`state` reports ready and delayed as ``redeliverable``, taken as
``dead``)::

    from        event                                       to
    unoffered   offer                                       new; released with its rc kept over a
                                                            restart; settled if settled before
    new, ready  deliver (the oldest waiting of its slot;    leased, rc + 1
                keyless: any)
    leased      ack by the holder                           settled
    leased      nack by the holder, delay d                 released; delayed until now + d if d > 0
    leased      change_visibility by the holder, v > 0      leased until now + v
    leased      change_visibility v == 0; deadline <= now;  released (ready at once)
                the holder leaves
    delayed     due: not_before <= now                      ready
    dead        take_dead                                   taken (reported once)
    taken       return_dead                                 dead (reported again)
    any         settle                                      settled
    unsettled   snapshot, restore                           unoffered, rc kept (see Restarts)

Illegal moves, as :class:`~fabric.push.leases.PartitionLeases`: an ack, nack or
change_visibility ignores settled offsets and raises :class:`NotLeaseHolder`, naming
the first offset of the range neither settled nor leased to the member and its state,
*after* acting on the offsets the member does hold. A negative offset, start > end, a
time, limit or key out of range, offers that do not continue ``offered_upto`` or a bad
snapshot raise :class:`BadParameter`; a deliver to a non-member :class:`UnknownMember`.
A move that ``MESSAGE_TRANSITIONS`` does not list is a bug here: :class:`InternalError`.

*Time* is a parameter: every method given ``now_ms`` first releases the leases whose
deadline is at or before it and ends the delays that passed, so a late ack finds its
lease gone; :meth:`next_deadline_ms` says when to call again.

*Data.* The caller reads batches from the log, decodes keys and ``offer``s them; there
is memory per offered, unsettled message only (``pending``; the caller bounds how far
ahead it offers, and ``max_pending`` refuses more). ``_msgs`` maps offset -> message;
per slot with work, a heap of released offsets and a deque of new ones (settled ones
are skipped lazily); per member a heap of ``(oldest offset, slot)`` of the slots it may
take, pushed whenever a slot's oldest message, readiness or taker changes and checked
lazily, so a deliver touches only that member's slots; keyless messages have one heap
and one deque. Timers are heaps of ``(time, seq, offsets)``, one entry per call, checked
lazily and rebuilt when stale offsets outnumber live ones. Limits: ``max_pending``
messages, ``MEMBERS_MAX`` members, ``VIRTUAL_POINTS_MAX`` points each; a join or leave
costs O(slots with work).

*Restarts.* A snapshot keeps the floor, the settled offsets above it and the receive
counts of delivered, unsettled offsets; not keys, leases or new offsets. A restored
table has no members and ``offered_upto == floor``: the caller offers again from there,
and each offset comes back settled, released with its receive count (ready at once, or
dead), or new. Settling offsets not offered yet (a purge) keeps them as settled spans;
``offered_upto`` jumps over a span that starts at it, so the caller, which reads from
``offered_upto`` for every offer, never reads them (an offer may still carry some inside
a batch: they stay settled).
"""

from __future__ import annotations

import enum
import heapq
import zlib
from bisect import bisect_left
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from fabric.errors import BadParameter, InternalError, NotLeaseHolder, UnknownMember
from fabric.push.leases import (
    DELAY_MS_MAX,
    MEMBER_CHARS_MAX,
    OFFSET_MAX,
    RECEIVE_COUNT_MAX,
    TAKE_DEAD_MAX,
    TIME_MS_MAX,
    VISIBILITY_MS_MAX,
    Delivery,
)
from fabric.push.ranges import RangeMap, RangeSet

SLOTS = 65536
NO_SLOT = -1  # a keyless message
VIRTUAL_POINTS_MAX = 1024
MEMBERS_MAX = 10_000
PENDING_MAX = 100_000_000
SNAPSHOT_VERSION = 1


class MessageState(enum.StrEnum):
    UNOFFERED = "unoffered"
    NEW = "new"
    LEASED = "leased"
    READY = "ready"
    DELAYED = "delayed"
    DEAD = "dead"
    TAKEN = "taken"
    SETTLED = "settled"


class MessageEvent(enum.StrEnum):
    OFFER = "offer"
    DELIVER = "deliver"
    ACK = "ack"
    NACK = "nack"
    VISIBILITY = "change_visibility"
    RELEASE = "release"  # lease deadline passed, or the holder left
    DUE = "due"
    TAKE = "take_dead"
    RETURN = "return_dead"
    SETTLE = "settle"


UNOFFERED, NEW, LEASED, READY, DELAYED, DEAD, TAKEN, SETTLED = MessageState
_RELEASED = frozenset({READY, DEAD})
MESSAGE_TRANSITIONS: dict[tuple[MessageState, MessageEvent], frozenset[MessageState]] = {
    (UNOFFERED, MessageEvent.OFFER): frozenset({NEW, READY, DEAD, SETTLED}),
    (NEW, MessageEvent.DELIVER): frozenset({LEASED}),
    (READY, MessageEvent.DELIVER): frozenset({LEASED}),
    (LEASED, MessageEvent.ACK): frozenset({SETTLED}),
    (LEASED, MessageEvent.NACK): frozenset({READY, DELAYED, DEAD}),
    (LEASED, MessageEvent.VISIBILITY): frozenset({LEASED, READY, DEAD}),
    (LEASED, MessageEvent.RELEASE): _RELEASED,
    (DELAYED, MessageEvent.DUE): frozenset({READY}),
    (DEAD, MessageEvent.TAKE): frozenset({TAKEN}),
    (TAKEN, MessageEvent.RETURN): frozenset({DEAD}),
    **{(s, MessageEvent.SETTLE): frozenset({SETTLED}) for s in (NEW, LEASED, READY, DELAYED, DEAD, TAKEN)},
}
_PUBLIC = {NEW: "new", LEASED: "leased", READY: "redeliverable", DELAYED: "redeliverable", DEAD: "dead", TAKEN: "dead"}


def _mix32(h: int) -> int:
    """MurmurHash3's 32-bit finalizer: every input bit flips each output bit with probability ~1/2."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def slot_of(key: bytes | None) -> int | None:
    """The slot of a message key: ``mix32(crc32(key)) >> 16`` in 0..65535; None for no key."""
    if key is None:
        return None
    if not isinstance(key, bytes):
        raise BadParameter(f"a key must be bytes or None, got {type(key).__name__}")
    return _mix32(zlib.crc32(key)) >> 16


def ring_points(member: str, virtual_points: int) -> list[int]:
    """The ring positions of a member: ``mix32(crc32(member_utf8 + index as 4 bytes big-endian)) >> 16``."""
    seed = zlib.crc32(member.encode("utf-8", "surrogatepass"))
    return [_mix32(zlib.crc32(i.to_bytes(4, "big"), seed)) >> 16 for i in range(virtual_points)]


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise BadParameter(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
    return value


def _check_member(member: object) -> str:
    if not isinstance(member, str) or not 0 < len(member) <= MEMBER_CHARS_MAX:
        raise BadParameter(f"member must be a string of 1..{MEMBER_CHARS_MAX} characters, got {member!r}")
    return member


def _check_range(start: int, end: int) -> None:
    if _check_int("start", start, 0, OFFSET_MAX) > _check_int("end", end, 0, OFFSET_MAX):
        raise BadParameter(f"range [{start}, {end}) has start > end")


@dataclass(slots=True)
class _Msg:
    slot: int  # NO_SLOT without a key
    state: MessageState
    rc: int  # deliveries so far
    member: str | None = None  # the holder while leased
    time_ms: int = 0  # the lease deadline while leased, not_before while delayed


@dataclass(slots=True)
class _Slot:
    redo: list[int] = field(default_factory=list)  # heap: released (ready or delayed) offsets
    fresh: deque[int] = field(default_factory=deque)  # never delivered, ascending
    leased: int = 0
    holder: str | None = None


class _Timers:
    """A heap of ``(time_ms, seq, offsets)``, one entry per call; offsets that moved on are skipped lazily."""

    __slots__ = ("heap", "refs", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, list[int]]] = []
        self.refs = 0  # offsets referenced by the heap, live or stale
        self.seq = 0

    def push(self, time_ms: int, offsets: list[int]) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time_ms, self.seq, offsets))
        self.refs += len(offsets)

    def due(self, now_ms: int) -> Iterator[tuple[int, int]]:
        """Pops the entries whose time has come: ``(time, offset)`` pairs, each to be checked by the caller."""
        heap = self.heap
        while heap and heap[0][0] <= now_ms:
            t, _, offsets = heapq.heappop(heap)
            self.refs -= len(offsets)
            for o in offsets:
                yield t, o

    def top(self, live: Callable[[int, int], bool]) -> int | None:
        """The earliest time with a live offset; stale offsets and entries on top are dropped."""
        heap = self.heap
        while heap:
            t, _, offsets = heap[0]
            i = 0
            while i < len(offsets) and not live(offsets[i], t):
                i += 1
            if i:
                del offsets[:i]
                self.refs -= i
            if offsets:
                return t
            heapq.heappop(heap)
        return None

    def compact(self, live_count: int, live: Callable[[], Iterable[tuple[int, int]]]) -> None:
        """Rebuild from the live ``(time, offset)`` pairs when stale offsets outnumber them."""
        if self.refs <= 2 * live_count + 1024:
            return
        by_time: dict[int, list[int]] = defaultdict(list)
        for t, o in live():
            by_time[t].append(o)
        self.heap = []
        self.refs = 0
        for t, offsets in by_time.items():
            self.seq += 1
            self.heap.append((t, self.seq, sorted(offsets)))
            self.refs += len(offsets)
        heapq.heapify(self.heap)


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
        self._floor = _check_int("floor", floor, 0, OFFSET_MAX)
        self._offered_upto = floor
        self.visibility_ms = _check_int("visibility_ms", visibility_ms, 1, VISIBILITY_MS_MAX)
        self.max_receive_count = _check_int("max_receive_count", max_receive_count, 0, RECEIVE_COUNT_MAX)
        self.virtual_points = _check_int("virtual_points", virtual_points, 1, VIRTUAL_POINTS_MAX)
        self.max_pending = _check_int("max_pending", max_pending, 1, PENDING_MAX)
        self._msgs: dict[int, _Msg] = {}  # offered, unsettled
        self._count = dict.fromkeys(MessageState, 0)
        self._slots: dict[int, _Slot] = {}  # slots with new, released or leased messages
        self._free_ready: list[int] = []  # heap: keyless ready offsets
        self._free_fresh: deque[int] = deque()  # keyless new offsets
        self._queues: dict[str, list[tuple[int, int]]] = {}  # member -> heap of (oldest offset, slot) it may take
        self._held: dict[str, set[int]] = {}  # member -> leased offsets
        self._ring: list[tuple[int, str]] = []  # (point, member), sorted
        self._points: list[int] = []  # the points of the ring, for bisect
        self._delayed: set[int] = set()
        self._dead: RangeMap[int] = RangeMap()  # rc; not reported yet
        self._taken: RangeMap[int] = RangeMap()  # rc; reported by take_dead, waiting for settle
        self._lease_timers = _Timers()
        self._delay_timers = _Timers()
        self._spans = RangeSet()  # settled without being offered, above the floor
        self._ahead: RangeMap[int] = RangeMap()  # rc of unoffered offsets, kept over a restart

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
        _check_int("offset", offset, 0, OFFSET_MAX)
        if offset < self._floor:
            return "settled"
        m = self._msgs.get(offset)
        if m is not None:
            return _PUBLIC[m.state]
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
        return sorted(self._queues)

    def owner(self, slot: int) -> str | None:
        """The member owning ``slot`` on the ring (None without members)."""
        return self._owner(_check_int("slot", slot, 0, SLOTS - 1))

    def holder_of_slot(self, slot: int) -> str | None:
        """The member holding leases on messages of ``slot``, if any."""
        sl = self._slots.get(_check_int("slot", slot, 0, SLOTS - 1))
        return sl.holder if sl is not None else None

    # -- membership ------------------------------------------------------------------

    def join(self, member: str) -> None:
        """Add a member (a live member joining again changes nothing); it takes over its arcs of the ring."""
        if _check_member(member) in self._queues:
            return
        if len(self._queues) >= MEMBERS_MAX:
            raise BadParameter(f"join of {member!r}: the group is full ({MEMBERS_MAX} members)")
        self._queues[member] = []
        self._held[member] = set()
        self._rebuild_ring(sorted(self._ring + [(p, member) for p in ring_points(member, self.virtual_points)]))

    def leave(self, member: str, now_ms: int) -> int:
        """The member is gone: its leases are released at once (or dead); returns how many. 0 for a non-member."""
        _check_member(member)
        self.expire(now_ms)
        if member not in self._queues:
            return 0
        mine = sorted(self._held[member])
        for o in mine:
            self._release(o, self._msgs[o], MessageEvent.RELEASE, now_ms, now_ms)
        del self._queues[member], self._held[member]
        self._rebuild_ring([pm for pm in self._ring if pm[1] != member])
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
        msgs, slots, count = self._msgs, self._slots, self._count
        spans = self._spans.overlaps(start, end)
        ahead = bool(self._ahead.intersect(start, end))
        touched: set[int] = set()
        for o, key in records:
            if spans and o in self._spans:
                continue  # settled before it was offered
            s = NO_SLOT if key is None else _mix32(zlib.crc32(key)) >> 16
            rc = self._ahead.get(o) if ahead else None
            if rc is not None:
                m = msgs[o] = _Msg(s, UNOFFERED, rc)
                count[UNOFFERED] += 1
                self._release(o, m, MessageEvent.OFFER, 0, 0)
            else:
                msgs[o] = _Msg(s, NEW, 0)
                count[NEW] += 1
                if s == NO_SLOT:
                    self._free_fresh.append(o)
                    continue
                sl = slots.get(s)
                if sl is None:
                    sl = slots[s] = _Slot()
                sl.fresh.append(o)
                if self._head(sl) != o:
                    continue
            touched.add(s)
        self._offered_upto = end
        if ahead:
            self._ahead.pop(start, end)
        self._skip_spans()
        self._touch_all(touched)
        self._advance_floor()

    def deliver(self, member: str, now_ms: int, max_records: int) -> list[Delivery]:
        """Lease to ``member`` at most ``max_records`` messages it may take now, lowest offsets first.

        Per slot that the member owns and nobody else holds: its oldest messages, up to the
        first one still delayed; and keyless messages, ready or new. Each :class:`Delivery`
        is a run of contiguous offsets with one receive count.
        """
        _check_member(member)
        _check_int("max_records", max_records, 0, OFFSET_MAX)
        if member not in self._queues:
            raise UnknownMember(f"deliver to {member!r}: not a member of the group; join first")
        self.expire(now_ms)
        deadline = now_ms + self.visibility_ms
        queue = self._queues[member]
        got: list[int] = []
        free = self._free_head()
        pushed: tuple[int, int] | None = None  # the entry this loop just queued: known valid
        while len(got) < max_records:
            top = pushed if queue and queue[0] == pushed else self._top(member)
            if free is not None and (top is None or free < top[0]):
                if self._free_ready and self._free_ready[0] == free:
                    heapq.heappop(self._free_ready)
                else:
                    self._free_fresh.popleft()
                self._lease(member, free, deadline)
                got.append(free)
                free = self._free_head()
                continue
            if top is None:
                break
            o, s = top
            sl = self._slots[s]
            if sl.redo and sl.redo[0] == o:
                heapq.heappop(sl.redo)
            else:
                sl.fresh.popleft()
            self._lease(member, o, deadline)
            got.append(o)
            head = self._head(sl)
            if head is not None and self._msgs[head].state is not DELAYED:
                pushed = (head, s)
                heapq.heapreplace(queue, pushed)
            else:
                pushed = None
                heapq.heappop(queue)
        if not got:
            return []
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
        self._touch_all(touched, known=member)
        self._advance_floor()
        if err is not None:
            raise err
        return len(mine)

    def nack(self, member: str, start: int, end: int, now_ms: int, delay_ms: int = 0) -> int:
        """Give back ``member``'s messages of ``[start, end)``: redeliverable at now + delay (blocking their slots)."""
        _check_int("delay_ms", delay_ms, 0, DELAY_MS_MAX)
        mine, err = self._holdings("nack", member, start, end, now_ms)
        self._release_all(mine, MessageEvent.NACK, now_ms + delay_ms, now_ms)
        if err is not None:
            raise err
        return len(mine)

    def change_visibility(self, member: str, start: int, end: int, now_ms: int, visibility_ms: int) -> int:
        """Lease ``member``'s messages of ``[start, end)`` until now + visibility (0: give them back now)."""
        _check_int("visibility_ms", visibility_ms, 0, VISIBILITY_MS_MAX)
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
        _check_member(member)
        _check_range(start, end)
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
        _check_int("now_ms", now_ms, 0, TIME_MS_MAX)
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
                if m.slot == NO_SLOT:
                    heapq.heappush(self._free_ready, o)
                touched.add(m.slot)
        self._touch_all(touched)
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
        _check_int("limit", limit, 1, TAKE_DEAD_MAX)
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
        _check_range(start, end)
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
        _check_range(start, end)
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
        self._touch_all(touched)
        self._advance_floor()
        return n

    # -- internals: messages -------------------------------------------------------

    def _step(self, o: int, m: _Msg, event: MessageEvent, to: MessageState) -> None:
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
        if m.slot != NO_SLOT:
            sl = self._slots[m.slot]
            sl.leased += 1
            sl.holder = member

    def _unlease(self, o: int, m: _Msg) -> None:
        if m.member is None:
            raise InternalError(f"offset {o}: unlease of a message in state {m.state.value!r}")
        self._held[m.member].discard(o)
        m.member = None
        if m.slot != NO_SLOT:
            sl = self._slots[m.slot]
            sl.leased -= 1
            if not sl.leased:
                sl.holder = None

    def _release(self, o: int, m: _Msg, event: MessageEvent, not_before: int, now_ms: int) -> None:
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
        if m.slot != NO_SLOT:
            sl = self._slots.get(m.slot)
            if sl is None:
                sl = self._slots[m.slot] = _Slot()
            heapq.heappush(sl.redo, o)
        elif m.state is READY:
            heapq.heappush(self._free_ready, o)

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
        self._touch_all(touched)

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

    # -- internals: slots and the ring ---------------------------------------------

    def _owner(self, slot: int) -> str | None:
        points = self._points
        if not points:
            return None
        i = bisect_left(points, slot)
        return self._ring[i if i < len(points) else 0][1]

    def _taker(self, s: int, sl: _Slot) -> str | None:
        """Who may take the slot's messages now: its owner, unless another member holds it."""
        owner = self._owner(s)
        return owner if sl.holder is None or sl.holder == owner else None

    def _head(self, sl: _Slot) -> int | None:
        """The slot's oldest new or released offset."""
        return self._oldest(sl.redo, sl.fresh)

    def _free_head(self) -> int | None:
        """The oldest keyless offset ready or new."""
        return self._oldest(self._free_ready, self._free_fresh)

    def _oldest(self, redo: list[int], fresh: deque[int]) -> int | None:
        """The lower of a heap's and a deque's first offsets; settled ones on top are dropped."""
        msgs = self._msgs
        while redo and redo[0] not in msgs:
            heapq.heappop(redo)
        while fresh and fresh[0] not in msgs:
            fresh.popleft()
        if redo and (not fresh or redo[0] < fresh[0]):
            return redo[0]
        return fresh[0] if fresh else None

    def _top(self, member: str) -> tuple[int, int] | None:
        """The member's lowest entry still naming a slot's oldest offset, ready, that the member may take."""
        queue = self._queues[member]
        while queue:
            o, s = queue[0]
            sl = self._slots.get(s)
            if (
                sl is not None
                and self._head(sl) == o
                and self._msgs[o].state is not DELAYED
                and self._taker(s, sl) == member
            ):
                return o, s
            heapq.heappop(queue)
        return None

    def _touch_all(self, slots: Iterable[int], known: str | None = None) -> None:
        """Queue each slot's oldest offset with the member that may take it now; drop slots left empty.

        ``known``: a member whose queue already has the slot's entry when it is the taker (an ack
        by the holder changes neither the oldest offset nor, for the owner, who may take it)."""
        for s in slots:
            sl = self._slots.get(s)
            if sl is None:
                continue
            head = self._head(sl)
            if head is None:
                if not sl.leased:
                    del self._slots[s]
                continue
            if self._msgs[head].state is DELAYED:
                continue
            taker = self._taker(s, sl)
            if taker is not None and taker != known:
                queue = self._queues[taker]
                heapq.heappush(queue, (head, s))
                if len(queue) > 2 * len(self._slots) + 1024:
                    self._requeue()

    def _requeue(self) -> None:
        """Rebuild every member's queue from the slots (after a ring change, or when stale entries pile up)."""
        queues: dict[str, list[tuple[int, int]]] = {m: [] for m in self._queues}
        empty: list[int] = []
        for s, sl in self._slots.items():
            head = self._head(sl)
            if head is None:
                if not sl.leased:
                    empty.append(s)
                continue
            taker = self._taker(s, sl)
            if taker is not None and self._msgs[head].state is not DELAYED:
                queues[taker].append((head, s))
        for s in empty:
            del self._slots[s]
        for q in queues.values():
            heapq.heapify(q)
        self._queues = queues

    def _rebuild_ring(self, ring: list[tuple[int, str]]) -> None:
        """A new ring (sorted; equal points rank by member id): requeue every slot for its new taker."""
        self._ring = ring
        self._points = [p for p, _ in ring]
        self._requeue()

    # -- persistence -----------------------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        """JSON-able state to survive a restart: the floor, settled offsets above it, receive counts."""
        settled = RangeSet()
        counts = RangeMap[int]()
        pos = self._floor
        for o in sorted(self._msgs):
            if o > pos:
                settled.add(pos, o)
            pos = o + 1
            rc = self._msgs[o].rc
            if rc:
                counts.set(o, o + 1, rc)
        settled.add(pos, max(pos, self._offered_upto))
        for s, e in self._spans:
            settled.add(s, e)
        for s, e, rc in self._ahead:
            counts.set(s, e, rc)
        return {
            "version": SNAPSHOT_VERSION,
            "kind": "key_shared",
            "floor": self._floor,
            "settled": settled.to_list(),
            "counts": [[s, e, rc] for s, e, rc in counts],
        }

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
        if not isinstance(snapshot, Mapping) or snapshot.get("version") != SNAPSHOT_VERSION:
            raise BadParameter(f"not a version {SNAPSHOT_VERSION} key_shared lease snapshot")
        if snapshot.get("kind") != "key_shared":
            raise BadParameter(f"not a key_shared lease snapshot: kind {snapshot.get('kind')!r}")
        floor = _check_int("snapshot floor", snapshot.get("floor"), 0, OFFSET_MAX)
        table = cls(
            floor,
            visibility_ms=visibility_ms,
            max_receive_count=max_receive_count,
            virtual_points=virtual_points,
            max_pending=max_pending,
        )
        settled = RangeSet.from_list(snapshot.get("settled"))
        if settled.overlaps(0, floor + 1):
            raise BadParameter("snapshot has settled ranges at or below its floor")
        counts = snapshot.get("counts")
        if not isinstance(counts, list):
            raise BadParameter("snapshot counts must be a list")
        pos = floor
        for item in counts:
            if not (isinstance(item, list) and len(item) == 3 and all(type(x) is int for x in item)):
                raise BadParameter(f"not a [start, end, receive_count] range: {item!r}")
            s, e, rc = item
            if not pos <= s < e <= OFFSET_MAX + 1 or not 1 <= rc <= RECEIVE_COUNT_MAX or settled.overlaps(s, e):
                raise BadParameter(f"snapshot count range {item!r} is out of order or overlaps settled offsets")
            table._ahead.set(s, e, rc)
            pos = e
        table._spans = settled
        return table

    def verify(self) -> None:
        """Check every invariant of the table (O(pending), for tests): raises InternalError when one breaks."""

        def check(ok: bool, why: str) -> None:
            if not ok:
                raise InternalError(f"key_shared table invariant broken: {why}")

        msgs, upto, mx = self._msgs, self._offered_upto, self.max_receive_count
        check(self._floor == (min(msgs) if msgs else upto), f"floor {self._floor} is not the oldest pending")
        check(max(msgs, default=-1) < upto and upto not in self._spans, "pending offsets past offered_upto")
        check(not self._spans.overlaps(0, self._floor + 1), "settled spans at or below the floor")
        check(all(s >= upto and not self._spans.overlaps(s, e) for s, e, _ in self._ahead), "kept receive counts")
        counts = dict.fromkeys(MessageState, 0)
        held: dict[str, set[int]] = {m: set() for m in self._queues}
        per_slot: dict[int, list[tuple[int, _Msg]]] = defaultdict(list)
        for o, m in msgs.items():
            counts[m.state] += 1
            check(o not in self._spans, f"offset {o} pending and settled")
            check((m.rc == 0) == (m.state is NEW), f"offset {o} {m.state} with rc {m.rc}")
            check((m.member is not None) == (m.state is LEASED), f"offset {o} {m.state} held by {m.member!r}")
            if m.member is not None:
                check(m.member in held, f"offset {o} leased to non-member {m.member!r}")
                held[m.member].add(o)
            check(not (m.state is READY and 0 < mx <= m.rc), f"offset {o} ready with rc {m.rc}")
            check(m.state not in (DEAD, TAKEN) or 0 < mx <= m.rc, f"offset {o} dead with rc {m.rc}")
            if m.slot != NO_SLOT and m.state not in (DEAD, TAKEN):
                per_slot[m.slot].append((o, m))
        check(all(counts[s] == self._count[s] for s in MessageState), "per-state counts")
        check(held == self._held, "per-member leases disagree with the messages")
        check({o for o, m in msgs.items() if m.state is DELAYED} == self._delayed, "delayed set")
        for ranges, state in ((self._dead, DEAD), (self._taken, TAKEN)):
            tracked = {o: rc for s, e, rc in ranges for o in range(s, e)}
            check(tracked == {o: m.rc for o, m in msgs.items() if m.state is state}, f"{state} ranges")
        free = {o: m.state for o, m in msgs.items() if m.slot == NO_SLOT}
        check({o for o, st in free.items() if st is READY} <= set(self._free_ready), "keyless ready not queued")
        check({o for o, st in free.items() if st is NEW} <= set(self._free_fresh), "keyless new not queued")
        check(set(per_slot) == set(self._slots), "slots with work and slot table disagree")
        entries = {m: set(q) for m, q in self._queues.items()}
        for s, sl in self._slots.items():
            items = per_slot[s]
            holders = {m.member for _, m in items if m.member is not None}
            check(len(holders) <= 1, f"slot {s} held by {len(holders)} members")
            check(sl.holder == (holders.pop() if holders else None), f"slot {s} holder")
            check(sl.leased == sum(1 for _, m in items if m.state is LEASED), f"slot {s} lease count")
            waiting = [o for o, m in items if m.state is not LEASED]
            check(set(waiting) <= set(sl.redo) | set(sl.fresh), f"slot {s} lost a waiting message")
            news = [o for o, m in items if m.state is NEW]
            check(not news or all(o < min(news) for o, m in items if m.state is not NEW), f"slot {s} order")
            head = self._head(sl)
            check(head == min(waiting, default=None), f"slot {s} head {head} is not its oldest waiting")
            taker = self._taker(s, sl)
            if head is not None and taker is not None and msgs[head].state is not DELAYED:
                check((head, s) in entries[taker], f"slot {s} not queued for {taker!r}")
        for timers, state in ((self._lease_timers, LEASED), (self._delay_timers, DELAYED)):
            entries_t = {(t, o) for t, _, offs in timers.heap for o in offs}
            check(all((m.time_ms, o) in entries_t for o, m in msgs.items() if m.state is state), f"{state} timers")
        ring = sorted((p, m) for m in self._queues for p in ring_points(m, self.virtual_points))
        check(self._ring == ring and self._points == [p for p, _ in ring], "the ring")
