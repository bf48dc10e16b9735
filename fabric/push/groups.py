"""Stream consumer groups: which live member may receive which partition, at every moment.

Theory of operation
-------------------
A ``stream`` group (Kafka semantics) shares the N partitions of one queue among its live
members. The node pushes data, so it must always know who may receive what; the one rule
everything here serves is **exclusive ownership**: a partition is held by at most one
member at any moment, where *held* means owned (consuming) or revoking (asked back, not
yet released).

Rebalancing is incremental and cooperative, never stop-the-world. Whenever membership
changes (join, leave, expiry) or a member confirms a release, :meth:`StreamGroup._rebalance`
recomputes each live member's *target*, ``floor(N/M)`` or ``ceil(N/M)``; the ceil slots go
to the members that already own the most (ties: smaller member id), so as few partitions as
possible move. Then:

* an owner above its target gets a :class:`Revoke` for its excess (its highest-numbered
  partitions). It keeps *holding* them (:meth:`revoking`) and nobody else may get them
  until it confirms with :meth:`revoked` (having committed its position), leaves, or
  expires;
* free partitions (ascending) are handed at once, with an :class:`Assign`, to members below
  their target (in member-id order). Only live members are ever assigned.

A member within its target keeps what it has (sticky), so a join only takes partitions from
members above their new target. Since the targets sum to N and every free partition is
assigned whenever some member is below target, a group with a live member has no free
partition; once no revocation is pending every member owns exactly its target (balanced).
Everything is deterministic: the same history of calls gives the same assignment.

Per partition (``PARTITION_TRANSITIONS``)::

    FREE --assign(B)--> OWNED(B) --revoke--> REVOKING(B) --confirm--> FREE --assign(C)--> OWNED(C)
                        OWNED(B) --release (B left or expired)-----> FREE
                                             REVOKING(B) --release--> FREE

Any other (state, event) pair is a bug in this module, never a peer's fault: the public
methods validate their input first. It raises :class:`InternalError` naming both.

Per member (``MEMBER_TRANSITIONS``); a member that is gone is forgotten, so "gone" and
"never joined" are one state and memory stays bounded::

    GONE --join--> LIVE   (a new member: generation + 1, a fresh heartbeat, holds nothing)
    LIVE --join--> LIVE   (a re-join of a live member: just a heartbeat, no change)
    LIVE --heartbeat / revoked--> LIVE   (both refresh the session, as a re-join does)
    LIVE --leave / expire--> GONE   (generation + 1; everything it held is free at once)

``heartbeat``, ``revoked`` and ``leave`` from a GONE member raise :class:`UnknownMember`
naming the state and event: the member must join again, as a new member (it was expired,
so its partitions may already be consumed by someone else). A join beyond
``max_members`` raises :class:`BadParameter`.

``revoked(member, partitions)`` frees only the partitions that are revoking *from that
member*; every other partition named is ignored (a duplicate or late confirmation must
never free a partition someone else, or this member again, now owns). A partition number
outside ``0..N-1`` raises :class:`BadParameter` before anything changes.

No :class:`Revoke` is emitted for a member that leaves or expires: it is gone, and the node
just stops pushing to it. Time is a parameter: a member is expired by
``expire(now_ms)`` when ``now_ms - last_heartbeat_ms > session_timeout_ms``, and
:meth:`next_deadline_ms` is the first ``now_ms`` at which that call has work.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from fabric.errors import BadParameter, InternalError, UnknownMember

MEMBER_ID_CHARS_MAX = 255
PARTITIONS_MAX = 1 << 16


# ---------------------------------------------------------------- changes told to members


def _check_change(kind: str, member: str, partitions: tuple[int, ...]) -> None:
    if not isinstance(member, str) or not member:
        raise BadParameter(f"{kind}: member must be a non-empty string, not {member!r}")
    if not isinstance(partitions, tuple) or not partitions:
        raise BadParameter(f"{kind} to {member!r}: partitions must be a non-empty tuple")
    for i, p in enumerate(partitions):
        if type(p) is not int or p < 0 or (i and p <= partitions[i - 1]):
            raise BadParameter(f"{kind} to {member!r}: partitions must be ascending, distinct ints >= 0")


@dataclass(frozen=True, slots=True)
class Assign:
    """Tell ``member``: start consuming these partitions (from the group's committed offsets)."""

    member: str
    partitions: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_change("assign", self.member, self.partitions)


@dataclass(frozen=True, slots=True)
class Revoke:
    """Tell ``member``: commit your position in these partitions, stop, and confirm with ``revoked``."""

    member: str
    partitions: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_change("revoke", self.member, self.partitions)


Change = Assign | Revoke


# ---------------------------------------------------------------- the transition tables


class PartitionState(enum.Enum):
    FREE = "free"
    OWNED = "owned"
    REVOKING = "revoking"


class PartitionEvent(enum.Enum):
    ASSIGN = "assign"  # handed to a live member below its target
    REVOKE = "revoke"  # asked back from an owner above its target
    CONFIRM = "confirm"  # the holder confirmed the release (revoked())
    RELEASE = "release"  # the holder left or expired


PARTITION_TRANSITIONS: dict[tuple[PartitionState, PartitionEvent], PartitionState] = {
    (PartitionState.FREE, PartitionEvent.ASSIGN): PartitionState.OWNED,
    (PartitionState.OWNED, PartitionEvent.REVOKE): PartitionState.REVOKING,
    (PartitionState.OWNED, PartitionEvent.RELEASE): PartitionState.FREE,
    (PartitionState.REVOKING, PartitionEvent.CONFIRM): PartitionState.FREE,
    (PartitionState.REVOKING, PartitionEvent.RELEASE): PartitionState.FREE,
}


class MemberState(enum.Enum):
    GONE = "gone"  # never joined, left or expired: not remembered
    LIVE = "live"


class MemberEvent(enum.Enum):
    JOIN = "join"
    HEARTBEAT = "heartbeat"
    REVOKED = "revoked"
    LEAVE = "leave"
    EXPIRE = "expire"


MEMBER_TRANSITIONS: dict[tuple[MemberState, MemberEvent], MemberState] = {
    (MemberState.GONE, MemberEvent.JOIN): MemberState.LIVE,
    (MemberState.LIVE, MemberEvent.JOIN): MemberState.LIVE,
    (MemberState.LIVE, MemberEvent.HEARTBEAT): MemberState.LIVE,
    (MemberState.LIVE, MemberEvent.REVOKED): MemberState.LIVE,
    (MemberState.LIVE, MemberEvent.LEAVE): MemberState.GONE,
    (MemberState.LIVE, MemberEvent.EXPIRE): MemberState.GONE,
}


def partition_step(partition: int, state: PartitionState, event: PartitionEvent) -> PartitionState:
    """The next state of a partition, or InternalError naming the state and the event."""
    nxt = PARTITION_TRANSITIONS.get((state, event))
    if nxt is None:
        raise InternalError(f"partition {partition}: illegal event {event.value!r} in state {state.value!r}")
    return nxt


def member_step(member: str, state: MemberState, event: MemberEvent) -> MemberState:
    """The next state of a member, or UnknownMember naming the state and the event."""
    nxt = MEMBER_TRANSITIONS.get((state, event))
    if nxt is None:
        raise UnknownMember(f"{event.value} from member {member!r} in state {state.value!r}: join the group again")
    return nxt


# ---------------------------------------------------------------- the group


@dataclass(slots=True)
class _Member:
    last_heartbeat_ms: int
    owned: set[int] = field(default_factory=set)
    revoking: set[int] = field(default_factory=set)


class StreamGroup:
    """The membership and partition ownership of one stream group on one queue. Pure: no I/O, no clock."""

    def __init__(self, partitions: int, *, session_timeout_ms: int, max_members: int = 10_000) -> None:
        if type(partitions) is not int or not 1 <= partitions <= PARTITIONS_MAX:
            raise BadParameter(f"partitions must be 1..{PARTITIONS_MAX}, not {partitions!r}")
        if type(session_timeout_ms) is not int or session_timeout_ms <= 0:
            raise BadParameter(f"session_timeout_ms must be a positive int, not {session_timeout_ms!r}")
        if type(max_members) is not int or max_members <= 0:
            raise BadParameter(f"max_members must be a positive int, not {max_members!r}")
        self.partitions = partitions
        self.retired = 0  # shrinking removed partitions partitions..retired-1: a late confirmation is ignored
        self.session_timeout_ms = session_timeout_ms
        self.max_members = max_members
        self.generation = 0
        self._members: dict[str, _Member] = {}
        self._state = [PartitionState.FREE] * partitions
        self._holder: list[str | None] = [None] * partitions

    # ------------------------------------------------------------ events

    def join(self, member: str, now_ms: int) -> list[Change]:
        """A member joins; a live member joining again only heartbeats (no change)."""
        _check_member_id(member)
        mem = self._members.get(member)
        self._step(member, MemberEvent.JOIN)
        if mem is not None:
            mem.last_heartbeat_ms = max(mem.last_heartbeat_ms, now_ms)
            return []
        if len(self._members) >= self.max_members:
            raise BadParameter(f"join from member {member!r}: the group is full ({self.max_members} members)")
        self._members[member] = _Member(last_heartbeat_ms=now_ms)
        self.generation += 1
        return self._rebalance()

    def leave(self, member: str, now_ms: int) -> list[Change]:
        """A member leaves, having committed: everything it held is free at once and reassigned."""
        self._step(member, MemberEvent.LEAVE)
        self._remove(member)
        self.generation += 1
        return self._rebalance()

    def heartbeat(self, member: str, now_ms: int) -> None:
        self._step(member, MemberEvent.HEARTBEAT)
        mem = self._members[member]
        mem.last_heartbeat_ms = max(mem.last_heartbeat_ms, now_ms)

    def revoked(self, member: str, partitions: Iterable[int], now_ms: int) -> list[Change]:
        """``member`` confirms it released these partitions; those revoking from it become free
        and go where the targets (recomputed now) say. Any other partition named is ignored."""
        self._step(member, MemberEvent.REVOKED)
        retired = range(self.partitions, self.retired)
        parts = [self._check_partition(p) for p in partitions if not (type(p) is int and p in retired)]
        mem = self._members[member]
        mem.last_heartbeat_ms = max(mem.last_heartbeat_ms, now_ms)
        confirmed = sorted(mem.revoking.intersection(parts))
        if not confirmed:
            return []
        for p in confirmed:
            self._move(p, PartitionEvent.CONFIRM, member)
        return self._rebalance()

    def expire(self, now_ms: int) -> list[Change]:
        """Remove the members silent for more than ``session_timeout_ms``; reassign what they held."""
        dead = sorted(m for m, mem in self._members.items() if now_ms - mem.last_heartbeat_ms > self.session_timeout_ms)
        if not dead:
            return []
        for member in dead:
            self._step(member, MemberEvent.EXPIRE)
            self._remove(member)
        self.generation += 1
        return self._rebalance()

    def grow(self, partitions: int) -> list[Change]:
        """The queue has more partitions now (``fabric queue alter --partitions``): the new ones
        start free and are handed out by the same rebalance as a join (a new generation)."""
        if type(partitions) is not int or not self.partitions <= partitions <= PARTITIONS_MAX:
            raise BadParameter(f"partitions may only grow, up to {PARTITIONS_MAX}: {self.partitions} -> {partitions!r}")
        if partitions == self.partitions:
            return []
        added = partitions - self.partitions
        self.partitions = partitions
        self._state.extend([PartitionState.FREE] * added)
        self._holder.extend([None] * added)
        self.generation += 1
        return self._rebalance()

    def shrink(self, partitions: int) -> list[Change]:
        """Shrinking removed partitions ``partitions..N-1`` (every group had consumed them): whoever
        holds one is told with a :class:`Revoke` and the partition is gone at once (there is no
        confirmation to wait for: nothing more comes from it; a late one is ignored); the rest
        rebalance over the members (a new generation)."""
        if type(partitions) is not int or not 1 <= partitions <= self.partitions:
            raise BadParameter(f"partitions may only shrink, to 1 or more: {self.partitions} -> {partitions!r}")
        if partitions == self.partitions:
            return []
        dropped: dict[str, list[int]] = {}
        for p in range(partitions, self.partitions):
            holder = self._holder[p]
            if holder is not None:
                mem = self._members[holder]
                mem.owned.discard(p)
                mem.revoking.discard(p)
                dropped.setdefault(holder, []).append(p)
        del self._state[partitions:]
        del self._holder[partitions:]
        self.retired = max(self.retired, self.partitions)
        self.partitions = partitions
        self.generation += 1
        told: list[Change] = [Revoke(m, tuple(ps)) for m, ps in sorted(dropped.items())]
        return told + self._rebalance()

    # ------------------------------------------------------------ queries

    def owned(self, member: str) -> frozenset[int]:
        """The partitions ``member`` may consume now (empty for a member not in the group)."""
        mem = self._members.get(member)
        return frozenset(mem.owned) if mem else frozenset()

    def revoking(self, member: str) -> frozenset[int]:
        """The partitions asked back from ``member``, not yet confirmed: it holds them, nobody else may get them."""
        mem = self._members.get(member)
        return frozenset(mem.revoking) if mem else frozenset()

    def owner(self, partition: int) -> str | None:
        """The member holding ``partition`` (owning or revoking it), or None if it is free."""
        return self._holder[self._check_partition(partition)]

    def state(self, partition: int) -> PartitionState:
        return self._state[self._check_partition(partition)]

    @property
    def members(self) -> list[str]:
        return sorted(self._members)

    def __contains__(self, member: object) -> bool:
        return member in self._members

    def __len__(self) -> int:
        return len(self._members)

    def next_deadline_ms(self) -> int | None:
        """The first ``now_ms`` at which :meth:`expire` would remove someone; None without members."""
        if not self._members:
            return None
        return min(m.last_heartbeat_ms for m in self._members.values()) + self.session_timeout_ms + 1

    def describe(self) -> dict[str, object]:
        return {
            "partitions": self.partitions,
            "generation": self.generation,
            "session_timeout_ms": self.session_timeout_ms,
            "members": {
                m: {
                    "owned": sorted(mem.owned),
                    "revoking": sorted(mem.revoking),
                    "last_heartbeat_ms": mem.last_heartbeat_ms,
                }
                for m, mem in sorted(self._members.items())
            },
            "free": [p for p in range(self.partitions) if self._state[p] is PartitionState.FREE],
        }

    def check_invariants(self) -> None:
        """Raise InternalError if the partition table and the members' sets disagree (for tests and asserts)."""
        seen: dict[int, str] = {}
        for m, mem in self._members.items():
            if mem.owned & mem.revoking:
                raise InternalError(f"member {m!r} both owns and is revoking {sorted(mem.owned & mem.revoking)}")
            for parts, state in ((mem.owned, PartitionState.OWNED), (mem.revoking, PartitionState.REVOKING)):
                for p in parts:
                    if p in seen:
                        raise InternalError(f"partition {p} held by both {seen[p]!r} and {m!r}")
                    seen[p] = m
                    if self._state[p] is not state or self._holder[p] != m:
                        raise InternalError(f"partition {p}: table says {self._state[p].value} by {self._holder[p]!r}")
        for p in range(self.partitions):
            if p not in seen and (self._state[p] is not PartitionState.FREE or self._holder[p] is not None):
                raise InternalError(f"partition {p} is {self._state[p].value} by {self._holder[p]!r}, a non-member")
            if self._members and p not in seen:
                raise InternalError(f"partition {p} is free while the group has live members")

    # ------------------------------------------------------------ internals

    def _step(self, member: str, event: MemberEvent) -> None:
        state = MemberState.LIVE if member in self._members else MemberState.GONE
        member_step(member, state, event)

    def _check_partition(self, partition: object) -> int:
        if type(partition) is not int or not 0 <= partition < self.partitions:
            raise BadParameter(f"partition must be 0..{self.partitions - 1}, not {partition!r}")
        return partition

    def _move(self, p: int, event: PartitionEvent, member: str) -> None:
        """Apply one row of PARTITION_TRANSITIONS to partition ``p`` on behalf of ``member``."""
        state = self._state[p]
        if state is not PartitionState.FREE and self._holder[p] != member:
            raise InternalError(
                f"partition {p}: {event.value!r} by {member!r} but it is {state.value} by {self._holder[p]!r}"
            )
        nxt = partition_step(p, state, event)
        mem = self._members[member]
        mem.owned.discard(p)
        mem.revoking.discard(p)
        if nxt is PartitionState.OWNED:
            mem.owned.add(p)
        elif nxt is PartitionState.REVOKING:
            mem.revoking.add(p)
        self._state[p] = nxt
        self._holder[p] = None if nxt is PartitionState.FREE else member

    def _remove(self, member: str) -> None:
        mem = self._members[member]
        for p in sorted(mem.owned | mem.revoking):
            self._move(p, PartitionEvent.RELEASE, member)
        del self._members[member]

    def _targets(self) -> dict[str, int]:
        """floor(N/M) or ceil(N/M) per member; the ceil slots go to the biggest owners (ties: smaller id)."""
        if not self._members:
            return {}
        base, extra = divmod(self.partitions, len(self._members))
        ranked = sorted(self._members, key=lambda m: (-len(self._members[m].owned), m))
        return {m: base + (1 if rank < extra else 0) for rank, m in enumerate(ranked)}

    def _rebalance(self) -> list[Change]:
        """Revoke what owners hold above target, hand free partitions to members below it."""
        targets = self._targets()
        changes: list[Change] = []
        for m in sorted(self._members):
            owned = self._members[m].owned
            excess = len(owned) - targets[m]
            if excess > 0:
                moving = sorted(owned)[-excess:]
                for p in moving:
                    self._move(p, PartitionEvent.REVOKE, m)
                changes.append(Revoke(m, tuple(moving)))
        free = [p for p in range(self.partitions) if self._state[p] is PartitionState.FREE]
        for m in sorted(self._members):
            if not free:
                break
            deficit = targets[m] - len(self._members[m].owned)
            if deficit > 0:
                given, free = free[:deficit], free[deficit:]
                for p in given:
                    self._move(p, PartitionEvent.ASSIGN, m)
                changes.append(Assign(m, tuple(given)))
        return changes


def _check_member_id(member: object) -> None:
    if not isinstance(member, str) or not 1 <= len(member) <= MEMBER_ID_CHARS_MAX:
        raise BadParameter(f"member id must be a string of 1..{MEMBER_ID_CHARS_MAX} chars, not {member!r}")
