"""The invariants of a key_shared lease table, checked whole: a test aid, O(pending).

Theory of operation
-------------------
:meth:`KeySharedLeases.verify <fabric.push.keyshared.KeySharedLeases.verify>` calls
:func:`verify`, which reads the table's private structures and recomputes from the
messages alone everything the table keeps on the side, raising
:class:`~fabric.errors.InternalError` naming the first that disagrees:

- positions: the floor is the oldest pending offset, nothing pending at or past
  ``offered_upto``, settled spans and kept receive counts above it and disjoint;
- per message: receive count 0 exactly when new, a holder exactly when leased (and a
  member), dead only at ``max_receive_count``; per-state counts, per-member leases,
  the delayed set, the dead and taken ranges, a timer entry for every lease and delay;
- per slot (:mod:`fabric.push.keyslots`): at most one holder, the lease count, every
  waiting message in the slot's heap or deque, new ones after the released ones, the
  head is the oldest waiting, and a head not blocked is queued with its taker; keyless
  ready and new messages are queued;
- the ring (:mod:`fabric.push.keyring`) is exactly the members' points.

The unit tests and the Hypothesis state machine call it after every step; the node
never does.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from fabric.errors import InternalError
from fabric.push.keymessages import DEAD, DELAYED, LEASED, NEW, READY, TAKEN, Message, MessageState
from fabric.push.keyring import ring_points
from fabric.push.keyslots import NO_SLOT

if TYPE_CHECKING:
    from fabric.push.keyshared import KeySharedLeases


def verify(table: KeySharedLeases) -> None:
    """Check every invariant of the table: raises InternalError when one breaks."""

    def check(ok: bool, why: str) -> None:
        if not ok:
            raise InternalError(f"key_shared table invariant broken: {why}")

    msgs, upto, mx, sq = table._msgs, table._offered_upto, table.max_receive_count, table._sq
    check(table._floor == (min(msgs) if msgs else upto), f"floor {table._floor} is not the oldest pending")
    check(max(msgs, default=-1) < upto and upto not in table._spans, "pending offsets past offered_upto")
    check(not table._spans.overlaps(0, table._floor + 1), "settled spans at or below the floor")
    check(all(s >= upto and not table._spans.overlaps(s, e) for s, e, _ in table._ahead), "kept receive counts")
    counts = dict.fromkeys(MessageState, 0)
    held: dict[str, set[int]] = {m: set() for m in sq.queues}
    per_slot: dict[int, list[tuple[int, Message]]] = defaultdict(list)
    for o, m in msgs.items():
        counts[m.state] += 1
        check(o not in table._spans, f"offset {o} pending and settled")
        # rc 0: never delivered (new), or given back uncounted (ready / delayed)
        check(m.rc >= 1 or m.state in (NEW, READY, DELAYED), f"offset {o} {m.state} with rc {m.rc}")
        check(m.state is not NEW or m.rc == 0, f"offset {o} new with rc {m.rc}")
        check((m.member is not None) == (m.state is LEASED), f"offset {o} {m.state} held by {m.member!r}")
        if m.member is not None:
            check(m.member in held, f"offset {o} leased to non-member {m.member!r}")
            held[m.member].add(o)
        check(not (m.state is READY and 0 < mx <= m.rc), f"offset {o} ready with rc {m.rc}")
        check(m.state not in (DEAD, TAKEN) or 0 < mx <= m.rc, f"offset {o} dead with rc {m.rc}")
        if m.slot != NO_SLOT and m.state not in (DEAD, TAKEN):
            per_slot[m.slot].append((o, m))
    check(all(counts[s] == table._count[s] for s in MessageState), "per-state counts")
    check(held == table._held, "per-member leases disagree with the messages")
    check({o for o, m in msgs.items() if m.state is DELAYED} == table._delayed, "delayed set")
    for ranges, state in ((table._dead, DEAD), (table._taken, TAKEN)):
        tracked = {o: rc for s, e, rc in ranges for o in range(s, e)}
        check(tracked == {o: m.rc for o, m in msgs.items() if m.state is state}, f"{state} ranges")
    free = {o: m.state for o, m in msgs.items() if m.slot == NO_SLOT}
    check({o for o, st in free.items() if st is READY} <= set(sq.free_ready), "keyless ready not queued")
    check({o for o, st in free.items() if st is NEW} <= set(sq.free_fresh), "keyless new not queued")
    check(set(per_slot) == set(sq.slots), "slots with work and slot table disagree")
    entries = {m: set(q) for m, q in sq.queues.items()}
    for s, sl in sq.slots.items():
        items = per_slot[s]
        holders = {m.member for _, m in items if m.member is not None}
        check(len(holders) <= 1, f"slot {s} held by {len(holders)} members")
        check(sl.holder == (holders.pop() if holders else None), f"slot {s} holder")
        check(sl.leased == sum(1 for _, m in items if m.state is LEASED), f"slot {s} lease count")
        waiting = [o for o, m in items if m.state is not LEASED]
        check(set(waiting) <= set(sl.redo) | set(sl.fresh), f"slot {s} lost a waiting message")
        news = [o for o, m in items if m.state is NEW]
        check(not news or all(o < min(news) for o, m in items if m.state is not NEW), f"slot {s} order")
        head = sq.head(sl)
        check(head == min(waiting, default=None), f"slot {s} head {head} is not its oldest waiting")
        taker = sq.taker(s, sl)
        if head is not None and taker is not None and msgs[head].state is not DELAYED:
            check((head, s) in entries[taker], f"slot {s} not queued for {taker!r}")
    for timers, state in ((table._lease_timers, LEASED), (table._delay_timers, DELAYED)):
        entries_t = {(time_ms, o) for time_ms, _, offs in timers.heap for o in offs}
        check(all((m.time_ms, o) in entries_t for o, m in msgs.items() if m.state is state), f"{state} timers")
    ring = sorted((p, m) for m in sq.queues for p in ring_points(m, table.virtual_points))
    check(sq.ring.entries == ring and sq.ring.points == [p for p, _ in ring], "the ring")
