"""The slot queues of a key_shared table: which member may take which message now, oldest first.

Theory of operation
-------------------
:class:`~fabric.push.keyshared.KeySharedLeases` keeps the state of every message;
:class:`SlotQueues` keeps the *order* in which messages may go out, and to whom. It
knows offsets and slots (:mod:`fabric.push.keyring`), never message states: the table
hands it two live views, ``pending`` (the offered, unsettled offsets) and ``blocked``
(the offsets waiting out a nack delay).

*Per slot with work* (:class:`Slot`): a heap ``redo`` of released offsets (ready or
delayed), a deque ``fresh`` of never-delivered offsets in ascending order, how many of
its messages are leased and the one member holding them. The slot's *head* is the
lower of the two first offsets; offsets no longer pending (settled) are dropped from
the top lazily. A head in ``blocked`` blocks its slot: nothing newer of that key may
pass it. A slot with neither waiting nor leased messages is dropped.

*Takers.* A slot's messages may be taken by its owner on the ring, unless another
member still holds some of them (the hand-over waits for the old holder to finish)::

    taker(slot) = owner(slot) if holder is None or holder == owner(slot) else nobody

*Per member* a heap ``queues[member]`` of ``(head offset, slot)`` for the slots it may
take. An entry is pushed whenever a slot's head, its blocking or its taker changes
(:meth:`SlotQueues.touch_all`) and checked lazily when it comes to the top, so a
:meth:`SlotQueues.take` touches only the member's own slots. Stale entries are
bounded: when a queue grows past twice the slots with work plus 1024, every queue is
rebuilt from the slots (:meth:`SlotQueues.requeue`), as after every join and leave.

*Keyless messages* have no slot and no order among members: one heap of ready offsets
and one deque of new ones, taken by any member. :meth:`SlotQueues.take` merges the
member's slot heads and the keyless heads, lowest offset first.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Container, Iterable
from dataclasses import dataclass, field

from fabric.push.keyring import Ring

NO_SLOT = -1  # a keyless message


@dataclass(slots=True)
class Slot:
    redo: list[int] = field(default_factory=list)  # heap: released (ready or delayed) offsets
    fresh: deque[int] = field(default_factory=deque)  # never delivered, ascending
    leased: int = 0
    holder: str | None = None


class SlotQueues:
    """Per-slot order, per-member queues of the slots each may take, and the keyless messages."""

    __slots__ = ("blocked", "free_fresh", "free_ready", "pending", "queues", "ring", "slots")

    def __init__(self, pending: Container[int], blocked: Container[int], virtual_points: int) -> None:
        self.pending = pending  # offered, unsettled offsets: any other offset found here is skipped
        self.blocked = blocked  # offsets waiting out a delay: each blocks its slot
        self.ring = Ring(virtual_points)
        self.slots: dict[int, Slot] = {}  # slots with new, released or leased messages
        self.free_ready: list[int] = []  # heap: keyless ready offsets
        self.free_fresh: deque[int] = deque()  # keyless new offsets
        self.queues: dict[str, list[tuple[int, int]]] = {}  # member -> heap of (oldest offset, slot) it may take

    # -- members ---------------------------------------------------------------------

    def join(self, member: str) -> None:
        self.queues[member] = []
        self.ring.join(member)
        self.requeue()

    def leave(self, member: str) -> None:
        del self.queues[member]
        self.ring.leave(member)
        self.requeue()

    def holder(self, slot: int) -> str | None:
        sl = self.slots.get(slot)
        return sl.holder if sl is not None else None

    # -- offsets in and out ------------------------------------------------------------

    def push_new(self, o: int, s: int) -> bool:
        """A new offset (ascending): True when it is now its slot's head, so the slot wants a touch."""
        if s == NO_SLOT:
            self.free_fresh.append(o)
            return False
        sl = self.slots.get(s)
        if sl is None:
            sl = self.slots[s] = Slot()
        sl.fresh.append(o)
        return self.head(sl) == o

    def push_released(self, o: int, s: int, ready: bool) -> None:
        """A released offset (ready, or delayed if not ``ready``) waits again; the caller touches the slot.

        A keyless offset waits only once ready (keyless messages block nothing)."""
        if s != NO_SLOT:
            sl = self.slots.get(s)
            if sl is None:
                sl = self.slots[s] = Slot()
            heapq.heappush(sl.redo, o)
        elif ready:
            heapq.heappush(self.free_ready, o)

    def unlease(self, s: int) -> None:
        """One lease of a message of slot ``s`` ended; the last one frees the slot."""
        if s != NO_SLOT:
            sl = self.slots[s]
            sl.leased -= 1
            if not sl.leased:
                sl.holder = None

    def take(self, member: str, max_records: int) -> list[int]:
        """Pop at most ``max_records`` offsets the member may take now, lowest first, and make it their
        slots' holder. Per slot: its oldest offsets, up to the first blocked one; keyless: ready or new."""
        queue = self.queues[member]
        got: list[int] = []
        free = self.free_head()
        pushed: tuple[int, int] | None = None  # the entry this loop just queued: known valid
        while len(got) < max_records:
            top = pushed if queue and queue[0] == pushed else self._top(member)
            if free is not None and (top is None or free < top[0]):
                if self.free_ready and self.free_ready[0] == free:
                    heapq.heappop(self.free_ready)
                else:
                    self.free_fresh.popleft()
                got.append(free)
                free = self.free_head()
                continue
            if top is None:
                break
            o, s = top
            sl = self.slots[s]
            if sl.redo and sl.redo[0] == o:
                heapq.heappop(sl.redo)
            else:
                sl.fresh.popleft()
            sl.leased += 1
            sl.holder = member
            got.append(o)
            head = self.head(sl)
            if head is not None and head not in self.blocked:
                pushed = (head, s)
                heapq.heapreplace(queue, pushed)
            else:
                pushed = None
                heapq.heappop(queue)
        return got

    # -- heads and takers --------------------------------------------------------------

    def taker(self, s: int, sl: Slot) -> str | None:
        """Who may take the slot's messages now: its owner, unless another member holds it."""
        owner = self.ring.owner(s)
        return owner if sl.holder is None or sl.holder == owner else None

    def head(self, sl: Slot) -> int | None:
        """The slot's oldest new or released offset."""
        return self._oldest(sl.redo, sl.fresh)

    def free_head(self) -> int | None:
        """The oldest keyless offset ready or new."""
        return self._oldest(self.free_ready, self.free_fresh)

    def _oldest(self, redo: list[int], fresh: deque[int]) -> int | None:
        """The lower of a heap's and a deque's first offsets; settled ones on top are dropped."""
        pending = self.pending
        while redo and redo[0] not in pending:
            heapq.heappop(redo)
        while fresh and fresh[0] not in pending:
            fresh.popleft()
        if redo and (not fresh or redo[0] < fresh[0]):
            return redo[0]
        return fresh[0] if fresh else None

    def _top(self, member: str) -> tuple[int, int] | None:
        """The member's lowest entry still naming a slot's oldest offset, ready, that the member may take."""
        queue = self.queues[member]
        while queue:
            o, s = queue[0]
            sl = self.slots.get(s)
            if sl is not None and self.head(sl) == o and o not in self.blocked and self.taker(s, sl) == member:
                return o, s
            heapq.heappop(queue)
        return None

    def touch_all(self, slots: Iterable[int], known: str | None = None) -> bool:
        """Queue each slot's oldest offset with the member that may take it now; drop slots left empty.

        ``known``: a member whose queue already has the slot's entry when it is the taker (an ack
        by the holder changes neither the oldest offset nor, for the owner, who may take it).
        True when a member other than ``known`` was given a slot to take (with ``known`` set:
        the holder's ack handed a slot over to its new owner, who has to be woken)."""
        handed = False
        for s in slots:
            sl = self.slots.get(s)
            if sl is None:
                continue
            head = self.head(sl)
            if head is None:
                if not sl.leased:
                    del self.slots[s]
                continue
            if head in self.blocked:
                continue
            taker = self.taker(s, sl)
            if taker is not None and taker != known:
                handed = True
                queue = self.queues[taker]
                heapq.heappush(queue, (head, s))
                if len(queue) > 2 * len(self.slots) + 1024:
                    self.requeue()
        return handed

    def requeue(self) -> None:
        """Rebuild every member's queue from the slots (after a ring change, or when stale entries pile up)."""
        queues: dict[str, list[tuple[int, int]]] = {m: [] for m in self.queues}
        empty: list[int] = []
        for s, sl in self.slots.items():
            head = self.head(sl)
            if head is None:
                if not sl.leased:
                    empty.append(s)
                continue
            taker = self.taker(s, sl)
            if taker is not None and head not in self.blocked:
                queues[taker].append((head, s))
        for s in empty:
            del self.slots[s]
        for q in queues.values():
            heapq.heapify(q)
        self.queues = queues
