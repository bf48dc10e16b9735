"""The states of one message in a key_shared lease table, and the moves between them.

Theory of operation
-------------------
:class:`~fabric.push.keyshared.KeySharedLeases` keeps one :class:`Message` per offered,
unsettled offset, and moves it only along a row of ``MESSAGE_TRANSITIONS``. Which
message a deliver may take (the oldest waiting of its slot, see
:mod:`fabric.push.keyslots`) is the table's business; this is what happens to each one.

Messages (``max`` is max_receive_count; "released" means ready, or dead when
0 < max <= rc; ``KeySharedLeases.state`` reports ready and delayed as
``redeliverable``, taken as ``dead``: ``PUBLIC_STATES``)::

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
    unsettled   snapshot, restore                           unoffered, rc kept (see
                                                            :mod:`fabric.push.keysnapshot`)

Illegal moves, as :class:`~fabric.push.leases.PartitionLeases`: an ack, nack or
change_visibility ignores settled offsets and raises :class:`NotLeaseHolder`, naming
the first offset of the range neither settled nor leased to the member and its state,
*after* acting on the offsets the member does hold. A negative offset, start > end, a
time, limit or key out of range, offers that do not continue ``offered_upto`` or a bad
snapshot raise :class:`BadParameter`; a deliver to a non-member :class:`UnknownMember`.
A move that ``MESSAGE_TRANSITIONS`` does not list is a bug here: :class:`InternalError`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


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
PUBLIC_STATES = {
    NEW: "new",
    LEASED: "leased",
    READY: "redeliverable",
    DELAYED: "redeliverable",
    DEAD: "dead",
    TAKEN: "dead",
}


@dataclass(slots=True)
class Message:
    slot: int  # NO_SLOT without a key
    state: MessageState
    rc: int  # deliveries so far
    member: str | None = None  # the holder while leased
    time_ms: int = 0  # the lease deadline while leased, not_before while delayed
