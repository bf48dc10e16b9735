"""Moving a queue between clusters (``fabric queue move Q --to CLUSTER``): the move's document and
its state machine.

Theory of operation
-------------------
A move is one key, ``/federation/moves/<queue>``, holding a ``Move``. Whoever asks writes it in
phase ``requested`` (only where no move of the queue is under way); from then on only the
federation manager writes it, each write one txn fenced by the manager epoch
(``Compare.created_at(/federation/manager, epoch)``) and by the key's mod_revision, so a manager
killed mid-move leaves the phase in etcd and its successor carries on from it. The phases:

===========  ===========================================  ======================================
phase        source cluster's copy                        destination cluster's copy
===========  ===========================================  ======================================
requested    serving (the manager checks the ask)         none
copying      serving; batches copied from it              created *sealed*; the copy appends
cutover      *sealed*: refuses PRODUCE (QUEUE_MOVED)      sealed; catching up to the sealed end
switched     deleted by its controller                    unsealed: takes writes from the end on
done         gone                                         the queue
cancelling   unsealed again                               deleted by its controller
cancelled    the queue, as before                         gone
refused      the queue, as before (``error`` says why)    none
===========  ===========================================  ======================================

Each cluster's elected controller reads the moves and brings its own copy to what the phase says
(``wanted``): create it sealed, seal it, unseal it, delete it; all through its ordinary fenced
queue operations. The manager moves the phase on (``TRANSITIONS``; an illegal move raises
``MoveError`` naming the phase and the event):

* ``requested -> copying`` (``accept``) or ``refused`` (``refuse``): the queue is in the
  directory, held wholly by one cluster, and the destination is another reporting cluster.
* ``copying -> cutover`` (``caught_up``): the destination's copy is within ``CUTOVER_LAG`` messages
  of the source on every partition.
* ``cutover -> switched`` (``switch``): every source partition's leader says it is sealed, its high
  watermark equals its log end, and the destination's log ends at exactly that offset. The same txn
  points ``/federation/queues/<queue>`` at the destination and copies the groups' committed
  offsets and queue groups' lease tables into the destination's namespace. From here on there is
  no way back: the destination is the queue.
* ``switched -> done`` (``cleaned``): the destination's copy is unsealed and the source's deleted.
* ``copying | cutover -> cancelling`` (``cancel``): asked for (``cancel`` set by
  ``fabric queue move --cancel``), or either cluster stopped reporting for ``LOST_MS``, or the
  copy hit an error it cannot get past (``error`` says which).
* ``cancelling -> cancelled`` (``rolled_back``): the destination's copy is gone and the source's
  unsealed.

Never both copies writable: the destination is unsealed only in ``switched``/``done``, reached
only after the source's leaders were seen sealed; the source is unsealed only in
``copying``/``cancelling``/``cancelled``, none of which follows ``switched``. ``writable`` is that
rule, and the simulation (``tests/federation/test_move_sim.py``) checks it after every event.

Everything here is pure: no sockets, files or clocks (``now_ms`` is passed in).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from fabric.federation.directory import ClusterReport, QueuePlacement, _name, _obj

MOVES_PREFIX = "/federation/moves/"
CUTOVER_LAG = 1000  # messages behind the source on every partition: start the cut-over
LOST_MS = 15_000  # a cluster that has not reported for this long during copying/cutover: roll back

REQUESTED = "requested"
COPYING = "copying"
CUTOVER = "cutover"
SWITCHED = "switched"
DONE = "done"
CANCELLING = "cancelling"
CANCELLED = "cancelled"
REFUSED = "refused"
PHASES = (REQUESTED, COPYING, CUTOVER, SWITCHED, DONE, CANCELLING, CANCELLED, REFUSED)
FINISHED = (DONE, CANCELLED, REFUSED)  # a new move of the queue may replace these

# (phase, event) -> next phase: the one table of the move
TRANSITIONS: dict[tuple[str, str], str] = {
    (REQUESTED, "accept"): COPYING,
    (REQUESTED, "refuse"): REFUSED,
    (COPYING, "caught_up"): CUTOVER,
    (COPYING, "cancel"): CANCELLING,
    (CUTOVER, "switch"): SWITCHED,
    (CUTOVER, "cancel"): CANCELLING,
    (SWITCHED, "cleaned"): DONE,
    (CANCELLING, "rolled_back"): CANCELLED,
}


class MoveError(ValueError):
    """An event the move's phase does not take (names both)."""


def move_key(queue: str) -> str:
    return MOVES_PREFIX + queue


