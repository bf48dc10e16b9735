"""The lease table of one (queue, group, partition): who holds which offsets, until when.

Theory of operation
-------------------
A ``queue`` subscription (SQS semantics) shares one partition's messages among the
members of a named group. Each delivery is a *lease* that lasts ``visibility_ms``;
an ack settles the messages, a nack or the lease's expiry makes them deliverable
again (a nack may ask for a delay), and every delivery counts one receive. A
message whose next delivery would be its ``max_receive_count + 1``-th is not
delivered again but reported *dead*: the caller copies it to the dead-letter queue
and then settles it (``max_receive_count == 0`` means never).

The node pushes whole record batches, so everything here is held and moved as
offset ranges ``[start, end)`` (:mod:`fabric.push.ranges`): delivering, acking or
expiring 500 records is a few list operations, never a loop over messages. Every
offset of the partition is in exactly one state; a receive count ``rc`` lives with
each range of delivered, unsettled offsets::

    new            at or above ``cursor``; never delivered
    leased         held by one member until ``deadline_ms``; valid while now < deadline
    redeliverable  given back; deliverable again from ``not_before_ms`` (delayed until then)
    dead           rc reached max_receive_count and not leased; waits for take_dead and settle
    settled        acked, dead-lettered or purged: never delivered again. Every offset below
                   ``floor`` is settled; ``floor`` is what gets persisted as the committed offset.

Transitions (``max`` is max_receive_count; "released" means redeliverable, or dead when 0 < max <= rc)::

    from           event                                       to
    new            deliver                                     leased, rc = 1
    redeliverable  deliver, once not_before <= now             leased, rc + 1 (lowest offsets first)
    leased         ack by the holder                           settled
    leased         nack by the holder, delay d                 released, not_before = now + d
    leased         nack by the holder, uncount                 released, rc - 1 (it was never handed out)
    leased         change_visibility by the holder, v > 0      leased until now + v
    leased         change_visibility by the holder, v == 0     released, not_before = now
    leased         deadline <= now (any call given now_ms)     released, not_before = now
    leased         drop_member(holder)                         released, not_before = now
    dead           take_dead                                   dead, taken (reported once)
    dead, taken    return_dead                                 dead (reported again)
    any            settle                                      settled
    any unsettled  snapshot, then restore (a restart)          released at once, rc kept

Illegal moves::

    ack/nack/change_visibility of a settled offset             ignored (acks are idempotent)
    ... of an offset leased to another member, redeliverable,  NotLeaseHolder naming the first such offset
        dead or never delivered                                and its state, *after* acting on the offsets
                                                               of the range the member does hold
    a negative offset, start > end, a time or a limit          BadParameter naming the argument
        out of range, an empty member name, a bad snapshot

Time is a parameter: every method given ``now_ms`` first expires the leases whose
deadline is at or before it, so a late ack finds its lease gone. Timers are heaps of
``(time, start, end)`` checked lazily against the maps (a split or extended lease
leaves a stale entry that is skipped), rebuilt when stale entries outnumber live ones.

Limits: ``deliver`` hands out nothing while ``max_leases`` lease ranges are out, and
no new offsets while ``max_ranges`` unsettled ranges (leases, holes left by nacks,
expiries and dead letters) are tracked; acks and nacks that cut a range in the middle
may go one range past either limit, they are never refused for it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import TypeVar

from fabric.errors import BadParameter, InternalError, NotLeaseHolder
from fabric.push.ranges import RangeMap, RangeSet

VISIBILITY_MS_MAX = 12 * 3600 * 1000  # as SQS: a lease lasts at most 12 hours
DELAY_MS_MAX = 12 * 3600 * 1000
RECEIVE_COUNT_MAX = 1000  # as the queue setting max_receive_count (0 = never dead-letter)
OFFSET_MAX = 2**63 - 1
TIME_MS_MAX = 2**62  # leaves room for now_ms + VISIBILITY_MS_MAX inside an int64
MEMBER_CHARS_MAX = 256
TAKE_DEAD_MAX = 1024  # ranges one take_dead call reports
SNAPSHOT_VERSION = 1

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Delivery:
    """Offsets ``[start, end)`` leased to a member until ``deadline_ms``, all received ``receive_count`` times."""

    start: int
    end: int
    receive_count: int
    deadline_ms: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end or self.receive_count < 1:
            raise BadParameter(f"bad delivery [{self.start}, {self.end}) receive_count={self.receive_count}")

    @property
    def count(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class _Lease:
    member: str
    deadline_ms: int
    receive_count: int


def check_int(name: str, value: object, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise BadParameter(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
    return value


def check_member(member: object) -> str:
    if not isinstance(member, str) or not 0 < len(member) <= MEMBER_CHARS_MAX:
        raise BadParameter(f"member must be a string of 1..{MEMBER_CHARS_MAX} characters, got {member!r}")
    return member


def check_range(start: int, end: int) -> None:
    if check_int("start", start, 0, OFFSET_MAX) > check_int("end", end, 0, OFFSET_MAX):
        raise BadParameter(f"range [{start}, {end}) has start > end")


def _lease_time(lease: _Lease) -> int:
    return lease.deadline_ms


def _delay_time(delayed: tuple[int, int]) -> int:
    return delayed[0]


class PartitionLeases:
    """Leases, redeliveries, receive counts and dead letters of one (queue, group, partition)."""

    # messages of a queue group are independent: an ack never makes one deliverable to another
    # member (KeySharedLeases sets this when an ack hands a key over)
    handed_over = False

    def __init__(
        self,
        floor: int,
        *,
        visibility_ms: int,
        max_receive_count: int,
        max_leases: int = 100_000,
        max_ranges: int = 1_000_000,
    ) -> None:
        self._floor = check_int("floor", floor, 0, OFFSET_MAX)
        self._cursor = floor
        self.visibility_ms = check_int("visibility_ms", visibility_ms, 1, VISIBILITY_MS_MAX)
        self.max_receive_count = check_int("max_receive_count", max_receive_count, 0, RECEIVE_COUNT_MAX)
        self.max_leases = check_int("max_leases", max_leases, 1, 10_000_000)
        self.max_ranges = check_int("max_ranges", max_ranges, 1, 100_000_000)
        self._settled = RangeSet()  # settled offsets above the floor (some may be above the cursor: purged)
        self._leases: RangeMap[_Lease] = RangeMap()
        self._delayed: RangeMap[tuple[int, int]] = RangeMap()  # (not_before_ms, rc), not_before > last now
        self._ready: RangeMap[int] = RangeMap()  # rc; redeliverable now
        self._dead: RangeMap[int] = RangeMap()  # rc; not reported yet
        self._taken: RangeMap[int] = RangeMap()  # rc; reported by take_dead, waiting for settle
        self._lease_timers: list[tuple[int, int, int]] = []  # (deadline_ms, start, end)
        self._delay_timers: list[tuple[int, int, int]] = []  # (not_before_ms, start, end)
        self._held: dict[str, int] = {}  # member -> offsets leased

    # -- positions and counts ----------------------------------------------------

    @property
    def floor(self) -> int:
        """Every offset below is settled: the committed offset to persist."""
        return self._floor

    @property
    def cursor(self) -> int:
        """The next offset never delivered (settled offsets right at it are skipped)."""
        return self._cursor

    @property
    def in_flight(self) -> int:
        """Offsets leased to some member."""
        return len(self._leases)

    @property
    def redeliverable(self) -> int:
        """Offsets given back (nack, expiry, departed member), including those still delayed."""
        return len(self._ready) + len(self._delayed)

    @property
    def dead(self) -> int:
        """Offsets dead and not settled yet, reported by take_dead or not."""
        return len(self._dead) + len(self._taken)

    def backlog(self, high_watermark: int) -> int:
        """Unsettled offsets in ``[floor, high_watermark)``, in flight or not."""
        if high_watermark <= self._floor:
            return 0
        return high_watermark - self._floor - self._settled.count(self._floor, high_watermark)

    def oldest_unsettled(self) -> int | None:
        """The lowest delivered offset not settled yet (the floor), or None when there is none."""
        return self._floor if self._floor < self._cursor else None

    def held(self, member: str) -> int:
        """Offsets leased to ``member``."""
        return self._held.get(member, 0)

    def members(self) -> list[str]:
        """Members holding leases."""
        return sorted(self._held)

    def state(self, offset: int) -> str:
        """One of ``new``, ``leased``, ``redeliverable``, ``dead``, ``settled``."""
        if offset < self._floor or offset in self._settled:
            return "settled"
        if offset in self._leases:
            return "leased"
        if offset in self._ready or offset in self._delayed:
            return "redeliverable"
        if offset in self._dead or offset in self._taken:
            return "dead"
        if offset >= self._cursor:
            return "new"
        raise InternalError(f"offset {offset} below cursor {self._cursor} is in no state")

    def holder(self, offset: int) -> str | None:
        lease = self._leases.get(offset)
        return lease.member if lease is not None else None

    def receive_count(self, offset: int) -> int:
        """Deliveries of an unsettled offset so far; 0 when never delivered or settled (counts are dropped)."""
        lease = self._leases.get(offset)
        if lease is not None:
            return lease.receive_count
        delayed = self._delayed.get(offset)
        if delayed is not None:
            return delayed[1]
        for m in (self._ready, self._dead, self._taken):
            rc = m.get(offset)
            if rc is not None:
                return rc
        return 0

    # -- delivery ------------------------------------------------------------------

    def deliver(self, member: str, now_ms: int, high_watermark: int, max_records: int) -> list[Delivery]:
        """Lease to ``member`` at most ``max_records`` offsets below ``high_watermark``.

        Redeliverable ranges come first, lowest offsets first, then new offsets from the
        cursor (skipping any settled ahead of it). Each :class:`Delivery` has one receive
        count. Returns less (or nothing) when the table is at ``max_leases``/``max_ranges``.
        """
        check_member(member)
        check_int("high_watermark", high_watermark, 0, OFFSET_MAX)
        check_int("max_records", max_records, 0, OFFSET_MAX)
        self.expire(now_ms)
        deadline = now_ms + self.visibility_ms
        out: list[Delivery] = []
        budget = max_records
        while budget > 0 and self._leases.ranges_count < self.max_leases:
            first = self._ready.first()
            if first is None or first[0] >= high_watermark:
                break
            start, end, rc = first
            end = min(end, start + budget, high_watermark)
            self._ready.pop(start, end)
            out.append(self._lease(member, start, end, deadline, rc + 1))
            budget -= end - start
        pos = self._cursor
        while budget > 0 and pos < high_watermark and self._has_room():
            gap = self._settled.first_gap(pos, high_watermark)
            if gap is None:
                pos = high_watermark
                break
            start, end = gap[0], min(gap[1], gap[0] + budget)
            out.append(self._lease(member, start, end, deadline, 1))
            budget -= end - start
            pos = end
        if pos > self._cursor:
            self._cursor = pos
            self._normalize()
        return out

    def _has_room(self) -> bool:
        if self._leases.ranges_count >= self.max_leases:
            return False
        tracked = sum(m.ranges_count for m in (self._leases, self._delayed, self._ready, self._dead, self._taken))
        return tracked < self.max_ranges

    # -- the member's moves --------------------------------------------------------

    def ack(self, member: str, start: int, end: int, now_ms: int) -> int:
        """Settle the offsets of ``[start, end)`` leased to ``member``; returns how many.

        Settled offsets in the range are ignored. Any other offset raises NotLeaseHolder
        (naming the first) after the member's offsets have been settled.
        """
        mine, err = self._holdings("ack", member, start, end, now_ms)
        n = 0
        for s, e, _ in mine:
            self._unlease(s, e)
            n += self._settled.add(s, e)
        self._normalize()
        if err is not None:
            raise err
        return n

    def nack(self, member: str, start: int, end: int, now_ms: int, delay_ms: int = 0, *, uncount: bool = False) -> int:
        """Give back the offsets of ``[start, end)`` leased to ``member``, redeliverable at now + delay.

        ``uncount``: the member never handed them to its application (a consumer closing with
        deliveries still buffered), so this delivery does not count toward max_receive_count."""
        check_int("delay_ms", delay_ms, 0, DELAY_MS_MAX)
        mine, err = self._holdings("nack", member, start, end, now_ms)
        for s, e, lease in mine:
            self._unlease(s, e)
            self._release(s, e, lease.receive_count - uncount, now_ms + delay_ms, now_ms)
        if err is not None:
            raise err
        return sum(e - s for s, e, _ in mine)

    def change_visibility(self, member: str, start: int, end: int, now_ms: int, visibility_ms: int) -> int:
        """Lease ``member``'s offsets of ``[start, end)`` until now + visibility (0: give them back now)."""
        check_int("visibility_ms", visibility_ms, 0, VISIBILITY_MS_MAX)
        mine, err = self._holdings("change_visibility", member, start, end, now_ms)
        deadline = now_ms + visibility_ms
        for s, e, lease in mine:
            if visibility_ms == 0:
                self._unlease(s, e)
                self._release(s, e, lease.receive_count, now_ms, now_ms)
            else:
                self._leases.set(s, e, _Lease(member, deadline, lease.receive_count))
                _push_timer(self._lease_timers, (deadline, s, e), self._leases, _lease_time)
        if err is not None:
            raise err
        return sum(e - s for s, e, _ in mine)

    def _holdings(
        self, verb: str, member: str, start: int, end: int, now_ms: int
    ) -> tuple[list[tuple[int, int, _Lease]], NotLeaseHolder | None]:
        """The member's lease pieces in the range, and the error for its first offset neither held nor settled."""
        check_member(member)
        check_range(start, end)
        self.expire(now_ms)
        mine: list[tuple[int, int, _Lease]] = []
        bad: int | None = None
        pos = start
        for s, e, lease in self._leases.intersect(start, end):
            if lease.member != member:
                continue
            if bad is None and pos < s:
                bad = self._first_unsettled(pos, s)
            mine.append((s, e, lease))
            pos = e
        if bad is None and pos < end:
            bad = self._first_unsettled(pos, end)
        if bad is None:
            return mine, None
        holder = self.holder(bad)
        state = self.state(bad)
        what = f"leased to {holder!r}" if holder is not None else "never delivered" if state == "new" else state
        return mine, NotLeaseHolder(f"{verb} of offset {bad} by {member!r}: it is {what}, not leased to {member!r}")

    def _first_unsettled(self, start: int, end: int) -> int | None:
        gap = self._settled.first_gap(max(start, self._floor), end) if end > self._floor else None
        return gap[0] if gap is not None else None

    # -- time and departures -------------------------------------------------------

    def expire(self, now_ms: int) -> int:
        """Leases with deadline <= now become redeliverable now (or dead); returns how many offsets."""
        check_int("now_ms", now_ms, 0, TIME_MS_MAX)
        n = 0
        timers = self._lease_timers
        while timers and timers[0][0] <= now_ms:
            _, start, end = heapq.heappop(timers)
            for s, e, lease in self._leases.intersect(start, end):
                if lease.deadline_ms <= now_ms:
                    self._unlease(s, e)
                    self._release(s, e, lease.receive_count, now_ms, now_ms)
                    n += e - s
        timers = self._delay_timers
        while timers and timers[0][0] <= now_ms:
            _, start, end = heapq.heappop(timers)
            for s, e, (not_before, rc) in self._delayed.intersect(start, end):
                if not_before <= now_ms:
                    self._delayed.pop(s, e)
                    self._ready.set(s, e, rc)
        return n

    def drop_member(self, member: str, now_ms: int) -> int:
        """The member is gone: its leases become redeliverable at once (or dead); returns how many offsets.

        Scans the whole lease table (O(lease ranges)): members leave rarely, acks come all the time.
        """
        check_member(member)
        self.expire(now_ms)
        if member not in self._held:
            return 0
        mine = [(s, e, lease) for s, e, lease in self._leases if lease.member == member]
        for s, e, lease in mine:
            self._unlease(s, e)
            self._release(s, e, lease.receive_count, now_ms, now_ms)
        return sum(e - s for s, e, _ in mine)

    def next_deadline_ms(self) -> int | None:
        """The earliest lease deadline or redelivery time: when to call again with now_ms."""
        times = [
            t
            for t in (
                _live_top(self._lease_timers, self._leases, _lease_time),
                _live_top(self._delay_timers, self._delayed, _delay_time),
            )
            if t is not None
        ]
        return min(times) if times else None

    # -- dead letters and settling -------------------------------------------------

    def take_dead(self, now_ms: int, limit: int = TAKE_DEAD_MAX) -> list[tuple[int, int, int]]:
        """Dead ranges ``(start, end, receive_count)`` not reported before, lowest first, at most ``limit``.

        The caller copies them to the dead-letter queue and then calls :meth:`settle`
        (or :meth:`return_dead` if the copy failed, to have them reported again).
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
            out.append(first)
        return out

    def return_dead(self, start: int, end: int) -> int:
        """Dead offsets of ``[start, end)`` reported by take_dead are reported again; returns how many."""
        check_range(start, end)
        parts = self._taken.pop(start, end)
        for s, e, rc in parts:
            self._dead.set(s, e, rc)
        return sum(e - s for s, e, _ in parts)

    def settle(self, start: int, end: int) -> int:
        """Settle ``[start, end)`` whatever its state (dead-lettered, expired by TTL, purged).

        Returns how many offsets were not settled before. Offsets above the cursor are
        settled too: they will never be delivered.
        """
        check_range(start, end)
        start = max(start, self._floor)
        if start >= end:
            return 0
        self._unlease(start, end)
        for m in (self._ready, self._delayed, self._dead, self._taken):
            m.pop(start, end)
        n = self._settled.add(start, end)
        self._normalize()
        return n

    def expirable(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """The offsets of ``[start, end)`` that an expiry (TTL) may take: nobody holds them.

        New and redeliverable offsets, as ``(start, end, receive_count)`` (0 for never
        delivered), in order; nothing changes until the caller settles them (after
        dead-lettering, so a failed write loses nothing). Leased offsets stay with their
        holder (an ack still counts; if the lease ends, a later call finds them); dead
        and settled offsets are not returned.
        """
        check_range(start, end)
        start = max(start, self._floor)
        if start >= end:
            return []
        out: list[tuple[int, int, int]] = list(self._ready.intersect(start, end))
        out += [(s, e, rc) for s, e, (_, rc) in self._delayed.intersect(start, end)]
        lo = max(start, self._cursor)
        if lo < end:
            out += [(s, e, 0) for s, e in self._settled.gaps(lo, end)]
        out.sort()
        return out

    # -- internals -----------------------------------------------------------------

    def _lease(self, member: str, start: int, end: int, deadline: int, rc: int) -> Delivery:
        self._leases.set(start, end, _Lease(member, deadline, rc))
        self._held[member] = self._held.get(member, 0) + end - start
        _push_timer(self._lease_timers, (deadline, start, end), self._leases, _lease_time)
        return Delivery(start, end, rc, deadline)

    def _unlease(self, start: int, end: int) -> None:
        for s, e, lease in self._leases.pop(start, end):
            left = self._held[lease.member] - (e - s)
            if left:
                self._held[lease.member] = left
            else:
                del self._held[lease.member]

    def _release(self, start: int, end: int, rc: int, not_before: int, now_ms: int) -> None:
        """Unleased offsets: dead if another delivery would pass max_receive_count, else redeliverable."""
        if 0 < self.max_receive_count <= rc:
            self._dead.set(start, end, rc)
        elif not_before <= now_ms:
            self._ready.set(start, end, rc)
        else:
            self._delayed.set(start, end, (not_before, rc))
            _push_timer(self._delay_timers, (not_before, start, end), self._delayed, _delay_time)

    def _normalize(self) -> None:
        """Move the floor over the settled prefix, the cursor up to it and over settled offsets."""
        span = self._settled.span_at(self._floor)
        if span is not None:
            self._settled.remove(*span)
            self._floor = span[1]
        self._cursor = max(self._cursor, self._floor)
        span = self._settled.span_at(self._cursor)
        if span is not None:
            self._cursor = span[1]

    # -- persistence -----------------------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        """JSON-able state to survive a restart: positions, settled ranges and receive counts."""
        pieces: list[tuple[int, int, int]] = [(s, e, lease.receive_count) for s, e, lease in self._leases]
        pieces += [(s, e, rc) for s, e, (_, rc) in self._delayed]
        for m in (self._ready, self._dead, self._taken):
            pieces += list(m)
        pieces.sort()
        counts: list[list[int]] = []
        for s, e, rc in pieces:
            if counts and counts[-1][1] == s and counts[-1][2] == rc:
                counts[-1][1] = e
            else:
                counts.append([s, e, rc])
        return {
            "version": SNAPSHOT_VERSION,
            "floor": self._floor,
            "cursor": self._cursor,
            "settled": self._settled.to_list(),
            "counts": counts,
        }

    @classmethod
    def restore(
        cls,
        snapshot: Mapping[str, object],
        *,
        visibility_ms: int,
        max_receive_count: int,
        max_leases: int = 100_000,
        max_ranges: int = 1_000_000,
    ) -> PartitionLeases:
        """The table after a restart: no leases; every delivered, unsettled offset is redeliverable
        at once with its receive count (or dead when that reached max_receive_count)."""
        if not isinstance(snapshot, Mapping) or snapshot.get("version") != SNAPSHOT_VERSION:
            raise BadParameter(f"not a version {SNAPSHOT_VERSION} lease snapshot")
        floor = check_int("snapshot floor", snapshot.get("floor"), 0, OFFSET_MAX)
        cursor = check_int("snapshot cursor", snapshot.get("cursor"), floor, OFFSET_MAX)
        table = cls(
            floor,
            visibility_ms=visibility_ms,
            max_receive_count=max_receive_count,
            max_leases=max_leases,
            max_ranges=max_ranges,
        )
        settled = RangeSet.from_list(snapshot.get("settled"))
        if settled.overlaps(0, floor + 1):
            raise BadParameter("snapshot has settled ranges at or below its floor")
        table._settled = settled
        table._cursor = cursor
        counts = snapshot.get("counts")
        if not isinstance(counts, list):
            raise BadParameter("snapshot counts must be a list")
        pos = floor
        total = 0
        for item in counts:
            if not (isinstance(item, list) and len(item) == 3 and all(type(x) is int for x in item)):
                raise BadParameter(f"not a [start, end, receive_count] range: {item!r}")
            s, e, rc = item
            if not pos <= s < e <= cursor or rc < 0 or settled.overlaps(s, e):
                raise BadParameter(f"snapshot count range {item!r} is out of order or overlaps settled offsets")
            table._release(s, e, rc, 0, 0)
            pos = e
            total += e - s
        if total != cursor - floor - settled.count(floor, cursor):
            raise BadParameter("snapshot counts do not cover the delivered, unsettled offsets")
        table._normalize()
        return table

    def verify(self) -> None:
        """Check every invariant of the table (O(n), for tests): raises InternalError when one breaks."""

        def fail(why: str) -> None:
            raise InternalError(f"lease table invariant broken: {why}")

        if not self._floor <= self._cursor:
            fail(f"floor {self._floor} > cursor {self._cursor}")
        first = self._settled.first()
        if first is not None and first <= self._floor:
            fail("settled offsets at or below the floor")
        if self._cursor in self._settled:
            fail("cursor on a settled offset")
        pieces: list[tuple[int, int]] = [(s, e) for s, e, _ in self._leases]
        for m in (self._delayed, self._ready, self._dead, self._taken):
            pieces += [(s, e) for s, e, _ in m]
        pieces.sort()
        for (_, e1), (s2, _) in pairwise(pieces):
            if e1 > s2:
                fail(f"ranges overlap at {s2}")
        for s, e in pieces:
            if s < self._floor or e > self._cursor or self._settled.overlaps(s, e):
                fail(f"unsettled range [{s}, {e}) outside [floor, cursor) or settled")
        covered = sum(e - s for s, e in pieces) + self._settled.count(self._floor, self._cursor)
        if covered != self._cursor - self._floor:
            fail("offsets below the cursor in no state")
        held: dict[str, int] = {}
        for s, e, lease in self._leases:
            held[lease.member] = held.get(lease.member, 0) + e - s
            if lease.receive_count < 1 or 0 < self.max_receive_count < lease.receive_count:
                fail(f"lease [{s}, {e}) has receive count {lease.receive_count}")
        if held != self._held:
            fail("per-member counts disagree with the leases")
        for s, e, rc in self._ready:
            if 0 < self.max_receive_count <= rc:
                fail(f"redeliverable [{s}, {e}) has receive count {rc}")


Timers = list[tuple[int, int, int]]  # heap of (time_ms, start, end)


def _push_timer(timers: Timers, entry: tuple[int, int, int], ranges: RangeMap[T], when: Callable[[T], int]) -> None:
    heapq.heappush(timers, entry)
    if len(timers) > 2 * ranges.ranges_count + 1024:  # mostly stale entries: rebuild from the live ranges
        timers[:] = [(when(v), s, e) for s, e, v in ranges]
        heapq.heapify(timers)


def _live_top(timers: Timers, ranges: RangeMap[T], when: Callable[[T], int]) -> int | None:
    """The earliest timer that still has a range firing at its time; stale entries on top are dropped."""
    while timers:
        t, start, end = timers[0]
        if any(when(v) == t for _, _, v in ranges.intersect(start, end)):
            return t
        heapq.heappop(timers)
    return None