@dataclass(frozen=True, slots=True)
class Move:
    queue: str
    source: str  # the cluster holding the queue when the move was asked
    destination: str
    phase: str = REQUESTED
    partitions: int = 0  # the queue's partition count (set on accept)
    cancel: bool = False  # asked to cancel (fabric queue move --cancel); honoured before `switched`
    sealed_at: tuple[int, ...] = ()  # per partition: the offset the source stopped at (set on switch)
    error: str | None = None  # why it was refused or rolled back
    started_ms: int = 0
    updated_ms: int = 0

    def __post_init__(self) -> None:
        _name(self.queue, "move 'queue'")
        _name(self.source, f"move {self.queue!r} 'source'")
        _name(self.destination, f"move {self.queue!r} 'destination'")
        if self.phase not in PHASES:
            raise ValueError(f"move {self.queue!r}: unknown phase {self.phase!r}")
        if type(self.partitions) is not int or self.partitions < 0:
            raise ValueError(f"move {self.queue!r}: 'partitions' must be a non-negative integer")
        if not all(type(o) is int and o >= 0 for o in self.sealed_at):
            raise ValueError(f"move {self.queue!r}: 'sealed_at' must be offsets")
        if self.error is not None and not isinstance(self.error, str):
            raise ValueError(f"move {self.queue!r}: 'error' must be a string or null")

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED

    def on(self, event: str, now_ms: int, **changes: Any) -> Move:
        """The move after ``event`` (with ``changes`` to its fields). Raises MoveError."""
        nxt = TRANSITIONS.get((self.phase, event))
        if nxt is None:
            raise MoveError(f"move of {self.queue!r}: event {event!r} is not taken in phase {self.phase!r}")
        return replace(self, phase=nxt, updated_ms=now_ms, **changes)

    def to_json(self) -> bytes:
        doc = {"version": 1, **asdict(self)}
        doc["sealed_at"] = list(self.sealed_at)
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Move:
        raw = _obj(json.loads(data), "move")
        sealed = raw.get("sealed_at", [])
        if not isinstance(sealed, list):
            raise ValueError("move: 'sealed_at' must be a list")
        cancel = raw.get("cancel", False)
        if type(cancel) is not bool:
            raise ValueError("move: 'cancel' must be true or false")
        fields = {k: raw.get(k) for k in ("queue", "source", "destination", "phase", "error")}
        ints = {k: raw.get(k, 0) for k in ("partitions", "started_ms", "updated_ms")}
        for k, v in ints.items():
            if type(v) is not int or v < 0:
                raise ValueError(f"move: {k!r} must be a non-negative integer, got {v!r}")
        return cls(**fields, **ints, cancel=cancel, sealed_at=tuple(sealed))  # type: ignore[arg-type]  # __post_init__ checks


@dataclass(frozen=True, slots=True)
class Local:
    """What one cluster's copy of a moving queue should be: present or not, sealed or not
    (None: leave it as it is)."""

    present: bool | None
    sealed: bool | None


LEAVE = Local(None, None)


def wanted(move: Move, cluster: str) -> Local:
    """What ``cluster``'s controller should make of its copy of ``move.queue`` now."""
    p = move.phase
    if cluster == move.destination:
        if p in (COPYING, CUTOVER):
            return Local(True, True)
        if p in (SWITCHED, DONE):
            return Local(True, False)
        if p in (CANCELLING, CANCELLED):
            return Local(False, None)
    elif cluster == move.source:
        if p in (CUTOVER,):
            return Local(True, True)
        if p in (SWITCHED, DONE):
            return Local(False, None)
        if p in (CANCELLING, CANCELLED):
            return Local(True, False)
    return LEAVE


def writable(move: Move, cluster: str) -> bool:
    """Whether ``cluster``'s copy may take client writes in ``move``'s phase (the invariant:
    never both the source's and the destination's)."""
    if cluster == move.destination:
        return move.phase in (SWITCHED, DONE)
    if cluster == move.source:
        return move.phase in (REQUESTED, COPYING, CANCELLING, CANCELLED, REFUSED)
    return False


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    """One partition as the copy last saw it: the source leader's high watermark, log end and
    seal, and where the destination's copy ends."""

    source_hw: int
    source_end: int
    source_sealed: bool
    dest_end: int

    @property
    def lag(self) -> int:
        return max(0, self.source_hw - self.dest_end)

    @property
    def cut(self) -> bool:
        """Sealed at the source, nothing unreplicated there, and the destination holds all of it."""
        return self.source_sealed and self.source_hw == self.source_end == self.dest_end


def next_event(move: Move, progress: list[PartitionProgress] | None) -> str | None:
    """The data-driven event of a copying or cut-over move given its copy's progress (None:
    none yet): ``caught_up`` when every partition is within ``CUTOVER_LAG``, ``switch`` when
    every partition is cut."""
    if progress is None or len(progress) != move.partitions:
        return None
    if move.phase == COPYING and all(x.lag <= CUTOVER_LAG for x in progress):
        return "caught_up"
    if move.phase == CUTOVER and all(x.cut for x in progress):
        return "switch"
    return None


def lost(cluster: str, reports: dict[str, ClusterReport], now_ms: int) -> str | None:
    """Why ``cluster`` counts as lost to a move (no report, or none for ``LOST_MS``), or None."""
    r = reports.get(cluster)
    if r is None:
        return f"cluster {cluster} does not report to the federation"
    if now_ms - r.published_ms > LOST_MS:
        return f"cluster {cluster} has not reported for {(now_ms - r.published_ms) / 1000:.1f} s"
    return None


def problem(
    queue: str, destination: str, placement: QueuePlacement | None, reports: dict[str, ClusterReport], now_ms: int
) -> str | None:
    """Why ``queue`` cannot be moved to ``destination`` now, or None. A queue moves whole, from
    the one cluster holding it (a split queue's partitions are not moved one by one yet)."""
    if placement is None:
        return f"queue {queue!r} is not in the federation directory"
    if placement.clusters[0] == destination and len(placement.clusters) == 1:
        return f"queue {queue!r} is on {destination} already"
    return unmovable(placement) or lost(destination, reports, now_ms)


def unmovable(placement: QueuePlacement) -> str | None:
    """Why the queue cannot move at all, or None."""
    queue = placement.queue
    if len(placement.clusters) != 1:
        return f"queue {queue!r} is split over {','.join(placement.clusters)}: only a queue on one cluster moves"
    settings = placement.settings
    if settings.get("priority_levels", 1) != 1:
        return f"queue {queue!r} has priority levels: its level logs are not copied (not built)"
    if settings.get("mode", "log") != "log":
        return f"queue {queue!r} is a direct queue: it stores nothing to move (create it where it should be)"
    if settings.get("encrypt"):
        return f"queue {queue!r} is encrypted at rest: its copy is not built"
    return None
